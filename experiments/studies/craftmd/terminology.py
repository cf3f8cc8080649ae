"""Q3 without a model: does the patient-AI use medical terminology? A fixed term list (terminology.tsv beside this
file) matched in the patient's lines only, as the study README (`medstack calibrate conversations`) describes.
"""

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
            term, lay = (line.split("\t") + [""])[:2]  # term, everyday words, why (the reason column is for readers)
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
