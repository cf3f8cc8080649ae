"""bench.png: output throughput and p99 end-to-end latency against concurrency, both engines."""

from __future__ import annotations

from pathlib import Path


def plot_bench(vllm: list[dict], hf: list[dict], path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    series = [("vLLM (concurrent requests)", vllm, "o-"), ("transformers generate (batch size)", hf, "s--")]
    levels = sorted({r["concurrency"] for _, rows, _ in series for r in rows})
    for label, rows, style in series:
        if not rows:
            continue
        rows = sorted(rows, key=lambda r: r["concurrency"])
        x = [r["concurrency"] for r in rows]
        ax1.plot(x, [r["output_tokens_per_s"] or 0 for r in rows], style, label=label)
        ax2.plot(x, [r["e2e_s_p99"] if r["e2e_s_p99"] is not None else float("nan") for r in rows], style, label=label)
    for ax, ylabel in ((ax1, "output tokens / s"), (ax2, "p99 end-to-end latency (s)")):
        if levels and max(levels) / max(min(levels), 1) >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(levels)
        ax.set_xticklabels([str(x) for x in levels])
        ax.set_xlabel("concurrency / batch size")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_title("throughput")
    ax2.set_title("tail latency")
    return _save(fig, path, title)


def plot_replay(replay: dict, path: Path, title: str = "") -> Path:
    """bench.png for a replay: wall time and output tok/s, endpoint vs batch-1 transformers loop."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [("vLLM\n(conc %d)" % replay["vllm"]["concurrency"], replay["vllm"])]
    if replay.get("hf"):
        rows.append(("transformers\n(batch 1 loop)", replay["hf"]))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 4))
    names = [n for n, _ in rows]
    colors = ["tab:blue", "tab:orange"][: len(rows)]
    ax1.bar(names, [r["wall_s"] or 0 for _, r in rows], color=colors)
    ax2.bar(names, [r["output_tokens_per_s"] or 0 for _, r in rows], color=colors)
    ax1.set_ylabel("wall time (s)")
    ax2.set_ylabel("output tokens / s")
    ax1.set_title("the run's calls, replayed")
    ax2.set_title("throughput")
    if replay.get("speedup"):
        ax1.text(0.5, 0.95, f"{replay['speedup']['wall_time']:.1f}x faster", transform=ax1.transAxes, ha="center", va="top")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, axis="y")
    return _save(fig, path, title)


def _save(fig, path: Path, title: str) -> Path:
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
