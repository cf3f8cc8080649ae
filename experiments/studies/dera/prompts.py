"""DERA's prompt templates: one file per role and step under ``prompts/``, read by the one loader
(:class:`experiments.core.prompts.PromptSet`); a record stores each template's hash (``prompt_hashes``).
"""

from __future__ import annotations

from pathlib import Path

from experiments.core.prompts import PromptSet

PROMPT_DIR = Path(__file__).with_name("prompts")
PROMPTS = PromptSet(PROMPT_DIR)


def render(name: str, **values) -> str:
    """The filled template as DERA sends it (one trailing newline)."""
    return PROMPTS.render(name, **values) + "\n"


def prompt_hash(name: str) -> str:
    return PROMPTS.hash(name)
