"""Pure scoring logic for CRAFT-MD answers (no model calls): MCQ choice, grader replies, subtype rule (the two grader
steps: docs/protocols.md, CRAFT-MD). Only an answer equal to the correct one after :func:`normalize` is scored without
asking: no word-set shortcut may decide a match ("Cushing disease" vs "Cushing syndrome" is asked). A verdict that
cannot be read is decided by a lexical form of the subtype rule where it can be (:func:`lexical_relation`), otherwise
the answer is *unscored* (correct=None) and counted, never silently 0.
"""

from __future__ import annotations

import re
from functools import partial

from experiments.common.choice import map_choice
from experiments.common.normalize import normalize as normalize_words, words
from experiments.common.parsing import extract_after, extract_verdict

CONCURRENT_RULES = ("zero", "any")
# words ignored by the lexical fallback; "disease", "syndrome", "disorder" are NOT among them:
# "Cushing disease" and "Cushing syndrome" are different diagnoses (one is a subtype of the other)
_STOP = {"the", "a", "an", "of", "and", "with", "to", "due", "in", "s"}


# case, apostrophes, punctuation and whitespace removed: the only equality that skips the grader
normalize = partial(normalize_words, drop_apostrophes=True)


def check_rule(rule: str) -> str:
    if rule not in CONCURRENT_RULES:
        raise ValueError(f"unknown concurrent-diagnosis rule {rule!r}; valid: {', '.join(CONCURRENT_RULES)}")
    return rule


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
    g, c = (set(words(x, stop=_STOP, singular=True)) for x in (given, correct))
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
    """The given diagnoses that need a grader verdict (one grader_match request each), in order; empty when the score
    is decided without asking (Multiple/None, a concurrent list under ``zero``, an answer equal to the correct one)."""
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


VERDICT_RULES = ("anywhere", "first_word")


def read_verdict(reply: str | None, verdict_rule: str = "first_word") -> bool | None:
    """A grader verdict reply -> True / False / None (no verdict: the grader is asked again), read by ``verdict_rule``
    (the setting; ``anywhere`` is the authors' reading, also inside a word: "not sure" and "diagnosis" say no)."""
    if reply is None:
        return None
    if verdict_rule == "anywhere":
        return extract_verdict(reply, ("yes",), ("no",), anywhere=True)
    if verdict_rule == "first_word":
        return extract_verdict(reply)
    raise ValueError(f"unknown verdict rule {verdict_rule!r}; valid: {', '.join(VERDICT_RULES)}")


def _one_verdict(given: str, correct: str, reply: str | None, verdict_rule: str = "first_word") -> tuple[int | None, str]:
    verdict = read_verdict(reply, verdict_rule)
    if verdict is not None:
        return int(verdict), "grader"
    rel = lexical_relation(given, correct)
    if rel is not None:
        return int(rel in ("equal", "given_broader")), "lexical_subtype_rule"
    return None, "unscored_verdict"


def grade_frq(extracted: str | None, status: str, correct: str, verdict_reply=None, rule: str = "zero", verdict_rule: str = "first_word") -> dict:
    """Final FRQ score from the grader's replies. ``verdict_reply``: None when step 2 was not asked; a reply string (one
    target); or, for several targets (rule ``any``), a list aligned with :func:`match_targets` or a dict target -> reply."""
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
    results = [_one_verdict(p, correct, r, verdict_rule) for p, r in zip(parts, replies)]
    for score, source in results:
        if score == 1:
            return {"correct": 1, "grade_source": source}
    if any(score is None for score, _ in results):
        return {"correct": None, "grade_source": "unscored_verdict"}
    sources = {source for _, source in results}
    return {"correct": 0, "grade_source": "grader" if sources == {"grader"} else "lexical_subtype_rule" if len(sources) == 1 else "grader+lexical"}
