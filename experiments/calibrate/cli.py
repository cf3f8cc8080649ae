"""`medstack calibrate craftmd-grader` and `medstack calibrate autoeval`: LLM judges against clinicians (SPEC 3.1, 3.2)."""

from __future__ import annotations

import asyncio
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
                            help="Calibrate LLM judges against clinicians' ratings (SPEC 3.1, 3.2). "
                                 "`medstack calibrate RUN_DIR --labels RUN_DIR/reviews` is the `reviews` command.")


def _log(msg: str) -> None:
    typer.echo(msg, err=True)


@calibrate_app.command("craftmd-grader")
def craftmd_grader(
    judge_model: str = typer.Option(..., "--judge-model", help="Judge in the grader role (alias or ALIAS@URL)."),
    labels: str = typer.Option("craftmd-expert-labels", "--labels", help="The authors' dermatologist check (validation_graderai.csv format, or a folder holding it): a path or a registered data set name."),
    rule: str = typer.Option("zero", "--rule", help="Concurrent-diagnosis rule: zero (SPEC: several diagnoses score 0) or any (the authors' release)."),
    published: Optional[str] = typer.Option(None, "--published", help="A folder of the authors' per-case JSON files (or a registered name, e.g. craftmd-published-gpt3_1106): also score their own grader's decisions."),
    out: Path = typer.Option(..., "--out", help="Results directory to write."),
    completion: Optional[bool] = typer.Option(None, "--completion/--chat", help="Send the grader prompt as a text completion (default: for the embedded base model) or as chat."),
    concurrency: int = typer.Option(16, "--concurrency", help="Requests in flight."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Bypass the response cache."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow non-local endpoints."),
) -> None:
    """Grade every (extracted diagnosis, gold) pair of the dermatologist set with the judge (the CRAFT-MD
    grader match prompt) and compare per-case counts of correct trials with the dermatologist's: exact
    agreement, mean |diff|, trial agreement bound, linear-weighted kappa, Spearman, confusion matrix.
    Exit 0 done, 2 bad input, 3 some grading requests failed (their cases left out)."""
    from experiments.calibrate.run import CalibrationFailed, calibrate_grader
    from experiments.core.commands import resolve_data

    labels, published = resolve_data(labels), resolve_data(published)

    if rule not in ("zero", "any"):
        raise typer.BadParameter("--rule must be zero or any")
    try:
        asyncio.run(calibrate_grader(judge_model, labels, out, rule=rule, published=published, completion=completion,
                                     concurrency=concurrency, use_cache=not no_cache, allow_remote=allow_remote, log=_log))
    except CalibrationFailed as e:
        typer.echo((out / "summary.md").read_text().rstrip("\n"))
        _log(f"error: {e}")
        raise typer.Exit(3)
    typer.echo((out / "summary.md").read_text().rstrip("\n"))
    _log(f"results in {out}")


@calibrate_app.command("autoeval")
def autoeval_cmd(
    ratings: Path = typer.Option(..., "--ratings", help="Judge ratings: a CSV (id, criterion, rating) or an autoeval results directory."),
    reference: Path = typer.Option(..., "--reference", help="Reference ratings CSV (id, criterion, rating; 1-5)."),
    out: Path = typer.Option(..., "--out", help="Results directory to write."),
) -> None:
    """Rubric judge vs reference ratings on the same (id, criterion) items: Spearman, Kendall tau-b,
    exact agreement, mean |diff|, linear-weighted kappa over 1-5, confusion matrix (SPEC 3.2)."""
    from experiments.calibrate.run import calibrate_autoeval

    calibrate_autoeval(str(ratings), str(reference), out)
    typer.echo((out / "summary.md").read_text().rstrip("\n"))


@calibrate_app.command("reviews")
def reviews_cmd(
    run_dir: Path = typer.Argument(..., help="The results directory that was reviewed (`medstack review`)."),
    labels: Path = typer.Option(..., "--labels", help="RUN_DIR/reviews (every <reviewer>.jsonl in it) or one label file downloaded from the offline page."),
    judge: Optional[str] = typer.Option(None, "--judge", help="The judge step, when the labels cover several."),
    n_boot: int = typer.Option(2000, "--n-boot", min=100, help="Bootstrap resamples for the CIs."),
) -> None:
    """The judge against each reviewer and their consensus (exact agreement, kappa -- linear-weighted for
    ordered scales --, mean |diff|, trial agreement bound, Spearman; stratified bootstrap CIs; sampling weights
    undone) and the reviewers' inter-rater agreement. Writes RUN_DIR/reviews/calibration-<judge>.json and .md."""
    from experiments.calibrate.reviews import calibrate_reviews, summary

    r = calibrate_reviews(run_dir, labels, judge, n_boot=n_boot)
    typer.echo(summary(r).rstrip("\n"))
    _log(f"results in {run_dir / 'reviews' / ('calibration-' + r['judge'] + '.json')}")


def register(app, run_app, score_app, import_app, data_app, finetune_app) -> None:
    app.add_typer(calibrate_app, name="calibrate")
