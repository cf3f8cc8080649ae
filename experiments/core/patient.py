"""The simulated patient's checks as one scorer (experiments/common/patient_checks.py holds the rules; no model).

A study whose records hold a doctor-patient conversation adds :func:`patient_checks` to its scorers. It reads only the
typed record (experiments/core/record.py): the transcript's ``doctor`` and ``patient`` turns, ``inputs["facts"]``
(what the patient was given), ``target`` (the correct diagnosis), ``inputs["choices"]`` and ``inputs["answer_index"]``
where the doctor chooses from a list (the correct answer is found by its index, not by its wording). One grade per check (``patient-check/<check>``): 1 when the conversation was
flagged, with the flagged and the checked patient turns in its metadata, so every check has a rate per conversation
and a rate per patient turn; a check that cannot apply (no choices, an answer that is no diagnosis) is not checkable.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from experiments.common.grade import FLAG, Grade, Metric
from experiments.common.patient_checks import CHECKS, DESCRIPTIONS, DEFAULT_SPAN_WORDS, check_conversation
from experiments.core.record import turns
from experiments.core.scorers import Scorer, always

NAME = "patient-check"
PER_CONVERSATION = Metric("per conversation")
PER_TURN = Metric("per patient turn", numerator="turns", denominator="patient_turns")
NEED_CHOICES = ("names_other_choice",)  # checks that need a list of choices to apply


def _hit_turns(hits) -> int:
    return len({h["patient_turn"] if isinstance(h, Mapping) else h for h in hits or []})


def check_grades(found: dict, choices: list | None) -> dict[str, Grade]:
    """One grade per check of ``check_conversation``'s result."""
    rule = lambda c: {"rule": f"patient_checks.{c}" + (f" ({found.get('span_words')} words)" if c == "copies_vignette" else "")}  # noqa: E731
    out = {}
    for c in CHECKS:
        if c not in found:
            continue
        hits = found[c]
        if hits is None or (c in NEED_CHOICES and not choices):
            out[c] = Grade(value=None, skipped=True, source="not checkable", judge=rule(c))
            continue
        extra = {"longest_span": found["longest_span"]} if c == "copies_vignette" and "longest_span" in found else {}
        out[c] = Grade(value=int(bool(hits)), answer=hits or None, source="rule", judge=rule(c),
                       metadata={"turns": _hit_turns(hits), "patient_turns": found.get("patient_turns", 0), **extra})
    return out


def patient_checks(span_words: Callable[[Any], int] = lambda s: DEFAULT_SPAN_WORDS, applies: Callable[[Any], bool] = always,
                   reference: Callable[[], Mapping] | None = None, validation: Mapping | None = None,
                   terms: Callable[[], Iterable[str]] = lambda: ()) -> Scorer:
    """The scorer; ``span_words(settings)``: the copied run with clinical content that flags a turn; ``terms()``: the
    clinical terms whose copying counts (a study's term list; the common rules know numbers with units, lab and gene
    tokens and chart wording without it)."""

    def decide(ctx, record: dict, settings, role) -> dict[str, Grade]:
        said = turns(record)
        if not any(r == "patient" for r, _ in said):
            return {}
        inputs = record.get("inputs") or {}
        choices = inputs.get("choices") or None
        found = check_conversation(said, vignette=str(inputs.get("facts") or ""), correct=str(record.get("target") or ""),
                                   choices=choices, answer_index=inputs.get("answer_index"), n_words=span_words(settings), terms=terms())
        return check_grades(found, choices)

    return Scorer(NAME, FLAG, "Did the simulated patient do this?", decide=decide, parts={c: DESCRIPTIONS[c].format(n="N") for c in CHECKS},
                  metrics=(PER_CONVERSATION, PER_TURN), applies=applies, reference=reference, validation=validation or {})
