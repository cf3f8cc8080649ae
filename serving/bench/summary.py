"""Ratios, the headline figure and the fixed-width tables of bench.md."""

from __future__ import annotations

from pathlib import Path

from serving.bench.compare import against_bench
from serving.bench.measure import FIGURES, nearest, ratios

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
    server_rows = [r for r in bench["results"]["vllm"] if r.get("server")]
    if server_rows:
        lines += ["", "## Server-side (from /metrics, per level)", "",
                  "Prefix-cache hit rate = hit tokens / queried tokens; TTFT split: mean time queued before scheduling, "
                  "mean prefill time, and the server's own mean TTFT.", "",
                  fixed_width(["conc", "prefix hit rate", "queue ms mean", "prefill ms mean", "server TTFT ms mean"],
                              [[str(r["concurrency"]), _fmt("{:.1%}", r["server"].get("prefix_cache_hit_rate")),
                                _fmt("{:.0f}", r["server"].get("queue_ms_mean")), _fmt("{:.0f}", r["server"].get("prefill_ms_mean")),
                                _fmt("{:.0f}", r["server"].get("server_ttft_ms_mean"))] for r in server_rows])]
    h = bench.get("headline")
    if h and h.get("ratio") is not None:
        lines += ["", f"**Headline:** vLLM at concurrency {h['vllm_concurrency']}: {h['vllm_output_tokens_per_s']:.2f} output tok/s = "
                  f"{h['ratio']:.2f}x the best transformers figure ({h['best_hf_output_tokens_per_s']:.2f} tok/s at batch {h['best_hf_batch']})."]
    roof = bench.get("roofline")
    if h and roof and roof.get("tok_s") and h.get("vllm_output_tokens_per_s"):
        lines += ["", f"**Roofline:** {h['vllm_output_tokens_per_s']:.1f} output tok/s is {h['vllm_output_tokens_per_s'] / roof['tok_s']:.0%} of this "
                  f"machine's compute ceiling of ~{roof['tok_s']:.0f} tok/s ({roof['basis']})."]
    if bench.get("serve_settings") or (bench.get("host") or {}).get("cpu_model"):
        lines += ["", "## Server settings and machine", ""]
        if bench.get("serve_settings"):
            lines.append("Server: " + ", ".join(f"{k}={v}" for k, v in bench["serve_settings"].items()))
        lines.append(dtype_line(bench))
        hst = bench.get("host") or {}
        if hst.get("cpu_model"):
            lines.append(f"Machine: {hst.get('cpu_model')}, {hst.get('logical_cpus')} logical CPUs ({hst.get('physical_cores')} cores reported), "
                         f"usable {hst.get('usable_cpus')}, ISA {'/'.join(hst.get('isa') or [])}, {hst.get('mem_gib')} GiB.")
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


def render_replay_markdown(bench: dict) -> str:
    """bench.md for ``medstack bench --replay``: the run's own calls, endpoint vs batch-1 transformers loop."""
    r = bench["replay"]
    w = r["workload"]
    lines = [
        f"# Replay of {w['run_dir']}: {bench['config']['model']}",
        "",
        f"{w['cases']} cases ({w['failed_cases']} failed), {w['calls']} calls replayed ({', '.join(f'{k}: {v}' for k, v in w['by_kind'].items())}); "
        f"not replayed: {', '.join(f'{k} {v}' for k, v in w['skipped_calls'].items())}. Recorded {w['prompt_tokens']} prompt and "
        f"{w['completion_tokens']} completion tokens. Endpoint: cases in parallel up to the run's concurrency ({w['concurrency']}), "
        "each call after the call it waited for in the run; every call generates its recorded number of tokens (ignore_eos / min_new_tokens). "
        "transformers: the same calls one at a time in the run's order, `generate` batch 1.",
        *([f"Host: {h.get('cpu_model')}, {h['cpus']} CPUs, 1-min load average {h['loadavg_1m_start']} at start, {h['loadavg_1m_end']} at end."]
          if (h := bench.get("host")) else []),
        "",
        fixed_width(["engine", "conc", "calls", "ok", "fail", "wall s", "out tokens", "out tok/s", "tot tok/s", "call latency s mean"],
                    [[{"vllm": "vLLM", "hf": "transformers (batch 1)"}[x["engine"]], str(x["concurrency"]), str(x["calls"]), str(x["completed"]),
                      str(x["failed"]), _fmt("{:.1f}", x["wall_s"]), str(x["output_tokens"]), _fmt("{:.2f}", x["output_tokens_per_s"]),
                      _fmt("{:.1f}", x["total_tokens_per_s"]), _fmt("{:.2f}", x["call_latency_s_mean"])]
                     for x in [r["vllm"], *([r["hf"]] if r.get("hf") else [])]]),
    ]
    if r["vllm"].get("server"):
        sv = r["vllm"]["server"]
        lines += ["", f"Server-side: prefix-cache hit rate {_fmt('{:.1%}', sv.get('prefix_cache_hit_rate'))}, mean queueing "
                  f"{_fmt('{:.0f}', sv.get('queue_ms_mean'))} ms, mean prefill {_fmt('{:.0f}', sv.get('prefill_ms_mean'))} ms per call."]
    for x in [r["vllm"], *([r["hf"]] if r.get("hf") else [])]:
        if x.get("failed"):
            lines.append(f"\n**{x['failed']} of {x['calls']} calls failed** ({x['engine']}); first error: {x.get('first_error')}")
    if r.get("speedup"):
        lines += ["", f"**Speed-up:** the run's workload finishes {r['speedup']['wall_time']:.2f}x faster on the endpoint "
                  f"({r['vllm']['wall_s']:.0f} s) than through the batch-1 transformers loop ({r['hf']['wall_s']:.0f} s); output tok/s "
                  f"{_fmt('{:.2f}x', r['speedup']['output_tokens_per_s'])}."]
    if bench.get("serve_settings"):
        lines += ["", "Server: " + ", ".join(f"{k}={v}" for k, v in bench["serve_settings"].items())]
    lines += ["", dtype_line(bench)]
    return "\n".join(lines) + "\n"


def dtype_line(bench: dict) -> str:
    """The number formats compared: the server's (and why) and the transformers baseline's."""
    ident = bench.get("identity") or {}
    why = (ident.get("vllm") or {}).get("dtype_reason")
    text = f"dtype: vLLM {bench.get('served_dtype') or 'unknown'}" + (f" ({why})" if why else "")
    if ident.get("hf"):
        text += f"; transformers baseline {ident['hf'].get('dtype')}"
    return text + "."
