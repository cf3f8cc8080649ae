"""Prompt templates (files in prompts/), filled with str.format; each record stores their hashes."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

PROMPT_DIR = Path(__file__).with_name("prompts")


@lru_cache(maxsize=None)
def template(name: str) -> str:
    return (PROMPT_DIR / f"{name}.txt").read_text(encoding="utf-8").strip()


def render(name: str, **fields) -> str:
    return template(name).format(**fields)


def prompt_hash(name: str) -> str:
    return hashlib.sha256(template(name).encode()).hexdigest()[:12]


def hashes(names) -> dict[str, str]:
    return {n: prompt_hash(n) for n in sorted(set(names))}
