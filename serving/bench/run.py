"""One benchmark, as a short sequence of named steps.

    resolve endpoint -> readiness probe -> one test prompt -> warm-up
    -> measured run per concurrency level (all requests issued at once, a semaphore
       keeps ``concurrency`` in flight) -> transformers baseline (same prompts)
    -> bench.json (config + results together), requests.jsonl, bench.md, bench.png

Not on the study runner: it measures the server, so it sends its own uncached requests at each fixed concurrency
(the runner's cache and resume would hide what is measured).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from serving.bench import prompts as P, replay as R
from serving.bench.compare import compare_run
from serving.bench.plot import plot_bench, plot_replay
from serving.bench.summary import render_replay_markdown, summarize, write_markdown
from serving.bench.measure import calculate_metrics
from serving.bench.send import RequestOutput, send_completion
from models.errors import MedstackError
from models.registry import resolve_weights
from serving import server_metrics
from serving.cpus import host_facts, parse_cpu_list
from serving.launcher import healthy, running_servers
from serving.refs import model_name
from serving.replicas import metrics_targets, scrape_targets
from serving.session import open_client


@dataclass
class BenchSettings:
    model: str
    """Registry alias, or ALIAS@URL for a server that is already up."""
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 32, 128])
    input_len: int = 512
    output_len: int = 128
    num_prompts: int | None = None
    """Requests per level; default max(4, 2 x level)."""
    prompts: str | None = None
    random_prompts: bool = False
    baseline: str | None = None
    baseline_batch: list[int] = field(default_factory=lambda: [1, 8, 32])
    baseline_threads: int | None = None
    """torch threads for the baseline (default: torch's own choice, one per core)."""
    warmups: int = 2
    temperature: float = 0.0
    seed: int = 0
    out: str | None = None
    allow_remote: bool = False
    ready_timeout: float = 120.0
    request_timeout: float = 1800.0
    roofline_tok_s: float | None = None
    """Compute ceiling on output tok/s to state shares against (default: estimated from /proc/cpuinfo and the weights)."""

    def requests_for(self, level: int) -> int:
        return self.num_prompts or max(4, 2 * level)


def _first_error(outputs: list[RequestOutput]) -> str | None:
    return next((o.error for o in outputs if not o.success), None)


def _log(msg: str) -> None:
    print(msg, flush=True)


async def _probe(base_url: str, api_key: str | None, deadline_s: float) -> None:
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        if await asyncio.to_thread(healthy, base_url, api_key):
            return
        await asyncio.sleep(1.0)
    raise MedstackError(f"the server at {base_url} did not answer /v1/models within {deadline_s:.0f} s")


async def _measure_level(sdk, model: str, prompts: list[list[int]], s: BenchSettings, level: int, base_url: str | None = None) -> tuple[dict, list[RequestOutput]]:
    sem = asyncio.Semaphore(level)

    async def one(p):
        async with sem:
            return await send_completion(sdk, model, p, s.output_len, temperature=s.temperature)

    before = await asyncio.to_thread(server_metrics.scrape, base_url) if base_url else {}
    t0 = time.perf_counter()
    outputs = await asyncio.gather(*(one(p) for p in prompts))
    figures = calculate_metrics(outputs, time.perf_counter() - t0)
    if base_url:  # server-side: prefix-cache hit rate, TTFT split into queueing and prefill
        figures["server"] = server_metrics.summary(before, await asyncio.to_thread(server_metrics.scrape, base_url))
    return figures, outputs


def server_record(base_url: str) -> dict | None:
    """The launcher's record of the server at ``base_url`` (settings it was started with), if we started it."""
    return next((r for r in running_servers() if r.get("base_url", "").rstrip("/") == base_url.rstrip("/")), None)


def count_params(weights: Path) -> int | None:
    """Parameters in a safetensors checkpoint, from the file headers (no tensors loaded)."""
    import struct

    total = 0
    files = sorted(Path(weights).glob("*.safetensors"))
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                size = 1
                for d in meta["shape"]:
                    size *= d
                total += size
    return total or None


def peak_flop_per_cycle(isa: list[str], dtype: str) -> tuple[int, str]:
    """(FLOP per cycle per CPU, what computes them) for matrix products in ``dtype`` on a CPU with this ISA.

    FP32 FMA: 32 with AVX2, 64 with AVX-512 (two FMA units). bfloat16: AVX512_BF16's dot product does twice
    the FP32 FMA's work per instruction (128), AMX's tile multiply 1,024 per core; without either, bf16 is
    converted and computed in FP32, so the FP32 peak is its ceiling (and a generous one)."""
    fp32 = 64 if "avx512f" in isa else 32 if "avx2" in isa else 16
    if dtype == "bfloat16":
        if "amx_bf16" in isa:
            return 1024, "BF16 (AMX)"
        if "avx512_bf16" in isa:
            return 2 * fp32, "BF16 (AVX512_BF16)"
        return fp32, "FP32 (bf16 emulated: no native bf16)"
    return fp32, "FP32"


def roofline(weights: Path, host: dict, override: float | None = None, dtype: str | None = None) -> dict | None:
    """Compute-bound ceiling on output tok/s for a dense decoder on this CPU, in the served ``dtype``:
    usable CPUs x FLOP/cycle of that dtype (``peak_flop_per_cycle``) x clock / (2 x parameters) FLOP per token."""
    if override:
        return {"tok_s": round(override, 1), "basis": "given with --roofline-tok-s"}
    params = count_params(weights)
    mhz, isa = host.get("cpu_mhz"), host.get("isa") or []
    ncpu = len(parse_cpu_list(host.get("usable_cpus") or "")) or host.get("cpus")
    if not params or not mhz or not ncpu:
        return None
    served = dtype if dtype in ("float32", "bfloat16") else "float32"
    per_cycle, unit = peak_flop_per_cycle(isa, served)
    flops = ncpu * per_cycle * mhz * 1e6
    assumed = "" if dtype == served else f" (served dtype {dtype or 'unknown'}: float32 assumed)"
    return {"tok_s": round(flops / (2 * params), 1), "params": params, "dtype": served,
            "basis": f"{ncpu} CPUs x {per_cycle} {unit} FLOP/cycle x {mhz / 1000:.2f} GHz / (2 x {params / 1e6:.0f}M params){assumed}"}


def served_dtype(identity: dict | None) -> str | None:
    """The dtype the benchmarked server computes in, from its identity (None where the server names none: serving/served_dtype.py)."""
    return (identity or {}).get("dtype")


def baseline_dtype(served: str | None) -> str:
    """The transformers baseline runs in the served dtype, so the ratio compares like with like (float32 when unknown)."""
    return served if served in ("float32", "bfloat16", "float16") else "float32"


@asynccontextmanager
async def _endpoint(s):
    """(endpoint, OpenAI SDK client on it, identities with the settings the server was started with) of ``s.model``,
    once it answers; the server medstack started for it is stopped after."""
    import openai

    async with open_client({"default": s.model}, use_cache=False, allow_remote=s.allow_remote, log=_log) as (client, identities):
        ep = client.endpoint("default")
        _log(f"endpoint: {ep.base_url} (served model {ep.model})")
        await _probe(ep.base_url, None if ep.api_key == "EMPTY" else ep.api_key, s.ready_timeout)
        sdk = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, timeout=s.request_timeout, max_retries=0)
        rec = server_record(ep.base_url) or {}
        try:
            yield ep, sdk, {**identities, "server_settings": rec.get("serve_settings"), "server_argv": rec.get("argv")}
        finally:
            await sdk.close()


def _hf_identity(weights: Path, dtype: str) -> dict:
    import torch
    import transformers

    return {"engine": f"transformers {transformers.__version__}", "torch": torch.__version__, "threads": torch.get_num_threads(),
            "dtype": dtype, "weights": str(weights)}


def _host(load_start: tuple) -> dict:
    """The machine, with the load average at start and now: the CPU may be shared, and other processes' load
    depresses every figure."""
    return {**host_facts(), "loadavg_1m_start": round(load_start[0], 2), "loadavg_1m_end": round(os.getloadavg()[0], 2)}


async def _run_vllm(s: BenchSettings, prompt_pool: list[list[int]], requests_log, on_level=lambda r: None) -> tuple[list[dict], dict]:
    async with _endpoint(s) as (ep, sdk, identities):
        test = await send_completion(sdk, ep.model, prompt_pool[0], min(s.output_len, 16), temperature=s.temperature)
        if not test.success:
            raise MedstackError(f"the test prompt failed against {ep.base_url}: {test.error}")
        _log(f"test prompt ok: {test.output_tokens} tokens in {test.latency:.2f} s")
        if s.warmups:
            _log(f"warm-up: {s.warmups} request(s)")
            await asyncio.gather(*(send_completion(sdk, ep.model, prompt_pool[i % len(prompt_pool)], s.output_len) for i in range(s.warmups)))
        results = []
        for level in s.concurrency:
            n = s.requests_for(level)
            _log(f"vLLM: concurrency {level}, {n} requests x {s.input_len} in / {s.output_len} out ...")
            figures, outputs = await _measure_level(sdk, ep.model, prompt_pool[:n], s, level, ep.base_url)
            _log(f"  {figures['output_tokens_per_s']} output tok/s, {figures['failed']} failed, {figures['duration_s']:.1f} s")
            results.append({"engine": "vllm", "concurrency": level, **figures, "first_error": _first_error(outputs)})
            on_level(results[-1])
            for o in outputs:
                requests_log.write(json.dumps({"engine": "vllm", "concurrency": level, **o.to_dict()}) + "\n")
    return results, identities


def _run_hf(s: BenchSettings, weights: Path, prompt_pool: list[list[int]], requests_log, on_level=lambda r: None,
            dtype: str = "float32") -> tuple[list[dict], dict]:
    from serving.bench import baseline_hf

    _log(f"transformers baseline: loading {weights} ({dtype}, the served dtype)")
    model = baseline_hf.load_model(str(weights), s.baseline_threads, dtype)
    baseline_hf.warm_up(model, prompt_pool[0])
    results = []
    for bs in s.baseline_batch:
        n = s.requests_for(bs)
        _log(f"transformers: batch {bs}, {n} requests ...")
        figures, outputs = baseline_hf.run_level(model, prompt_pool[:n], s.output_len, bs)
        _log(f"  {figures['output_tokens_per_s']} output tok/s, {figures['duration_s']:.1f} s")
        results.append({"engine": "hf", "concurrency": bs, "batch_size": bs, **figures, "first_error": _first_error(outputs)})
        on_level(results[-1])
        for o in outputs:
            requests_log.write(json.dumps({"engine": "hf", "concurrency": bs, **o.to_dict()}) + "\n")
    del model
    return results, _hf_identity(weights, dtype)


def run_bench(s: BenchSettings, compare_runs: list[str] | None = None) -> Path:
    from transformers import AutoTokenizer

    # validate everything cheap before touching the server
    if s.baseline not in (None, "hf"):
        raise MedstackError(f"--baseline {s.baseline!r}: the only baseline is 'hf' (transformers generate)")
    alias = model_name(s.model)
    _, weights = resolve_weights(alias)
    tokenizer = AutoTokenizer.from_pretrained(str(weights))
    levels = list(s.concurrency) + (list(s.baseline_batch) if s.baseline else [])
    pool_size = max(s.requests_for(c) for c in levels)
    if s.random_prompts:
        source = f"random token ids (seed {s.seed})"
        pool = P.random_prompts(tokenizer, pool_size, s.input_len, s.seed)
    else:
        texts = P.load_texts(s.prompts)
        source = str(s.prompts or P.DEFAULT_DATA.relative_to(Path(__file__).parents[2]))
        pool = P.build_prompts(tokenizer, texts, pool_size, s.input_len, s.seed)
    compare_inputs = [compare_run(r) for r in compare_runs or []]  # fail on bad paths before measuring

    out = Path(s.out or f"runs/bench/{alias}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_start = os.getloadavg()
    with open(out / "requests.jsonl", "w") as requests_log:
        done: list[dict] = []  # finished levels, kept in bench.partial.json until the run completes

        def on_level(result: dict) -> None:
            done.append(result)
            requests_log.flush()
            (out / "bench.partial.json").write_text(json.dumps({"config": asdict(s), "levels": done}, indent=2, default=str))

        vllm_results, identities = asyncio.run(_run_vllm(s, pool, requests_log, on_level))
        dtype = served_dtype(identities.get("default"))
        hf_results, hf_ident = _run_hf(s, weights, pool, requests_log, on_level, baseline_dtype(dtype)) if s.baseline else ([], None)
    (out / "bench.partial.json").unlink(missing_ok=True)

    bench = {
        "config": {**asdict(s), "prompt_source": source},
        "started": started,
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "identity": {"vllm": identities.get("default"), "hf": hf_ident},
        "serve_settings": identities.get("server_settings"),
        "host": _host(load_start),
        "results": {"vllm": vllm_results, "hf": hf_results},
    }
    on_gpu = ((identities.get("default") or {}).get("device") == "gpu") or bool((identities.get("server_settings") or {}).get("on_gpu"))
    bench["served_dtype"] = dtype
    bench["roofline"] = None if on_gpu and not s.roofline_tok_s else roofline(weights, bench["host"], s.roofline_tok_s, dtype)
    bench.update(summarize(vllm_results, hf_results, compare_inputs))
    (out / "bench.json").write_text(json.dumps(bench, indent=2, default=str))
    plot_bench(vllm_results, hf_results, out / "bench.png", title=f"{alias}: {s.input_len} in / {s.output_len} out tokens")
    md = write_markdown(bench, out / "bench.md")
    print(md)
    _log(f"wrote {out / 'bench.json'}, {out / 'bench.md'}, {out / 'bench.png'}")
    if vllm_results and all(r["completed"] == 0 for r in vllm_results):
        raise MedstackError(f"every vLLM request failed (first error: {vllm_results[0]['first_error']}); see {out / 'requests.jsonl'}")
    return out


@dataclass
class ReplaySettings:
    model: str
    run_dir: str
    baseline: str | None = None
    baseline_threads: int | None = None
    concurrency: int | None = None
    """Default: the run's own (config.yaml)."""
    send_seed: bool = False
    out: str | None = None
    allow_remote: bool = False
    ready_timeout: float = 120.0
    request_timeout: float = 1800.0


def run_replay(s: ReplaySettings) -> Path:
    """``medstack bench --replay RUN_DIR``: the run's calls against the endpoint (and the batch-1 loop)."""
    if s.baseline not in (None, "hf"):
        raise MedstackError(f"--baseline {s.baseline!r}: the only baseline is 'hf' (transformers generate)")
    wl = R.load_workload(s.run_dir)
    alias = model_name(s.model)
    _, weights = resolve_weights(alias)
    desc = wl.describe()
    _log(f"replay of {s.run_dir}: {desc['cases']} cases, {desc['calls']} calls, {desc['completion_tokens']} completion tokens, "
         f"concurrency {s.concurrency or wl.concurrency}")
    out = Path(s.out or f"runs/bench/replay-{Path(s.run_dir).name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "requests.jsonl").write_text("")
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_start = os.getloadavg()

    async def endpoint():
        async with _endpoint(s) as (ep, sdk, identities):
            test = await R.send_call(sdk, ep.model, wl.in_call_order()[0], send_seed=s.send_seed)
            if not test["success"]:
                raise MedstackError(f"the first recorded call failed against {ep.base_url}: {test['error']}")
            targets = metrics_targets([ep.base_url])  # a replica group or router: every replica's /metrics, not the router's
            before = await asyncio.to_thread(scrape_targets, targets)
            figures, records = await R.replay_endpoint(wl, sdk, ep.model, send_seed=s.send_seed, concurrency=s.concurrency)
            per_server = server_metrics.endpoint_figures(targets, before, await asyncio.to_thread(scrape_targets, targets))
            figures["server"] = per_server.get(ep.base_url) or server_metrics.summary({}, {})
            if targets[ep.base_url] != [ep.base_url]:
                figures["server_replicas"] = {u: per_server[u] for u in targets[ep.base_url] if u in per_server}
        return figures, records, identities.get("default"), identities["server_settings"]

    _log("vLLM: replaying ...")
    vllm, records, ident, serve_settings = asyncio.run(endpoint())
    R.write_requests(out / "requests.jsonl", records, "vllm")
    _log(f"  {vllm['wall_s']:.1f} s wall, {vllm['output_tokens_per_s']} output tok/s, {vllm['failed']} failed")
    hf, hf_ident = None, None
    if s.baseline:
        from transformers import AutoTokenizer

        from serving.bench import baseline_hf

        hf_dtype = baseline_dtype(served_dtype(ident))
        _log(f"transformers: replaying {desc['calls']} calls one at a time (batch 1, {hf_dtype}, the served dtype) ...")
        model = baseline_hf.load_model(str(weights), s.baseline_threads, hf_dtype)
        tok = AutoTokenizer.from_pretrained(str(weights))
        baseline_hf.warm_up(model, tok("Hello", return_tensors=None)["input_ids"])
        hf, hf_records = R.replay_hf(wl, model, tok, R._chat_template(alias), log=_log)
        R.write_requests(out / "requests.jsonl", hf_records, "hf")
        hf_ident = _hf_identity(weights, hf_dtype)
        _log(f"  {hf['wall_s']:.1f} s wall, {hf['output_tokens_per_s']} output tok/s, {hf['failed']} failed")
        del model
    bench = {
        "config": {**asdict(s), "kind": "replay"},
        "started": started,
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "identity": {"vllm": ident, "hf": hf_ident},
        "serve_settings": serve_settings,
        "served_dtype": served_dtype(ident),
        "host": _host(load_start),
        "replay": {"workload": desc, "vllm": vllm, "hf": hf, "speedup": R.speedup(vllm, hf)},
    }
    (out / "bench.json").write_text(json.dumps(bench, indent=2, default=str))
    plot_replay(bench["replay"], out / "bench.png", title=f"{alias}: replay of {Path(s.run_dir).name}")
    md = render_replay_markdown(bench)
    (out / "bench.md").write_text(md)
    print(md)
    _log(f"wrote {out / 'bench.json'}, {out / 'bench.md'}, {out / 'bench.png'}")
    if vllm["completed"] == 0:
        raise MedstackError(f"every replayed call failed (first error: {vllm['first_error']}); see {out / 'requests.jsonl'}")
    return out
