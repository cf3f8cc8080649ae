"""CRAFT-MD's other commands: `import craftmd`, `import craftmd-experts` (`run craftmd` and `meld`: study.py; its comparison
is `medstack compare`'s, through ``StudyResults.compare``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from experiments.core.commands import log


def _print(text: str) -> None:
    """Markdown tables as they are (rich would wrap them at the terminal width)."""
    typer.echo(text.rstrip("\n"))


def import_craftmd(
    src: str = typer.Argument(..., help="Folder of the CRAFT-MD authors' per-case result JSON files, or a registered name (craftmd-published-gpt3_1106, ...)."),
    name: str = typer.Option(..., "--name", help="Run name, e.g. gpt-4 (shown by `compare`)."),
    out: Path = typer.Option(..., "--out", help="Results directory to write."),
    cases: Optional[str] = typer.Option(None, "--cases", help="Case CSV (or craftmd-cases) to take MCQ choices and specialties from (by case_id) when the files lack them."),
) -> None:
    """Import published CRAFT-MD per-case results as a results directory (same record shape as a local run).

    MCQ free-text answers are mapped to choices by one rule for every model: exact choice text,
    letter, stated ("the diagnosis is X"), unique contained choice text, first-mentioned choice
    (unless hedged with "or"), the one choice equal up to spelling slips, else unparsed (= wrong, listed).
    FRQ uses the published grades (-1 = wrong); the run records grades: published, concurrent rule: any.
    """
    from experiments.core.commands import resolve_data
    from experiments.craftmd.importer import import_folder

    metrics = import_folder(Path(resolve_data(src)), name, out, resolve_data(cases))
    _print((Path(out) / "summary.md").read_text())
    log(f"imported {metrics['records']} records into {out}")


def import_experts_cmd(
    src: str = typer.Argument("craftmd-expert-labels", help="Folder of the authors' three expert workbooks (validation_clinicalllm_patientai_d1.xlsx, _d2.xlsx, validation_clinicallm_patientai_tiebreak_d3.xlsx), or the registered name craftmd-expert-labels."),
    out: Path = typer.Option(..., "--out", help="Results directory to write (records: one per conversation; metrics.json; summary.md)."),
) -> None:
    """Import the CRAFT-MD authors' expert assessment of 180 conversations: Q1 and Q2 per model, Q3,
    exact McNemar tests between models and the raters' agreement, each beside the published value.

    Labels are combined as the authors did: the two raters' shared label, the tie-breaker's where they
    disagree. The conversations become records the report's case browser shows (docs/protocols.md)."""
    from experiments.core.commands import resolve_data
    from experiments.craftmd.experts import import_experts

    metrics = import_experts(Path(resolve_data(src)), out)
    _print((Path(out) / "summary.md").read_text())
    log(f"imported {metrics['conversations']} expert-labelled conversations into {out}")


def register(app, import_app, **_) -> None:
    import_app.command("craftmd")(import_craftmd)
    import_app.command("craftmd-experts")(import_experts_cmd)
