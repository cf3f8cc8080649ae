"""A graded answer as a typed value (in the spirit of Inspect's ``Score``), read by the studies' metrics instead of
chained ``.get``; records on disk keep their shape (craftmd/metrics.py ``grades``, dera/report.py ``gptf1_grades``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Grade:
    """``value``: 1 / 0 / a fraction or named values (P/R/F1), None = unscored; ``source``: the rule that decided."""

    value: float | Mapping[str, float | None] | None
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
