"""Judges as a study declares them, for the tools that know no study: review, calibrate, rescore, the report.

A :class:`Judge` is one LLM-judge (or rule) decision a study's records carry as typed scores
(experiments/common/grade.py: ``scores: {STEP[/PART][@JUDGE]: Grade}``). The study says once, in its folder, what
the decision is (``scale``, ``question``), which role makes it, what the judge was shown (``show``, for the blind
review page) and how to ask it again over a stored answer (``ask``, for ``medstack rescore``). Everything else is
generic: review items are built from the scores, a panel's grade is the majority (binary) or mean (ordinal) of its
members', agreement between two judges is computed over the scores they share.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

from experiments.common.grade import Grade, grades, split_name

# scales: kind binary | count | rating | unit; the values a label may take (unit: any number in [0, 1])
BINARY = {"kind": "binary", "values": [1, 0], "names": {"1": "match", "0": "no match"}}
YES_NO = {"kind": "binary", "values": [1, 0], "names": {"1": "yes", "0": "no"}}
RATING = {"kind": "rating", "values": [1, 2, 3, 4, 5]}
UNIT = {"kind": "unit", "values": None}


def count_scale(n: int) -> dict:
    return {"kind": "count", "values": list(range(n + 1)), "max": n}


@dataclass(frozen=True)
class Judge:
    """One judged decision of a study's records.

    ``step``: its name (``--judge STEP``; the scores ``STEP`` / ``STEP/PART``); ``role``: the run's role that makes it;
    ``scale`` / ``question``: what a reviewer answers; ``show(record, part, config)``: exactly what the judge was
    given (the review page shows nothing else); ``items(records, config, path)``: a builder of its own for a step
    that is not one score per item (a count over trials), returning (scale, items); ``ask(ctx, record, part,
    settings, role)``: ask the judge again over the stored answer (awaitable Grade), None where it cannot be re-asked."""

    step: str
    scale: Mapping[str, Any]
    question: str
    role: str = "judge"
    show: Callable[[dict, str | None, dict], dict] | None = None
    items: Callable[[list[dict], dict, Path], tuple[dict, list[dict]]] | None = None
    ask: Callable[..., Awaitable[Grade]] | None = None

    @property
    def ordinal(self) -> bool:
        return self.scale.get("kind") != "binary"


def review_items(judge: Judge, records: list[dict], config: dict, path: Path, by: str | None = None) -> tuple[dict, list[dict]]:
    """The review items of ``judge`` over a run's records: one per scored grade of the step (``by``: the grades of
    that judge, ``@by``, instead of the run's own): ``{"id", "verdict", "stratum", "show"}``."""
    if judge.items is not None and by is None:
        return judge.items(records, config, path)
    items = []
    for r in records:
        for name, g in grades(r).items():
            step, part, who = split_name(name)
            if step != judge.step or who != by or not g.scored or isinstance(g.value, Mapping):
                continue
            if by is not None and not by_judge(g):  # a rescore's judge never saw it (DERA: no answer, 0 by rule)
                continue
            v = g.value
            verdict = on_scale(v, judge.scale)
            level = str(verdict) if judge.scale.get("kind") != "unit" else ("high" if v >= 0.5 else "low")
            items.append({"id": f"{r['id']}|{part}" if part else str(r["id"]), "verdict": verdict,
                          "stratum": "|".join([level, part or "", str(r.get("model", ""))]),
                          "show": judge.show(r, part, config) if judge.show else {"answer": g.answer}})
    return dict(judge.scale), items


def on_scale(value: float, scale: Mapping[str, Any]) -> float | int:
    """The one rule that puts a value (a panel's mean rating) on a judge's scale, for review and agreement alike: the
    nearest point, halfway going up (2.5 -> 3); a unit scale keeps the value."""
    if scale.get("kind") == "unit":
        return float(value)
    points = sorted(scale.get("values") or []) or [math.floor(value + 0.5)]
    return min(reversed(points), key=lambda c: abs(c - value))


def by_judge(g: Grade) -> bool:
    """False for a grade a rule of ours decided alone (``judge`` names a rule, no model: DERA's 0 for no answer)."""
    return bool(g.judge.get("model")) or not g.judge.get("rule")


def panel_grade(members: list[Grade], *, ordinal: bool, name: str = "panel") -> Grade:
    """A judge panel's grade, its members' values kept in metadata. Binary: the value more than half of ALL the
    members gave (a member that could not score counts against every value), else unscored. Ordinal: the mean of the
    members that scored. Members that all decided by one rule (nothing to judge) give that rule's grade."""
    values = [g.value for g in members if g.scored]
    if not values:
        value = None
    elif ordinal:
        value = sum(values) / len(values)
    else:
        top, count = Counter(values).most_common(1)[0]
        value = top if 2 * count > len(members) else None
    rule = members[0].judge if members and not any(by_judge(g) for g in members) else None
    return Grade(value=value, answer=members[0].answer if members else None, source="mean" if ordinal else "majority",
                 judge=rule or {"model": name, "rule": "mean" if ordinal else "majority"},
                 metadata={"members": [{"model": g.judge.get("model"), "value": g.value} for g in members]})
