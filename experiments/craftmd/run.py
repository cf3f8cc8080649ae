"""`medstack run craftmd`: cases × trials -> records.jsonl, metrics.json, summary.md (resumable)."""

from __future__ import annotations

from pathlib import Path

from experiments.craftmd.data import load_cases
from experiments.craftmd.metrics import per_specialty, run_metrics, summary_markdown
from experiments.craftmd.protocol import solve
from experiments.craftmd.settings import CraftSettings
from experiments.results import RunDir
from experiments.runner import run_cases
from models.errors import MedstackError
from serving.session import open_client


def units_for(cases: list[dict], trials: int) -> list[dict]:
    """One unit of work per (case, trial), id ``<case_id>/t<trial>``."""
    return [{"id": f"{c['case_id']}/t{t}", "case": c, "trial": t} for c in cases for t in range(trials)]


def finish(rundir: RunDir, settings: CraftSettings, run_stats: dict | None = None) -> dict:
    records = rundir.records()
    metrics = run_metrics(records)
    metrics["per_specialty"] = per_specialty(records)
    if run_stats:
        metrics["run"] = run_stats
    rundir.write_metrics(metrics)
    rundir.write_summary(summary_markdown(settings.name or settings.roles["clinical"], metrics))
    return metrics


async def run(settings: CraftSettings, log=print) -> dict:
    if not settings.data:
        raise MedstackError("no case file: pass --data CASES.csv or an AgentClinic OSCE .jsonl (or set data: in the config)")
    if not settings.out:
        raise MedstackError("no results directory: pass --out DIR")
    if not (settings.mcq or settings.frq):
        raise MedstackError("nothing to ask: --no-mcq and --no-frq together leave no question")
    cases = load_cases(settings.data, specialty=settings.specialty, limit=settings.limit)
    settings = settings.model_copy(update={"name": settings.name or settings.roles["clinical"].partition("@")[0]})
    rundir = RunDir(Path(settings.out), settings.model_dump(mode="json"))
    async with open_client(settings.roles, concurrency=settings.concurrency, timeout=settings.timeout, retries=settings.retries,
                           use_cache=settings.use_cache, allow_remote=settings.allow_remote, log=log) as (client, identities):
        rundir.write_identity(identities, {"experiment": "craftmd"})
        stats = await run_cases(units_for(cases, settings.trials), lambda u: solve(client, u, settings), rundir, client,
                                concurrency=settings.concurrency, description=f"craftmd {settings.name}")
    return finish(rundir, settings, stats)
