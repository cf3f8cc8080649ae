"""Paper tables as figures (matplotlib PNG), in the manner of the papers' bar charts: one cluster per
run (the paper's models as groups), one bar per declared row with its 95% CI, the published value
as a black diamond on the bar it belongs to, the paper's other models as hatched bars."""

from __future__ import annotations

import io
from pathlib import Path

from experiments.tables.build import ComputedTable

COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd"]


def figure_png(t: ComputedTable) -> bytes | None:
    """The table's figure as PNG bytes; None when the table declares no plot or has nothing to draw."""
    if t.plot is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = [r for r in t.rows if not t.plot.rows or r.id in t.plot.rows]
    groups = t.groups
    if not rows or not groups:
        return None
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) * max(1, len(rows)) * 0.45 + 2.5), 4.2))
    x = np.arange(len(groups))
    drew_pub = False
    for j, r in enumerate(rows):
        pos = x + (j - (len(rows) - 1) / 2) * width
        for gi, g in enumerate(groups):
            c = g.cells.get(r.id)
            if c is None:
                continue
            color = COLORS[j % len(COLORS)]
            if g.kind == "paper":
                if c.published is not None:
                    ax.bar(pos[gi], c.published, width, color=color, alpha=0.45, hatch="//", edgecolor="white")
                continue
            if c.value is not None:
                err = None
                if c.low is not None and c.high is not None:
                    err = [[c.value - c.low], [c.high - c.value]]
                ax.bar(pos[gi], c.value, width, yerr=err, capsize=3, color=color, alpha=0.8 if g.kind == "published-run" else 1.0)
            else:
                ax.text(pos[gi], 0.01, "n/a", ha="center", va="bottom", fontsize=7, rotation=90, color="#555")
            if c.published is not None:
                ax.plot(pos[gi], c.published, marker="D", color="black", markersize=5, zorder=5)
                drew_pub = True
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[j % len(COLORS)]) for j in range(len(rows))]
    labels = [r.label for r in rows]
    if drew_pub:
        handles.append(plt.Line2D([], [], marker="D", color="black", linestyle="none", markersize=5))
        labels.append("paper")
    if any(g.kind == "paper" for g in groups):
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="#999", alpha=0.45, hatch="//", edgecolor="white"))
        labels.append("paper only (no run here)")
    names = [g.label + (" (paper)" if g.kind == "paper" else "") for g in groups]
    ax.set_xticks(x, names, rotation=20 if len(groups) > 3 else 0, ha="right" if len(groups) > 3 else "center", fontsize=8)
    ax.set_ylabel(t.plot.ylabel)
    if t.plot.ylim:
        ax.set_ylim(*t.plot.ylim)
    ax.grid(axis="y", alpha=0.3)
    import textwrap

    ax.set_title("\n".join(textwrap.wrap(t.title, 70)), fontsize=10)
    ncol = min(len(labels), 5 if max(len(x) for x in labels) <= 16 else 2)  # long row names: fewer legend columns
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05 * (1 + (len(labels) - 1) // ncol), 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_figures(tables: list[ComputedTable], out: str | Path) -> list[Path]:
    """``paper-<study>-<table>.png`` per table with a plot."""
    written = []
    for t in tables:
        png = figure_png(t)
        if png:
            p = Path(out) / f"paper-{t.study}-{t.id}.png"
            p.write_bytes(png)
            written.append(p)
    return written


def confusion_png(cm: list[list[int]], path: Path, title: str, xlabel: str, ylabel: str, labels=None) -> None:
    """A confusion matrix of two raters as a PNG (a calibration's figure): counts in the cells, rows ``ylabel``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    a = np.asarray(cm)
    labels = labels if labels is not None else list(range(a.shape[0]))
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    im = ax.imshow(a, cmap="Blues")
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            ax.text(j, i, str(a[i, j]), ha="center", va="center", color="white" if a[i, j] > a.max() / 2 else "black", fontsize=9)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
