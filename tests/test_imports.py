"""The package imports form no cycle and never go up a layer (issue 31, item 5).

Every non-test .py file of the packages below is parsed (ast, not imported), and every import it makes is
an edge: top-level AND function-local ones, since an import moved into a function to dodge a cycle is
still that cycle. Layers (an import may go down or sideways, never up):

    layer 3  scripts/                the command line
    layer 2  experiments/, finetune/ studies, runner, tables, reports; LoRA fine-tuning
    layer 1  serving/                launching vLLM, the client, the response cache, CPU topology
    layer 0  models/                 registry, local weights, paths, errors, the fine-tuned prompt format

Cycles are checked between modules and between units (each ``experiments/<folder>`` and each other
top-level package), so two studies, or a study and fine-tuning, never import each other either way.
"""

from __future__ import annotations

import ast
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


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in the file)."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in filter(None, (_resolve(n, modules) for n in names)):
                if target != mod:
                    graph[mod].add(target)
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


def unit(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "experiments" and len(parts) > 1 else parts[0]


def test_the_walk_sees_function_local_imports():
    graph = import_graph()
    assert "models.errors" in graph["serving.launcher"]  # top-level
    assert "experiments.core.results" in graph["experiments.craftmd.experts"]  # made inside a function only


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
