"""A graded answer as a typed value (in the spirit of Inspect's ``Score``): what every record carries under
``scores: {name: Grade}``, and how a score is named (docs/layout.md, "Results folders").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class Grade:
    """``value``: 1 / 0 / a count / a rating / a fraction or named values (P/R/F1), None = unscored.

    ``answer``: what was judged; ``explanation``: the judge's reply or the rule's reason; ``judge``: who decided
    (``{"model", "prompt_hash", "rule"}``: a model and its prompt, or a rule of ours); ``source``: the rule that
    decided (exact match, the first word, ...); ``metadata``: what else the study keeps (a panel's member values)."""

    value: float | Mapping[str, float | None] | None
    answer: Any = None
    source: str | None = None
    skipped: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)
    explanation: str | None = None
    judge: Mapping[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> bool:
        return not self.skipped and self.value is not None

    def named(self, name: str) -> float | None:
        """One of several named values (None when unscored or not named)."""
        return self.value.get(name) if isinstance(self.value, Mapping) else None

    def to_json(self) -> dict:
        """The grade as stored in a record (empty fields left out)."""
        return {k: v for k, v in asdict(self).items() if k == "value" or v not in (None, False, {}, "")}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Grade":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def score_name(step: str, part: str | None = None, judge: str | None = None) -> str:
    return step + (f"/{part}" if part else "") + (f"@{judge}" if judge else "")


def split_name(name: str) -> tuple[str, str | None, str | None]:
    """``STEP[/PART][@JUDGE]`` -> (step, part, judge)."""
    base, _, judge = name.partition("@")
    step, _, part = base.partition("/")
    return step, part or None, judge or None


def grades(record: Mapping[str, Any]) -> dict[str, Grade]:
    """A record's typed scores (an empty dict for a record without any)."""
    raw = record.get("scores")
    if not isinstance(raw, Mapping):
        return {}
    return {name: Grade.from_json(g) for name, g in raw.items() if isinstance(g, Mapping) and "value" in g}


def to_disk(scores: Mapping[str, Grade]) -> dict:
    return {name: g.to_json() for name, g in scores.items()}


# ------------------------------------------------------------------ what a value means, and how it is aggregated

@dataclass(frozen=True)
class Scale:
    """What a score's value means (docs/layout.md, "Scorers"). ``kind``: ``binary`` (1 / 0), ``count`` (0..max: how
    many of a case's trials), ``rating`` (an ordinal scale, ``values`` its points), ``unit`` (a continuous value in
    [0, 1]). ``names``: a word per value for a reviewer ("1": "yes"). ``normalise``: a rule over all of a run's
    values applied before any mean, for a value whose scale the run decides (DERA's similarity: out of range -> 0,
    unless every value is 100); the grades keep the judge's own value."""

    kind: str
    values: tuple = ()
    names: Mapping[str, str] = field(default_factory=dict)
    normalise: Callable[[list], list] | None = None

    @property
    def ordinal(self) -> bool:
        return self.kind != "binary"

    @property
    def max(self) -> int | None:
        return max(self.values) if self.kind == "count" and self.values else None

    def json(self) -> dict:
        """The scale as the review page and its sample file hold it."""
        out: dict = {"kind": self.kind, "values": list(self.values) if self.values else None}
        if self.names:
            out["names"] = dict(self.names)
        if self.kind == "count":
            out["max"] = self.max
        return out


BINARY = Scale("binary", (1, 0), {"1": "match", "0": "no match"})
YES_NO = Scale("binary", (1, 0), {"1": "yes", "0": "no"})
FLAG = Scale("binary", (1, 0), {"1": "flagged", "0": "not flagged"})
RATING = Scale("rating", (1, 2, 3, 4, 5))
UNIT = Scale("unit")


def count_scale(n: int) -> Scale:
    return Scale("count", tuple(range(n + 1)))


@dataclass(frozen=True)
class Metric:
    """How a score's grades become one figure, resampled by unit (the case, where trials repeat it).

    Without ``numerator``: the mean over units of each unit's mean value. With ``numerator`` and ``denominator`` (keys
    of each grade's metadata: a conversation's flagged patient turns and its patient turns): the ratio of their sums
    (a rate per patient turn). Either way the 95 % interval comes from resampling whole units (experiments/common/stats.py)."""

    label: str = "mean"
    numerator: str | None = None
    denominator: str | None = None


MEAN = Metric()


@dataclass(frozen=True)
class Figure:
    """One metric of one score over a run: the figure, its 95 % interval, ``n`` units (cases) behind it, ``values``
    the grades that scored, ``unscored`` (unreadable), ``not_checkable`` (the score cannot apply: skipped)."""

    score: str
    metric: str
    value: float | None
    low: float | None
    high: float | None
    n: int
    values: int
    unscored: int
    not_checkable: int

    def json(self) -> dict:
        return asdict(self)

    def text(self, digits: int = 3, percent: bool = False) -> str:
        """'0.550 [0.150, 0.900]', or 'not checkable' / 'unscored' / '–' where there is no figure."""
        if self.value is None:
            return "not checkable" if self.not_checkable and not self.values and not self.unscored else (
                "unscored" if self.unscored else "–")
        k = 100 if percent else 1
        f = f"{{:.{digits}f}}"
        return f"{f.format(k * self.value)} [{f.format(k * self.low)}, {f.format(k * self.high)}]"


def _scored(records, name: str, scale: Scale | None, unit: str) -> tuple[list[tuple[str, Grade, float]], int, int]:
    """(unit, grade, value) of every scored grade of ``name`` (the value normalised over them where the scale says
    so), the unscored count and the not-checkable (skipped) count."""
    base, _, key = name.partition("[")
    key = key.rstrip("]") or None
    rows: list[tuple[str, Grade]] = []
    unscored = skipped = 0
    for r in records:
        raw = (r.get("scores") or {}).get(base)
        if not isinstance(raw, Mapping) or "value" not in raw:
            continue
        g = Grade.from_json(raw)
        if g.skipped:
            skipped += 1
            continue
        v = g.named(key) if key else g.value
        if v is None or isinstance(v, Mapping):
            unscored += 1
            continue
        rows.append((str(r.get(unit) if r.get(unit) is not None else r.get("id")), g))
    values = [float(g.named(key) if key else g.value) for _, g in rows]
    if scale is not None and scale.normalise is not None:
        values = [float(v) for v in scale.normalise(values)]
    return [(u, g, v) for (u, g), v in zip(rows, values)], unscored, skipped


def _unit_means(rows) -> dict[str, float]:
    per: dict[str, list[float]] = {}
    for u, _, v in rows:
        per.setdefault(u, []).append(v)
    return {u: sum(v) / len(v) for u, v in per.items()}


def unit_values(records, name: str, scale: Scale | None = None, unit: str = "case_id") -> dict[str, float]:
    """unit (case) -> the mean of its scored values of score ``name``: what a paired test pairs."""
    return _unit_means(_scored(records, name, scale, unit)[0])


def aggregate(records, name: str, metric: Metric = MEAN, scale: Scale | None = None, unit: str = "case_id") -> Figure:
    """The one aggregation of score ``name`` (a full name: ``frq/vignette``, ``patient-check/leaks@panel``) over
    ``records`` (the finished ones): the unit of each record is its ``unit`` field (else its ``id``). Named values
    (``name[key]``: P/R/F1) aggregate one of them."""
    from experiments.common.stats import mean_ci, ratio_ci

    rows, unscored, skipped = _scored(records, name, scale, unit)
    if metric.numerator:
        num: dict[str, float] = {}
        den: dict[str, float] = {}
        for u, g, _ in rows:
            num[u] = num.get(u, 0.0) + float(g.metadata.get(metric.numerator) or 0)
            den[u] = den.get(u, 0.0) + float(g.metadata.get(metric.denominator) or 0)
        ci = ratio_ci(list(num.values()), [den[u] for u in num])
    else:
        ci = mean_ci(_unit_means(rows).values())
    some = ci.n > 0 and ci.mean == ci.mean
    return Figure(name, metric.label, ci.mean if some else None, ci.low if some else None, ci.high if some else None,
                  ci.n, len(rows), unscored, skipped)
