"""Pure scoring logic for CRAFT-MD answers (no model calls): MCQ choice, grader replies, subtype rule.

FRQ grading has two grader-AI steps; this module turns their replies into scores:
1. extraction reply -> (diagnosis, status); status ``multiple`` (alternatives: "a or b") or
   ``none`` scores 0 without step 2. Status ``concurrent`` ("a, b": several diagnoses named as
   present together) depends on the concurrent-diagnosis rule (SPEC section 3):
   ``zero`` (SPEC's grader; the default) scores it 0 like "Multiple"; ``any`` (the authors'
   released grades) grades each named diagnosis and scores 1 when any matches.
2. equivalence reply -> verdict (one per given diagnosis). Only an answer equal to the correct
   one after normalization (case, punctuation, apostrophes, whitespace) is scored without asking:
   no word-set shortcut may decide a match ("Cushing disease" vs "Cushing syndrome" is asked).
   If a verdict cannot be parsed, a lexical form of the subtype rule decides when it can (word
   sets: the correct answer's words include all the given diagnosis' words = correct is a subtype
   of the given one -> match; the given one has extra words = more specific subtype -> no match);
   otherwise the answer is *unscored* (correct=None) and counted, never silently 0.

MCQ mapping (:func:`map_choice`, one rule for every model, local or imported): letter; exact
choice text; the choice a committing phrase names ("the diagnosis is X", "answer: X", "Final
Diagnosis: X"); exactly one choice text contained; the choice mentioned first when several are
(unless the first two are joined by "or"/"vs" = a hedge); one choice equal up to spelling slips
(``fuzzy``, :func:`same_but_typos`); else unparsed.
"""

from __future__ import annotations

import re

from experiments.common.parsing import _norm, extract_after, extract_verdict, match_choice

CONCURRENT_RULES = ("zero", "any")
# words ignored by the lexical fallback; "disease", "syndrome", "disorder" are NOT among them:
# "Cushing disease" and "Cushing syndrome" are different diagnoses (one is a subtype of the other)
_STOP = {"the", "a", "an", "of", "and", "with", "to", "due", "in", "s"}


def normalize(s: str | None) -> str:
    """Case, apostrophes, punctuation and whitespace removed: the only equality that skips the grader."""
    s = re.sub(r"['’`]", "", (s or "").lower())
    return re.sub(r"\s+", " ", re.sub(r"[^a-z0-9]+", " ", s)).strip()


def check_rule(rule: str) -> str:
    if rule not in CONCURRENT_RULES:
        raise ValueError(f"unknown concurrent-diagnosis rule {rule!r}; valid: {', '.join(CONCURRENT_RULES)}")
    return rule


def words(s: str) -> set[str]:
    toks = re.findall(r"[a-z0-9]+", (s or "").lower())
    return {t.rstrip("s") if len(t) > 3 else t for t in toks if t not in _STOP}


def parse_mcq(reply: str, choices: list[str], answer_index: int | None) -> dict:
    """Parsed MCQ answer: chosen index (or None = refusal/unparsed, scored wrong) and correctness."""
    idx, how = map_choice(reply, choices)
    out = {"answer": reply, "choice": idx, "choice_text": choices[idx] if idx is not None else None, "parsed_by": how}
    if answer_index is None:
        out["correct"] = None  # the case's answer matches none of its choices: unscorable, counted
        out["unscored_reason"] = "answer_not_in_choices"
    else:
        out["correct"] = int(idx == answer_index)
    return out


# -- MCQ mapping ----------------------------------------------------------------------------------

MCQ_RULES = ("exact", "letter", "stated", "contains", "first", "fuzzy", "unparsed")
_STATED = re.compile(
    r"(?:final\s+diagnosis|(?:most\s+)?(?:likely|probable|correct|best|right|final)\s+(?:diagnosis|answer|choice|option)|"
    r"diagnosis|answer|choice|option|diagnosed\s+with|consistent\s+with|suggestive\s+of|likely\s+has|suffering\s+from)"
    r"[^.:\n]{0,60}?(?:\bis\b|\bwould\s+be\b|:|-|–)\s*\**\s*(.+)", re.I)
_HEDGE = re.compile(r"\b(or|vs|versus|and/or)\b|/", re.I)


def _mentions(text: str, choices: list[str]) -> tuple[list[tuple[int, int, int]], str]:
    """(start, end, choice index) of each choice text occurring in the normalized text, a choice
    contained in a longer mentioned choice not counted separately."""
    nt = _norm(text)
    found = []
    for i, c in enumerate(_norm(x) for x in choices):
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
    distinct = []
    for start, end, i in found:
        if not distinct or distinct[-1][2] != i:
            distinct.append((start, end, i))
    if not distinct:
        return None
    if len({i for _, _, i in distinct}) > 1:
        between = nt[distinct[0][1]: distinct[1][0]]
        if _HEDGE.search(between) and len(between.split()) <= 4:
            return None
    return distinct[0][2]


def _by_text(text: str, choices: list[str], *, stated: bool = True, first: bool = True) -> tuple[int | None, str]:
    """Map by choice text only (no letters): exact > stated > contains > first > fuzzy."""
    if not text or not choices:
        return None, "unparsed"
    nt = _norm(text)
    normed = [_norm(c) for c in choices]
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
    close = [i for i, c in enumerate(normed) if c and same_but_typos(nt, c)]
    if len(close) == 1:
        return close[0], "fuzzy"
    return None, "unparsed"


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


def map_choice(text: str, choices: list[str]) -> tuple[int | None, str]:
    """Free-text MCQ answer -> (choice index or None, rule that decided), one rule for every model.

    In order: ``exact`` (the whole answer is a choice text, case/punctuation-insensitive);
    ``letter`` (``Answer: B``, ``(B)``, a lone ``B``; experiments.common.parsing.match_choice) unless the
    text itself names a choice by exact/stated/contains (the named choice wins: models invent letters
    for unlettered lists, and "A history of ..." is an article) ; ``stated`` (the choice named right
    after a committing phrase: "the most likely diagnosis is X", "Answer: X", "**Final Diagnosis:**
    X"); ``contains`` (exactly one choice text occurs); ``first`` (several occur: the one mentioned
    first, unless the first two are joined by "or"/"vs"/"/" = a hedge, which is no pick); ``fuzzy``
    (exactly one choice equal up to spelling slips, :func:`same_but_typos`); else ``unparsed``
    (scored wrong, never dropped).
    """
    if not text or not choices:
        return None, "unparsed"
    tidx, thow = _by_text(text, choices)
    if thow == "exact":
        return tidx, thow
    lidx, lhow = match_choice(text, choices)
    if lhow == "letter":
        if tidx is not None and tidx != lidx and (thow in ("stated", "contains") or (thow == "fuzzy" and re.match(r"^\W*[A-J]\.", choices[tidx]))):
            return tidx, thow
        article = re.search(r"(?:^|(?:answer|choice|option)\W*(?:is)?\W*)A\s+[a-z]", text.strip(), flags=re.I) and not re.search(r"\(A\)|\bA[.):]", text)
        if not article:
            return lidx, "letter"
    return tidx, thow


# -- FRQ grading ----------------------------------------------------------------------------------

MAX_DIAGNOSIS_WORDS = 10
_QUALIFIER = re.compile(r"^(?:\w+\s+)?(?:type|subtype|variant|form|stage|grade|phase)(?:\s+\w+)?$|^(?:acute|chronic)\s+exacerbation$", re.I)


def split_concurrent(value: str | None) -> list[str]:
    """The diagnoses of an extracted answer listing several as present together ("a, b", "a; b"),
    or [value]. One name with commas stays whole: "hand, foot, and mouth disease" (a one-word part
    followed by an "and ..." part) and qualifiers ("delusional disorder, erotomanic type")."""
    if not value:
        return []
    parts = [p.strip() for p in re.split(r"\s*[,;]\s*", value.strip()) if p.strip()]
    if len(parts) < 2:
        return [value.strip()]
    if re.match(r"^(and|or)\b", parts[-1], re.I) and any(len(p.split()) == 1 for p in parts[:-1]):
        return [value.strip()]
    out: list[str] = []
    for p in parts:
        p = re.sub(r"^(and|&)\s+", "", p, flags=re.I)
        if out and _QUALIFIER.match(p):
            out[-1] = f"{out[-1]}, {p}"
        else:
            out.append(p)
    return out


def classify_extracted(value: str | None) -> tuple[str | None, str]:
    """An extracted diagnosis string -> (value, status) with status ok | concurrent | multiple | none | unparsed."""
    if value is None:
        return None, "unparsed"
    value = value.strip().strip('"“”*.').strip()
    low = value.lower()
    if re.match(r"^multiple\b", low):
        return None, "multiple"
    if not value or re.match(r"^(none|no diagnosis|n/?a)\b", low):
        return None, "none"
    if len(split_concurrent(value)) > 1:
        return value, "concurrent"
    return value, "ok"


def parse_extraction(reply: str) -> tuple[str | None, str]:
    """Grader step 1 reply -> (diagnosis, status) with status ok | multiple | none | unparsed."""
    if reply is None or not reply.strip():
        return None, "unparsed"
    value = extract_after(reply, "Diagnosis") or reply.strip().splitlines()[0]
    value = value.strip().strip('"“”*.').strip()
    if re.match(r"^(multiple|none|no diagnosis|n/?a)\b", value.lower()):
        return classify_extracted(value)
    # an echo of the prompt or a sentence, not a diagnosis name (a list may name a few)
    if max((len(p.split()) for p in split_concurrent(value)), default=0) > MAX_DIAGNOSIS_WORDS or len(value) > 200:
        return None, "unparsed"
    if not value:
        return None, "unparsed"
    return classify_extracted(value)


def lexical_relation(given: str, correct: str) -> str | None:
    """equal | given_broader (correct is a subtype of given) | given_narrower | None (no word-set relation)."""
    g, c = words(given), words(correct)
    if not g or not c:
        return None
    if g == c:
        return "equal"
    if g < c:
        return "given_broader"
    if c < g:
        return "given_narrower"
    return None


def match_targets(extracted: str | None, status: str, correct: str, rule: str = "zero") -> list[str]:
    """The given diagnoses that need a grader verdict (one grader_match request each), in order.

    Empty when the score is decided without asking: Multiple/None; a concurrent list under rule
    ``zero``; an answer (or, under ``any``, one listed diagnosis) equal to the correct one after
    :func:`normalize`.
    """
    check_rule(rule)
    if extracted is None or status not in ("ok", "concurrent"):
        return []
    if status == "ok":
        return [] if normalize(extracted) == normalize(correct) else [extracted]
    if rule == "zero":
        return []
    parts = split_concurrent(extracted)
    if any(normalize(p) == normalize(correct) for p in parts):
        return []
    return parts


def needs_verdict(extracted: str | None, status: str, correct: str, rule: str = "zero") -> bool:
    return bool(match_targets(extracted, status, correct, rule))


def _one_verdict(given: str, correct: str, reply: str | None) -> tuple[int | None, str]:
    verdict = extract_verdict(reply) if reply is not None else None
    if verdict is not None:
        return int(verdict), "grader"
    rel = lexical_relation(given, correct)
    if rel is not None:
        return int(rel in ("equal", "given_broader")), "lexical_subtype_rule"
    return None, "unscored_verdict"


def grade_frq(extracted: str | None, status: str, correct: str, verdict_reply=None, rule: str = "zero") -> dict:
    """Final FRQ score from the grader's replies.

    ``verdict_reply``: None when step 2 was not asked; a reply string (one target); or, for several
    targets (rule ``any``), a list aligned with :func:`match_targets` or a dict target -> reply.
    """
    check_rule(rule)
    if status in ("multiple", "none"):
        return {"correct": 0, "grade_source": f"extraction_{status}"}
    if status not in ("ok", "concurrent") or extracted is None:
        return {"correct": None, "grade_source": "unscored_extraction"}
    if status == "concurrent" and rule == "zero":
        return {"correct": 0, "grade_source": "extraction_concurrent"}
    parts = split_concurrent(extracted) if status == "concurrent" else [extracted]
    if any(normalize(p) == normalize(correct) for p in parts):
        return {"correct": 1, "grade_source": "exact"}
    if isinstance(verdict_reply, dict):
        replies = [verdict_reply.get(p) for p in parts]
    elif isinstance(verdict_reply, (list, tuple)):
        replies = list(verdict_reply) + [None] * (len(parts) - len(verdict_reply))
    else:
        replies = [verdict_reply] + [None] * (len(parts) - 1)
    results = [_one_verdict(p, correct, r) for p, r in zip(parts, replies)]
    for score, source in results:
        if score == 1:
            return {"correct": 1, "grade_source": source}
    if any(score is None for score, _ in results):
        return {"correct": None, "grade_source": "unscored_verdict"}
    sources = {source for _, source in results}
    return {"correct": 0, "grade_source": "grader" if sources == {"grader"} else "lexical_subtype_rule" if len(sources) == 1 else "grader+lexical"}
