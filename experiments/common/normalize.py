"""The one word normaliser: a text as the words it is compared or scored in. ``split``, what a word is: ``alnum`` a run
of ASCII letters and digits, anything else separating (choice texts, CRAFT-MD's exact match and word overlap);
``letters`` a run of Unicode letters and digits (patient checks); ``punct`` words between whitespace with each ASCII
punctuation mark a word (MediTOD's NLG normalization); ``space`` words between whitespace. ``lower``: lower-case first;
``drop_apostrophes``: ' ’ ` removed first ("Crohn's" one word); ``stop``: words left out; ``singular``: a word of more
than three characters loses its trailing s's."""

from __future__ import annotations

import re
import string

_PUNCT = re.compile("([" + re.escape(string.punctuation) + "])")
_SPLIT = {"alnum": re.compile(r"[a-z0-9]+").findall, "letters": re.compile(r"[^\W_]+").findall,
          "punct": lambda t: _PUNCT.sub(r" \1 ", t).split(), "space": str.split}


def words(text: str | None, *, split: str = "alnum", lower: bool = True, drop_apostrophes: bool = False,
          stop: frozenset[str] | set[str] = frozenset(), singular: bool = False) -> list[str]:
    t = text or ""
    if drop_apostrophes:
        t = re.sub(r"['’`]", "", t)
    out = _SPLIT[split](t.lower() if lower else t)
    if stop:
        out = [w for w in out if w not in stop]
    return [w.rstrip("s") if len(w) > 3 else w for w in out] if singular else out


def normalize(text: str | None, **options) -> str:
    """The words of :func:`words` joined by one space: the form two texts are compared in."""
    return " ".join(words(text, **options))
