"""`medstack sweep`: a study once per model (experiments/tools/sweep/run.py)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Literal, Optional

import typer

from experiments.core import registry
from experiments.core.commands import StudyFlags, log, study_command
from experiments.core.config import ConfigError
from models.errors import MedstackError

def study_parser(study: str):
    """The registered study and its command (flags generated from its settings) to parse the study's options."""
    entry = registry.get(study)
    app = typer.Typer()
    app.command(study)(study_command(entry))
    return entry, typer.main.get_command(app), StudyFlags(entry.make(), entry.fixed)


SLURM_HELP = "Slurm (with --executor slurm; docs/cluster.md)"


def sweep(
    ctx: typer.Context,
    study: Optional[str] = typer.Argument(None, metavar="STUDY", help="The study to run once per model, as in `medstack run STUDY` (`medstack run --help` lists them); "
                                          "or `status DIR`: where a Slurm sweep's jobs are."),
    models: Optional[str] = typer.Option(None, "--models", help="Required: comma list of model references (ALIAS or ALIAS@URL), run in turn, e.g. embedded,llama3-8b-instruct."),
    out: Optional[Path] = typer.Option(None, "--out", help="Sweep folder (default runs/sweep-STUDY); one results directory per model inside. The same command again resumes."),
    published: List[str] = typer.Option([], "--published", help="A fetched release of the study's authors' runs to import into the sweep, for a study that declares them (repeatable, or a comma list)."),
    report: bool = typer.Option(True, "--report/--no-report", help="End with `medstack report` over the sweep (SWEEP/report.html)."),
    vary: Optional[str] = typer.Option(None, "--vary", help="Comma list of the roles each model of --models plays (default: the roles the study has under test)."),
    executor: Literal["local", "slurm"] = typer.Option("local", "--executor", help="local: the entries in turn on this machine; slurm: one Slurm job per entry "
                                 "(a job array), then a join job; the command returns once they are submitted."),
    slurm_partition: Optional[str] = typer.Option(None, "--slurm-partition", help=f"{SLURM_HELP}: the partition."),
    slurm_join_partition: Optional[str] = typer.Option(None, "--slurm-join-partition", help=f"{SLURM_HELP}: the partition of the join job "
                                                       "(one CPU, no GPU, 30 minutes; default: --slurm-partition), e.g. a CPU partition."),
    slurm_account: Optional[str] = typer.Option(None, "--slurm-account", help=f"{SLURM_HELP}: the account charged."),
    slurm_time: Optional[str] = typer.Option(None, "--slurm-time", help=f"{SLURM_HELP}: each entry job's time limit (MINUTES, HH:MM:SS or D-HH:MM:SS)."),
    slurm_max_parallel: Optional[int] = typer.Option(None, "--slurm-max-parallel", min=1, help=f"{SLURM_HELP}: at most N of the entry jobs "
                                                     "submitted together running at once (over every job array)."),
    slurm_cpus: Optional[int] = typer.Option(None, "--slurm-cpus", min=1, help=f"{SLURM_HELP}: CPUs per entry job (default 8 per GPU, 2 without GPUs)."),
    slurm_extra: List[str] = typer.Option([], "--slurm-extra", help=f"{SLURM_HELP}: KEY=VALUE, one more #SBATCH --KEY=VALUE line (repeatable; "
                                          "the value is kept whole, commas included), e.g. constraint=a100, mail-type=BEGIN,END, gres=gpu:a100:1."),
    slurm_setup: List[str] = typer.Option([], "--slurm-setup", help=f"{SLURM_HELP}: a shell line each job runs first (repeatable), "
                                          "e.g. 'module load cuda/12.1'."),
    slurm_python: Optional[str] = typer.Option(None, "--slurm-python", help=f"{SLURM_HELP}: the command that runs Python in a job "
                                               "(default: this Python), e.g. 'apptainer exec --nv medstack.sif python'."),
    help_: bool = typer.Option(False, "--help", metavar="", help="Show this message, and with STUDY the study's own options, and exit."),
) -> None:
    """Run STUDY once per model in turn, each an ordinary results directory under one sweep folder, then
    `compare` (where the study declares a comparison) and the report. Every other option is the study's own (see `medstack run STUDY --help`).

    Only the role under test varies; every other role is one model for every run, named once with
    --role ROLE=ALIAS (e.g. --role patient=ALIAS; a role that follows another, as a summarizer may follow a
    grader, is not named), as in the papers. A sweep whose study needs a fixed role that is not named
    is refused (exit 2). SWEEP/summary.md and the report name the role -> model map.

    A running server for a model is reused, else one is started for its run and stopped before the next.
    Finished runs are skipped, a partial one resumes. A model whose run cannot start (weights missing, ...)
    is reported and the sweep goes on; exit 3 then, or when cases failed. Bad input: exit 2 before anything runs.

    --executor slurm: each entry is a Slurm job on the cluster (its servers started inside it, requeued and
    resumed when preempted), then a join job; `medstack sweep status SWEEP` shows the jobs (docs/cluster.md).
    With --dry-run it writes the sbatch scripts and the plan, prints the sbatch commands and submits nothing.
    """
    from experiments.tools.sweep.run import parse_models, summary_lines

    if study in ("status", "slurm-job", "slurm-join") and not help_:
        return _slurm_command(study, list(ctx.args))
    if help_ or study is None:
        show_help(ctx, study)
        raise typer.Exit(0 if help_ else 2)
    if not models:
        raise ConfigError(f"sweep {study}: --models is required (a comma list of model references, e.g. embedded,llama3-8b-instruct)")
    sweep_dir = out or Path("runs") / f"sweep-{study}"
    spec = {"study": study, "args": list(ctx.args), "models": models, "out": str(sweep_dir), "published": list(published),
            "report": report, "vary": vary}
    run_exec = None
    if executor == "slurm":
        from experiments.tools.sweep.slurm import SlurmSubmit
        from serving.slurm import SlurmOptions, parse_extra, require_slurm

        if "--dry-run" not in ctx.args:  # a dry run writes the scripts and runs no Slurm command
            require_slurm()
        run_exec = SlurmSubmit(SlurmOptions(partition=slurm_partition, account=slurm_account, time=slurm_time, max_parallel=slurm_max_parallel,
                                            cpus=slurm_cpus, extra=parse_extra(slurm_extra), setup=list(slurm_setup), python=slurm_python,
                                            join_partition=slurm_join_partition), spec)
    parse_models(models)
    outcome = _run(spec, run_exec)
    typer.echo("\n".join(["", f"# sweep {study}: {sweep_dir}", "", *summary_lines(outcome)]))
    if outcome.exit_code:
        bad = [r for r in outcome.runs if r.status in ("error", "incomplete")]
        log(f"[red]{len(bad)} model run(s) did not finish:[/red] " + "; ".join(f"{r.model}: {r.message}" for r in bad)
             + ". Run the same command again to resume.")
        raise typer.Exit(outcome.exit_code)


def show_help(ctx: typer.Context, study: str | None) -> None:
    """The sweep's own help; with STUDY, then the study's options (as `medstack run STUDY --help` shows them)."""
    ctx.get_help()  # typer's rich help prints itself
    if study is None or study in ("status", "slurm-job", "slurm-join"):
        return
    _, cmd, _ = study_parser(study)
    import textwrap

    typer.echo("\n" + textwrap.fill(f"The options of {study}, given after the sweep's own as to `medstack run {study}` (the sweep sets "
                                    "each run's --out and --model itself: give --models, and --out for the sweep folder):", width=78,
                                    break_on_hyphens=False, break_long_words=False))
    cmd.get_help(cmd.make_context(f"{ctx.command_path} {study}", [], resilient_parsing=True))


def _run(spec: dict, executor=None):
    """Parse the study's options of a sweep (as given on the command line, or as a Slurm job re-reads them) and run it."""
    from experiments.tools.sweep.run import parse_models, run_sweep

    study = spec["study"]
    entry, cmd, flags = study_parser(study)
    try:
        parsed = cmd.make_context(study, list(spec["args"]), resilient_parsing=False)
    except Exception as e:  # click usage errors: one line naming the option
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        raise ConfigError(f"sweep {study}: {msg}") from None
    return run_sweep(entry.make, flags.overrides, dict(parsed.params), parse_models(spec["models"]), Path(spec["out"]),
                     published=spec["published"], report=spec["report"], vary=spec["vary"], log=log, executor=executor)


def _slurm_command(name: str, args: list[str]) -> None:
    """`sweep status DIR`; inside the jobs: `sweep slurm-job DIR LABEL`, `sweep slurm-join DIR`."""
    from experiments.tools.sweep import slurm

    if len(args) != {"status": 1, "slurm-job": 2, "slurm-join": 1}[name] or args[0].startswith("-"):
        raise ConfigError(f"usage: medstack sweep {name} DIR" + (" LABEL" if name == "slurm-job" else ""))
    sweep_dir = Path(args[0])
    if name == "status":
        typer.echo("\n".join(slurm.status_lines(sweep_dir)))
        return
    doc = slurm.read_plan(sweep_dir)
    if name == "slurm-job":
        entry = doc.get("entries", {}).get(args[1])
        if entry is None:
            raise ConfigError(f"sweep slurm-job: {args[1]!r} is not an entry of {sweep_dir}")
    slurm.job_environment(doc, sweep_dir, args[1] if name == "slurm-job" else None)
    if name == "slurm-job":
        try:
            outcome = _run(doc["spec"], slurm.EntryJob(args[1]))
        except MedstackError as e:  # its input changed since it was submitted (a file gone, ...): failed, said in its state
            slurm.record_failure(Path(entry["out"]), str(e))
            raise
        bad = [r for r in outcome.runs if r.label == args[1] and r.status not in ("finished", "skipped")]
    else:
        outcome = _run(doc["spec"], slurm.JoinJob())
        bad = [r for r in outcome.runs if r.status == "error"]
        from experiments.tools.sweep.run import summary_lines

        typer.echo("\n".join(summary_lines(outcome)))
    if bad:
        raise typer.Exit(3)


def register(app, **_):
    app.command("sweep", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(sweep)
