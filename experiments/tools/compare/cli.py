"""`medstack compare RUN... --out DIR`: runs of any study side by side."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer


def compare_cmd(
    results: List[Path] = typer.Argument(..., help="Results directories (local runs, imported releases, rescored runs)."),
    out: Path = typer.Option(Path("compare-out"), "--out", help="Where to write summary.md, scores.json, paired.json (and the study's own comparison files)."),
) -> None:
    """Runs side by side. Where every run is of one study that declares a comparison (e.g. accuracy per
    format x run with 95% bootstrap CIs, paired tests, a bar chart), that comparison first; then the runs with a column
    per setting that differs among them, the paper's effects relative to a baseline run among them (a bias run over
    the unbiased run), for every run and typed score (STEP, STEP/PART, STEP/PART@JUDGE) the mean of the scored values with its
    95% bootstrap CI and n, and the paired differences between runs over the cases both hold (no p-value below 10
    shared cases). Exit 2 for a folder that is not a results directory."""
    from experiments.tools.compare.run import run_compare
    from experiments.core.commands import log

    result = run_compare([str(p) for p in results], out)
    typer.echo((out / "summary.md").read_text(encoding="utf-8").rstrip("\n"))
    for w in result["warnings"]:
        log(f"[yellow]warning:[/yellow] {w}")
    log(f"wrote {out}/summary.md, scores.json, paired.json")


def register(app, **_) -> None:
    app.command("compare")(compare_cmd)
