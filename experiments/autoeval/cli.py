"""`medstack autoeval`: the rubric judge as a study command (the common options + its own)."""

from __future__ import annotations

from typing import Optional

import typer

from experiments.core.commands import study_command

ALL = "empathy,concerns,welfare,understanding"


def _autoeval_overrides(v: dict) -> dict:
    """Study options -> settings keys; RESULTS is --data, --judge-model is --role judge=REF."""
    out: dict = {}
    if v.get("results"):
        out["data"] = v["results"]
    if v.get("judge_model"):
        out["roles"] = {"judge": v["judge_model"]}
    if v.get("criteria") is not None:
        out["criteria"] = [c.strip() for c in v["criteria"].split(",") if c.strip()]
    for key in ("reference", "examples", "api"):
        if v.get(key) is not None:
            out[key] = v[key]
    if v.get("max_tokens") is not None:
        out["explain"] = {"max_tokens": v["max_tokens"]}
        out["rate"] = {"max_tokens": v["max_tokens"]}
    return out


AUTOEVAL_OPTIONS = {
    "results": (Optional[str], typer.Argument(None, help="A results directory (or its records.jsonl) whose records carry a 'transcript' (CRAFT-MD, DERA, MediTOD, ...); same as --data.")),
    "criteria": (Optional[str], typer.Option(None, "--criteria", help=f"Comma-separated criteria keys or names (default from config: {ALL}).")),
    "judge_model": (Optional[str], typer.Option(None, "--judge-model", "-j", help="Judge model (alias of --role judge=REF): registry alias, or ALIAS@URL of a running server.")),
    "reference": (Optional[str], typer.Option(None, "--reference", help="CSV with columns id, criterion, rating: reference ratings for rank agreement (Kendall tau, Spearman).")),
    "examples": (Optional[str], typer.Option(None, "--examples", help="JSONL of example dialogues with known ratings (id, criterion, rating, transcript), one per rating 1-5 per criterion (default: ours).")),
    "api": (Optional[str], typer.Option(None, "--api", help="chat | completion (completion = raw text prompt ending in 'Good:', for base models).")),
    "max_tokens": (Optional[int], typer.Option(None, "--max-tokens", help="Override max_tokens of both judge steps (explain and rate; >= 1).")),
}


def _study():
    from experiments.autoeval.run import AutoevalStudy

    return AutoevalStudy()


autoeval = study_command(_study, options=AUTOEVAL_OPTIONS, to_overrides=_autoeval_overrides, help="""Rate every stored doctor-patient dialogue 1-5 per rubric criterion with a self-CoT LLM judge (AMIE style).

    Step (a): the judge explains (Good/Bad/Summary) example dialogues with known ratings, once per judge
    model (cached in the output directory). Step (b): a few-shot prompt with one explained example per
    rating point rates each dialogue (Good/Bad/Summary/Rating). Unparseable ratings are unscored and counted.
    One case per (dialogue, criterion); --limit counts dialogues. Default --out runs/autoeval/<results>-<judge>;
    default config experiments/autoeval/configs/default.yaml (see also amie.yaml, embedded-completion.yaml).
    Writes records.jsonl, metrics.json (mean rating per criterion with 95% CI, n, unscored; agreement with
    --reference) and summary.md. Exit 0 done, 2 bad input, 3 some ratings failed (run the same command again).
    """)


def register(app, run_app=None, score_app=None, import_app=None, data_app=None, finetune_app=None) -> None:
    app.command("autoeval")(autoeval)
