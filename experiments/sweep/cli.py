"""`medstack sweep`: a study once per model (experiments/sweep/run.py)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from experiments.core import registry
from experiments.core.commands import StudyFlags, log, study_command
from experiments.core.config import ConfigError

def study_parser(study: str):
    """The registered study and its command (flags generated from its settings) to parse the study's options."""
    entry = registry.get(study)
    app = typer.Typer()
    app.command(study)(study_command(entry))
    return entry, typer.main.get_command(app), StudyFlags(entry.make(), entry.fixed)


def sweep(
    ctx: typer.Context,
    study: Optional[str] = typer.Argument(None, metavar="STUDY", help="The study to run once per model: craftmd, dera-summarize, dera-qa, meditod-nlu, autoeval, ... (as in `medstack run STUDY`)."),
    models: Optional[str] = typer.Option(None, "--models", help="Required: comma list of model references (ALIAS or ALIAS@URL), run in turn, e.g. embedded,llama3-8b-instruct."),
    out: Optional[Path] = typer.Option(None, "--out", help="Sweep folder (default runs/sweep-STUDY); one results directory per model inside. The same command again resumes."),
    published: List[str] = typer.Option([], "--published", help="CRAFT-MD: a fetched release to import into the sweep, e.g. craftmd-published-gpt3_1106 (repeatable, or a comma list)."),
    report: bool = typer.Option(True, "--report/--no-report", help="End with `medstack report` over the sweep (SWEEP/report.html)."),
    vary: Optional[str] = typer.Option(None, "--vary", help="Comma list of the roles each model of --models plays (default: the role under test: "
                                       "CRAFT-MD clinical, DERA decider,researcher, MediTOD model, autoeval judge)."),
    help_: bool = typer.Option(False, "--help", metavar="", help="Show this message, and with STUDY the study's own options, and exit."),
) -> None:
    """Run STUDY once per model in turn, each an ordinary results directory under one sweep folder, then
    `compare` (CRAFT-MD) and the report. Every other option is the study's own (see `medstack run STUDY --help`).

    Only the role under test varies; every other role is one model for every run, named once with
    --role ROLE=ALIAS (CRAFT-MD: --role patient=ALIAS --role grader=ALIAS, the summarizer follows the grader;
    DERA: --role judge=ALIAS), as in the papers. A sweep whose study needs a fixed role that is not named
    is refused (exit 2). SWEEP/summary.md and the report name the role -> model map.

    A running server for a model is reused, else one is started for its run and stopped before the next.
    Finished runs are skipped, a partial one resumes. A model whose run cannot start (weights missing, ...)
    is reported and the sweep goes on; exit 3 then, or when cases failed. Bad input: exit 2 before anything runs.
    """
    from experiments.sweep.run import parse_models, run_sweep, summary_lines

    if help_ or study is None:
        show_help(ctx, study)
        raise typer.Exit(0 if help_ else 2)
    if not models:
        raise ConfigError(f"sweep {study}: --models is required (a comma list of model references, e.g. embedded,llama3-8b-instruct)")
    entry, cmd, flags = study_parser(study)
    try:
        parsed = cmd.make_context(study, list(ctx.args), resilient_parsing=False)
    except Exception as e:  # click usage errors: one line naming the option
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        raise ConfigError(f"sweep {study}: {msg}") from None
    values = dict(parsed.params)
    sweep_dir = out or Path("runs") / f"sweep-{study}"
    outcome = run_sweep(entry.make, flags.overrides, values, parse_models(models), sweep_dir,
                        published=published, report=report, vary=vary, log=log)
    typer.echo("\n".join(["", f"# sweep {study}: {sweep_dir}", "", *summary_lines(outcome)]))
    if outcome.exit_code:
        bad = [r for r in outcome.runs if r.status in ("error", "incomplete")]
        log(f"[red]{len(bad)} model run(s) did not finish:[/red] " + "; ".join(f"{r.model}: {r.message}" for r in bad)
             + ". Run the same command again to resume.")
        raise typer.Exit(outcome.exit_code)


def show_help(ctx: typer.Context, study: str | None) -> None:
    """The sweep's own help; with STUDY, then the study's options (as `medstack run STUDY --help` shows them)."""
    ctx.get_help()  # typer's rich help prints itself
    if study is None:
        return
    _, cmd, _ = study_parser(study)
    typer.echo(f"\nThe options of {study}, given after the sweep's own as to `medstack run {study}` (the sweep sets each run's --out "
               "and --model itself: give --models, and --out for the sweep folder):")
    cmd.get_help(cmd.make_context(f"{ctx.command_path} {study}", [], resilient_parsing=True))


def register(app, **_):
    # --help is ours: `sweep STUDY --help` also shows the study's options (click's own would stop before STUDY is read)
    app.command("sweep", context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []})(sweep)
