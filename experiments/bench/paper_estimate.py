"""The full CRAFT-MD paper run on a GPU, on paper: calls, tokens after prefix caching, wall time, concurrency.

    python -m experiments.bench.paper_estimate --run RUN_DIR [--published DIR] [--json OUT]

Three measured inputs, one cited:

1. **Our prompt templates, in tokens** — from the call log of a real CRAFT-MD run (``--run``, a results
   directory of ``medstack run craftmd``; the same log ``bench --replay`` replays). For each step the
   template's own tokens are the call's prompt tokens less the conversation text it carries (the
   completion tokens of the calls that produced that text, from the same record).
2. **Conversation shape** — from the CRAFT-MD authors' released per-case runs (``--published``, a folder of
   ``case_*.json``): doctor turns per conversation (assistant messages less the fixed greeting), and the
   mean length of doctor and patient messages, summaries and answers (characters / 4 = tokens).
   Without ``--published`` the LLaMA-2-7b figures measured from that release are used (``LLAMA2_SHAPE``).
3. **The call pattern** — ``experiments.craftmd.protocol``: patient opening, T doctor turns, T-1 patient
   turns, one summary, then per format (4) an MCQ and an FRQ, an extraction and a match per FRQ:
   2T + 17 calls.
4. **Throughput of an 8B model on one H100 under vLLM** (cited; see ``THROUGHPUT``).

Prefix caching (vLLM's automatic prefix caching, exact-prefix block reuse) is modelled per call: a
conversation turn re-uses the previous turn of the same view (its prompt and its answer), so only the
other party's new message is prefilled; the patient's system prompt (with the vignette) is prefilled once
per case (five trials in a row); grader and summary templates are shared by every call, so only their
variable tail is prefilled; MCQ/FRQ prompts are counted whole (conservative: the two questions of a format
share the context but are sent at the same moment). GPU time = uncached prompt tokens / prefill rate +
output tokens / decode rate; replicas divide it (data parallel, one replica per GPU).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import statistics as st
from pathlib import Path

from experiments.common.markdown import md_table
from experiments.core.results import iter_records

CASE_TRIALS = 2004 * 5  # the released case set (2,004 cases) x 5 trials: one format set per case-trial
FORMATS = ("vignette", "multiturn", "singleturn", "summarized")
CHARS_PER_TOKEN = 4.0
MSG_OVERHEAD = 5  # chat-template tokens around each message (role header, end of turn)

# doctor turns, and characters per doctor / patient message, summary, answer — measured from the authors'
# release (rajpurkarlab/craft-md, results of LLaMA-2-7b, 10,020 case-trials) by published_shape()
LLAMA2_SHAPE = {"source": "CRAFT-MD release, llama2-7b (10,020 case-trials)", "turns_mean": 8.41, "turns_p50": 8, "turns_max": 14,
                "doctor_chars": 389, "patient_chars": 111, "summary_chars": 708, "answer_chars": 60}

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


def published_shape(folder: str | Path) -> dict:
    """Conversation shape of a folder of the authors' per-case result files."""
    turns, doc, pat, summ, ans = [], [], [], [], []
    for f in glob.glob(str(Path(folder) / "*.json")):
        d = json.loads(Path(f).read_text())
        for key, t in d.items():
            if not key.startswith("trial_"):
                continue
            conv = t.get("multiturn_conversation") or []
            turns.append(sum(m.get("role") == "assistant" for m in conv) - 1)  # less the fixed greeting
            for m in conv[2:]:
                (doc if m.get("role") == "assistant" else pat).append(len(m.get("content") or ""))
            summ.append(len(t.get("summarized_conversation") or ""))
            ans += [len(str(t.get(f"{f_}_{m_}") or "")) for f_ in FORMATS for m_ in ("mcq", "frq")]
    if not turns:
        raise SystemExit(f"{folder}: no case_*.json with trial_* entries")
    return {"source": str(folder), "case_trials": len(turns), "turns_mean": round(st.mean(turns), 2), "turns_p50": st.median(turns),
            "turns_max": max(turns), "doctor_chars": round(st.mean(doc)), "patient_chars": round(st.mean(pat)),
            "summary_chars": round(st.mean(summ)), "answer_chars": round(st.mean(ans))}


def template_tokens(run_dir: str | Path) -> dict:
    """Per step, the prompt tokens of our template itself (measured prompt tokens less the text carried).

    One streamed pass over the records: each record's call log is reduced to its few per-step figures as it is
    read, and only those are held (the last record per id wins), never the call logs of the whole run."""
    latest: dict[str, dict | None] = {}
    for r in iter_records(Path(run_dir) / "records.jsonl"):
        latest[str(r["id"])] = None if r.get("status") == "failed" else _template_rows(r.get("calls") or [])
    rows: dict[str, list[float]] = {}
    for per in latest.values():
        for k, v in (per or {}).items():
            rows.setdefault(k, []).extend(v)
    if not rows:
        raise SystemExit(f"{run_dir}: no finished CRAFT-MD record with a conversation in its call log")
    return {k: round(st.mean(v), 1) for k, v in rows.items()}


def _template_rows(call_log: list[dict]) -> dict[str, list[float]] | None:
    """One record's template tokens per step (None without a conversation in its call log)."""
    calls = {c["step"]: c for c in call_log}
    if "patient_opening" not in calls or "doctor_turn_1" not in calls:
        return None
    rows: dict[str, list[float]] = {}

    def add(k, v):
        rows.setdefault(k, []).append(v)

    out = {s: c.get("completion_tokens") or 0 for s, c in calls.items()}
    conv = [s for s in calls if s.startswith(("doctor_turn_", "patient_turn_"))]
    patient_out = out["patient_opening"] + sum(out[s] for s in conv if s.startswith("patient_turn_"))
    last_doctor = max((s for s in conv if s.startswith("doctor_turn_")), key=lambda s: int(s.rsplit("_", 1)[1]))
    shown = out["patient_opening"] + sum(out[s] for s in conv if s != last_doctor)
    add("patient_system+opening", calls["patient_opening"]["prompt_tokens"])
    add("doctor_system", calls["doctor_turn_1"]["prompt_tokens"] - out["patient_opening"])
    if "summary" in calls:
        add("summary", calls["summary"]["prompt_tokens"] - patient_out)
    carried = {"vignette": 0, "multiturn": shown, "singleturn": out["patient_opening"], "summarized": out.get("summary", 0)}
    for fmt in FORMATS:
        for mode in ("mcq", "frq"):
            c = calls.get(f"{fmt}_{mode}")
            if c:
                add(f"{fmt}_{mode}", c["prompt_tokens"] - carried[fmt])
        if f"{fmt}_extract" in calls:
            add("extract", calls[f"{fmt}_extract"]["prompt_tokens"] - out.get(f"{fmt}_frq", 0))
        if f"{fmt}_match" in calls:
            add("match", calls[f"{fmt}_match"]["prompt_tokens"])
    return rows


def case_trial_calls(tpl: dict, shape: dict, turns: int) -> list[tuple[str, float, float, float]]:
    """(step, prompt tokens, uncached prompt tokens, output tokens) of one case-trial with ``turns`` doctor turns."""
    d = shape["doctor_chars"] / CHARS_PER_TOKEN + MSG_OVERHEAD
    p = shape["patient_chars"] / CHARS_PER_TOKEN + MSG_OVERHEAD
    summ = shape["summary_chars"] / CHARS_PER_TOKEN
    ans = shape["answer_chars"] / CHARS_PER_TOKEN
    sp, sd = tpl["patient_system+opening"], tpl["doctor_system"]
    calls = [("patient_opening", sp, sp / 5, p)]  # the case's system prompt is shared by its 5 trials
    for t in range(1, turns + 1):
        prompt = sd + t * p + (t - 1) * d
        calls.append((f"doctor_turn_{t}", prompt, p if t > 1 else p + sd / CASE_TRIALS, d))
        if t < turns:
            calls.append((f"patient_turn_{t}", sp + t * d + t * p, d, p))
    statements = turns * p
    calls.append(("summary", tpl.get("summary", 0) + statements, statements, summ))
    carried = {"vignette": 0, "multiturn": turns * p + (turns - 1) * d, "singleturn": p, "summarized": summ}
    for fmt in FORMATS:
        for mode in ("mcq", "frq"):
            prompt = tpl.get(f"{fmt}_{mode}", 0) + carried[fmt]
            calls.append((f"{fmt}_{mode}", prompt, prompt, ans))
        calls.append(("extract", tpl.get("extract", 0) + ans, ans + MSG_OVERHEAD, 8))
        calls.append(("match", tpl.get("match", 0), 24, 2))
    return calls


def estimate(tpl: dict, shape: dict, throughput: dict = THROUGHPUT, replicas=(1, 2, 4, 8), measured_hit: float | None = None) -> dict:
    lo, hi = math.floor(shape["turns_mean"]), math.ceil(shape["turns_mean"])
    w = shape["turns_mean"] - lo  # the mean number of turns, as a mix of the two nearest whole numbers
    per = {"calls": 0.0, "prompt": 0.0, "uncached": 0.0, "output": 0.0}
    for turns, weight in ((lo, 1 - w), (hi, w)):
        for _, prompt, uncached, output in case_trial_calls(tpl, shape, max(1, turns)):
            per["calls"] += weight
            per["prompt"] += weight * prompt
            per["uncached"] += weight * uncached
            per["output"] += weight * output
    total = {k: v * CASE_TRIALS for k, v in per.items()}
    gpu_s = total["uncached"] / throughput["prefill_tok_s"] + total["output"] / throughput["decode_tok_s"]
    # bounds: the prefix-cache hit rate a real server reports may be lower than the model's (evictions, a turn
    # routed to another replica, 16-token blocks): the same run at a given hit rate, and with none
    bounds = {}
    for h in ([measured_hit] if measured_hit is not None else []) + [0.0]:
        bounds[f"{round(100 * h)} % cached"] = round(((1 - h) * total["prompt"] / throughput["prefill_tok_s"] + total["output"] / throughput["decode_tok_s"]) / 3600, 2)
    rows = []
    for n in replicas:
        wall = gpu_s / n
        rows.append({"replicas": n, "wall_h": round(wall / 3600, 2), "calls_per_s": round(total["calls"] / wall, 1),
                     "concurrency": throughput["batch"] * n})
    return {"case_trials": CASE_TRIALS, "per_case_trial": {k: round(v, 1) for k, v in per.items()},
            "total": {k: round(v) for k, v in total.items()}, "prefix_cache_saving": round(1 - total["uncached"] / total["prompt"], 3),
            "gpu_seconds": round(gpu_s), "gpu_hours_if": bounds, "replicas": rows, "throughput": throughput, "shape": shape, "templates": tpl}


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
        *md_table(["case-trials", "calls", "prompt tokens", "prompt tokens after prefix caching", "output tokens", "GPU time (1 H100)"], [[
            f"{e['case_trials']:,}", f"{t['calls']:,}", f"{t['prompt']:,}", f"{t['uncached']:,} ({100 * e['prefix_cache_saving']:.0f} % cached)",
            f"{t['output']:,}", f"{e['gpu_seconds'] / 3600:.2f} h"]]), "",
        "GPU time (1 H100) at a lower prefix-cache hit rate: " + "; ".join(f"{k}: {v} h" for k, v in e["gpu_hours_if"].items()), "",
        *md_table(["replicas (1 H100 each)", "wall time", "calls/s the runner must sustain", "concurrency that keeps them busy"],
                  [[r["replicas"], f"{r['wall_h']} h", r["calls_per_s"], r["concurrency"]] for r in e["replicas"]])])


def main() -> None:
    ap = argparse.ArgumentParser(description="Estimate the full CRAFT-MD paper run on H100s from a real run's call log.")
    ap.add_argument("--run", required=True, help="results directory of a real `medstack run craftmd` (its call log)")
    ap.add_argument("--published", help="folder of the CRAFT-MD authors' case_*.json files (default: the LLaMA-2-7b figures measured from it)")
    ap.add_argument("--json", help="write the estimate here as JSON")
    a = ap.parse_args()
    shape = published_shape(a.published) if a.published else LLAMA2_SHAPE
    hit = _measured_hit(a.run)
    e = estimate(template_tokens(a.run), shape, measured_hit=hit)
    if a.json:
        Path(a.json).write_text(json.dumps(e, indent=2))
    print(markdown(e))
    print(f"\nper case-trial: {e['per_case_trial']}\ntemplates (tokens): {e['templates']}\nshape: {shape}")


if __name__ == "__main__":
    main()
