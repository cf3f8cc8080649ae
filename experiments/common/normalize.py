"""The one word normaliser: a text as the words it is compared or scored in, with named options.

``split`` says what a word is:

- ``"alnum"``: a run of ASCII letters and digits (after lower-casing); anything else separates, accented letters
  included (``"café"`` -> ``caf``). Choice texts, CRAFT-MD's exact match and its word overlap.
- ``"letters"``: a run of Unicode letters and digits (``"café"`` stays whole). CRAFT-MD's patient checks.
- ``"punct"``: words between whitespace, each ASCII punctuation mark a word of its own (``"b)."`` -> ``b ) .``).
  MediTOD's NLG normalization (BLEU; ROUGE's own tokenizer keeps ASCII letters and digits only).
- ``"space"``: words between whitespace, as written.

``lower``: lower-case first; ``drop_apostrophes``: remove ``'``, ``’`` and `````` first, so ``"Crohn's"`` is one word;
``stop``: words left out; ``singular``: a word longer than three characters loses its trailing ``s``\\ es (``spots`` ->
``spot``).
"""

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
