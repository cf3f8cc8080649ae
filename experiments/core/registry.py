"""The study registry. Each study folder's ``study.py`` says once what its studies are:

    register_study("craftmd", CraftmdStudy, help="...")      # `medstack run craftmd`; flags from CraftmdStudy.settings_cls
    register_tables(HERE / "paper_tables.yaml", ADAPTER)      # its paper tables and their adapter

`medstack run`, ``--dry-run``, ``sweep``, ``report``, ``compare`` and the tables read it. Found by layout: every
``experiments/*/study.py`` is imported once when all studies are asked for; the command line lists the commands a
folder's ``__init__.py`` declares (``COMMANDS``, ``TOP_LEVEL``) and imports a study.py only when its command runs or
shows its --help. Every ``experiments/*/cli.py`` and ``finetune/cli.py`` adds its other commands.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

from experiments.core.commands import lazy_group, study_command
from experiments.core.config import ConfigError
from experiments.core.results import Run, read_run, settings_of, upgrade_record
from experiments.core.study import Study, StudyResults

EXPERIMENTS = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class StudyEntry:
    name: str  # the command: `medstack run NAME` (`medstack NAME` when top_level)
    make: Callable[[], Study]  # the Study class (or a factory)
    help: str
    top_level: bool = False
    fixed: dict = field(default_factory=dict)  # settings the command fixes (MediTOD's task)


@dataclass(frozen=True)
class PaperTables:
    path: Path  # the study's paper_tables.yaml (experiments/tables/declare.py)
    adapter: Any  # its experiments.tables.adapter.PaperAdapter


STUDIES: dict[str, StudyEntry] = {}
TABLES: dict[str, PaperTables] = {}
RESULTS: dict[str, StudyResults] = {}  # experiment -> what its study declares about its results folders


def register_study(name: str, study: Callable[[], Study], *, help: str = "", top_level: bool = False, fixed: dict | None = None) -> None:
    """Register a study command. Where its folder's ``__init__.py`` declares it (``COMMANDS``, ``TOP_LEVEL``), the help's
    first paragraph and the command's place come from there, and ``help`` adds only the paragraphs after it."""
    if name in (decl := declared()):
        help, top_level = decl[name][1] + ("\n\n" + help.strip("\n") if help.strip() else ""), decl[name][2]
    STUDIES[name] = StudyEntry(name, study, help, top_level, fixed or {})
    if isinstance(getattr(study, "results", None), StudyResults):
        register_results(study.results)


def register_tables(path: Path, adapter: Any) -> None:
    TABLES[str(path)] = PaperTables(path, adapter)


def _modules(file: str) -> list[str]:
    return [f"experiments.{p.parent.name}.{p.stem}" for p in sorted(EXPERIMENTS.glob(f"*/{file}"))]


def studies() -> dict[str, StudyEntry]:
    """Every registered study (importing each study folder's ``study.py`` registers it)."""
    for module in _modules("study.py"):
        importlib.import_module(module)
    return STUDIES


def declared() -> dict[str, tuple[str, str, bool]]:
    """Every study command a folder declares in its ``__init__.py`` (``COMMANDS``: name -> help, ``TOP_LEVEL``), as
    (folder's study module, help, top level), read without importing any ``study.py``."""
    out = {}
    for module in _modules("study.py"):
        package = importlib.import_module(module.rpartition(".")[0])
        top = set(getattr(package, "TOP_LEVEL", ()))
        out.update({name: (module, help, name in top) for name, help in getattr(package, "COMMANDS", {}).items()})
    return out


def get(name: str) -> StudyEntry:
    module = declared().get(name, (None,))[0]
    if module and name not in STUDIES:  # a declared study: import its folder's study.py only
        importlib.import_module(module)
    if name not in STUDIES and name not in studies():
        raise ConfigError(f"unknown study {name!r}; studies: {', '.join(sorted(STUDIES))}")
    return STUDIES[name]


def paper_tables() -> list[PaperTables]:
    studies()
    return list(TABLES.values())


def _command(name: str):
    """The click command of one study: its folder's study.py imported now (experiments/core/commands.py lazy_group)."""
    import typer

    one = typer.Typer()
    one.command(name)(study_command(get(name)))
    return typer.main.get_command(one)


def register_all(app, run_app, **apps) -> None:
    """Plug every study command and every folder's other commands into `medstack`. A study its folder declares
    (``declared()``) is listed without importing its study.py; any other is imported and registered now."""
    lazy: dict[bool, dict] = {True: {}, False: {}}
    for name, (_, help, top) in declared().items():
        lazy[top][name] = (help, partial(_command, name))
    folders = {module for module, _, _ in declared().values()}
    for module in _modules("study.py"):
        if module not in folders:
            importlib.import_module(module)
    for entry in STUDIES.values():
        (app if entry.top_level else run_app).command(entry.name)(study_command(entry))
    app.info.cls, run_app.info.cls = lazy_group(lazy[True]), lazy_group(lazy[False])
    for module in _modules("cli.py") + ["finetune.cli"]:
        importlib.import_module(module).register(app=app, run_app=run_app, **apps)


def register_results(results: StudyResults) -> None:
    RESULTS[results.experiment] = results


def results_for(experiment: str) -> StudyResults | None:
    """What the study of results folders of ``experiment`` (config.yaml) declares; None for a kind no study declares."""
    studies()
    return RESULTS.get(experiment)


def results_of(run: Run) -> StudyResults | None:
    """What is declared about this run's kind: by :attr:`Run.experiment` (identity.json's, the study command's name),
    else by config.yaml's ``experiment`` (they differ where a command's name is not its settings' experiment:
    ``meld`` / ``craftmd-meld``, ``calibrate-conversations`` / ``calibrate-craftmd-conversations``)."""
    return results_for(run.experiment) or results_for(str(run.config.get("experiment") or ""))


def open_run(path, *, lenient: bool = False) -> Run:
    """A results folder read by the one reader, its older records upgraded by their study (typed scores included)."""
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
