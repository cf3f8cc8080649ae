"""The study registry. Each study folder declares once, in its package's ``__init__.py``, everything it adds:
``STUDY = StudyDeclaration(commands=(Command(...), ...), tables=..., adapter=..., results=..., cli=...)`` (docs/layout.md,
Adding a study, shows one). A reference ``"module:attr"`` names something in the folder, imported when used (or the
object itself: a study declared in one file). Each command's Study class carries its settings, roles, strata and
results (``Study.results``). Found by layout: every ``experiments/studies/<folder>/__init__.py`` that declares ``STUDY``, and
each folder ``$MEDSTACK_STUDIES`` names (os.pathsep-separated; loaded under its folder's name). `medstack --help` lists
the commands from the declarations alone.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

from experiments.core.commands import lazy_group, study_command
from experiments.core.config import ConfigError
from experiments.core.results import Run, read_run, settings_of, upgrade_record
from experiments.core.study import Study, StudyResults
from experiments.datasets.registry import STUDIES_ENV, study_folders

EXPERIMENTS = Path(__file__).resolve().parent.parent
STUDIES = EXPERIMENTS / "studies"  # one folder per study


@dataclass(frozen=True)
class Command:
    """One study command: `medstack run NAME` (`medstack NAME` when ``top_level``). As :func:`get` returns it, ``make``
    is the object and ``help`` the whole help."""

    name: str
    help: str  # the help's first paragraph, as `medstack --help` lists it (the only copy)
    make: Any  # the Study class or a factory: "module:attr" in the folder, or the object
    more: str = ""  # the paragraphs after the first, in the command's own --help
    top_level: bool = False
    fixed: dict = field(default_factory=dict)  # settings the command fixes (MediTOD's task)


@dataclass(frozen=True)
class StudyDeclaration:
    """Everything one study folder adds to medstack (the module docstring shows one)."""

    commands: tuple[Command, ...]
    tables: str | None = None  # its paper_tables.yaml, beside __init__.py (experiments/tables/declare.py)
    adapter: Any = None  # the tables' PaperAdapter (experiments/tables/adapter.py)
    results: tuple = ()  # StudyResults of more kinds of results folders than its commands write (its calibrations, imports)
    cli: dict[str, Any] = field(default_factory=dict)  # its other commands: "GROUP NAME" -> the typer function
    package: str = ""  # set when found: the package's import name
    folder: Path | None = None  # set when found

    def resolve(self, ref):
        """A ``"module:attr"`` reference of this folder -> the object (anything else is the object already)."""
        if not isinstance(ref, str):
            return ref
        module, _, attr = ref.partition(":")
        return getattr(importlib.import_module(f"{self.package}.{module}"), attr)


@dataclass
class Loaded:
    """The study commands with their modules imported, and the kinds of results folders they declare."""

    studies: dict[str, Command]
    results: dict[str, StudyResults]


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


def loaded() -> Loaded:
    """Every study imported: its commands, the kinds of results folders they declare."""
    return _loaded(os.environ.get(STUDIES_ENV, ""))


@lru_cache(maxsize=None)
def _loaded(extra: str) -> Loaded:
    out = Loaded({}, {})
    for name in commands():
        out.studies[name] = entry = _entry(name)
        if isinstance(results := entry.make().results, StudyResults):
            out.results[results.experiment] = results
    for d in declarations():
        out.results.update({more.experiment: more for more in map(d.resolve, d.results)})
    return out


def _entry(name: str) -> Command:
    c, d = commands()[name]
    return replace(c, make=d.resolve(c.make), help=c.help + ("\n\n" + c.more.strip("\n") if c.more.strip() else ""), more="")


def studies() -> dict[str, Command]:
    """Every study command (each study's modules imported)."""
    return loaded().studies


def get(name: str) -> Command:
    """One study command, importing its own folder's modules only."""
    if name not in commands():
        raise ConfigError(f"unknown study {name!r}; studies: {', '.join(sorted(commands()))}")
    return _entry(name)


def _command(name: str):
    """The click command of one study: its folder's study module imported now (experiments/core/commands.py lazy_group)."""
    import typer

    one = typer.Typer()
    one.command(name)(study_command(get(name)))
    return typer.main.get_command(one)


def register_all(app, run_app, **apps) -> None:
    """Plug every study command and every other command into `medstack`: the study commands are listed from their
    declarations without importing a study module; each declaration's ``cli`` adds its other commands to their group
    (``import``, ``calibrate``, ...); every tool folder's ``cli.py`` and ``finetune/cli.py`` add theirs."""
    lazy: dict[bool, dict] = {True: {}, False: {}}
    for name, (c, _) in commands().items():
        lazy[c.top_level][name] = (c.help, partial(_command, name))
    app.info.cls, run_app.info.cls = lazy_group(lazy[True]), lazy_group(lazy[False])
    found = sorted(EXPERIMENTS.glob("*/cli.py")) + sorted(EXPERIMENTS.glob("tools/*/cli.py"))  # the framework's and the tools'
    tools = [".".join(p.relative_to(EXPERIMENTS.parent).with_suffix("").parts) for p in found]
    for module in tools + ["finetune.cli"]:
        importlib.import_module(module).register(app=app, run_app=run_app, **apps)
    groups = {"": app, "run": run_app, **{k.removesuffix("_app"): v for k, v in apps.items()}}
    for d in declarations():
        for where, ref in d.cli.items():
            group, _, name = where.rpartition(" ")
            if group in groups:  # an app built without that group (tests) leaves its commands out
                groups[group].command(name)(d.resolve(ref))


def results_for(experiment: str) -> StudyResults | None:
    """What the study of results folders of ``experiment`` (config.yaml) declares; None for a kind no study declares."""
    return loaded().results.get(experiment)


def results_of(run: Run) -> StudyResults | None:
    """What is declared about this run's kind: by :attr:`Run.experiment` (identity.json's, the study command's name),
    else by config.yaml's ``experiment`` (they differ where a command's name is not its settings' experiment:
    ``meld`` / ``craftmd-meld``, ``calibrate-conversations`` / ``calibrate-craftmd-conversations``)."""
    return results_for(run.experiment) or results_for(str(run.config.get("experiment") or ""))


def open_run(path, *, lenient: bool = False) -> Run:
    """A results folder read by the one reader, its older records upgraded by their study (typed scores included,
    given config.yaml read into the study's settings class: results.settings_of)."""
    run = read_run(path, lenient=lenient)
    declared = results_of(run)
    if declared is not None and (declared.upgrade or declared.scores):
        study = study_of(run.experiment) or study_of(str(run.config.get("experiment") or ""))
        settings = settings_of(run.config, study.settings_cls if study else None)
        run.records = [upgrade_record(r, settings, declared.upgrade, declared.scores) for r in run.records]
    return run


def study_of(experiment: str) -> Study | None:
    """A fresh instance of the study whose runs are results folders of ``experiment`` (identity.json / config.yaml):
    its ``settings_cls`` validates such a folder's config.yaml, its ``prompts`` are the ones the run used. None when
    no registered study writes them."""
    made = [entry.make() for entry in studies().values()]
    return (next((s for s in made if s.results is not None and s.results.experiment == experiment), None)
            or next((s for s in made if s.name == experiment), None))
