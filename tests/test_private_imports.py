"""No module imports a private name (``_x``) from another package, or from a private module; nothing builds on
CPython's private regex parser (``re._parser``, ``sre_parse``, ``re._constants``). Parsed with ast, not imported;
the tests may reach into the module they test."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "serving", "experiments", "finetune", "scripts")
REGEX_INTERNALS = {"sre_parse", "sre_compile", "sre_constants", "re._parser", "re._compiler", "re._constants", "re._casefix"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(root: Path = ROOT) -> list[str]:
    """'file:line: what' for every import of a private name from another package or of the regex internals."""
    found = []
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            package = ".".join(parts[:-1])
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
                if isinstance(node, ast.Import):
                    pairs = [(a.name, None) for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    pairs = [(node.module or "", a.name) for a in node.names]
                else:
                    continue  # a relative import stays in its package
                for module, name in pairs:
                    where = f"{f.relative_to(root)}:{node.lineno}"
                    full = f"{module}.{name}" if name else module
                    if module in REGEX_INTERNALS or full in REGEX_INTERNALS:
                        found.append(f"{where}: {full} (CPython's private regex parser)")
                    elif any(_private(p) for p in module.split(".")):
                        found.append(f"{where}: {module} (a private module)")
                    elif name and _private(name) and not (module == package or module.startswith(package + ".")):
                        found.append(f"{where}: {name} from {module}")
    return found


def test_no_private_name_is_imported_across_packages():
    assert not private_imports(), "private imports:\n" + "\n".join(private_imports())


def test_the_check_finds_each_kind(tmp_path):
    pkg = tmp_path / "experiments" / "x"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from serving.launcher import _kill\nfrom re import _parser\nimport sre_parse\n"
                              "from experiments.x.b import _same_package\nfrom . import _relative\n")
    found = private_imports(tmp_path)
    assert [line.split(": ", 1)[1] for line in found] == [
        "_kill from serving.launcher", "re._parser (CPython's private regex parser)", "sre_parse (CPython's private regex parser)"]
