"""The judge decisions a clinician can review, for any kind of results directory (docs/protocols.md, Judge calibration;
experiments/tools/review/README.md).

A judge *step* names one scorer of a run, as its study declares it (``Study.scorers``: experiments/core/scorers.py);
``STEP@JUDGE`` reviews the grades another judge gave after the run (``medstack rescore``).
Its items are built from the records' typed scores: ``{"id", "verdict", "stratum", "show"}`` where ``verdict`` is
never sent to the page and ``show`` is exactly what the judge was given (the page shows nothing else).
"""

from __future__ import annotations

from pathlib import Path

from experiments.core import registry
from experiments.core.scorers import review_items
from models.errors import DataError


def reviewable() -> dict[str, tuple[str, ...]]:
    """kind -> its scorers' names, for every registered kind of results folder that declares scorers."""
    return {name: tuple(s.name for s in cls.scorers) for name, cls in sorted(registry.kinds().items()) if cls and cls.scorers and name == cls.name}


def _listing() -> str:
    return "; ".join(f"{e}: {', '.join(s)}" for e, s in reviewable().items()) or "none registered"


def load_judge(run_dir: str | Path, step: str) -> dict:
    """{"step", "experiment", "scale", "items": [...]} for judge ``step`` (``STEP`` or ``STEP@JUDGE``) of the run; a step
    the run does not have, or a run without any judged item, is bad input naming the folder."""
    p = Path(run_dir)
    run = registry.open_run(p)  # ResultsError (exit 2) for a folder without records.jsonl
    study = registry.study_of(run)
    exp = study.name if study is not None else run.experiment
    if study is None or not study.scorers:
        raise DataError(f"{p}: a {exp or 'unknown'} run has no judge to review (reviewable: {_listing()})")
    base, _, by = step.partition("@")
    judge = next((s for s in study.scorers if s.name == base), None)
    if judge is None or (step.count("@") > 1) or (by == "" and "@" in step):
        raise DataError(f"--judge {step}: a {exp} run's judge steps are {', '.join(s.name for s in study.scorers)} "
                        "(STEP@JUDGE: the grades a rescore added)")
    scale, items = review_items(judge, run.finished, run.config, by=by or None)
    scale = {**scale.json(), "question": judge.question}
    if not items:
        raise DataError(f"{p}: no record carries a {step} decision to review"
                        + (f" (rescore the run with that judge first: `medstack rescore {p} --judge {base} ...`)" if by else ""))
    ids = [it["id"] for it in items]
    if len(set(ids)) != len(ids):
        raise DataError(f"{p}: two items share an id under --judge {step}")
    return {"step": step, "experiment": exp, "scale": scale, "items": items}
