"""`medstack rescore RUN --judge STEP --judge-model M --out RUN2` (or `--panel M1,M2,M3`): a finished run's judge asked again by other models."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def rescore(
    run: Path = typer.Argument(..., help="A results directory (finished or partial): its finished records are graded again. Never written."),
    judge: str = typer.Option(..., "--judge", metavar="STEP", help="The judge step to ask again, as the run's study declares it "
                                                                   "(e.g. frq, llm-exact). A step the run lacks is refused, naming its steps."),
    model: Optional[str] = typer.Option(None, "--judge-model", metavar="REF", help="One judge model: registry ALIAS or ALIAS@URL, "
                                                                                "optionally LABEL=REF (default label: the alias). Its grades are STEP/PART@LABEL."),
    old_model: Optional[str] = typer.Option(None, "--model", "-m", hidden=True),  # the option's earlier name
    panel: Optional[str] = typer.Option(None, "--panel", metavar="LIST", help="A judge panel instead: [LABEL=]REF,[LABEL=]REF,... (at least two; the same "
                                                                             "model twice needs two labels). Grades per member and STEP/PART@panel: "
                                                                             "the majority of binary grades (a tie unscored), the mean of ordinal ones."),
    out: Path = typer.Option(..., "--out", metavar="RUN2", help="Results directory to write (not RUN); the same command again resumes."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1, metavar="N", help="Records (and requests) in flight \\[default: the source run's]."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Bypass the response cache (fresh samples; a killed rescore then cannot replay its calls)."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow an ALIAS@URL endpoint that is not on this machine."),
    api_key: Optional[str] = typer.Option(None, "--api-key", metavar="KEY", help="API key for keyed endpoints (default: $MEDSTACK_API_KEY). Never written to the results."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Build every judge request as the rescore would send it into RUN2/dry-run.jsonl; nothing is sent."),
) -> None:
    """Ask one judge step of a finished run again, with another judge model (--judge-model) or a panel (--panel), over the
    stored answers: only the judge's requests are sent (the study's own prompt, sampling and parser), no doctor,
    patient or answer request. RUN2 holds every record of RUN with both grades (STEP/PART and STEP/PART@LABEL),
    metrics.json each judge's means and its agreement with the run's own judge (percent agreement, Cohen's or
    linear-weighted kappa, mean |diff|) and, for a panel, Fleiss' kappa; summary.md puts the judges side by side.
    `medstack review RUN2 --judge STEP@LABEL` (or @panel) reviews the new judge. An unreadable judge reply is
    unscored, never fatal. Exit 0 done, 2 bad input (nothing started), 3 failed or unstarted records (the same
    command resumes)."""
    from experiments.core.commands import execute, log
    from experiments.tools.rescore.run import prepare_rescore

    study, settings, cases = prepare_rescore(run, judge, model=model or old_model, panel=panel, out=out, concurrency=concurrency,
                                             use_cache=not no_cache, allow_remote=allow_remote, log=log)
    execute(study, settings, cases, api_key=api_key, dry_run=dry_run)


def register(app, **_) -> None:
    app.command("rescore")(rescore)
