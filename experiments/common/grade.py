"""A graded answer as a typed value, in the spirit of Inspect's ``Score``: what the studies' metrics read
instead of chained ``.get`` on the nested dicts of a record. Records on disk keep their own shape; a study
builds its grades from a record (``experiments/craftmd/metrics.py`` ``grades``, ``experiments/dera/report.py``
``gptf1_grades``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

Value = float | Mapping[str, float | None] | None


@dataclass(frozen=True)
class Grade:
    """``value``: 1 / 0 / a fraction, or named values (precision, recall, f1); None = unscored (counted, never 0).
    ``source``: the rule or step that decided; ``skipped``: not asked in this run; ``metadata``: the rest."""

    value: Value
    answer: Any = None
    source: str | None = None
    skipped: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> bool:
        return not self.skipped and self.value is not None

    def named(self, name: str) -> float | None:
        """One of several named values (None when unscored or not named)."""
        return self.value.get(name) if isinstance(self.value, Mapping) else None
