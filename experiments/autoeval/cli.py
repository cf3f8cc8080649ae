"""`medstack autoeval`: plugs the rubric judge into the command line."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

ALL = "empathy,concerns,welfare,understanding"


def autoeval(
    results: str = typer.Argument(..., help="A results directory (or its records.jsonl) whose records carry a 'transcript' (CRAFT-MD, DERA, ...)."),
    criteria: Optional[str] = typer.Option(None, help=f"Comma-separated criteria keys or names (default from config: {ALL})."),
    judge_model: Optional[str] = typer.Option(None, "--judge-model", "-j", help="Judge model: registry alias, or ALIAS@URL of a running server (default: embedded)."),
    reference: Optional[str] = typer.Option(None, help="CSV with columns id, criterion, rating: reference ratings for rank agreement (Kendall tau, Spearman)."),
    examples: Optional[str] = typer.Option(None, help="JSONL of example dialogues with known ratings (id, criterion, rating, transcript), one per rating 1-5 per criterion (default: ours)."),
    limit: Optional[int] = typer.Option(None, help="Rate only the first N dialogues."),
    out: Optional[str] = typer.Option(None, help="Output results directory (default: runs/autoeval/<results name>-<judge>). Re-running resumes."),
    concurrency: Optional[int] = typer.Option(None, help="Concurrent judge requests."),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="YAML settings (default: experiments/autoeval/configs/default.yaml; see also amie.yaml, embedded-completion.yaml)."),
    api: Optional[str] = typer.Option(None, help="chat | completion (completion = raw text prompt ending in 'Good:', for base models)."),
    max_tokens: Optional[int] = typer.Option(None, help="Override max_tokens of both judge steps (explain and rate)."),
    no_cache: bool = typer.Option(False, help="Bypass the response cache."),
    allow_remote: bool = typer.Option(False, help="Allow a non-local judge endpoint."),
) -> None:
    """Rate every stored doctor-patient dialogue 1-5 per rubric criterion with a self-CoT LLM judge (AMIE style).

    Step (a): the judge explains (Good/Bad/Summary) example dialogues with known ratings, once per judge
    model (cached in the output directory). Step (b): a few-shot prompt with one explained example per
    rating point rates each dialogue (Good/Bad/Summary/Rating). Unparseable ratings are unscored and counted.
    Writes records.jsonl, metrics.json (mean rating per criterion with 95% CI, n, unscored; agreement with
    --reference) and summary.md.
    """
    from experiments.autoeval.run import run_autoeval, settings_from_cli

    console = Console(stderr=True)
    overrides = {
        "data": results, "out": out, "limit": limit, "concurrency": concurrency, "api": api,
        "criteria": [c.strip() for c in criteria.split(",") if c.strip()] if criteria is not None else None,
        "roles": {"judge": judge_model} if judge_model else None,
        "reference": reference, "examples": examples,
        "use_cache": False if no_cache else None, "allow_remote": True if allow_remote else None,
    }
    if max_tokens is not None:
        overrides["explain"] = {"max_tokens": max_tokens}
        overrides["rate"] = {"max_tokens": max_tokens}
    settings = settings_from_cli(config, overrides)
    result = asyncio.run(run_autoeval(settings, log=lambda m: console.print(m)))
    typer.echo((Path(result["out"]) / "summary.md").read_text())
    console.print(f"results: {result['out']}")


def register(app, run_app=None, score_app=None, import_app=None, data_app=None, finetune_app=None) -> None:
    app.command("autoeval")(autoeval)
