"""Q3 without a model: does the patient-AI use medical terminology? A fixed term list (terminology.tsv beside this
file: medical words a patient would say in everyday words, with its sources in its header) matched in the patient's
lines only: case-insensitive, whole words, a term also with -s or -es added. The list was written and committed
before it was scored against the dermatologists' Q3 labels, and is never tuned on them (docs/protocols.md gives the
measured agreement)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

TERMS_FILE = Path(__file__).with_name("terminology.tsv")


@lru_cache(maxsize=None)
def terms() -> dict[str, str]:
    """term -> the everyday words a patient would use."""
    out = {}
    for line in TERMS_FILE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            term, _, lay = line.partition("\t")
            out[term.strip().lower()] = lay.strip()
    return out


@lru_cache(maxsize=None)
def _pattern() -> re.Pattern:
    alternatives = sorted((re.escape(t) for t in terms()), key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(alternatives) + r")(?:e?s)?\b", re.IGNORECASE)


def medical_terms(text: str) -> list[str]:
    """The listed terms in ``text``, each once, in the order met (as listed: the singular form)."""
    return list(dict.fromkeys(m.group(1).lower() for m in _pattern().finditer(text or "")))


def terminology_check(turns: list[tuple[str, str]]) -> dict:
    """``{"verdict": True when a patient line holds a listed term, "terms": [...]}`` over ``(role, text)`` turns."""
    found = medical_terms("\n".join(text for role, text in turns if role == "patient"))
    return {"verdict": bool(found), "terms": found}
