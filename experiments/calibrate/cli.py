"""`medstack calibrate craftmd-grader` and `medstack calibrate autoeval`: LLM judges against clinicians (docs/protocols.md, Judge calibration and Auto-evaluation)."""

from __future__ import annotations

import asyncio
import sys
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


def _log(msg: str) -> None:
    typer.echo(msg, err=True)


@calibrate_app.command("craftmd-grader")
def craftmd_grader(
    judge_model: str = typer.Option(..., "--judge-model", help="Judge in the grader role (alias or ALIAS@URL)."),
    labels: str = typer.Option("craftmd-expert-labels", "--labels", help="The authors' dermatologist check (validation_graderai.csv format, or a folder holding it): a path or a registered data set name."),
    rule: str = typer.Option("zero", "--rule", help="Concurrent-diagnosis rule: zero (the paper: several diagnoses score 0) or any (the authors' release)."),
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


@calibrate_app.command("conversations")
def conversations_cmd(
    model: str = typer.Option(..., "--model", "-m", help="The assessor (alias or ALIAS@URL): the model that answers the conversation questions."),
    labels: str = typer.Option("craftmd-expert-labels", "--labels", help="The paper's expert labels: the folder of the three workbooks, or a registered data set name."),
    out: Path = typer.Option(..., "--out", help="Results directory to write (the same --out again resumes)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the first N conversations (the four models taken in turn)."),
    answers: str = typer.Option("free", "--answers", help="free, or constrained: each request sent with its declared reply format (vLLM structured outputs)."),
    completion: Optional[bool] = typer.Option(None, "--completion/--chat", help="Send the requests as text completions (default: for the embedded base model) or as chat."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="The assessor's max_tokens (temperature 0)."),
    concurrency: int = typer.Option(16, "--concurrency", min=1, help="Conversations in flight."),
    n_boot: int = typer.Option(2000, "--n-boot", min=100, help="Bootstrap resamples for the CIs."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Bypass the response cache."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow non-local endpoints."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="API key for keyed endpoints (default: $MEDSTACK_API_KEY)."),
) -> None:
    """Ask the CRAFT-MD conversation assessor's questions (the requests of `run craftmd --assess-conversations`) of the
    paper's expert-labelled conversations and compare with the dermatologists per question: agreement and Cohen's
    kappa with bootstrap CIs, the confusion matrix, the % yes per model beside the experts'. Runs on the study runner
    (resume, cache). Exit 0 done, 2 bad input, 3 some conversations got no answer (run the same command again)."""
    from experiments.calibrate.conversations import ConversationCalibration, ConversationCalibrationSettings
    from experiments.core.commands import log, report_resume, resolve_data, resume_command
    from experiments.core.concurrency import run_async
    from experiments.core.config import Sampling
    from experiments.core.runner import prepare_run, run_study
    from serving.refs import ModelRef

    if answers not in ("free", "constrained"):
        raise typer.BadParameter("--answers must be free or constrained")
    alias = ModelRef.parse(model, where="--model").alias
    completion = (alias == "embedded") if completion is None else completion
    study = ConversationCalibration()
    settings = ConversationCalibrationSettings(
        data=resolve_data(labels), out=str(out), limit=limit, roles={"assessor": model}, answers=answers, concurrency=concurrency,
        use_cache=not no_cache, allow_remote=allow_remote, n_boot=n_boot, completion_steps=["assessor"] if completion else [],
        sampling={"assessor": Sampling(temperature=0.0, max_tokens=max_tokens)})
    settings, cases = prepare_run(study, settings)
    resume = resume_command(sys.argv[1:])
    outcome = run_async(run_study(study, settings, cases, api_key=api_key, resume_command=resume, log=log))
    typer.echo(outcome.summary.rstrip("\n"))
    _log(f"results in {outcome.out}")
    if outcome.exit_code:
        report_resume(outcome, resume)
        raise typer.Exit(outcome.exit_code)


@calibrate_app.command("autoeval")
def autoeval_cmd(
    ratings: Path = typer.Option(..., "--ratings", help="Judge ratings: a CSV (id, criterion, rating) or an autoeval results directory."),
    reference: Path = typer.Option(..., "--reference", help="Reference ratings CSV (id, criterion, rating; 1-5)."),
    out: Path = typer.Option(..., "--out", help="Results directory to write."),
) -> None:
    """Rubric judge vs reference ratings on the same (id, criterion) items: Spearman, Kendall tau-b,
    exact agreement, mean |diff|, linear-weighted kappa over 1-5, confusion matrix (docs/protocols.md, Auto-evaluation)."""
    from experiments.calibrate.run import calibrate_autoeval

    calibrate_autoeval(str(ratings), str(reference), out)
    typer.echo((out / "summary.md").read_text().rstrip("\n"))


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
    from experiments.calibrate.reviews import calibrate_reviews, summary

    r = calibrate_reviews(run_dir, labels, judge, n_boot=n_boot, tiebreak=tiebreak)
    typer.echo(summary(r).rstrip("\n"))
    _log(f"results in {run_dir / 'reviews' / ('calibration-' + r['judge'] + '.json')}")


def register(app, run_app, score_app, import_app, data_app, finetune_app) -> None:
    app.add_typer(calibrate_app, name="calibrate")
