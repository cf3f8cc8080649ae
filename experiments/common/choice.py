"""The one multiple-choice mapper: a free-text reply -> a choice (CRAFT-MD answers and case answers, DERA letters).

:func:`map_choice`, one rule for every model, in order: ``exact`` (the whole reply is a choice text,
case/punctuation-insensitive); ``letter`` (:func:`pick_letter`) unless the text names a choice by
exact/stated/contains (models invent letters for unlettered lists; "A history of ..." is an article);
``stated`` (the choice right after a committing phrase: "the most likely diagnosis is X", "**Final
Diagnosis:** X"); ``contains`` (exactly one choice text occurs); ``first`` (several: the first mentioned,
unless the first two are joined by "or"/"vs"/"/" = a hedge); ``fuzzy`` (exactly one choice equal up to
spelling slips, :func:`same_but_typos`, or above a rapidfuzz threshold); else ``unparsed`` (scored wrong).
"""

from __future__ import annotations

import re

from experiments.common.normalize import normalize
from experiments.common.parsing import extract_after

LETTERS = "ABCDEFGHIJ"
MCQ_RULES = ("exact", "letter", "stated", "contains", "first", "fuzzy", "unparsed")
_STATED = re.compile(
    r"(?:final\s+diagnosis|(?:most\s+)?(?:likely|probable|correct|best|right|final)\s+(?:diagnosis|answer|choice|option)|"
    r"diagnosis|answer|choice|option|diagnosed\s+with|consistent\s+with|suggestive\s+of|likely\s+has|suffering\s+from)"
    r"[^.:\n]{0,60}?(?:\bis\b|\bwould\s+be\b|:|-|–)\s*\**\s*(.+)", re.I)
_HEDGE = re.compile(r"\b(or|vs|versus|and/or)\b|/", re.I)


def pick_letter(text: str, letters: str, *, loose: bool = False) -> str | None:
    """The letter (one of ``letters``) a reply picks, or None. Strict (CRAFT-MD): right after an answer/choice/
    option label (``Answer: B``, ``answer is (B)``) or alone at the start (``B)``, ``(B)``, a lone ``B``; not
    "A 22-year-old ..."). Loose (DERA): the first standalone letter after an ``Answer:`` label, else anywhere."""
    if not text or not letters:
        return None
    if loose:
        after = extract_after(text, "answer")
        found = (re.search(rf"(?<![A-Za-z])\(?([{letters}])\)?(?![A-Za-z])", c) for c in ([after] if after else []) + [text])
        return next((m.group(1) for m in found if m), None)
    t = text.strip()
    m = (re.search(rf"(?i:answer|choice|option)\**\s*(?:(?i:is))?\s*[:\-]?\s*\**\s*\(?([{letters}])(?![A-Za-z0-9])", t)
         or re.match(rf"^\W*\(?([{letters}])(?:[).:\]]|\s*$|\s*\n|\s+[-–:])", t))
    return m.group(1).upper() if m else None


def _mentions(text: str, choices: list[str]) -> tuple[list[tuple[int, int, int]], str]:
    """(start, end, choice index) of each choice text occurring in the normalized text, a choice
    contained in a longer mentioned choice not counted separately."""
    nt = normalize(text)
    found = []
    for i, c in enumerate(normalize(x) for x in choices):
        if not c:
            continue
        for m in re.finditer(rf"(?<![a-z0-9]){re.escape(c)}(?![a-z0-9])", nt):
            found.append((m.start(), m.end(), i))
    found = [f for f in found if not any(g != f and g[0] <= f[0] and f[1] <= g[1] and (g[1] - g[0]) > (f[1] - f[0]) for g in found)]
    return sorted(found), nt


def _stated_choice(text: str, choices: list[str]) -> int | None:
    """The choice named right after a committing phrase ("the most likely diagnosis is X")."""
    for m in _STATED.finditer(text):
        phrase = re.split(r"(?<=[a-z0-9)])[.;!?](?:\s|$)|\n", m.group(1).strip().strip("*").strip(), maxsplit=1)[0]
        idx, how = _by_text(phrase, choices, stated=False, first=False)
        if idx is not None:
            return idx
        found, _ = _mentions(phrase, choices)
        if found:
            return found[0][2]
    return None


def _first_choice(text: str, choices: list[str]) -> int | None:
    """The choice mentioned first when several are, unless the first two mentions are joined by a hedge."""
    found, nt = _mentions(text, choices)
    distinct = [f for k, f in enumerate(found) if k == 0 or found[k - 1][2] != f[2]]  # runs of one choice: its first mention
    if not distinct:
        return None
    if len({i for _, _, i in distinct}) > 1:
        between = nt[distinct[0][1]: distinct[1][0]]
        if _HEDGE.search(between) and len(between.split()) <= 4:
            return None
    return distinct[0][2]


def _fuzzy(nt: str, normed: list[str], threshold: float | None) -> int | None:
    if threshold is None:
        close = [i for i, c in enumerate(normed) if c and same_but_typos(nt, c)]
        return close[0] if len(close) == 1 else None
    from rapidfuzz import fuzz

    scores = sorted(((fuzz.token_set_ratio(nt, c), i) for i, c in enumerate(normed)), reverse=True) + [(-1, None)]
    return scores[0][1] if scores[0][0] >= threshold and scores[0][0] > scores[1][0] else None


def _by_text(text: str, choices: list[str], *, stated: bool = True, first: bool = True,
             fuzzy: float | None = None) -> tuple[int | None, str]:
    """Map by choice text only (no letters): exact > stated > contains > first > fuzzy."""
    if not text or not choices:
        return None, "unparsed"
    nt = normalize(text)
    normed = [normalize(c) for c in choices]
    for i, c in enumerate(normed):
        if c and nt == c:
            return i, "exact"
    if stated:
        idx = _stated_choice(text, choices)
        if idx is not None:
            return idx, "stated"
    found, _ = _mentions(text, choices)
    distinct = {i for _, _, i in found}
    if len(distinct) == 1:
        return distinct.pop(), "contains"
    if len(distinct) > 1:
        idx = _first_choice(text, choices) if first else None
        return (idx, "first") if idx is not None else (None, "unparsed")
    idx = _fuzzy(nt, normed, fuzzy)
    return (idx, "fuzzy") if idx is not None else (None, "unparsed")


def same_but_typos(a: str, b: str) -> bool:
    """The ``fuzzy`` MCQ rule: two normalized texts name the same thing up to spelling slips.

    Words compared leave out "the" and a possessive "s" ("Alzheimer's disease" = "Alzheimer
    disease"). Either the words are equal once spaces are removed ("lymphogranulomavenereum"), or
    they are the same words except for one-letter slips (one insertion, deletion, substitution or
    swap, in words of 5+ letters) and the texts are >= 95 % alike (rapidfuzz ratio). So a different
    ending ("endometriosis" / "endometritis"), a different short word ("hepatitis a" / "b", "cd4" /
    "cd8") or a slip in a single short name ("dysphagia" / "dysphasia") is no match.
    """
    from rapidfuzz import fuzz
    from rapidfuzz.distance import OSA

    wa, wb = ([w for w in x.split() if w not in ("the", "s")] for x in (a, b))
    if "".join(wa) == "".join(wb):
        return bool(wa)
    if len(wa) != len(wb) or fuzz.ratio(" ".join(wa), " ".join(wb)) < 95:
        return False
    return all(x == y or (max(len(x), len(y)) >= 5 and OSA.distance(x, y) == 1) for x, y in zip(wa, wb))


def map_choice(text: str, choices: list[str], *, letters: bool = True, stated: bool = True, first: bool = True,
               fuzzy: float | None = None) -> tuple[int | None, str]:
    """Free-text answer -> (choice index or None, rule that decided; module docstring). The switches leave steps
    out; ``fuzzy``: None = spelling slips, a number = rapidfuzz ``token_set_ratio`` >= it, strictly the best."""
    if not text or not choices:
        return None, "unparsed"
    tidx, thow = _by_text(text, choices, stated=stated, first=first, fuzzy=fuzzy)
    if thow == "exact" or not letters:
        return tidx, thow
    letter = pick_letter(text, LETTERS[: len(choices)])
    if letter is not None:
        lidx = LETTERS.index(letter)
        if tidx is not None and tidx != lidx and (thow in ("stated", "contains") or (thow == "fuzzy" and re.match(r"^\W*[A-J]\.", choices[tidx]))):
            return tidx, thow
        article = re.search(r"(?:^|(?:answer|choice|option)\W*(?:is)?\W*)A\s+[a-z]", text.strip(), flags=re.I) and not re.search(r"\(A\)|\bA[.):]", text)
        if not article:
            return lidx, "letter"
    return tidx, thow
