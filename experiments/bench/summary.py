"""Ratios, the headline figure and the fixed-width tables of bench.md."""

from __future__ import annotations

from pathlib import Path

from experiments.bench.compare import against_bench
from experiments.bench.measure import FIGURES, nearest, ratios

RESULT_COLUMNS = [
    ("engine", "engine", "{}"), ("conc", "concurrency", "{}"), ("ok", "completed", "{}"), ("fail", "failed", "{}"),
    ("req/s", "requests_per_s", "{:.3f}"), ("out tok/s", "output_tokens_per_s", "{:.2f}"), ("tot tok/s", "total_tokens_per_s", "{:.1f}"),
    ("TTFT ms mean", "ttft_ms_mean", "{:.0f}"), ("p50", "ttft_ms_p50", "{:.0f}"), ("p99", "ttft_ms_p99", "{:.0f}"),
    ("ITL ms mean", "itl_ms_mean", "{:.1f}"), ("p50", "itl_ms_p50", "{:.1f}"), ("p99", "itl_ms_p99", "{:.1f}"),
    ("E2E s mean", "e2e_s_mean", "{:.2f}"), ("p50", "e2e_s_p50", "{:.2f}"), ("p99", "e2e_s_p99", "{:.2f}"),
]
RATIO_HEADS = ["req/s", "out tok/s", "tot tok/s", "TTFT mean", "p50", "p99", "ITL mean", "p50", "p99", "E2E mean", "p50", "p99"]


def summarize(vllm: list[dict], hf: list[dict], compare_inputs: list[dict]) -> dict:
    out: dict = {"ratios": [], "headline": None, "compare_runs": [against_bench(r, vllm) for r in compare_inputs]}
    for level in vllm:
        base = nearest(hf, level["concurrency"])
        if base is not None:
            out["ratios"].append({"concurrency": level["concurrency"], "baseline_batch": base["concurrency"], "figures": ratios(level, base)})
    if vllm:
        top = max(vllm, key=lambda r: r["concurrency"])
        head = {"vllm_concurrency": top["concurrency"], "vllm_output_tokens_per_s": top["output_tokens_per_s"]}
        if hf:
            best = max(hf, key=lambda r: r["output_tokens_per_s"] or 0)
            head.update(best_hf_batch=best["concurrency"], best_hf_output_tokens_per_s=best["output_tokens_per_s"])
            if top["output_tokens_per_s"] and best["output_tokens_per_s"]:
                head["ratio"] = round(top["output_tokens_per_s"] / best["output_tokens_per_s"], 2)
        out["headline"] = head
    return out


def fixed_width(heads: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"
    return "\n".join([line(heads), "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|", *(line(r) for r in rows)])


def _fmt(fmt: str, v) -> str:
    return "-" if v is None else fmt.format(v)


def results_table(levels: list[dict]) -> str:
    rows = [[_fmt(fmt, ({"vllm": "vLLM", "hf": "transformers"}.get(r.get(key), r.get(key)) if key == "engine" else r.get(key))) for _, key, fmt in RESULT_COLUMNS] for r in levels]
    return fixed_width([h for h, _, _ in RESULT_COLUMNS], rows)


def ratio_table(ratio_rows: list[dict]) -> str:
    rows = [[str(r["concurrency"]), str(r["baseline_batch"]), *(_fmt("{:.2f}x", r["figures"].get(k)) for k in FIGURES)] for r in ratio_rows]
    return fixed_width(["vLLM conc", "vs HF batch", *RATIO_HEADS], rows)


def render_markdown(bench: dict) -> str:
    c = bench["config"]
    lines = [
        f"# Serving benchmark: {c['model']}",
        "",
        f"{c['input_len']} prompt tokens -> {c['output_len']} output tokens per request (ignore_eos), temperature {c['temperature']}; "
        f"prompts: {c['prompt_source']}; started {bench.get('started')}.",
        "Latencies: TTFT and inter-token latency (ITL) in ms, end-to-end (E2E) in s. "
        "vLLM: all requests issued at once, `conc` in flight. transformers: `generate` over batches of `conc` prompts.",
        *([f"Host: {h['cpus']} CPUs, 1-min load average {h['loadavg_1m_start']} at start, {h['loadavg_1m_end']} at end "
           "(other processes on a shared CPU depress every figure)."] if (h := bench.get("host")) else []),
        "",
        "## Results",
        "",
        results_table(bench["results"]["vllm"] + bench["results"]["hf"]),
    ]
    for r in bench["results"]["vllm"] + bench["results"]["hf"]:
        if r.get("failed"):
            lines.append(f"\n**{r['failed']} of {r['requests']} requests failed** ({r['engine']}, level {r['concurrency']}); first error: {r.get('first_error')}")
    if bench.get("ratios"):
        lines += ["", "## vLLM / transformers (throughput: higher is better for vLLM; latency: lower is better)", "",
                  ratio_table(bench["ratios"])]
    h = bench.get("headline")
    if h and h.get("ratio") is not None:
        lines += ["", f"**Headline:** vLLM at concurrency {h['vllm_concurrency']}: {h['vllm_output_tokens_per_s']:.2f} output tok/s = "
                  f"{h['ratio']:.2f}x the best transformers figure ({h['best_hf_output_tokens_per_s']:.2f} tok/s at batch {h['best_hf_batch']})."]
    if bench.get("compare_runs"):
        rows = [[r["run"], str(r["concurrency"]), _fmt("{:.2f}", r["output_tokens_per_s"]), _fmt("{}", r["bench_concurrency"]),
                 _fmt("{:.2f}", r["bench_output_tokens_per_s"]), _fmt("{:.0%}", r["fraction"])] for r in bench["compare_runs"]]
        lines += ["", "## Experiment runs vs the saturated figure", "",
                  fixed_width(["run", "conc", "run tok/s", "bench conc", "bench tok/s", "fraction"], rows)]
    return "\n".join(lines) + "\n"


def write_markdown(bench: dict, path: Path) -> str:
    md = render_markdown(bench)
    Path(path).write_text(md)
    return md
