"""End-to-end: the real server's dtype follows the CPU, is shown and recorded, is told to a client that asks
(``serving.served_dtype``: the engine's own dtype on /v1/models), and keys the response cache; workers of two dtypes
are refused as one router's."""

from __future__ import annotations

import asyncio
import json

import pytest

from serving.client import GenConfig
from serving.launcher import ServeError, choose_cpu_dtype, cpu_flags, running_servers
from serving.replicas import check_same_dtype
from serving.served_dtype import ask_dtype
from serving.session import open_client

pytestmark = pytest.mark.e2e
MSG = [{"role": "user", "content": "Name one cause of chest pain."}]


def test_default_server_dtype_is_the_cpus_and_is_shown(embedded_server, cli):
    expected, why = choose_cpu_dtype(cpu_flags())  # float32 on this project's AVX2 machines, bfloat16 with avx512_bf16/amx_bf16
    assert f"dtype {expected}: {why}" in embedded_server["cli_stderr"]
    mine = [r for r in json.loads(cli("serve", "status", "--json", check=True).stdout) if r["port"] == embedded_server["port"]]
    assert mine[0]["dtype"] == expected and mine[0]["dtype_reason"] == why
    assert mine[0]["gpu_memory_utilization"] is None  # CPU: no share of a GPU (serve status shows "-")
    assert f"--dtype {expected}" in " ".join(mine[0]["argv"])
    assert expected in cli("serve", "status", check=True).stdout
    # asked of the server itself: the dtype the engine resolved, on its /v1/models answer
    assert ask_dtype(embedded_server["base_url"]) == (expected, "asked of the server: its /v1/models header X-Medstack-Dtype")


def test_other_dtype_server_does_not_reuse_cached_answers(embedded_server, tmp_path):
    """A run asking for the other dtype starts its own server of that dtype (the running one is not reused),
    and its calls miss the cache the default server's answers were stored in."""
    default = embedded_server.get("dtype") or choose_cpu_dtype(cpu_flags())[0]
    other = "bfloat16" if default == "float32" else "float32"
    cache = str(tmp_path / "responses.sqlite")
    before = sorted((r["base_url"], r["dtype"]) for r in running_servers() if r["alias"] == "embedded")  # other tests' servers too
    gen = GenConfig(temperature=0.0, max_tokens=8)

    async def ask(dtype, inside=lambda ident: None):
        async with open_client({"default": "embedded"}, cache_path=cache, dtype=dtype, log=lambda m: None) as (client, ids):
            inside(ids["default"])
            return await client.chat(MSG, gen=gen), ids["default"]

    def two_dtypes(ident):
        """While the other dtype's server runs: each real server, asked, names its own; a router over both is refused."""
        asked = {u: ask_dtype(u) for u in (embedded_server["base_url"], ident["base_url"])}
        assert [d for d, _ in asked.values()] == [default, other]
        with pytest.raises(ServeError, match="dtypes differ"):
            check_same_dtype(asked)
        assert check_same_dtype(asked, allow_mixed=True)[0] == "+".join(sorted([default, other]))

    first, ident = asyncio.run(ask(None))
    again, _ = asyncio.run(ask(default))
    assert first.ok and not first.cached and again.cached and ident["dtype"] == default and not ident["started_by_run"]
    switched, ident = asyncio.run(ask(other, two_dtypes))
    assert switched.ok, switched.error
    assert not switched.cached and ident["dtype"] == other and ident["started_by_run"] and f"--dtype {other}" in " ".join(ident["argv"])
    # CPU: the second server started beside the running one as before, with no GPU share planned or passed
    assert ident["gpu_memory_utilization"] is None and "--gpu-memory-utilization" not in ident["argv"]
    after = sorted((r["base_url"], r["dtype"]) for r in running_servers() if r["alias"] == "embedded")
    assert after == before and ident["base_url"] not in [u for u, _ in after]  # the run's own server was stopped, the others left
