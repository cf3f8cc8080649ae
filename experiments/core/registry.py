"""The study registry. Each study folder declares once, in its package's ``__init__.py``, everything it adds:
``STUDY = StudyDeclaration(commands=(Command(...), ...), tables=..., adapter=..., results=..., cli=...)`` (docs/layout.md,
Adding a study, shows one). A reference ``"module:attr"`` names something in the folder, imported when used (or the
object itself: a study declared in one file). A command's name is the one name of its study: the registry gives it to
the Study class (``Study.name``), and results folders of that kind carry it (config.yaml's ``experiment``). Found by
layout: every ``experiments/studies/<folder>/__init__.py`` that declares ``STUDY``, and each folder ``$MEDSTACK_STUDIES``
names (os.pathsep-separated; loaded under its folder's name). This module declares; the command line
(experiments/core/commands.py) reads it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from experiments.core.config import ConfigError
from experiments.core.record import is_typed
from experiments.core.results import Run, read_run, settings_of
from experiments.core.study import Study
from experiments.datasets.registry import STUDIES_ENV, study_folders

EXPERIMENTS = Path(__file__).resolve().parent.parent
STUDIES = EXPERIMENTS / "studies"  # one folder per study


@dataclass(frozen=True)
class Command:
    """One study command: `medstack run NAME` (`medstack NAME` when ``top_level``). As :func:`get` returns it, ``make``
    is the Study class named ``name`` and ``help`` the whole help."""

    name: str
    help: str  # the help's first paragraph, as `medstack --help` lists it (the only copy)
    make: Any  # the Study class: "module:attr" in the folder, or the object
    more: str = ""  # the paragraphs after the first, in the command's own --help
    top_level: bool = False
    fixed: dict = field(default_factory=dict)  # settings the command fixes (MediTOD's task)
    tables: bool = True  # its runs appear in the folder's paper tables
    formerly: tuple[str, ...] = ()  # older names of its results folders' kind (config.yaml's ``experiment``), read as its own


@dataclass(frozen=True)
class Kind:
    """A kind of results folder a study folder writes besides its commands' runs (a calibration, an import): its name,
    the Study class that reads it, and its older names."""

    name: str
    make: Any
    formerly: tuple[str, ...] = ()


@dataclass(frozen=True)
class StudyDeclaration:
    """Everything one study folder adds to medstack (the module docstring shows one)."""

    commands: tuple[Command, ...]
    tables: str | None = None  # its paper_tables.yaml, beside __init__.py (experiments/tables/declare.py)
    adapter: Any = None  # the tables' PaperAdapter (experiments/tables/adapter.py)
    results: tuple[Kind, ...] = ()  # more kinds of results folders it writes (calibrations, imports)
    cli: dict[str, Any] = field(default_factory=dict)  # its other commands: "GROUP NAME" -> the typer function
    package: str = ""  # set when found: the package's import name
    folder: Path | None = None  # set when found

    def resolve(self, ref):
        """A ``"module:attr"`` reference of this folder -> the object (anything else is the object already)."""
        if not isinstance(ref, str):
            return ref
        module, _, attr = ref.partition(":")
        return getattr(importlib.import_module(f"{self.package}.{module}"), attr)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The names of the results kinds its paper tables cover: its commands'."""
        return tuple(c.name for c in self.commands if c.tables)


@dataclass(frozen=True)
class TableSource:
    """Where a study folder's paper tables are declared (experiments/tables reads it): its paper_tables.yaml, its
    adapter, the folder's name and the kinds of results folders they cover."""

    path: Path
    adapter: Any
    study: str
    kinds: tuple[str, ...]


def table_sources() -> tuple[TableSource, ...]:
    """Every study folder's paper-table source."""
    return tuple(t for d in declarations() if (t := _tables_of(d)) is not None)


def _tables_of(d: StudyDeclaration) -> TableSource | None:
    return TableSource(d.folder / d.tables, d.resolve(d.adapter), d.folder.name, d.kinds) if d.tables else None


def _load_folder(folder: Path):
    """A study package outside ``experiments/`` ($MEDSTACK_STUDIES), imported under its folder's name."""
    name = folder.name
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py", submodule_search_locations=[str(folder)])
    if spec is None or not (folder / "__init__.py").exists():
        raise ConfigError(f"${STUDIES_ENV}: {folder} is not a study package (no __init__.py)")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@lru_cache(maxsize=None)
def _declarations(extra: str) -> tuple[StudyDeclaration, ...]:
    found = []
    packages = [importlib.import_module(f"experiments.studies.{p.parent.name}") for p in sorted(STUDIES.glob("*/__init__.py"))]
    packages += [_load_folder(f) for f in study_folders(extra)]
    for package in packages:
        decl = getattr(package, "STUDY", None)
        if isinstance(decl, StudyDeclaration):
            found.append(replace(decl, package=package.__name__, folder=Path(package.__file__).parent))
    return tuple(found)


def declarations() -> tuple[StudyDeclaration, ...]:
    """Every study folder's declaration (their packages' ``__init__.py`` only: no study module is imported)."""
    return _declarations(os.environ.get(STUDIES_ENV, ""))


def commands() -> dict[str, tuple[Command, StudyDeclaration]]:
    """Every study command, with the declaration it comes from."""
    return {c.name: (c, d) for d in declarations() for c in d.commands}


@lru_cache(maxsize=None)
def _named(cls: type, name: str, tables: TableSource | None = None, formerly: tuple[str, ...] = ()) -> type:
    """The Study class named ``name``, with its paper tables and older names (a class shared by several commands,
    MediTOD's, gets one subclass each)."""
    return type(cls.__name__, (cls,), {"name": name, "tables": (tables,) if tables else (), "formerly": formerly,
                                       "__module__": cls.__module__, "__doc__": cls.__doc__})


def _entry(name: str) -> Command:
    c, d = commands()[name]
    made = _named(d.resolve(c.make), name, _tables_of(d) if c.tables else None, c.formerly)
    return replace(c, make=made, help=c.help + ("\n\n" + c.more.strip("\n") if c.more.strip() else ""), more="")


def get(name: str) -> Command:
    """One study command, importing its own folder's modules only."""
    if name not in commands():
        raise ConfigError(f"unknown study {name!r}; studies: {', '.join(sorted(commands()))}")
    return _entry(name)


def studies() -> dict[str, Command]:
    """Every study command (each study's modules imported)."""
    return _studies(os.environ.get(STUDIES_ENV, ""))


@lru_cache(maxsize=None)
def _studies(extra: str) -> dict[str, Command]:
    return {name: _entry(name) for name in commands()}


def kinds() -> dict[str, type[Study]]:
    """Every kind of results folder a study writes, by name, older names included: its commands' and those its
    declaration adds (``results``: calibrations, imports). Imports every study."""
    return {name: _kind(name) for d in declarations() for k in (*d.commands, *d.results) for name in (k.name, *k.formerly)}


def _kind(experiment: str) -> type[Study] | None:
    """The Study class of results folders of kind ``experiment`` (a name or an older one), importing its folder only."""
    for d in declarations():
        for c in d.commands:
            if experiment == c.name or experiment in c.formerly:
                return _entry(c.name).make
        for k in d.results:
            if experiment == k.name or experiment in k.formerly:
                return _named(d.resolve(k.make), k.name, None, k.formerly)
    return None


def named(cls: type) -> type:
    """``cls`` as the registry names it: the Study class a declaration's command or kind makes of it (a command that
    builds its study itself, a calibration, gets its one name from there)."""
    for d in declarations():
        for k in (*d.commands, *d.results):
            if isinstance(k.make, str) and k.make.endswith(f":{cls.__name__}") or k.make is cls:
                made = _kind(k.name)
                if made is not None and issubclass(made, cls):
                    return made
    raise ConfigError(f"{cls.__name__}: no study declaration makes it")


def study_for(experiment: str) -> Study | None:
    """A fresh instance of the study whose results folders are of kind ``experiment`` (config.yaml / identity.json);
    None for a kind no study declares."""
    cls = _kind(experiment) if experiment else None
    return cls() if cls is not None else None


def study_of(run: Run) -> Study | None:
    """The study of a results folder: by identity.json's kind, else config.yaml's."""
    return study_for(run.experiment) or study_for(str(run.config.get("experiment") or ""))


def open_run(path, *, lenient: bool = False) -> Run:
    """A results folder read by the one reader, its older records put in today's typed shape by their study
    (``Study.upgrade``, given config.yaml read into the study's settings class: results.settings_of)."""
    run = read_run(path, lenient=lenient)
    study = study_of(run)
    if study is not None and any(not is_typed(r) and r.get("status") != "failed" for r in run.records):
        settings = settings_of(run.config, study.settings_cls)
        run.records = [r if is_typed(r) or r.get("status") == "failed" else study.upgrade(r, settings) for r in run.records]
    return run
