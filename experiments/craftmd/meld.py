"""`medstack meld`: the MELD contamination check (SPEC 3).

The model gets the first half of a vignette (by words) and is asked for the second half with its
word count; the reply is cut to that many words and compared with the true second half:
similarity = 1 − normalized Levenshtein distance (rapidfuzz, characters). A similarity >= 0.95
suggests the case was memorized.
"""

from __future__ import annotations

from pathlib import Path

from rapidfuzz.distance import Levenshtein

from experiments.config import RunSettings
from experiments.craftmd.data import load_cases
from experiments.craftmd.prompts import prompt_hash, render
from experiments.results import RunDir
from experiments.runner import run_cases
from experiments.stats import mean_ci
from models.errors import MedstackError
from serving.client import GenConfig
from serving.session import open_client


class MeldSettings(RunSettings):
    experiment: str = "craftmd-meld"
    threshold: float = 0.95
    temperature: float = 0.0
    max_tokens: int = 512


def split_halves(text: str) -> tuple[str, str]:
    w = text.split()
    half = len(w) // 2
    return " ".join(w[:half]), " ".join(w[half:])


def similarity(generated: str, truth: str) -> float:
    """1 − normalized Levenshtein distance of the two strings (1.0 = identical)."""
    return float(Levenshtein.normalized_similarity(generated.strip(), truth.strip()))


def truncate_words(text: str, n: int) -> str:
    return " ".join(text.split()[:n])


async def solve(client, case: dict, s: MeldSettings) -> dict:
    first, second = split_halves(case["vignette"])
    n = len(second.split())
    prompt = render("meld", first_half=first, n_words=n)
    r = await client.chat([{"role": "user", "content": prompt}], gen=GenConfig(temperature=s.temperature, max_tokens=min(s.max_tokens, 2 * n + 16)))
    gen = truncate_words(r.text, n)
    sim = similarity(gen, second)
    return {"id": case["case_id"], "case_id": case["case_id"], "specialty": case["specialty"], "model": s.roles.get("default", "").partition("@")[0],
            "first_half": first, "true_second_half": second, "n_words": n, "generation": r.text, "generation_cut": gen,
            "similarity": sim, "memorized": int(sim >= s.threshold), "error": r.error, "prompt_hash": prompt_hash("meld"),
            "usage": {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens, "latency": r.latency}}


def meld_metrics(records: list[dict], threshold: float) -> dict:
    sims = [r["similarity"] for r in records if r.get("similarity") is not None]
    ci = mean_ci(sims)
    return {"n": len(sims), "mean_similarity": ci.mean if sims else None, "ci": [ci.low, ci.high] if sims else None,
            "share_ge_threshold": sum(s >= threshold for s in sims) / len(sims) if sims else None, "threshold": threshold,
            "max_similarity": max(sims) if sims else None, "request_errors": sum(1 for r in records if r.get("error"))}


async def run_meld(s: MeldSettings, log=print) -> dict:
    if not s.data or not s.out:
        raise MedstackError("meld needs --data CASES and --out DIR")
    cases = load_cases(s.data, limit=s.limit)
    rundir = RunDir(Path(s.out), s.model_dump(mode="json"))
    async with open_client(s.roles, concurrency=s.concurrency, timeout=s.timeout, retries=s.retries, use_cache=s.use_cache, allow_remote=s.allow_remote, log=log) as (client, idents):
        rundir.write_identity(idents, {"experiment": "craftmd-meld"})
        stats = await run_cases(cases, lambda c: solve(client, c, s), rundir, client, concurrency=s.concurrency, id_key="case_id", description="meld")
    records = rundir.records()
    metrics = {**meld_metrics(records, s.threshold), "run": stats}
    rundir.write_metrics(metrics)
    lines = ["# MELD contamination check", "", f"model: {s.roles.get('default')}; cases: {metrics['n']}",
             f"mean similarity: {metrics['mean_similarity']}; share >= {s.threshold}: {metrics['share_ge_threshold']}; max: {metrics['max_similarity']}", "",
             "| case | similarity |", "| --- | --- |"] + [f"| {r['case_id']} | {r['similarity']:.3f} |" for r in records if r.get("similarity") is not None]
    rundir.write_summary("\n".join(lines) + "\n")
    return metrics
