"""The study registry: every study says once, in its own ``experiments/<study>/study.py``, what it is.

    register_study("craftmd", CraftmdStudy, help="...")          # `medstack run craftmd`, flags from CraftSettings
    register_study("meld", MeldStudy, help="...", top_level=True)  # `medstack meld`
    register_tables(HERE / "paper_tables.yaml", ADAPTER)          # its paper tables and their adapter

The Study class names its settings model (``settings_cls``) and default config (``default_config``); the
command's flags are generated from the settings model (experiments/core/commands.py). `medstack run`,
``--dry-run``, ``sweep``, ``report``, ``compare`` and ``tables`` read this registry. Studies are found by
layout: every ``experiments/*/study.py`` is imported once; every ``experiments/*/cli.py`` (and ``finetune/cli.py``)
with a ``register(**apps)`` adds its other commands.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from experiments.core.commands import study_command
from experiments.core.config import ConfigError
from experiments.core.study import Study

EXPERIMENTS = Path(__file__).resolve().parent.parent
ROOT = EXPERIMENTS.parent


@dataclass(frozen=True)
class StudyEntry:
    name: str  # the command: `medstack run NAME` (or `medstack NAME` when top_level)
    study: Callable[[], Study]  # the Study class (or a factory)
    help: str
    top_level: bool = False
    fixed: dict = field(default_factory=dict)  # settings the command fixes (e.g. MediTOD's task)

    def make(self) -> Study:
        return self.study()


@dataclass(frozen=True)
class PaperTables:
    path: Path  # the study's paper_tables.yaml (experiments/tables/declare.py)
    adapter: Any  # its experiments.tables.adapter.PaperAdapter


STUDIES: dict[str, StudyEntry] = {}
TABLES: dict[str, PaperTables] = {}
_found: list[bool] = []


def register_study(name: str, study: Callable[[], Study], *, help: str, top_level: bool = False, fixed: dict | None = None) -> StudyEntry:
    entry = StudyEntry(name, study, help, top_level, fixed or {})
    STUDIES[name] = entry
    return entry


def register_tables(path: str | Path, adapter: Any) -> PaperTables:
    tables = PaperTables(Path(path), adapter)
    TABLES[str(tables.path)] = tables
    return tables


def _modules(file: str) -> list[str]:
    return [f"experiments.{p.parent.name}.{p.stem}" for p in sorted(EXPERIMENTS.glob(f"*/{file}"))]


def discover() -> None:
    """Import every study folder's ``study.py`` (each registers itself), once."""
    if not _found:
        for module in _modules("study.py"):
            importlib.import_module(module)
        _found.append(True)


def studies() -> dict[str, StudyEntry]:
    discover()
    return STUDIES


def get(name: str) -> StudyEntry:
    entry = studies().get(name)
    if entry is None:
        raise ConfigError(f"unknown study {name!r}; studies: {', '.join(sorted(STUDIES))}")
    return entry


def paper_tables() -> list[PaperTables]:
    discover()
    return list(TABLES.values())


def register_all(app, run_app, **apps) -> None:
    """Plug every study command and every folder's other commands into `medstack`."""
    for entry in studies().values():
        (app if entry.top_level else run_app).command(entry.name)(study_command(entry))
    cli_modules = _modules("cli.py") + (["finetune.cli"] if (ROOT / "finetune" / "cli.py").exists() else [])
    for module in cli_modules:
        importlib.import_module(module).register(app=app, run_app=run_app, **apps)
