"""The CPU engine's dtype follows the CPU; the dtype is part of the server identity and the cache key."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from serving.bench.run import baseline_dtype, peak_flop_per_cycle, roofline
from serving.launcher import ServeError, ServerSettings, build_command, choose_cpu_dtype, cpu_flags, find_server, write_record
from tests.test_runner import ToySettings, ToyStudy, records

AVX2_EPYC = {"fpu", "sse2", "avx", "avx2", "fma"}  # this project's AVX2 machines
BF16_EPYC = AVX2_EPYC | {"avx512f", "avx512bw", "avx512_bf16"}  # the EPYC with avx512_bf16
SAPPHIRE = AVX2_EPYC | {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}


def test_choice_from_cpu_flags():
    assert choose_cpu_dtype(AVX2_EPYC)[0] == "float32"
    assert choose_cpu_dtype(set())[0] == "float32"  # unreadable /proc/cpuinfo: the safe choice
    assert choose_cpu_dtype(AVX2_EPYC | {"avx512f"})[0] == "float32"  # AVX-512 alone has no bf16 arithmetic
    dtype, why = choose_cpu_dtype(BF16_EPYC)
    assert dtype == "bfloat16" and "avx512_bf16" in why
    dtype, why = choose_cpu_dtype(AVX2_EPYC | {"amx_bf16"})
    assert dtype == "bfloat16" and "amx_bf16" in why
    assert "no native bfloat16" in choose_cpu_dtype(AVX2_EPYC)[1]


def test_cpu_flags_reads_the_flags_line():
    text = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu avx2 avx512_bf16\n"
    assert cpu_flags(text) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags("processor\t: 0\n") == set()
    assert "fpu" in cpu_flags()  # this machine's, read from /proc/cpuinfo


@pytest.fixture
def local_weights(monkeypatch, tmp_path):
    for alias in ("mistral-7b-instruct-v0.2",):
        (tmp_path / alias).mkdir()
        (tmp_path / alias / "config.json").write_text("{}")
    monkeypatch.setenv("MEDSTACK_WEIGHTS", str(tmp_path))
    return "mistral-7b-instruct-v0.2"


def _dtype(argv: list[str]) -> str:
    assert argv.count("--dtype") == 1
    return argv[argv.index("--dtype") + 1]


def test_command_line_dtype_follows_the_cpu_and_the_override(monkeypatch, local_weights):
    import serving.launcher as L

    monkeypatch.setattr(L, "cpu_flags", lambda cpuinfo=None: BF16_EPYC)
    assert _dtype(build_command(ServerSettings(alias=local_weights), on_gpu=False)[0]) == "bfloat16"
    assert _dtype(build_command(ServerSettings(alias=local_weights, dtype="float32"), on_gpu=False)[0]) == "float32"
    monkeypatch.setattr(L, "cpu_flags", lambda cpuinfo=None: AVX2_EPYC)
    assert _dtype(build_command(ServerSettings(alias=local_weights), on_gpu=False)[0]) == "float32"
    assert _dtype(build_command(ServerSettings(alias=local_weights, dtype="auto"), on_gpu=False)[0]) == "float32"
    assert _dtype(build_command(ServerSettings(alias=local_weights, dtype="bfloat16"), on_gpu=False)[0]) == "bfloat16"
    # GPU: the registry's dtype (bfloat16 for this alias) unless overridden
    assert _dtype(build_command(ServerSettings(alias=local_weights), on_gpu=True)[0]) == "bfloat16"
    assert _dtype(build_command(ServerSettings(alias=local_weights, dtype="float16"), on_gpu=True)[0]) == "float16"
    with pytest.raises(ServeError, match="--dtype 'int8': expected one of auto, float32, bfloat16, float16"):
        build_command(ServerSettings(alias=local_weights, dtype="int8"), on_gpu=False)
    with pytest.raises(ServeError, match="use medstack's own --dtype"):  # it would silently override the recorded one
        build_command(ServerSettings(alias=local_weights, extra_args=["--dtype=bfloat16"]), on_gpu=False)


def test_roofline_uses_the_served_dtype_peak(tmp_path):
    import struct

    header = json.dumps({"w": {"dtype": "F32", "shape": [1000, 1000], "data_offsets": [0, 4]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    host = {"cpu_mhz": 2000.0, "usable_cpus": "0-1", "isa": ["avx2", "avx512f", "avx512_bf16"]}
    fp32 = roofline(tmp_path, host, dtype="float32")
    bf16 = roofline(tmp_path, host, dtype="bfloat16")
    assert bf16["tok_s"] == 2 * fp32["tok_s"] and "AVX512_BF16" in bf16["basis"] and bf16["dtype"] == "bfloat16"
    # no native bf16: bf16 is computed in FP32, so the ceiling does not rise
    no_bf16 = {**host, "isa": ["avx2"]}
    assert roofline(tmp_path, no_bf16, dtype="bfloat16")["tok_s"] == roofline(tmp_path, no_bf16, dtype="float32")["tok_s"]
    unknown = roofline(tmp_path, host, dtype=None)
    assert unknown["tok_s"] == fp32["tok_s"] and "float32 assumed" in unknown["basis"]
    assert peak_flop_per_cycle(["avx2", "avx512f", "avx512_bf16", "amx_bf16"], "bfloat16") == (1024, "BF16 (AMX)")
    assert peak_flop_per_cycle(["avx2"], "float32") == (32, "FP32")


def test_baseline_runs_in_the_served_dtype():
    assert baseline_dtype("bfloat16") == "bfloat16" and baseline_dtype("float32") == "float32"
    assert baseline_dtype(None) == "float32" and baseline_dtype("auto") == "float32"


def _fake_embedded(home) -> None:
    """A stand-in for the prepared embedded checkpoint: enough for the registry and the weights hash."""
    d = home / "models" / "embedded"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"\0" * 8)
    (d / "medstack_prepared.json").write_text(json.dumps({"weights_sha256": "ab" * 32}))


def test_cache_is_not_shared_across_dtypes(monkeypatch, tmp_path):
    """A resumed run whose server now computes in the other dtype asks again; back on the first dtype it hits the cache.

    The endpoint is the instant stand-in (a real HTTP server) recorded as a medstack server of the embedded model."""
    from experiments.tools.bench.runner_scale import InstantEndpoint
    from serving.client import GenConfig
    from serving.session import open_client

    home = tmp_path / "home"
    monkeypatch.setenv("MEDSTACK_HOME", str(home))
    _fake_embedded(home)
    cache = tmp_path / "responses.sqlite"
    msgs = [{"role": "user", "content": "Chest pain since this morning: what is the next step?"}]

    async def ask(dtype: str | None = None):
        async with open_client({"default": "embedded"}, cache_path=str(cache), dtype=dtype, log=lambda m: None) as (client, ids):
            r = await client.chat(msgs, gen=GenConfig(temperature=0.0, max_tokens=16))
            return r, ids["default"], client.endpoint("default").identity

    with InstantEndpoint() as ep:
        rec = {"alias": "embedded", "base_url": ep.base_url, "pid": ep.proc.pid, "port": ep.port, "host": "127.0.0.1",
               "argv": ["vllm"], "env": {}, "device": "cpu", "dtype": "float32", "dtype_reason": "test"}
        write_record(rec)
        first, ident, key32 = asyncio.run(ask())
        again, _, _ = asyncio.run(ask())
        assert not first.cached and again.cached and ident["dtype"] == "float32" and key32.endswith(":float32")
        write_record({**rec, "dtype": "bfloat16"})  # the same model, now served in bfloat16
        bf16, ident, key16 = asyncio.run(ask())
        assert not bf16.cached and ident["dtype"] == "bfloat16" and key16 != key32
        assert asyncio.run(ask())[0].cached
        write_record(rec)
        assert asyncio.run(ask())[0].cached  # the float32 answer is still there for a float32 server
        # an explicit dtype takes only a server of that dtype
        assert find_server("embedded", dtype="float32")["port"] == ep.port
        assert find_server("embedded", dtype="bfloat16") is None and find_server("embedded", dtype="auto") is not None
        assert os.path.exists(cache)


def test_resumed_run_tags_each_record_with_the_dtype_that_answered_it(monkeypatch, tmp_path):
    """A run resumed against a server of the other dtype: identity.json then names the resuming server, so each
    record keeps the dtype of the server that answered it, and the resumed cases' calls miss the cache."""
    from experiments.tools.bench.runner_scale import InstantEndpoint
    from experiments.core.runner import prepare_run, run_study

    home = tmp_path / "home"
    monkeypatch.setenv("MEDSTACK_HOME", str(home))
    _fake_embedded(home)
    out = tmp_path / "run"

    def run(limit: int) -> None:
        settings, cases = prepare_run(ToyStudy(), ToySettings(out=str(out), limit=limit))
        asyncio.run(run_study(ToyStudy(), settings, cases, log=lambda m: None))

    with InstantEndpoint() as ep:
        rec = {"alias": "embedded", "base_url": ep.base_url, "pid": ep.proc.pid, "port": ep.port, "host": "127.0.0.1",
               "argv": ["vllm"], "env": {}, "device": "cpu", "dtype": "float32", "dtype_reason": "test"}
        write_record(rec)
        run(2)
        write_record({**rec, "dtype": "bfloat16"})  # the run resumed after the server came back in bfloat16
        run(4)
    got = records(out)
    both = lambda dtype: {"asker": dtype, "answerer": dtype}  # noqa: E731
    assert {i: r["served_dtype"] for i, r in got.items()} == {"c0": both("float32"), "c1": both("float32"),
                                                                "c2": both("bfloat16"), "c3": both("bfloat16")}
    assert all(r["status"] == "ok" for r in got.values())
    assert not any(c["cached"] for i in ("c2", "c3") for c in got[i]["calls"])
    models = json.loads((out / "identity.json").read_text())["models"]
    assert models["asker"]["dtype"] == models["answerer"]["dtype"] == "bfloat16"  # only the records still say float32 for c0, c1


def test_run_summary_names_the_dtype():
    from experiments.core.runner import _footer, served_by

    ids = {"doctor": {"alias": "embedded", "device": "cpu", "dtype": "bfloat16", "dtype_reason": "native"}, "patient": {"alias": "x"}}
    metrics = {"case_status": {"finished": 1, "total": 1},
               "run": {"cases_resumed": 0, "wall_seconds": 1.0, "completion_tokens": 3, "output_tokens_per_s": 3.0, "requests": 1,
                       "cache_hits": 0, "served": served_by(ids)}}
    text = _footer(metrics, [], 0, None)
    assert "doctor = embedded (cpu, dtype bfloat16)" in text and "patient = x (device unknown, dtype unknown)" in text


def test_run_settings_dtype_key():
    from experiments.core.config import ConfigError, RunSettings, load_settings

    assert load_settings(RunSettings, None, {"dtype": "bfloat16"}).dtype == "bfloat16"
    with pytest.raises(ConfigError, match="dtype"):
        load_settings(RunSettings, None, {"dtype": "int8"})


def test_cli_serve_names_a_bad_dtype(cli):
    p = cli("serve", "--model", "embedded", "--dtype", "int8")
    said = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2 and "--dtype" in said and "'int8'" in said and "'bfloat16'" in said and "Traceback" not in p.stderr


def test_unknown_dtype_endpoint_is_said_once_and_cached_apart(monkeypatch, tmp_path):
    """An ALIAS@URL endpoint that names no dtype (the instant stand-in, like a plain vLLM server): one line when the
    client opens, however many roles use it; its answers are kept under its URL, apart from a known dtype's."""
    from experiments.tools.bench.runner_scale import InstantEndpoint
    from serving.client import GenConfig
    from serving.session import open_client

    home = tmp_path / "home"
    monkeypatch.setenv("MEDSTACK_HOME", str(home))
    _fake_embedded(home)  # for the recorded server below
    cache = str(tmp_path / "responses.sqlite")
    msgs = [{"role": "user", "content": "Fever and a stiff neck: what is the next step?"}]

    async def ask():
        said = []
        async with open_client({"doctor": f"embedded@{ep.base_url}", "patient": f"embedded@{ep.base_url}"}, cache_path=cache,
                               log=said.append) as (client, ids):
            r = await client.chat(msgs, role="doctor", gen=GenConfig(temperature=0.0, max_tokens=16))
            return r, ids["doctor"], client.endpoint("doctor").identity, [s for s in said if "dtype" in s]

    with InstantEndpoint() as ep:
        first, ident, key_unknown, said = asyncio.run(ask())
        assert said == [f"dtype unknown for embedded@{ep.base_url} (no X-Medstack-Dtype header on /v1/models (servers medstack "
                        f"starts send it) and no /server_info (vLLM answers it only with VLLM_SERVER_DEV_MODE=1)): its answers "
                        f"are cached apart, under this URL"]
        assert ident["dtype"] is None and not first.cached and asyncio.run(ask())[0].cached
        assert "dtype-unknown" in key_unknown and key_unknown.count(ep.base_url) == 2
        # the same URL recorded as a medstack server of a known dtype: another key, no line, no answer from the unknown's
        write_record({"alias": "embedded", "base_url": ep.base_url, "pid": ep.proc.pid, "port": ep.port, "host": "127.0.0.1",
                      "argv": ["vllm"], "env": {}, "device": "cpu", "dtype": "float32", "dtype_reason": "test"})
        known, ident, key32, said = asyncio.run(ask())
        assert not said and ident["dtype"] == "float32" and key32 == f"embedded@{ep.base_url}:float32" and not known.cached


def test_unknown_dtype_cache_keys_name_the_endpoint():
    from serving.session import endpoint_identity

    keys = {endpoint_identity("embedded", {"weights": "w", "dtype": d, "base_url": u})
            for d, u in [(None, "http://a:1/v1"), (None, "http://b:1/v1"), ("float32", "http://a:1/v1"), ("float32", "http://b:1/v1"),
                         ("bfloat16+float32", "http://a:1/v1")]}
    assert keys == {"embedded:w:dtype-unknown@http://a:1/v1", "embedded:w:dtype-unknown@http://b:1/v1", "embedded:w:float32",
                    "embedded:w:bfloat16+float32@http://a:1/v1"}


def test_served_dtype_names_and_the_middleware():
    """The middleware every server medstack starts runs (vLLM --middleware): the engine's dtype on a 200 /v1/models only."""
    import torch
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from fastapi.testclient import TestClient
    from types import SimpleNamespace

    from serving.launcher import DTYPE_MIDDLEWARE
    from serving.served_dtype import announce_dtype, dtype_name

    assert [dtype_name(v) for v in (torch.bfloat16, "torch.float32", "half", "float16", "auto", "int8", None)] == \
        ["bfloat16", "float32", "float16", "float16", None, None, None]
    app = FastAPI()
    app.state.vllm_config = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))

    @app.get("/v1/models")
    async def models(request: __import__("fastapi").Request):
        ok = request.headers.get("authorization") == "Bearer k"
        return JSONResponse({"data": []} if ok else {"error": "Unauthorized"}, status_code=200 if ok else 401)

    app.middleware("http")(announce_dtype)  # as vLLM adds a function given to --middleware
    client = TestClient(app)
    assert client.get("/v1/models", headers={"Authorization": "Bearer k"}).headers["x-medstack-dtype"] == "bfloat16"
    assert "x-medstack-dtype" not in client.get("/v1/models").headers  # not to a request without the key
    assert DTYPE_MIDDLEWARE == "serving.served_dtype.announce_dtype"
