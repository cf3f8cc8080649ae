"""A scripted stand-in for the model server, behind the REAL client (cache, retries, usage).

``ScriptedLLM(respond)`` is an :class:`serving.client.LLMClient` whose transport is a Python
function ``respond(role, content, gen) -> str`` instead of HTTP. ``respond`` may raise
the client's ``TransportError`` (see :func:`down`) to play a server that stopped answering; the
client's own retry loop (with no back-off delay) then gives up as it would in a real run.
Used to unit-test protocol logic and the runner's failure policy; the real server is exercised
by the e2e tests.
"""

from __future__ import annotations

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
