"""End-to-end: the real vLLM server (CPU build) with the embedded model."""

from __future__ import annotations

import asyncio
import json

import pytest

from serving.cache import ResponseCache
from serving.client import Endpoint, GenConfig, LLMClient
from serving.launcher import free_port

pytestmark = pytest.mark.e2e
MSG = [{"role": "user", "content": "List three symptoms of influenza."}]


def client_for(rec, model="embedded", **kw):
    return LLMClient({"default": Endpoint(rec["base_url"], model, f"test:{model}")}, **kw)


def test_detach_prints_url_and_status_lists_server(embedded_server, cli):
    assert embedded_server["base_url"] in embedded_server["cli_stdout"]
    assert "log:" in embedded_server["cli_stderr"]
    if "log" in embedded_server:  # the KV cache capacity vLLM logged, what `concurrency: auto` is bounded by
        from serving.launcher import kv_cache_tokens

        kv = kv_cache_tokens(embedded_server["log"])
        assert kv and kv > 2048 and f"its KV cache holds {kv:,} tokens" in embedded_server["cli_stderr"]
    status = cli("serve", "status", "--json", check=True)
    recs = json.loads(status.stdout)
    mine = [r for r in recs if r["port"] == embedded_server["port"]]
    assert mine and mine[0]["alias"] == "embedded" and "test-lora" in mine[0]["adapters"]


def test_chat_and_completion_return_text_and_usage(embedded_server):
    async def go():
        c = client_for(embedded_server)
        chat = await c.chat(MSG, gen=GenConfig(max_tokens=16))
        comp = await c.complete("The patient presented with", gen=GenConfig(max_tokens=16))
        length = await c.served_context_length()
        await c.aclose()
        return chat, comp, length

    chat, comp, length = asyncio.run(go())
    assert length == 2048  # the served max_model_len (the registry's context_length for the embedded model)
    for r in (chat, comp):
        assert r.ok, r.error
        assert r.text.strip()
        assert r.prompt_tokens > 0 and 0 < r.completion_tokens <= 16


def test_lora_adapter_is_served_and_changes_output(embedded_server):
    async def go():
        base = client_for(embedded_server, "embedded")
        lora = client_for(embedded_server, "test-lora")
        a = await base.complete("Chief complaint: cough for two weeks. Assessment:", gen=GenConfig(max_tokens=12))
        b = await lora.complete("Chief complaint: cough for two weeks. Assessment:", gen=GenConfig(max_tokens=12))
        return a, b

    a, b = asyncio.run(go())
    assert a.ok and b.ok, (a.error, b.error)
    assert a.text != b.text


def test_cache_answers_without_server_call(embedded_server, tmp_path):
    async def go():
        c = client_for(embedded_server, cache=ResponseCache(tmp_path / "cache.sqlite"))
        first = await c.chat(MSG, gen=GenConfig(max_tokens=12))
        second = await c.chat(MSG, gen=GenConfig(max_tokens=12))
        return c, first, second

    c, first, second = asyncio.run(go())
    assert not first.cached and second.cached and first.texts == second.texts
    assert c.usage["default"].requests == 1 and c.usage["default"].cache_hits == 1


async def _forward(reader, writer, target_port):
    up_r, up_w = await asyncio.open_connection("127.0.0.1", target_port)

    async def pipe(r, w):
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        finally:
            w.close()

    await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer), return_exceptions=True)


def test_client_retries_through_late_server(embedded_server):
    """Nothing listens on the port at first; a proxy to the real server comes up 3 s later."""
    port = free_port()

    async def go():
        async def late_proxy():
            await asyncio.sleep(3)
            return await asyncio.start_server(lambda r, w: _forward(r, w, embedded_server["port"]), "127.0.0.1", port)

        c = LLMClient({"default": Endpoint(f"http://127.0.0.1:{port}/v1", "embedded", "x")}, retries=6, backoff=0.5)
        proxy_task = asyncio.create_task(late_proxy())
        result = await c.chat(MSG, gen=GenConfig(max_tokens=8))
        (await proxy_task).close()
        return result

    result = asyncio.run(go())
    assert result.ok, result.error
    assert result.text


def test_chat_command_uses_running_server(embedded_server, cli):
    proc = cli("chat", "--model", "embedded", "--max-tokens", "8", "Name one antibiotic.", check=True)
    assert proc.stdout.strip()
    assert "completion tokens" in proc.stderr


def test_port_in_use_is_a_clear_error(embedded_server, cli):
    proc = cli("serve", "--model", "embedded", "--port", str(embedded_server["port"]), "--detach")
    assert proc.returncode == 2 and "already in use" in proc.stderr


def test_non_local_url_refused(cli):
    proc = cli("chat", "--model", "embedded@http://10.1.2.3:8000/v1", "hello")
    assert proc.returncode == 2 and "--allow-remote" in proc.stderr


def test_unknown_alias_and_missing_weights_exit_2(cli, tmp_path):
    proc = cli("serve", "--model", "no-such-model")
    assert proc.returncode == 2 and "unknown model alias" in proc.stderr
    proc = cli("chat", "--model", "llama3-8b-instruct", "hi", env={"MEDSTACK_WEIGHTS": str(tmp_path), "HF_HOME": str(tmp_path)})
    assert proc.returncode == 2 and "not found" in proc.stderr and "MEDSTACK_WEIGHTS" in proc.stderr
