"""One benchmark, as a short sequence of named steps.

    resolve endpoint -> readiness probe -> one test prompt -> warm-up
    -> measured run per concurrency level (all requests issued at once, a semaphore
       keeps ``concurrency`` in flight) -> transformers baseline (same prompts)
    -> bench.json (config + results together), requests.jsonl, bench.md, bench.png
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from models.errors import MedstackError
from experiments.bench.measure import calculate_metrics
from experiments.bench.send import RequestOutput, send_completion


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
    baseline_batch: list[int] = field(default_factory=lambda: [1, 8])
    baseline_threads: int | None = None
    """torch threads for the baseline (default: torch's own choice, one per core)."""
    warmups: int = 2
    temperature: float = 0.0
    seed: int = 0
    out: str | None = None
    allow_remote: bool = False
    ready_timeout: float = 120.0
    request_timeout: float = 1800.0

    def requests_for(self, level: int) -> int:
        return self.num_prompts or max(4, 2 * level)


def _first_error(outputs: list[RequestOutput]) -> str | None:
    return next((o.error for o in outputs if not o.success), None)


def _log(msg: str) -> None:
    print(msg, flush=True)


async def _probe(base_url: str, api_key: str | None, deadline_s: float) -> None:
    from serving.launcher import healthy

    deadline = time.time() + deadline_s
    while time.time() < deadline:
        if await asyncio.to_thread(healthy, base_url, api_key):
            return
        await asyncio.sleep(1.0)
    raise MedstackError(f"the server at {base_url} did not answer /v1/models within {deadline_s:.0f} s")


async def _measure_level(sdk, model: str, prompts: list[list[int]], s: BenchSettings, level: int) -> tuple[dict, list[RequestOutput]]:
    sem = asyncio.Semaphore(level)

    async def one(p):
        async with sem:
            return await send_completion(sdk, model, p, s.output_len, temperature=s.temperature)

    t0 = time.perf_counter()
    outputs = await asyncio.gather(*(one(p) for p in prompts))
    return calculate_metrics(outputs, time.perf_counter() - t0), outputs


async def _run_vllm(s: BenchSettings, prompt_pool: list[list[int]], requests_log, on_level=lambda r: None) -> tuple[list[dict], dict]:
    import openai

    from serving.session import open_client

    async with open_client({"default": s.model}, use_cache=False, allow_remote=s.allow_remote, log=_log) as (client, identities):
        ep = client.endpoint("default")
        _log(f"endpoint: {ep.base_url} (served model {ep.model})")
        await _probe(ep.base_url, None if ep.api_key == "EMPTY" else ep.api_key, s.ready_timeout)
        sdk = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, timeout=s.request_timeout, max_retries=0)
        try:
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
                figures, outputs = await _measure_level(sdk, ep.model, prompt_pool[:n], s, level)
                _log(f"  {figures['output_tokens_per_s']} output tok/s, {figures['failed']} failed, {figures['duration_s']:.1f} s")
                results.append({"engine": "vllm", "concurrency": level, **figures, "first_error": _first_error(outputs)})
                on_level(results[-1])
                for o in outputs:
                    requests_log.write(json.dumps({"engine": "vllm", "concurrency": level, **o.to_dict()}) + "\n")
        finally:
            await sdk.close()
    return results, identities


def _run_hf(s: BenchSettings, weights: Path, prompt_pool: list[list[int]], requests_log, on_level=lambda r: None) -> tuple[list[dict], dict]:
    import torch
    import transformers

    from experiments.bench import baseline_hf

    _log(f"transformers baseline: loading {weights} (float32)")
    model = baseline_hf.load_model(str(weights), s.baseline_threads)
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
    ident = {"engine": f"transformers {transformers.__version__}", "torch": torch.__version__,
             "threads": torch.get_num_threads(), "dtype": "float32", "weights": str(weights)}
    del model
    return results, ident


def run_bench(s: BenchSettings, compare_runs: list[str] | None = None) -> Path:
    from transformers import AutoTokenizer

    from experiments.bench import prompts as P
    from experiments.bench.compare import compare_run
    from experiments.bench.plot import plot_bench
    from experiments.bench.summary import summarize, write_markdown
    from models.registry import resolve_weights

    # validate everything cheap before touching the server
    if s.baseline not in (None, "hf"):
        raise MedstackError(f"--baseline {s.baseline!r}: the only baseline is 'hf' (transformers generate)")
    alias = s.model.partition("@")[0]
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
        hf_results, hf_ident = _run_hf(s, weights, pool, requests_log, on_level) if s.baseline else ([], None)
    (out / "bench.partial.json").unlink(missing_ok=True)

    bench = {
        "config": {**asdict(s), "prompt_source": source},
        "started": started,
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "identity": {"vllm": identities.get("default"), "hf": hf_ident},
        # the CPU may be shared: other processes' load depresses every figure
        "host": {"cpus": os.cpu_count(), "loadavg_1m_start": round(load_start[0], 2), "loadavg_1m_end": round(os.getloadavg()[0], 2)},
        "results": {"vllm": vllm_results, "hf": hf_results},
    }
    bench.update(summarize(vllm_results, hf_results, compare_inputs))
    (out / "bench.json").write_text(json.dumps(bench, indent=2, default=str))
    plot_bench(vllm_results, hf_results, out / "bench.png", title=f"{alias}: {s.input_len} in / {s.output_len} out tokens")
    md = write_markdown(bench, out / "bench.md")
    print(md)
    _log(f"wrote {out / 'bench.json'}, {out / 'bench.md'}, {out / 'bench.png'}")
    if vllm_results and all(r["completed"] == 0 for r in vllm_results):
        raise MedstackError(f"every vLLM request failed (first error: {vllm_results[0]['first_error']}); see {out / 'requests.jsonl'}")
    return out
