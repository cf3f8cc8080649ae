"""Prompt templates: one ``string.Template`` text file per prompt in a study's ``prompts/`` folder.

A missing value is an error naming the template and the placeholder. Records and the results directory keep the
templates' hashes, so a resumed run never mixes prompt versions. ``constraint(name)`` returns a step's declared
reply format (docs/constrained-answers.md).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from string import Template

from experiments.core.constraints import DECLARATION_FILE, build, read_declarations
from models.errors import MedstackError


class PromptError(MedstackError):
    """A missing template or placeholder value."""


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class PromptSet:
    """The templates of one study folder, read once."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    @lru_cache(maxsize=None)
    def text(self, name: str) -> str:
        path = self.folder / (name if name.endswith(".txt") else f"{name}.txt")
        if not path.exists():
            have = ", ".join(sorted(p.stem for p in self.folder.glob("*.txt")))
            raise PromptError(f"no prompt template {name!r} in {self.folder} (have: {have})")
        return path.read_text(encoding="utf-8")

    def render(self, name: str, **values) -> str:
        try:
            return Template(self.text(name)).substitute({k: "" if v is None else str(v) for k, v in values.items()}).strip()
        except KeyError as e:
            raise PromptError(f"prompt template {self.folder / name} needs a value for {e}") from None
        except ValueError as e:
            raise PromptError(f"prompt template {self.folder / name}: {e}") from None

    def hash(self, *names: str) -> str:
        """One hash over the named templates (order matters)."""
        return _sha("\x00".join(self.text(n) for n in names))

    def hashes(self, names) -> dict[str, str]:
        return {n: self.hash(n) for n in sorted(set(names))}

    @lru_cache(maxsize=None)
    def declarations(self) -> dict:
        return read_declarations(self.folder / DECLARATION_FILE)

    def constraint(self, name: str, **values):
        """The declared output format of template ``name`` (a Constraint), or None for a free-text step."""
        decl = self.declarations().get(name[:-4] if name.endswith(".txt") else name)
        return build(decl, values, f"{self.folder.name}/constraints.yaml: {name}") if decl else None

    def constraint_file_hash(self) -> dict[str, str]:
        """{constraints.yaml: hash} when the folder declares constraints (pinned by constrained runs)."""
        path = self.folder / DECLARATION_FILE
        return {DECLARATION_FILE: _sha(path.read_text(encoding="utf-8"))} if path.exists() else {}

    def file_hashes(self) -> dict[str, str]:
        """Every template file in the folder -> hash (what a results directory pins)."""
        return {p.name: _sha(p.read_text(encoding="utf-8")) for p in sorted(self.folder.glob("*.txt"))}
