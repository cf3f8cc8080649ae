"""Experiment runs against the benchmark: a run's sustained output tokens/s as a fraction of
the engine's saturated figure at the same (or nearest) concurrency.

``experiments.core.runner.run_cases`` writes ``output_tokens_per_s`` and ``concurrency`` under
``metrics.json["run"]``; that is all this reads.
"""

from __future__ import annotations

import json
from pathlib import Path

from models.errors import DataError
from serving.bench.measure import nearest


def compare_run(path: str | Path) -> dict:
    """Read the ``run`` section of a results directory's metrics.json."""
    p = Path(path)
    f = p / "metrics.json" if p.is_dir() else p
    if not f.exists():
        raise DataError(f"{f}: no metrics.json (is {p} a results directory?)")
    try:
        metrics = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{f}:{e.lineno}: not valid JSON ({e.msg})") from None
    run = metrics.get("run") if isinstance(metrics, dict) else None
    if not isinstance(run, dict) or run.get("output_tokens_per_s") is None or run.get("concurrency") is None:
        raise DataError(f"{f}: no 'run' section with output_tokens_per_s and concurrency (written by experiments.core.runner.run_cases)")
    return {
        "run": str(p),
        "output_tokens_per_s": float(run["output_tokens_per_s"]),
        "concurrency": int(run["concurrency"]),
        "wall_seconds": run.get("wall_seconds"),
        "requests": run.get("requests"),
        "cache_hits": run.get("cache_hits"),
    }


def against_bench(run: dict, vllm_levels: list[dict]) -> dict:
    level = nearest(vllm_levels, run["concurrency"])
    if level is None or not level.get("output_tokens_per_s"):
        return {**run, "bench_concurrency": None, "bench_output_tokens_per_s": None, "fraction": None}
    return {
        **run,
        "bench_concurrency": level["concurrency"],
        "bench_output_tokens_per_s": level["output_tokens_per_s"],
        "fraction": round(run["output_tokens_per_s"] / level["output_tokens_per_s"], 3),
    }
