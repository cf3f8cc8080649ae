"""What a project that stands on its own never says: the design note it was built from (SPEC), issue numbers, a path
outside the repository (this machine's folders, the shared data folder, another user's home), or how its text was
written (who ran what, in which session or working copy) instead of what the project is and does.
Used by tests/test_standalone.py (tracked files, tests included, and every command's help) and tests/conftest.py
(every summary.md a test run writes)."""

from __future__ import annotations

import re

CITATIONS = {
    "the design note": re.compile(r"\bSPEC\b|SPEC\.md"),
    "an issue number": re.compile(r"\b(?:issue|pr|pull request)[- ]?#?\d+|\bissues?/\d+", re.I),
    "a machine path": re.compile(r"/work/|\.\./shared\b|/home/\w|ENVIRONMENT\.md|/tmp/(?!ray\b)[\w.-]+"),
    "narration": re.compile(
        r"\b(?:other|another|others'|several|seven|eight) (?:helpers?|sessions?|agents?|engineers?)\b|\bthe helper'?s?\b"
        r"|\bhelpers' |\b(?:this|that|the same|in the) session\b(?!'s server)|\bsession(?:'s)? time\b|\bworking cop(?:y|ies)\b"
        r"|\bworktrees?\b|\bcoordinator\b|\b(?:I|we) (?:ran|measured|tried)\b|\bthis branch\b|\bthe brief\b", re.I),
}
BARE_NUMBER = re.compile(r"(?<![\w&/#])#\d{1,5}\b(?![\w-])")  # "#35" in prose (markdown only: code has colours)
IN_TESTS = ("the design note", "an issue number", "narration")  # a test may name a machine path (a fixture's old home)


def citations(text: str, markdown: bool = False, kinds=tuple(CITATIONS)) -> list[str]:
    """``what: line`` for every line of ``text`` that cites something outside the project or narrates its making."""
    found = []
    for no, line in enumerate(text.splitlines(), 1):
        for what in kinds:
            if CITATIONS[what].search(line):
                found.append(f"{what}, line {no}: {line.strip()[:160]}")
        if markdown and BARE_NUMBER.search(line):
            found.append(f"an issue number, line {no}: {line.strip()[:160]}")
    return found
