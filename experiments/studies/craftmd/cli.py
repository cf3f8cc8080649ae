"""CRAFT-MD's other commands: `import craftmd`, `import craftmd-experts`, `calibrate craftmd-grader`, `calibrate conversations`
(declared in __init__.py; its comparison is `medstack compare`'s, through ``Study.compare``)."""

from __future__ import annotations

import asyncio
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
    cases: Optional[str] = typer.Option(None, "--cases", help="Case CSV (or craftmd-cases) to take MCQ choices and specialties from (by case_id) when the files lack them [default: craftmd-cases once fetched]."),
) -> None:
    """Import published CRAFT-MD per-case results as a results directory (same record shape as a local run).

    MCQ free-text answers are mapped to choices by the one rule every model's answers go through (unmapped = wrong,
    listed); FRQ uses the published grades (-1 = wrong), recorded as grades: published, concurrent rule: any."""
    from experiments.datasets.registry import resolve_data
    from experiments.studies.craftmd.importer import CASES_SET, default_cases, import_folder, import_lines

    cases_csv = resolve_data(cases) if cases else default_cases()
    if not cases and cases_csv:
        log(f"MCQ choices and specialties from the fetched {CASES_SET} ({cases_csv}); --cases names another case file")
    metrics = import_folder(Path(resolve_data(src)), name, out, cases_csv, need_cases=True)
    typer.echo("\n".join(import_lines(metrics, out, cases_csv)))


def import_experts_cmd(
    src: str = typer.Argument("craftmd-expert-labels", help="Folder of the authors' three expert workbooks (validation_clinicalllm_patientai_d1.xlsx, _d2.xlsx, validation_clinicallm_patientai_tiebreak_d3.xlsx), or the registered name craftmd-expert-labels."),
    out: Path = typer.Option(..., "--out", help="Results directory to write (records: one per conversation; metrics.json; summary.md)."),
) -> None:
    """Import the CRAFT-MD authors' expert assessment of 180 conversations: Q1 and Q2 per model, Q3, exact McNemar
    tests between models and the raters' agreement, each beside the published value; labels combined as the authors
    did. The conversations become records the report's case browser shows (docs/protocols.md)."""
    from experiments.datasets.registry import resolve_data
    from experiments.studies.craftmd.experts import import_experts

    metrics = import_experts(Path(resolve_data(src)), out)
    _print((Path(out) / "summary.md").read_text())
    log(f"imported {metrics['conversations']} expert-labelled conversations into {out}")


STUDY_CONFIG_HELP = "The CRAFT-MD run settings whose instrument is calibrated (default: the one `run craftmd` reads, experiments/studies/craftmd/configs/paper.yaml)."


def calibrate_grader_cmd(
    judge_model: str = typer.Option(..., "--judge-model", help="Judge in the grader role (alias or ALIAS@URL)."),
    labels: str = typer.Option("craftmd-expert-labels", "--labels", help="The authors' dermatologist check (validation_graderai.csv format, or a folder holding it): a path or a registered data set name."),
    config: Optional[Path] = typer.Option(None, "--config", help=STUDY_CONFIG_HELP + " Its grader sampling, re-asks, verdict rule and concurrent-diagnosis rule are used."),
    rule: Optional[str] = typer.Option(None, "--concurrent-rule", help="Concurrent-diagnosis rule, instead of the config's: zero (the paper: several diagnoses score 0) or any (the authors' release)."),
    old_rule: Optional[str] = typer.Option(None, "--rule", hidden=True),  # the option's earlier name
    published: Optional[str] = typer.Option(None, "--published", help="A folder of the authors' per-case JSON files (or a registered name, e.g. craftmd-published-gpt3_1106): also score their own grader's decisions."),
    out: Path = typer.Option(..., "--out", help="Results directory to write."),
    completion: Optional[bool] = typer.Option(None, "--completion/--chat", help="Send the grader prompt as a text completion or as chat, instead of as the config's run does (completion_steps)."),
    concurrency: int = typer.Option(16, "--concurrency", help="Requests in flight."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Write every request to OUT/dry-run.jsonl as the calibration would send it; send nothing."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Bypass the response cache."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow non-local endpoints."),
) -> None:
    """Grade every extracted diagnosis of the dermatologist set with the judge as a CRAFT-MD run of --config grades and
    compare per-case counts of correct trials with the dermatologist's (agreement, mean |diff|, linear-weighted kappa,
    Spearman, confusion matrix). Exit 0 done, 2 bad input, 3 some grading requests failed (their cases left out)."""
    from experiments.studies.craftmd.calibrate_grader import CalibrationFailed, calibrate_grader
    from experiments.datasets.registry import resolve_data

    labels, published = resolve_data(labels), resolve_data(published)
    rule = rule or old_rule
    if rule is not None and rule not in ("zero", "any"):
        raise typer.BadParameter("--concurrent-rule must be zero or any")
    try:
        asyncio.run(calibrate_grader(judge_model, labels, out, config=config, rule=rule, published=published, completion=completion,
                                     concurrency=concurrency, use_cache=not no_cache, allow_remote=allow_remote, dry_run=dry_run, log=log))
    except CalibrationFailed as e:
        _print((out / "summary.md").read_text())
        log(f"error: {e}")
        raise typer.Exit(3)
    if dry_run:
        return
    _print((out / "summary.md").read_text())
    log(f"results in {out}")


def calibrate_conversations_cmd(
    model: Optional[str] = typer.Option(None, "--assessor-model", help="The assessor (alias or ALIAS@URL): the model that answers the conversation questions. Without it, the deterministic checks alone (no server)."),
    old_model: Optional[str] = typer.Option(None, "--model", "-m", hidden=True),  # the option's earlier name
    labels: str = typer.Option("craftmd-expert-labels", "--labels", help="The paper's expert labels: the folder of the three workbooks, or a registered data set name."),
    out: Path = typer.Option(..., "--out", help="Results directory to write (the same --out again resumes)."),
    config: Optional[Path] = typer.Option(None, "--config", help=STUDY_CONFIG_HELP + " Its assessor sampling and message form are used."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the first N conversations (the four models taken in turn)."),
    answers: Optional[str] = typer.Option(None, "--answers", help="free, or constrained: each request sent with its declared reply format (vLLM structured outputs); default: the config's."),
    completion: Optional[bool] = typer.Option(None, "--completion/--chat", help="Send the requests as text completions or as chat, instead of as the config's run does (completion_steps)."),
    concurrency: int = typer.Option(16, "--concurrency", min=1, help="Conversations in flight."),
    n_boot: int = typer.Option(2000, "--n-boot", min=100, help="Bootstrap resamples for the CIs (whole cases resampled)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Bypass the response cache."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow non-local endpoints."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="API key for keyed endpoints (default: $MEDSTACK_API_KEY)."),
) -> None:
    """Check the paper's expert-labelled conversations against the dermatologists (combined and per rater): the
    medical-terminology check of the patient's lines (Q3, no model) and, with --assessor-model, the conversation
    assessor as a run of --config asks it, on the study runner (resume, cache). Agreement, Cohen's kappa, sensitivity,
    specificity with case-clustered CIs. Exit 0 done, 2 bad input, 3 some conversations got no answer (run it again)."""
    from experiments.studies.craftmd.calibrate_conversations import ConversationCalibration, ConversationCalibrationSettings, calibrate_without_model
    from experiments.studies.craftmd.calibrate_grader import settings_line, study_settings
    from experiments.core.commands import execute
    from experiments.core.registry import named
    from experiments.datasets.registry import resolve_data
    from experiments.core.runner import prepare_run

    if answers not in (None, "free", "constrained"):
        raise typer.BadParameter("--answers must be free or constrained")
    model = model or old_model
    if model is None:  # the terminology check alone: an option of the assessor's would be silently unused
        given = [flag for flag, value in (("--config", config), ("--limit", limit), ("--answers", answers), ("--completion/--chat", completion),
                                          ("--concurrency", concurrency != 16 or None), ("--no-cache", no_cache or None),
                                          ("--allow-remote", allow_remote or None), ("--api-key", api_key)) if value is not None]
        if given:
            from experiments.core.config import ConfigError

            raise ConfigError(f"{', '.join(given)}: only with --assessor-model (they set how the assessor is asked); without it "
                              "only the terminology check runs, over every conversation, with no model")
        calibrate_without_model(resolve_data(labels), out, n_boot=n_boot)
        _print((out / "summary.md").read_text())
        log(f"results in {out}")
        return
    run = study_settings(config, {"assessor": model}, completion=completion, step="assessor")
    if answers:  # the summary's settings line is the one the requests are built from
        run = run.model_copy(update={"answers": answers})
    study = named(ConversationCalibration)()
    settings = ConversationCalibrationSettings(
        data=resolve_data(labels), out=str(out), limit=limit, roles={"assessor": model}, answers=run.answers, concurrency=concurrency,
        use_cache=not no_cache, allow_remote=allow_remote, n_boot=n_boot, sampling={"assessor": run.sampling["assessor"]},
        completion_steps=["assessor"] if "assessor" in run.completion_steps else [], lone_system_as_user=run.lone_system_as_user,
        study_config=str(config or "experiments/studies/craftmd/configs/paper.yaml"), settings_line=settings_line(run, "assessor", config))
    settings, cases = prepare_run(study, settings)
    execute(study, settings, cases, api_key=api_key)
