"""`medstack calibrate`: LLM judges against clinicians (docs/protocols.md, Judge calibration): the group and
`calibrate reviews`. A study adds its own calibrations to the group from its folder's cli.py
(``register(calibrate_app=...)``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperGroup


class _CalibrateGroup(TyperGroup):
    """`medstack calibrate RUN_DIR --labels ...` is `medstack calibrate reviews RUN_DIR --labels ...`: a first
    argument that names no sub-command is a results directory."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["reviews", *args]
        return super().resolve_command(ctx, args)


calibrate_app = typer.Typer(cls=_CalibrateGroup, no_args_is_help=True,
                            help="Calibrate LLM judges against clinicians' ratings (docs/protocols.md, Judge calibration and Auto-evaluation). "
                                 "`medstack calibrate RUN_DIR --labels RUN_DIR/reviews` is the `reviews` command.")


@calibrate_app.command("reviews")
def reviews_cmd(
    run_dir: Path = typer.Argument(..., help="The results directory that was reviewed (`medstack review`)."),
    labels: Path = typer.Option(..., "--labels", help="RUN_DIR/reviews (every <reviewer>.jsonl in it) or one label file downloaded from the offline page."),
    judge: Optional[str] = typer.Option(None, "--judge", help="The judge step, when the labels cover several."),
    n_boot: int = typer.Option(2000, "--n-boot", min=100, help="Bootstrap resamples for the CIs."),
    tiebreak: Optional[str] = typer.Option(None, "--tiebreak", help="A third reviewer whose label decides the items the others disagree on "
                                                                    "(otherwise those items are set aside from the consensus, and counted)."),
) -> None:
    """The judge against each reviewer, the reviewers' inter-rater agreement, then the judge against their
    consensus with the count of items set aside for disagreement (exact agreement, kappa -- linear-weighted for
    ordered scales --, mean |diff|, trial agreement bound, Spearman; stratified bootstrap CIs; sampling weights
    undone). Writes RUN_DIR/reviews/calibration-<judge>.json and .md. Exit 2 for bad labels (named by file and line)."""
    from experiments.tools.calibrate.reviews import calibrate_reviews, summary

    r = calibrate_reviews(run_dir, labels, judge, n_boot=n_boot, tiebreak=tiebreak)
    typer.echo(summary(r).rstrip("\n"))
    typer.echo(f"results in {run_dir / 'reviews' / ('calibration-' + r['judge'] + '.json')}", err=True)


def register(app, calibrate_app=calibrate_app, **_) -> None:
    app.add_typer(calibrate_app, name="calibrate")
