"""Deterministic checks of the simulated patient: pure functions of a conversation's turns, no model.

A conversation is a list of ``(role, text)`` turns, role ``doctor`` or ``patient`` (a live run's transcript
and a released conversation alike). Patient turns are numbered 1, 2, ... in order (``patient_turn``).
The rules (also stated in experiments/craftmd/README.md, "Patient checks"):

- ``names_diagnosis``: a patient turn that comes before the doctor's last turn contains the correct
  diagnosis, or (when the run asks the MCQ) the text of any of the case's answer choices, as a whole
  word sequence after lowercasing and dropping apostrophes and punctuation ("Plaque psoriasis" is
  named by "...it looks like plaque psoriasis!", not by "psoriasis" alone). Patient turns after the
  doctor's last turn (nothing the doctor could use) are not checked.
- ``copies_vignette``: a patient turn shares a run of at least ``n_words`` consecutive words with the
  vignette (same word normalization; the longest run is found with difflib).
- ``empty_turn``: a patient turn that is empty or only whitespace.
- ``turn_cap``: the conversation ended because the doctor reached the turn cap (stop reason ``turn_cap``).
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher

CHECKS = ("names_diagnosis", "copies_vignette", "empty_turn", "turn_cap")
DESCRIPTIONS = {
    "names_diagnosis": "a patient turn names the correct diagnosis (or, with MCQ, a choice's text) before the doctor's final turn",
    "copies_vignette": "a patient turn copies {n} or more consecutive words of the vignette",
    "empty_turn": "a patient turn is empty",
    "turn_cap": "the conversation reached the turn cap",
}
DEFAULT_SPAN_WORDS = 12


def words(text: str | None) -> list[str]:
    """Lowercased word tokens (letters and digits), apostrophes dropped first ("Crohn's" -> "crohns")."""
    return re.findall(r"[^\W_]+", re.sub(r"['’`]", "", (text or "").lower()))


def contains_phrase(text_words: list[str], phrase_words: list[str]) -> bool:
    """``phrase_words`` occurs in ``text_words`` as a contiguous word sequence."""
    if not phrase_words:
        return False
    return f" {' '.join(phrase_words)} " in f" {' '.join(text_words)} "


def patient_turns(turns: list[tuple[str, str]]) -> list[tuple[int, int, str]]:
    """(index in ``turns``, patient turn number from 1, text) of every patient turn."""
    out = []
    for i, (role, text) in enumerate(turns):
        if role == "patient":
            out.append((i, len(out) + 1, text or ""))
    return out


def names_diagnosis(turns: list[tuple[str, str]], correct: str, choices: list[str] | None = None) -> list[dict]:
    """Patient turns before the doctor's last turn that name the correct diagnosis or a choice:
    ``[{"patient_turn", "named", "correct"}]`` (``correct``: the named text is the correct diagnosis)."""
    last_doctor = max((i for i, (role, _) in enumerate(turns) if role == "doctor"), default=-1)
    terms: list[tuple[str, bool]] = [(correct, True)] if (correct or "").strip() else []
    for c in choices or []:
        if (c or "").strip() and words(c) != words(correct):
            terms.append((c, False))
    out = []
    for i, n, text in patient_turns(turns):
        if i >= last_doctor:
            continue
        tw = words(text)
        for term, is_correct in terms:
            if contains_phrase(tw, words(term)):
                out.append({"patient_turn": n, "named": term.strip(), "correct": is_correct})
    return out


def longest_copied_run(text: str, vignette: str) -> tuple[int, str]:
    """The longest run of consecutive words ``text`` shares with ``vignette``: (length, the words)."""
    a, b = words(text), words(vignette)
    if not a or not b:
        return 0, ""
    m = SequenceMatcher(None, a, b, autojunk=False).find_longest_match(0, len(a), 0, len(b))
    return m.size, " ".join(a[m.a:m.a + m.size])


def copies_vignette(turns: list[tuple[str, str]], vignette: str, n_words: int = DEFAULT_SPAN_WORDS) -> list[dict]:
    """Patient turns sharing ``n_words`` or more consecutive words with the vignette: ``[{"patient_turn", "words", "span"}]``."""
    out = []
    for _, n, text in patient_turns(turns):
        size, span = longest_copied_run(text, vignette)
        if size >= n_words:
            out.append({"patient_turn": n, "words": size, "span": span})
    return out


def empty_turns(turns: list[tuple[str, str]]) -> list[int]:
    """Numbers of the patient turns that are empty or only whitespace."""
    return [n for _, n, text in patient_turns(turns) if not text.strip()]


def check_conversation(turns: list[tuple[str, str]], *, vignette: str, correct: str, choices: list[str] | None = None,
                       stop_reason: str | None = None, n_words: int = DEFAULT_SPAN_WORDS) -> dict:
    """Every check on one conversation. ``choices``: the answer choices when the run asks the MCQ (else None)."""
    return {
        "names_diagnosis": names_diagnosis(turns, correct, choices),
        "copies_vignette": copies_vignette(turns, vignette, n_words),
        "empty_turn": empty_turns(turns),
        "turn_cap": stop_reason == "turn_cap",
        "patient_turns": len(patient_turns(turns)),
        "span_words": n_words,
    }


def flagged(checks: dict) -> list[str]:
    """The checks a conversation failed, in :data:`CHECKS` order."""
    return [c for c in CHECKS if checks.get(c)]


def count_checks(all_checks: list[dict]) -> dict:
    """Per check: conversations flagged (and patient turns flagged), over the conversations checked."""
    out: dict = {"conversations": len(all_checks)}
    for c in CHECKS:
        flags = [x.get(c) for x in all_checks]
        out[c] = {"conversations": sum(bool(f) for f in flags)}
        if c != "turn_cap":
            out[c]["turns"] = sum(len({(e["patient_turn"] if isinstance(e, dict) else e) for e in f or []}) for f in flags)
    return out
