"""A graded answer as a typed value (in the spirit of Inspect's ``Score``): what every record carries under
``scores: {name: Grade}``, and how a score is named (docs/layout.md, "Results folders").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

SCHEMA = 2  # records written with typed scores; a folder without the number (1) is read through its study's upgrade


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
