"""The package imports form no cycle, never go up a layer, and follow docs/layout.md's Architecture table.

Every non-test .py file of the packages below is parsed (ast, not imported), and every import it makes is
an edge: top-level AND function-local ones, since an import moved into a function to dodge a cycle is
still that cycle, and ``importlib.import_module("...")`` with a literal name or an f-string's literal prefix.
The table (folder | responsible for | may import) is parsed and every edge between two folders checked
against it: the tools over results import no study folder; a study imports core, common, tables. Layers
(an import may go down or sideways, never up):

    layer 3  scripts/                the command line
    layer 2  experiments/, finetune/ studies, runner, tables, reports; LoRA fine-tuning
    layer 1  serving/                launching vLLM, the client, the response cache, CPU topology
    layer 0  models/                 registry, local weights, paths, errors, the fine-tuned prompt format

Cycles are checked between modules and between units (each study, each tool, each other ``experiments/<folder>``,
the serving benchmark and each other top-level package), so two studies, or a study and fine-tuning, never import each other either way.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"models": 0, "serving": 1, "experiments": 2, "finetune": 2, "scripts": 3}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in LAYERS:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _resolve(name: str, modules: dict) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _dynamic_name(node: ast.Call) -> str | None:
    """The module an ``importlib.import_module(...)`` / ``__import__(...)`` call names: its literal, or the literal
    prefix of an f-string cut back to whole package names (``f"experiments.{x}.study"`` -> ``experiments``)."""
    f = node.func
    named = (isinstance(f, ast.Attribute) and f.attr == "import_module") or (isinstance(f, ast.Name) and f.id in ("import_module", "__import__"))
    if not named or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        prefix = ""
        for part in arg.values:
            if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                break
            prefix += part.value
        return prefix.rpartition(".")[0] or None
    return None


def edges(source: str, mod: str, package: str, modules: dict) -> set[str]:
    """The project modules one file imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and (name := _dynamic_name(node)):
            names = [name]
        else:
            continue
        out.update(t for t in filter(None, (_resolve(n, modules) for n in names)) if t != mod)
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in the file)."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        graph[mod] |= edges(path.read_text(encoding="utf-8"), mod, package, modules)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


GROUPS = ("experiments.studies", "experiments.tools")  # folders of units: each study, each tool


def unit(module: str) -> str:
    """The unit a module belongs to: a study or a tool folder, another folder of experiments/, the serving
    benchmark, or a top-level package (``experiments`` for the packages that only hold units)."""
    parts = module.split(".")
    if ".".join(parts[:2]) in GROUPS:
        return ".".join(parts[:3]) if len(parts) > 2 else "experiments"
    if parts[:2] == ["serving", "bench"]:
        return "serving.bench"
    return ".".join(parts[:2]) if parts[0] == "experiments" and len(parts) > 1 else parts[0]


def test_the_walk_sees_function_local_and_importlib_imports():
    graph = import_graph()
    assert "models.errors" in graph["serving.launcher"]  # top-level
    assert "serving.session" in graph["experiments.tools.report.collect"]  # made inside a function only
    modules = _modules()
    src = ("import importlib\ndef f(x):\n    importlib.import_module('experiments.studies.craftmd.study')\n"
           "    importlib.import_module(f'experiments.studies.dera.{x}')\n    importlib.import_module(f'experiments.{x}.study')\n")
    assert edges(src, "experiments.tools.report.x", "experiments.tools.report", modules) == {"experiments.studies.craftmd.study", "experiments.studies.dera", "experiments"}


# ------------------------------------------------------------------ docs/layout.md's Architecture table

STUDY_ROW = "experiments/studies/<study>/"


def _unit_of_path(token: str) -> str:
    return unit(".".join(p for p in token.strip().strip("`").removesuffix(".py").split("/") if p))


def architecture() -> tuple[dict[str, str], dict[str, set[str] | None]]:
    """(unit -> its row, row -> the units it may import (None: everything)) from docs/layout.md's table."""
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8").split("## Architecture", 1)[1]
    table = next(block for block in text.split("\n\n") if block.startswith("| folder | responsible for | may import |"))
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    studies = {f"experiments.studies.{p.parent.name}" for p in (ROOT / "experiments" / "studies").glob("*/study.py")}
    row_of: dict[str, str] = {}
    allowed: dict[str, set[str] | None] = {}
    for line in rows:
        folders, _, may = [c.strip() for c in line.strip("|").split("|")]
        name = folders
        units = studies if STUDY_ROW in folders else {_unit_of_path(t) for t in re.findall(r"`([^`]+/)`", folders)}
        for u in units:
            assert u not in row_of, f"docs/layout.md: {u} is in two rows of the Architecture table"
            row_of[u] = name
        targets = set()
        for t in re.findall(r"`([^`]+)`", may):
            targets |= studies if t == STUDY_ROW else {_unit_of_path(t)}
        allowed[name] = None if may == "everything" else targets
    return row_of, allowed


def test_every_folder_has_a_row_of_the_architecture_table():
    row_of, _ = architecture()
    units = {unit(m) for m in _modules()} - {"experiments"}
    assert sorted(units - set(row_of)) == [], "folders without a row in docs/layout.md's Architecture table"
    assert {"experiments.studies.craftmd", "experiments.studies.dera", "experiments.studies.meditod", "experiments.studies.autoeval"} <= {u for u, r in row_of.items() if STUDY_ROW in r}


def test_every_import_follows_the_architecture_table():
    row_of, allowed = architecture()
    bad = sorted(f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
                 if unit(a) != unit(b) and unit(b) != "experiments" and (ok := allowed[row_of[unit(a)]]) is not None and unit(b) not in ok)
    assert bad == [], "imports docs/layout.md's Architecture table does not allow"


def test_tools_import_no_study():
    row_of, allowed = architecture()
    studies = {u for u, r in row_of.items() if STUDY_ROW in r}
    tools = {u for u, r in row_of.items() if "experiments/tools/report/" in r}
    assert {"experiments.tools.review", "experiments.tools.calibrate", "experiments.tools.compare", "experiments.tools.sweep", "experiments.tools.bench"} <= tools
    assert not studies & allowed[row_of["experiments.tools.report"]] and not studies & allowed[row_of["experiments.tables"]]


def test_no_import_cycle_between_modules():
    assert cycles(import_graph()) == []


def test_no_import_cycle_between_units():
    units: dict[str, set[str]] = defaultdict(set)
    for a, targets in import_graph().items():
        units[unit(a)].update(unit(b) for b in targets if unit(b) != unit(a))
    assert cycles(units) == []


def test_no_import_goes_up_a_layer():
    up = sorted(f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
                if LAYERS[b.split(".")[0]] > LAYERS[a.split(".")[0]])
    assert up == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _reaches(module: str, graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for b in graph.get(todo.pop(), ()):
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def test_declaring_a_study_reaches_no_command_line():
    """Core declares, the command line reads: the registry, a study's declaration and the scorers import neither the
    module that builds the commands nor typer (docs/layout.md, Architecture); nor do the paper tables import the
    registry (their declarations are handed to them)."""
    graph = import_graph()
    for module in ("experiments.core.registry", "experiments.core.scorers", "experiments.core.study", "experiments.core.runner"):
        assert "experiments.core.commands" not in _reaches(module, graph), module
        source = (ROOT / Path(*module.split("."))).with_suffix(".py").read_text(encoding="utf-8")
        assert not re.search(r"^\s*(import typer|from typer)", source, re.M), module
    assert not any(m.startswith("experiments.tables") and "experiments.core.registry" in targets for m, targets in graph.items())
