"""autoeval's other command: `calibrate autoeval` (declared in __init__.py)."""

from pathlib import Path

import typer


def autoeval_cmd(
    ratings: Path = typer.Option(..., "--ratings", help="Judge ratings: a CSV (id, criterion, rating) or an autoeval results directory."),
    reference: Path = typer.Option(..., "--reference", help="Reference ratings CSV (id, criterion, rating; 1-5)."),
    out: Path = typer.Option(..., "--out", help="Results directory to write."),
) -> None:
    """Rubric judge vs reference ratings on the same (id, criterion) items: Spearman, Kendall tau-b,
    exact agreement, mean |diff|, linear-weighted kappa over 1-5, confusion matrix (docs/protocols.md, Auto-evaluation)."""
    from experiments.studies.autoeval.calibrate import calibrate_autoeval

    calibrate_autoeval(str(ratings), str(reference), out)
    typer.echo((out / "summary.md").read_text().rstrip("\n"))
