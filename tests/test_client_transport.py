"""The client's HTTP transport against a real local HTTP server (aiohttp's own web server, not a model):
what goes on the wire, how each kind of failure becomes a ChatResult, retries, keep-alive pooling."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from aiohttp import web

from serving.client import AUTH_MARK, ChatResult, Endpoint, GenConfig, LLMClient

KEY = "sk-local-secret-123"


class Fake:
    """Answers /v1/chat/completions, /v1/completions and /v1/models from a script of (status, body) pairs."""

    def __init__(self):
        self.script: list[tuple[int, object]] = []
        self.seen: list[dict] = []
        self.peers: set = set()
        self.delay = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        self.peers.add(request.transport.get_extra_info("peername"))
        body = await request.json() if request.method == "POST" else None
        self.seen.append({"path": request.path, "auth": request.headers.get("Authorization"), "body": body})
        if self.delay:
            await asyncio.sleep(self.delay)
        if request.path.endswith("/models"):
            return web.json_response({"object": "list", "data": [{"id": "m", "max_model_len": 4096}, {"id": "other"}]})
        status, out = self.script.pop(0) if self.script else (200, None)
        if out is None:
            out = {"choices": [{"index": 1, "message": {"content": "second"}, "text": "second", "finish_reason": "length"},
                               {"index": 0, "message": {"content": "first"}, "text": "first", "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 11, "completion_tokens": 3}}
        if isinstance(out, str):
            return web.Response(status=status, text=out)
        return web.json_response(out, status=status)


@pytest.fixture
async def fake():
    f = Fake()
    app = web.Application()
    app.router.add_route("*", "/v1/{tail:.*}", f.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    f.url = f"http://127.0.0.1:{port}/v1"
    yield f
    await runner.cleanup()


def client(url: str, **kw) -> LLMClient:
    kw = {"retries": 2, "backoff": 0.0, "timeout": 5, **kw}
    return LLMClient({"default": Endpoint(url, "m", "m@test", api_key=KEY)}, **kw)


async def test_chat_sends_the_body_as_is_and_reads_choices_in_index_order(fake):
    c = client(fake.url)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    gen = GenConfig(temperature=0.7, max_tokens=9, n=2, stop=("\nA:",), structured=json.dumps({"choice": ["yes", "no"]}))
    r = await c.chat(msgs, gen=gen)
    await c.aclose()
    assert r.ok and r.texts == ["first", "second"] and r.finish_reasons == ["stop", "length"]
    assert (r.prompt_tokens, r.completion_tokens) == (11, 3)
    sent = fake.seen[0]
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == f"Bearer {KEY}"
    assert sent["body"]["messages"] == msgs and sent["body"]["model"] == "m" and sent["body"]["stop"] == ["\nA:"]
    assert sent["body"]["structured_outputs"] == {"choice": ["yes", "no"]} and sent["body"]["n"] == 2
    assert "seed" not in sent["body"]  # seeds are sent only with send_seed (see LLMClient._send)


async def test_completion_goes_to_the_completions_route(fake):
    c = client(fake.url)
    r = await c.complete("Q: 1+1\nA:")
    await c.aclose()
    assert r.text == "first" and fake.seen[0]["path"] == "/v1/completions" and fake.seen[0]["body"]["prompt"] == "Q: 1+1\nA:"


async def test_4xx_is_not_retried_and_names_the_servers_message(fake):
    fake.script = [(400, {"error": {"message": "This model's maximum context length is 2048 tokens.", "type": "BadRequestError"}})]
    c = client(fake.url, retries=3)
    r = await c.chat([{"role": "user", "content": "x"}])
    await c.aclose()
    assert r.error == "HTTP 400: This model's maximum context length is 2048 tokens." and len(fake.seen) == 1
    assert r.error_kind == "status"


async def test_401_names_the_endpoint_and_never_the_key(fake):
    fake.script = [(401, {"error": {"message": "Unauthorized"}})]
    c = client(fake.url, retries=3)
    r = await c.chat([{"role": "user", "content": "x"}])
    await c.aclose()
    assert r.error.startswith(f"HTTP 401 from {fake.url}: {AUTH_MARK}") and KEY not in r.error and len(fake.seen) == 1
    assert r.error_kind == "auth"


async def test_5xx_and_429_are_retried_until_an_answer(fake):
    fake.script = [(500, "Internal Server Error"), (429, {"message": "slow down"}), (200, None)]
    c = client(fake.url, retries=3)
    r = await c.chat([{"role": "user", "content": "x"}])
    await c.aclose()
    assert r.ok and r.text == "first" and len(fake.seen) == 3 and c.usage["default"].failed == 0 and r.error_kind is None


async def test_persistent_5xx_gives_up_with_the_last_error(fake):
    fake.script = [(503, {"error": {"message": "engine dead"}})] * 3
    c = client(fake.url, retries=2)
    r = await c.chat([{"role": "user", "content": "x"}])
    await c.aclose()
    assert r.error == "gave up after 3 attempts: HTTP 503: engine dead" and c.usage["default"].failed == 1
    assert r.error_kind == "transport"


async def test_a_body_that_is_not_json_is_a_failed_request_not_an_exception(fake):
    fake.script = [(200, "<html>proxy page</html>")] * 2
    c = client(fake.url, retries=1)
    r = await c.chat([{"role": "user", "content": "x"}])
    await c.aclose()
    assert r.error.startswith("gave up after 2 attempts: HTTP 200 with a body that is not JSON")


async def test_timeout_is_a_retryable_failure(fake):
    fake.delay = 1.0
    c = client(fake.url, retries=0, timeout=0.2)
    r = await c.chat([{"role": "user", "content": "x"}])
    await c.aclose()
    assert r.error == f"gave up after 1 attempts: no answer from {fake.url}/chat/completions within 0.2 s"


async def test_connection_refused_gives_up_without_raising():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = client(f"http://127.0.0.1:{port}/v1", retries=1)
    r = await c.chat([{"role": "user", "content": "x"}])
    await c.aclose()
    assert not r.ok and r.error.startswith("gave up after 2 attempts: ClientConnectorError") and str(port) in r.error and r.error_kind == "transport"


async def test_served_context_length_reads_the_models_listing(fake):
    c = client(fake.url)
    assert await c.served_context_length() == 4096
    other = LLMClient({"default": Endpoint(fake.url, "other", "o")})
    assert await other.served_context_length() is None  # listed without a length
    await c.aclose(), await other.aclose()
    gone = client("http://127.0.0.1:9/v1", retries=0)
    assert await gone.served_context_length() is None  # no answer: the caller falls back to the registry
    await gone.aclose()


async def test_connections_are_kept_alive_and_bounded_by_concurrency(fake):
    fake.delay = 0.02
    c = client(fake.url, concurrency=4)
    results = await asyncio.gather(*[c.chat([{"role": "user", "content": f"q{i}"}]) for i in range(40)])
    await c.aclose()
    assert all(isinstance(r, ChatResult) and r.ok for r in results) and len(fake.seen) == 40
    assert 1 <= len(fake.peers) <= 4  # 40 requests over at most `concurrency` kept-alive connections
