"""Paper-table declarations, read from ``experiments/<study>/paper_tables.yaml`` (schema: experiments/tables/README.md).

Nothing here computes: :mod:`experiments.tables.build` does, :mod:`experiments.tables.render` prints.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from experiments.core.config import ConfigError


class Row(BaseModel):
    label: str
    score: str | None = None  # a score's figure (metrics.json's ``scores``: the one aggregation, resampled by case)
    figure: str = "mean"  # which of the score's metrics (its scorer's: "mean", "per patient turn", ...)
    key: str | None = None  # per-case values from the adapter
    metric: str | None = None  # dotted path into metrics.json (corpus-level figure, no CI)
    n: str | None = None  # dotted path into metrics.json for the n of a metric row
    ci: str | None = None  # key rows: dotted path to the same mean/CI the study already put in metrics.json
    #                        ({accuracy|mean, ci_low|low, ci_high|high, n}); used when present, else computed
    digits: int = 3

    @model_validator(mode="after")
    def _one_source(self) -> "Row":
        if sum(x is not None for x in (self.score, self.key, self.metric)) != 1:
            raise ValueError(f"row {self.label!r}: give exactly one of score (a score's figure), key (per-case values) or metric (metrics.json path)")
        return self

    @property
    def id(self) -> str:
        return self.score or self.key or self.metric


class Plot(BaseModel):
    rows: list[str] | None = None  # row ids to draw (default: all)
    ylabel: str = "value"
    ylim: tuple[float, float] | None = None


class Table(BaseModel):
    id: str
    title: str
    when: dict[str, Any] = Field(default_factory=dict)
    rows: list[Row]
    tests: list[tuple[str, str]] = Field(default_factory=list)
    plot: Plot | None = None
    note: str | None = None

    @model_validator(mode="after")
    def _tests_name_rows(self) -> "Table":
        ids = {r.id for r in self.rows}
        for a, b in self.tests:
            for x in (a, b):
                if x not in ids:
                    raise ValueError(f"table {self.id}: test row {x!r} is not one of its rows")
        return self


class Published(BaseModel):
    model: str  # the paper's model name
    label: str | None = None  # the group label when shown alone (default: model)
    match: str | None = None  # regex (case-insensitive) on a run's name/model: that run is the paper's model
    any_model: bool = False  # shown beside every run the entry's `when` matches (the paper has one model only)
    when: dict[str, Any] = Field(default_factory=dict)
    source: str | None = None  # overrides the declaration's source
    values: dict[str, float]


class Footnote(BaseModel):
    when: dict[str, Any]  # attribute conditions (see build.matches)
    text: str  # may name attributes: {max_turns}
    tables: list[str] | None = None  # only under these tables (default: every table of the study)


class Declaration(BaseModel):
    study: str = ""  # the study folder's name (given when loaded)
    title: str
    paper: str
    source: str
    order: int = 99  # where its section comes in the report (lower first; then by study name)
    experiments: list[str] = Field(default_factory=list)  # the kinds of results folders it covers: its folder's commands (given when loaded)
    adapter: Any = None  # the registered PaperAdapter
    published: list[Published] = Field(default_factory=list)
    footnotes: list[Footnote] = Field(default_factory=list)
    tables: list[Table]
    path: str = ""

    def covers(self, experiment: str) -> bool:
        return experiment in self.experiments


def load_declaration(path: str | Path, adapter: Any = None, study: str = "", kinds: tuple[str, ...] = ()) -> Declaration:
    """A study folder's paper_tables.yaml (``study``: the folder's name; ``kinds``: the results kinds it covers, its
    commands), cached by path."""
    return _load(str(path), adapter, study, tuple(kinds))


@lru_cache(maxsize=None)
def _load(path: str, adapter: Any, study: str, kinds: tuple[str, ...]) -> Declaration:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        return Declaration.model_validate({**raw, "path": str(p), "adapter": adapter, "study": study, "experiments": list(kinds)})
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({e})") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{p}: {where}: {first['msg']}") from None


def ordered(decls) -> tuple[Declaration, ...]:
    """Declarations in the report's order."""
    return tuple(sorted(decls, key=lambda d: (d.order, d.study)))
