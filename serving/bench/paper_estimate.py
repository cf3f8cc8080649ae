"""A run at paper scale on GPUs, on paper: calls, tokens after prefix caching, wall time, concurrency.

    python -m serving.bench.paper_estimate --run RUN_DIR [--case-trials N] [--json OUT]

The workload is the run's own call log (the one ``bench --replay`` replays), scaled from the run's finished
cases to ``--case-trials`` of them. Prefix caching (vLLM's automatic prefix caching) is modelled from the logged
prompts: a call's prompt is cached up to its longest run of leading messages that an earlier call of the run
sent (a conversation turn re-uses the previous turn; cases that share a system prompt share it). Counted at
message boundaries only, so a start shared inside a message is prefilled again: conservative. GPU time = uncached
prompt tokens / prefill rate + output tokens / decode rate (``THROUGHPUT``, cited); replicas divide it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from serving.bench.replay import latest_records
from serving.bench.summary import fixed_width

THROUGHPUT = {
    # LambdaLabsML/vllm-benchmark, benchmark_v0.md, "vLLM v0.5.4 v.s. v0.6.0", Llama 3.1 8B, tp=1, 1x H100-80GB-SXM,
    # rps=inf, 5,000 prompts, max-num-seqs 256, max-seq-len 2048: output throughput 3,958.40 tok/s (v0.6.0, one
    # scheduler step) and 8,088.35 tok/s (ten scheduler steps). The lower figure is used.
    "decode_tok_s": 3958.4,
    "decode_source": "https://github.com/LambdaLabsML/vllm-benchmark/blob/main/benchmark_v0.md (Llama 3.1 8B, 1x H100 SXM, vLLM 0.6.0: 3,958 output tok/s; 8,088 with 10 scheduler steps)",
    "batch": 256,  # max-num-seqs of that measurement: the requests in flight that saturate one replica
    # prefill: 2 x 8.03e9 FLOP per token on 989 TFLOP/s dense BF16 (H100 SXM) at an assumed 40 % utilisation
    "prefill_tok_s": round(989e12 * 0.40 / (2 * 8.03e9)),
    "prefill_source": "derived: H100 SXM 989 TFLOP/s dense BF16 x 40 % utilisation (assumed) / (2 x 8.03e9 FLOP per token)",
}


def _prefixes(call: dict) -> tuple[list[bytes], list[int]]:
    """Hashes of the call's prompt cut after each message, with the characters up to each cut."""
    messages = call.get("messages") if call.get("kind") == "chat" else [{"role": "", "content": call.get("prompt") or ""}]
    h, hashes, chars, n = hashlib.blake2b(digest_size=12), [], [], 0
    for m in messages or []:
        text = m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
        h.update(f"\0{m.get('role')}\0{len(text)}\0".encode())
        h.update(text.encode())
        n += len(text)
        hashes.append(h.copy().digest())
        chars.append(n)
    return hashes, chars


def _counted(rec: dict) -> list[tuple] | None:
    """A finished record's calls that reached the engine: (prefix hashes, their characters, prompt, output tokens)."""
    if rec.get("status") == "failed":
        return None
    return [(*_prefixes(c), c.get("prompt_tokens") or 0, c["completion_tokens"]) for c in rec.get("calls") or []
            if not c.get("error") and c.get("completion_tokens")]


def workload(run_dir: str | Path) -> dict:
    """Calls, prompt tokens, their part a prefix cache would hold, and output tokens of the run's finished cases.

    One streamed pass: each record is reduced to its calls' prefix hashes as it is read, never held whole."""
    seen: set[bytes] = set()
    w = {"case_trials": 0, "calls": 0, "prompt": 0, "uncached": 0.0, "output": 0}
    for _, calls in latest_records(Path(run_dir) / "records.jsonl", _counted).values():
        if calls is None:
            continue
        w["case_trials"] += 1
        for hashes, chars, prompt, output in calls:
            hit = next((i for i in range(len(hashes) - 1, -1, -1) if hashes[i] in seen), None)
            seen.update(hashes)
            w["calls"] += 1
            w["prompt"] += prompt
            w["uncached"] += (1 - (chars[hit] / chars[-1] if hit is not None else 0.0)) * prompt
            w["output"] += output
    if not w["calls"]:
        raise SystemExit(f"{run_dir}: no finished case with a call log to estimate from")
    return w


def estimate(w: dict, case_trials: int | None = None, throughput: dict = THROUGHPUT, replicas=(1, 2, 4, 8),
             measured_hit: float | None = None) -> dict:
    n = case_trials or w["case_trials"]
    per = {k: w[k] / w["case_trials"] for k in ("calls", "prompt", "uncached", "output")}
    total = {k: v * n for k, v in per.items()}
    decode_s = total["output"] / throughput["decode_tok_s"]
    gpu_s = total["uncached"] / throughput["prefill_tok_s"] + decode_s
    # bounds: the prefix-cache hit rate a real server reports may be lower than the model's (evictions, a turn
    # routed to another replica, 16-token blocks): the same run at a given hit rate, and with none
    bounds = {f"{round(100 * h)} % cached": round(((1 - h) * total["prompt"] / throughput["prefill_tok_s"] + decode_s) / 3600, 2)
              for h in ([measured_hit] if measured_hit is not None else []) + [0.0]}
    rows = [{"replicas": r, "wall_h": round(gpu_s / r / 3600, 2), "calls_per_s": round(total["calls"] * r / gpu_s, 1),
             "concurrency": throughput["batch"] * r} for r in replicas]
    return {"case_trials": n, "measured_case_trials": w["case_trials"], "per_case_trial": {k: round(v, 1) for k, v in per.items()},
            "total": {k: round(v) for k, v in total.items()}, "prefix_cache_saving": round(1 - total["uncached"] / total["prompt"], 3),
            "gpu_seconds": round(gpu_s), "gpu_hours_if": bounds, "replicas": rows, "throughput": throughput}


def _measured_hit(run_dir: str) -> float | None:
    """The prefix-cache hit rate the run's server reported (metrics.json run.server), if any."""
    try:
        servers = json.loads((Path(run_dir) / "metrics.json").read_text())["run"].get("server") or {}
    except (OSError, ValueError, KeyError):
        return None
    rates = [s.get("prefix_cache_hit_rate") for s in servers.values() if s.get("prefix_cache_hit_rate") is not None]
    return rates[0] if rates else None


def markdown(e: dict) -> str:
    t = e["total"]
    return "\n".join([
        fixed_width(["case-trials", "calls", "prompt tokens", "prompt tokens after prefix caching", "output tokens", "GPU time (1 H100)"], [[
            f"{e['case_trials']:,}", f"{t['calls']:,}", f"{t['prompt']:,}", f"{t['uncached']:,} ({100 * e['prefix_cache_saving']:.0f} % cached)",
            f"{t['output']:,}", f"{e['gpu_seconds'] / 3600:.2f} h"]]), "",
        "GPU time (1 H100) at a lower prefix-cache hit rate: " + "; ".join(f"{k}: {v} h" for k, v in e["gpu_hours_if"].items()), "",
        fixed_width(["replicas (1 H100 each)", "wall time", "calls/s the runner must sustain", "concurrency that keeps them busy"],
                    [[str(r["replicas"]), f"{r['wall_h']} h", str(r["calls_per_s"]), str(r["concurrency"])] for r in e["replicas"]])])


def main() -> None:
    ap = argparse.ArgumentParser(description="Estimate a run at paper scale on H100s from a real run's call log.")
    ap.add_argument("--run", required=True, help="results directory of a real run (its call log is the workload)")
    ap.add_argument("--case-trials", type=int, help="case-trials of the run to estimate (default: the run's own finished ones)")
    ap.add_argument("--json", help="write the estimate here as JSON")
    a = ap.parse_args()
    e = estimate(workload(a.run), a.case_trials, measured_hit=_measured_hit(a.run))
    if a.json:
        Path(a.json).write_text(json.dumps(e, indent=2))
    print(markdown(e))
    print(f"\nper case-trial: {e['per_case_trial']} (from {e['measured_case_trials']} finished case-trials)")


if __name__ == "__main__":
    main()
