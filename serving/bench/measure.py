"""Measuring: a pure function from request records and wall time to the benchmark figures.

Definitions (over successful requests; failed ones are only counted):
- requests_per_s       completed requests / duration
- output_tokens_per_s  generated tokens / duration
- total_tokens_per_s   (prompt + generated tokens) / duration
- ttft_ms              time from sending to the first token
- itl_ms               every gap between consecutive tokens of a request, pooled over requests
- tpot_ms              per request (latency - ttft) / (output_tokens - 1)
- e2e_s                end-to-end latency of a request, sending to last token
Percentiles use linear interpolation between closest ranks (numpy's default).
"""

from __future__ import annotations

import numpy as np

FIGURES = (
    "requests_per_s", "output_tokens_per_s", "total_tokens_per_s",
    "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99",
    "itl_ms_mean", "itl_ms_p50", "itl_ms_p99",
    "e2e_s_mean", "e2e_s_p50", "e2e_s_p99",
)
HIGHER_IS_BETTER = {"requests_per_s", "output_tokens_per_s", "total_tokens_per_s"}


def _get(o, key):
    return o[key] if isinstance(o, dict) else getattr(o, key)


def _stats(prefix: str, values: list[float], scale: float) -> dict:
    if not values:
        return {f"{prefix}_mean": None, f"{prefix}_p50": None, f"{prefix}_p99": None}
    a = np.asarray(values, dtype=float) * scale
    return {
        f"{prefix}_mean": round(float(a.mean()), 4),
        f"{prefix}_p50": round(float(np.percentile(a, 50)), 4),
        f"{prefix}_p99": round(float(np.percentile(a, 99)), 4),
    }


def calculate_metrics(outputs: list, duration: float) -> dict:
    """Figures for one measured level. ``outputs``: RequestOutput objects or their dicts."""
    ok = [o for o in outputs if _get(o, "success")]
    input_tokens = sum(_get(o, "prompt_len") for o in ok)
    output_tokens = sum(_get(o, "output_tokens") for o in ok)
    rate = (lambda x: round(x / duration, 4)) if duration > 0 else (lambda x: None)
    tpots = [(_get(o, "latency") - _get(o, "ttft")) / (_get(o, "output_tokens") - 1) for o in ok if _get(o, "output_tokens") > 1]
    return {
        "requests": len(outputs),
        "completed": len(ok),
        "failed": len(outputs) - len(ok),
        "duration_s": round(duration, 4),
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "requests_per_s": rate(len(ok)),
        "output_tokens_per_s": rate(output_tokens),
        "total_tokens_per_s": rate(input_tokens + output_tokens),
        **_stats("ttft_ms", [_get(o, "ttft") for o in ok], 1000.0),
        **_stats("tpot_ms", tpots, 1000.0),
        **_stats("itl_ms", [x for o in ok for x in _get(o, "itl")], 1000.0),
        **_stats("e2e_s", [_get(o, "latency") for o in ok], 1.0),
    }


def ratios(vllm: dict, base: dict) -> dict:
    """vLLM / baseline for every figure both have (None where undefined)."""
    out = {}
    for k in FIGURES:
        a, b = vllm.get(k), base.get(k)
        out[k] = round(a / b, 3) if a is not None and b not in (None, 0) else None
    return out


def nearest(levels: list[dict], concurrency: int) -> dict | None:
    """The level with the same, else the nearest, concurrency (ties: the lower one)."""
    if not levels:
        return None
    return min(levels, key=lambda r: (abs(r["concurrency"] - concurrency), r["concurrency"]))
