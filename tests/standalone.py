"""What a project that stands on its own never cites: the design note it was built from (SPEC), issue numbers,
or a path outside the repository (this machine's folders, the shared data folder, another user's home).
Used by tests/test_standalone.py (tracked files) and tests/conftest.py (every summary.md a test run writes)."""

from __future__ import annotations

import re

CITATIONS = {
    "the design note": re.compile(r"\bSPEC\b|SPEC\.md"),
    "an issue number": re.compile(r"\b(?:issue|pr|pull request)[- ]?#?\d+|\bissues?/\d+", re.I),
    "a machine path": re.compile(r"/work/|\.\./shared\b|/home/\w|ENVIRONMENT\.md|/tmp/(?!ray\b)[\w.-]+"),
}
BARE_NUMBER = re.compile(r"(?<![\w&/#])#\d{1,5}\b(?![\w-])")  # "#35" in prose (markdown only: code has colours)


def citations(text: str, markdown: bool = False) -> list[str]:
    """``what: line`` for every line of ``text`` that cites something outside the project."""
    found = []
    for no, line in enumerate(text.splitlines(), 1):
        for what, pattern in CITATIONS.items():
            if pattern.search(line):
                found.append(f"{what}, line {no}: {line.strip()[:160]}")
        if markdown and BARE_NUMBER.search(line):
            found.append(f"an issue number, line {no}: {line.strip()[:160]}")
    return found
