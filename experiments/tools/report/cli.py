"""`medstack report`: one offline HTML file over any number of results directories."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer


def report(
    results: List[Path] = typer.Argument(..., help="Results directories, or folders holding them (searched recursively)."),
    out: Path = typer.Option(Path("report.html"), "--out", "-o", help="HTML file to write."),
    max_cases: int = typer.Option(500, help="At most this many cases per run are rendered (all are counted)."),
) -> None:
    """Write ONE self-contained HTML file (no network: CSS, JS and charts inline): run index, metrics,
    charts, per-case transcripts with filters by run / model / outcome, config and model identity."""
    from experiments.tools.report.build import build_report

    path = build_report([str(r) for r in results], out, max_cases=max_cases)
    print(path.resolve())


def register(app, **_):
    app.command("report")(report)
