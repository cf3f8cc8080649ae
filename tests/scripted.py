"""A scripted stand-in for the model server, behind the REAL client (cache, retries, usage).

``ScriptedLLM(respond)`` is an :class:`serving.client.LLMClient` whose transport is a Python
function ``respond(role, content, gen) -> str`` instead of HTTP. ``respond`` may raise
the client's ``TransportError`` (see :func:`down`) to play a server that stopped answering; the
client's own retry loop (with no back-off delay) then gives up as it would in a real run.
Used to unit-test protocol logic and the runner's failure policy; the real server is exercised
by the e2e tests.

``ChatStub`` is the same idea over HTTP: an OpenAI-shaped chat endpoint whose reply is its subclass's
``answer(body)``, for a scripted agent served beside the real server (``serve_stub`` starts one on 127.0.0.1).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from serving.client import ChatResult, Endpoint, LLMClient, TransportError


def down() -> TransportError:
    return TransportError("ClientConnectorError: Cannot connect to host 127.0.0.1:9 (scripted: the server is down)")


class ScriptedLLM(LLMClient):
    def __init__(self, respond, roles=("default",), cache=None, retries: int = 1):
        endpoints = {r: Endpoint("http://127.0.0.1:9/v1", "scripted", "scripted-model") for r in roles}
        super().__init__(endpoints, concurrency=8, timeout=5, retries=retries, backoff=0.0, cache=cache)
        self.respond = respond
        self.sent: list[tuple[str, object]] = []

    def endpoint(self, role: str) -> Endpoint:
        return Endpoint("http://127.0.0.1:9/v1", role, "scripted-model")  # the served name carries the role

    async def _send(self, kind, content, ep: Endpoint, gen, t0) -> ChatResult:
        self.sent.append((ep.model, content))
        text = self.respond(ep.model, content, gen)
        return ChatResult(texts=[text] * gen.n, prompt_tokens=10, completion_tokens=len(str(text).split()) or 1,
                          finish_reasons=["stop"] * gen.n)


class ChatStub(BaseHTTPRequestHandler):
    """An OpenAI-shaped chat completions endpoint answering ``answer(body)`` (the request's JSON body); a subclass
    that must answer otherwise (an error status) overrides ``reply(body) -> (JSON, status)``."""

    def answer(self, body: dict) -> str:
        raise NotImplementedError

    def reply(self, body: dict) -> tuple[dict, int]:
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "embedded",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.answer(body)}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}, 200

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(404)
        self.end_headers()

    def do_POST(self):
        out, code = self.reply(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        data = json.dumps(out).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def serve_stub(handler: type[ChatStub]) -> ThreadingHTTPServer:
    """``handler`` served on a free port of 127.0.0.1 in a daemon thread (call ``shutdown()`` when done)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
