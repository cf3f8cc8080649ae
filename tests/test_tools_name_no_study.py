"""The tools over studies and their results (docs/layout.md) name no study, strings included: every .py file of
theirs (and every template the report and the review page render) is scanned for each study's names, taken from the registry (its commands, the folder it lives in, the
kinds of results folders it declares, its paper-table declaration's name and title), as whole words in any case,
and for dynamic imports (``importlib.import_module`` / ``__import__``) of anything but a literal module outside
the study folders. A tool reaches a study only through the registry."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from experiments.core import registry
from experiments.tables.build import declarations as load

ROOT = Path(__file__).resolve().parents[1]


def tool_files() -> list[Path]:
    folders = [ROOT / "experiments" / "tools", ROOT / "experiments" / "tables", ROOT / "serving" / "bench"]
    return [f for d in folders for ext in ("py", "j2", "js") for f in sorted(d.rglob(f"*.{ext}"))]


def declarations():
    return load(registry.table_sources())


def study_folders() -> set[str]:
    """The folders of the declared studies (each package with a StudyDeclaration)."""
    return {d.package.rpartition(".")[2] for d in registry.declarations() if d.package.startswith("experiments.")}


def study_names() -> set[str]:
    names = set(registry.studies()) | set(registry.commands()) | set(registry.kinds()) | study_folders()
    names |= {n for d in declarations() for n in (d.study, d.title, *d.experiments)}
    return {n for n in names if n}


def name_pattern(names) -> re.Pattern:
    words = sorted(names, key=len, reverse=True)
    return re.compile(r"(?<![\w])(" + "|".join(re.escape(w) for w in words) + r")(?![\w])", re.I)


def dynamic_imports(source: str, folders: set[str]) -> list[str]:
    """``import_module(...)`` / ``__import__(...)`` calls whose module is not a literal, or is a study folder's."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if not ((isinstance(f, ast.Attribute) and f.attr == "import_module") or (isinstance(f, ast.Name) and f.id in ("import_module", "__import__"))):
            continue
        arg = node.args[0] if node.args else None
        literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
        if not literal or arg.value.split(".")[:2] in [["experiments", x] for x in folders]:
            bad.append(f"line {node.lineno}: {ast.unparse(node)}")
    return bad


def test_names_come_from_the_registry():
    names = {n.lower() for n in study_names()}
    # every study command, every study folder, and the studies' display names are in the list the scan uses
    assert set(registry.commands()) <= names and {x.lower() for x in study_folders()} <= names
    assert {d.title.lower() for d in declarations()} <= names and len(study_folders()) >= 2


def test_the_scan_finds_what_it_looks_for():
    folder, command = sorted(study_folders())[0], sorted(registry.commands())[0]
    pat = name_pattern(study_names())
    assert pat.search(f"help: e.g. {command.upper()} runs") and pat.search(f"# see experiments/{folder}/x.py")
    assert not pat.search(f"x{folder}y and {command}_extra")  # a study's name inside another word is not it
    title = declarations()[0].title  # a study order, a registry look-up by name, a help string naming a paper's study
    assert all(pat.search(x) for x in (f"STUDY_ORDER = ('{command}',)", f"registry.get('{command}')", f'help="e.g. {title} runs"'))
    src = (f"import importlib\nimportlib.import_module('experiments.{folder}.study')\n"
           "importlib.import_module(f'experiments.{x}.cli')\nimportlib.import_module('experiments.core.registry')\n")
    assert [b.split(":")[0] for b in dynamic_imports(src, study_folders())] == ["line 2", "line 3"]


def test_tools_name_no_study():
    pat, folders = name_pattern(study_names()), study_folders()
    found = []
    for f in tool_files():
        text = f.read_text(encoding="utf-8")
        rel = f.relative_to(ROOT)
        for i, line in enumerate(text.splitlines(), 1):
            found += [f"{rel}:{i}: {m.group(0)!r}" for m in pat.finditer(line)]
        found += [f"{rel}: {b}" for b in (dynamic_imports(text, folders) if f.suffix == ".py" else [])]
    assert len(tool_files()) > 20 and not found, "a tool names a study:\n" + "\n".join(found)
