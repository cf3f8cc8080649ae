"""Prompt templates: one file per role and step under ``prompts/``, filled with ``string.Template``.

Every record stores the sha256 (first 12 hex digits) of each template it used, so a run
says exactly which prompt text produced it.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from string import Template

from models.errors import MedstackError

PROMPT_DIR = Path(__file__).with_name("prompts")


@lru_cache(maxsize=None)
def template_text(name: str) -> str:
    path = PROMPT_DIR / f"{name}.txt"
    if not path.exists():
        valid = ", ".join(sorted(p.stem for p in PROMPT_DIR.glob("*.txt")))
        raise MedstackError(f"no prompt template {name!r} in {PROMPT_DIR} (have: {valid})")
    return path.read_text(encoding="utf-8")


def prompt_hash(name: str) -> str:
    return hashlib.sha256(template_text(name).encode()).hexdigest()[:12]


def render(name: str, **values) -> str:
    try:
        return Template(template_text(name)).substitute({k: "" if v is None else str(v) for k, v in values.items()}).strip() + "\n"
    except KeyError as e:
        raise MedstackError(f"prompt template {name!r} needs a value for {e}") from None
