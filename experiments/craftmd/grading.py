"""Pure scoring logic for CRAFT-MD answers (no model calls): MCQ choice, grader replies, subtype rule.

FRQ grading has two grader-AI steps; this module turns their replies into scores:
1. extraction reply -> (diagnosis, status); status ``multiple`` or ``none`` scores 0 without step 2;
2. equivalence reply -> verdict. If the grader's verdict cannot be parsed, a lexical form of the
   same rule decides when it can (word sets: equal, or the correct answer's words include all the
   given diagnosis' words = correct is a subtype of the given one -> match; the given one has extra
   words = more specific subtype -> no match); otherwise the answer is *unscored* (correct=None) and
   counted, never silently 0.
"""

from __future__ import annotations

import re

from experiments.parsing import extract_after, extract_verdict, match_choice

_STOP = {"the", "a", "an", "of", "and", "disease", "syndrome", "disorder", "with", "to", "due", "in", "s"}


def words(s: str) -> set[str]:
    toks = re.findall(r"[a-z0-9]+", (s or "").lower())
    return {t.rstrip("s") if len(t) > 3 else t for t in toks if t not in _STOP}


def parse_mcq(reply: str, choices: list[str], answer_index: int | None) -> dict:
    """Parsed MCQ answer: chosen index (or None = refusal/unparsed, scored wrong) and correctness."""
    idx, how = match_choice(reply, choices)
    out = {"answer": reply, "choice": idx, "choice_text": choices[idx] if idx is not None else None, "parsed_by": how}
    if answer_index is None:
        out["correct"] = None  # the case's answer matches none of its choices: unscorable, counted
        out["unscored_reason"] = "answer_not_in_choices"
    else:
        out["correct"] = int(idx == answer_index)
    return out


MAX_DIAGNOSIS_WORDS = 10


def parse_extraction(reply: str) -> tuple[str | None, str]:
    """Grader step 1 reply -> (diagnosis, status) with status ok | multiple | none | unparsed."""
    if reply is None or not reply.strip():
        return None, "unparsed"
    value = extract_after(reply, "Diagnosis") or reply.strip().splitlines()[0]
    value = value.strip().strip('"“”*.').strip()
    if len(value.split()) > MAX_DIAGNOSIS_WORDS:  # an echo of the prompt or a sentence, not a diagnosis name
        return None, "unparsed"
    low = value.lower()
    if re.match(r"^multiple\b", low):
        return None, "multiple"
    if re.match(r"^(none|no diagnosis|n/?a)\b", low):
        return None, "none"
    if not value or len(value) > 120:
        return None, "unparsed"
    return value, "ok"


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


def grade_frq(extracted: str | None, status: str, correct: str, verdict_reply: str | None) -> dict:
    """Final FRQ score from the grader's two replies. ``verdict_reply`` is None when step 2 was not asked."""
    if status in ("multiple", "none"):
        return {"correct": 0, "grade_source": f"extraction_{status}"}
    if status != "ok" or extracted is None:
        return {"correct": None, "grade_source": "unscored_extraction"}
    rel = lexical_relation(extracted, correct)
    if rel == "equal":
        return {"correct": 1, "grade_source": "exact"}
    verdict = extract_verdict(verdict_reply) if verdict_reply is not None else None
    if verdict is not None:
        return {"correct": int(verdict), "grade_source": "grader"}
    if rel is not None:
        return {"correct": int(rel == "given_broader"), "grade_source": "lexical_subtype_rule"}
    return {"correct": None, "grade_source": "unscored_verdict"}


def needs_verdict(extracted: str | None, status: str, correct: str) -> bool:
    return status == "ok" and extracted is not None and lexical_relation(extracted, correct) != "equal"
