"""Scorers: every judge and check a study has, each declared once (docs/layout.md, "Scorers").

A :class:`Scorer` says what it decides (``question``, per part where it has parts), on what scale (``scale``:
experiments/common/grade.py), how (``decide``: a rule, or a model ``role`` with the study's prompt, sampling,
re-asks and verdict rule), what it was shown (``show``, for the blind review page) and how its grades become figures
(``metrics``, resampled by ``unit``: the case, where trials repeat it). ``solve`` produces the transcript and the
answer; the runner then runs the study's scorers over the finished record, ``medstack rescore`` runs one again over
stored records with other models, ``review`` shows its decisions, ``calibrate`` holds them against labels, and the
study's tables, ``compare`` and the report aggregate its grades with :func:`figures`, the one aggregation.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from experiments.common.grade import MEAN, Figure, Grade, Metric, Scale, aggregate, grades, score_name, split_name, to_disk
from experiments.common.markdown import md_table

Decision = Mapping[str | None, Grade]  # part (None: the record is one item) -> its grade


def always(settings) -> bool:
    return True


@dataclass(frozen=True)
class Scorer:
    """One judge or check (the module docstring). ``decide(ctx, record, settings, role)`` returns ``{part: Grade}``
    (awaitable for a model's decision; ``ctx`` the case's one call log, None for a rule); None where the grades come
    from elsewhere (an import, a calibration) and cannot be asked again. ``parts``: part -> what that part checks,
    where one scorer decides several things at once (the patient checks). ``items(records, config)``: review items of
    its own (a count over a case's trials) as ``(scale, items)``. ``applies(settings)``: whether a run with these
    settings runs it; ``optional``: run only when the run names it (``--scorers NAME``). ``validation``: part -> its precision and recall on a labelled set, shown beside its rate;
    ``reference()``: other runs' figures shown beside a run's (label -> {"SCORE|METRIC": figure}: the authors' releases)."""

    name: str
    scale: Scale
    question: str
    decide: Callable[..., Decision | Awaitable[Decision]] | None = None
    role: str | None = None
    show: Callable[[dict, str | None], dict] | None = None
    items: Callable[[list[dict], dict], tuple[Scale, list[dict]]] | None = None
    metrics: tuple[Metric, ...] = (MEAN,)
    unit: str = "case_id"
    parts: Mapping[str, str] = field(default_factory=dict)
    applies: Callable[[Any], bool] = always
    validation: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    reference: Callable[[], Mapping[str, Mapping[str, Mapping]]] | None = None
    optional: bool = False
    label: str = ""  # what its figure is called in words ("diagnostic accuracy (moderator)"); default: its question

    @property
    def rescorable(self) -> bool:
        """A model's decision that can be asked again over a stored record."""
        return self.decide is not None and self.role is not None

    def question_of(self, part: str | None) -> str:
        return self.parts.get(part, self.question) if part else self.question

    def rule(self, record: dict, settings) -> dict[str, Grade]:
        """A rule's grades of ``record`` (no model, no context), named ``NAME[/PART]``: an import runs a check so."""
        return {score_name(self.name, part): g for part, g in self.decide(None, record, settings, None).items()}

    async def run(self, ctx, record: dict, settings, role: str | None = None) -> dict[str, Grade]:
        """Its grades of ``record``, named ``NAME[/PART]`` (the run's own) or ``NAME[/PART]@LABEL`` (``label``: a rescore's)."""
        got = self.decide(ctx, record, settings, role or self.role)
        if inspect.isawaitable(got):
            got = await got
        return {score_name(self.name, part): g for part, g in got.items()}


async def score_record(scorers, ctx, record: dict, settings) -> dict:
    """``record`` with the grades of each of ``scorers``, run in order (a later one may read an earlier one's grade)."""
    for scorer in scorers:
        record["scores"] = {**record.get("scores", {}), **to_disk(await scorer.run(ctx, record, settings))}
    return record


def find(scorers, name: str) -> Scorer | None:
    """The scorer whose scores ``name`` is (``STEP[/PART][@JUDGE]``), or None."""
    step = split_name(name)[0]
    return next((s for s in scorers if s.name == step), None)


def readable(name: str, scorers=()) -> str:
    """A score's name (``STEP[/PART][@JUDGE][[KEY]]``) in words, as compare's rows say it: its scorer's label (else its
    question), the part's description, the judge of a rescore; a score no scorer declares keeps its name."""
    base, _, key = name.partition("[")
    step, part, judge = split_name(base)
    sc = find(scorers, base)
    if sc is None:
        return name
    if part and not sc.label:  # a part's own description says what it checks
        words = f"{step.replace('-', ' ')}: {sc.parts.get(part, part)}"
    else:
        words = (sc.label or sc.question.rstrip("?")) + (f", {sc.parts.get(part, part)}" if part else "")
    if key:
        words += f": {key.rstrip(']')}"
    return words + (f" (judge {judge})" if judge else "")


def figures(records: list[dict], scorers=(), names: list[str] | None = None) -> list[Figure]:
    """Every metric of every score ``records`` carry (or of ``names``), each through its scorer's declared metrics,
    scale and unit (a score no scorer declares: the mean over cases): the one aggregation that summary.md, the paper
    tables, ``compare`` and the report all show."""
    if names is None:
        found: dict[str, None] = {}
        for r in records:
            for n, g in grades(r).items():
                keys = [f"{n}[{k}]" for k in g.value] if isinstance(g.value, Mapping) else [n]
                found.update(dict.fromkeys(keys))
        # a score of named values: a record's unscored grade (None) is counted by each named figure, not a figure of its own
        names = sorted(n for n in found if not any(k.startswith(n + "[") for k in found))
    out = []
    for n in names:
        sc = find(scorers, n)
        for m in (sc.metrics if sc else (MEAN,)):
            out.append(aggregate(records, n, m, sc.scale if sc else None, sc.unit if sc else "case_id"))
    return out


# ------------------------------------------------------------------ review: the items a clinician labels

def review_items(scorer: Scorer, records: list[dict], config: dict, by: str | None = None) -> tuple[Scale, list[dict]]:
    """The review items of ``scorer`` over a run's records: one per scored grade (``by``: the grades of that judge,
    ``@by``, instead of the run's own): ``{"id", "verdict", "stratum", "show"}``, the verdict on the scorer's scale
    (normalised over the run where the scale says so)."""
    if scorer.items is not None and by is None:
        return scorer.items(records, config)
    rows = []
    for r in records:
        for name, g in grades(r).items():
            step, part, who = split_name(name)
            if step != scorer.name or who != by or not g.scored or isinstance(g.value, Mapping):
                continue
            if scorer.role is not None and not by_judge(g):  # a model's scorer, but a rule decided (DERA: no answer, 0): nothing to check
                continue
            rows.append((r, part, g))
    values = [g.value for _, _, g in rows]
    if scorer.scale.normalise is not None:
        values = scorer.scale.normalise(values)
    items = []
    for (r, part, g), v in zip(rows, values):
        verdict = on_scale(v, scorer.scale)
        level = str(verdict) if scorer.scale.kind != "unit" else ("high" if v >= 0.5 else "low")
        items.append({"id": f"{r['id']}|{part}" if part else str(r["id"]), "verdict": verdict,
                      "stratum": "|".join([level, part or "", str((r.get("metadata") or {}).get("model") or r.get("model") or "")]),
                      "show": scorer.show(r, part) if scorer.show else {"answer": g.answer}})
    return scorer.scale, items


def on_scale(value: float, scale: Scale) -> float | int:
    """The one rule that puts a value (a panel's mean rating) on a scale, for review and agreement alike: the nearest
    point, halfway going up (2.5 -> 3); a unit scale keeps the value."""
    if scale.kind == "unit":
        return float(value)
    points = sorted(scale.values or ()) or [math.floor(value + 0.5)]
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


# ------------------------------------------------------------------ the figures as summary.md, compare and the report show them

SCORES_NOTE = ("Each figure over the finished records: the mean over cases of each case's mean grade (for a 0/1 score, the "
               "share), or, for a metric \"per ...\", the ratio of the two sums; [95 % CI] from 10,000 resamples of whole "
               "cases (fixed seed); n = cases. Unscored grades (an unreadable reply) are left out and counted; \"not "
               "checkable\": the score cannot apply to that record, never a 0.")


def figure_cell(f: Mapping) -> str:
    """One figure (``Figure.json()``) in a table cell: value [CI] (n cases; unscored; not checkable)."""
    fig = Figure(**{k: f.get(k) for k in Figure.__dataclass_fields__})
    extra = [f"n={fig.n}"] if fig.value is not None else []
    extra += [f"{fig.unscored} unscored"] if fig.unscored else []
    extra += [f"{fig.not_checkable} not checkable" if fig.value is not None else f"{fig.not_checkable} records"] if fig.not_checkable else []
    return fig.text() + (f" ({'; '.join(extra)})" if extra else "")


def validation_cell(v: Mapping | None) -> str:
    """A check's precision / recall on a labelled set, with intervals, as every table shows it beside the check's rate."""
    if not v:
        return "–"
    def one(k):
        x = v.get(k)
        ci = v.get(f"{k}_ci") or [None, None]
        return "–" if x is None else f"{x:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if None not in ci else "")
    where = f" ({v['n']} labelled, {v['part']})" if v.get("n") else ""
    if v.get("precision") is None and v.get("recall") is None and "positives" in v:
        return f"– (no labelled positive, none flagged){where}" if not v.get("positives") and not v.get("flagged") else f"–{where}"
    return f"{one('precision')} / {one('recall')}" + where


def scores_markdown(figs: list[dict], scorers, columns: list[tuple[str, list[dict]]] | None = None) -> str:
    """The "Scores" section: every figure, one table per scorer (its question and scale), one row per score, a column
    per metric (per run, where several are compared). ``figs``: one run's figures (``Figure.json()``, metrics.json's
    ``scores``); ``columns``: several runs' instead, ``[(label, figures)]``. A scorer's declared validation (precision /
    recall on a labelled set) and reference runs (the authors' releases) are columns of their own."""
    columns = columns if columns is not None else [("this run", figs)]
    keyed = [(label, {(f["score"], f["metric"]): f for f in fl}) for label, fl in columns]
    names = list(dict.fromkeys(f["score"] for _, fl in columns for f in fl))
    if not names:
        return ""
    lines = ["## Scores", "", SCORES_NOTE]
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(split_name(n)[0], []).append(n)
    for step, group in groups.items():
        sc = find(scorers, step)
        metrics = list(dict.fromkeys([m.label for m in sc.metrics] if sc else [])) or \
            list(dict.fromkeys(m for _, d in keyed for (n, m) in d if n in group))
        refs = dict(sc.reference()) if sc and sc.reference else {}
        valid = bool(sc and sc.validation)
        head = f"### {step}" + (f": {sc.question} ({sc.scale.kind}; {'role ' + sc.role if sc.role else 'a rule, no model'})" if sc else "")
        one = len(keyed) == 1
        cols = ["score", *(m if one else f"{label}: {m}" for label, _ in keyed for m in metrics),
                *(["precision / recall (labelled set)"] if valid else []), *(f"{r}: {m}" for r in refs for m in metrics)]
        rows = []
        for name in group:
            part = split_name(name)[1]
            label = name if not (sc and part in sc.parts) else f"{name}: {sc.parts[part]}"
            row = [label.replace("|", "\\|")]
            row += [figure_cell(d[(name, m)]) if (name, m) in d else "–" for _, d in keyed for m in metrics]
            if valid:
                row.append(validation_cell(sc.validation.get(part or "")))
            row += [figure_cell(ref[f"{name}|{m}"]) if f"{name}|{m}" in ref else "–" for ref in refs.values() for m in metrics]
            rows.append(row)
        lines += ["", head, "", *md_table(cols, rows)]
    return "\n".join(lines) + "\n"
