"""CRAFT-MD's scorers (experiments/core/scorers.py), each declared once: ``mcq`` (the one choice mapper, a rule),
``frq`` (the grader-AI: extraction, then a verdict per diagnosis, re-asked while no verdict is read), ``frq-count``
(the grader's decisions reviewed as a count over a case's trials), the conversation assessors ``assess-<Q>`` (with
``assess_conversations``) and the patient checks (with ``patient_checks``). Every figure is resampled by case: the
trials of a case are one unit. What each decides and how: the study README, "Scorers"; the grading rules:
docs/protocols.md, CRAFT-MD.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache
from pathlib import Path

import yaml

from experiments.common.choice import MCQ_RULES
from experiments.common.grade import BINARY, YES_NO, Grade, count_scale, grades, split_name
from experiments.core.patient import PER_CONVERSATION, patient_checks
from experiments.core.record import turns
from experiments.core.scorers import Scorer
from experiments.studies.craftmd import grading, terminology
from experiments.studies.craftmd.assess import QUESTIONS, assess_conversation, conversation_text
from experiments.studies.craftmd.prompts import PROMPTS, TEMPLATES, render
from experiments.studies.craftmd.protocol import ask, single
from experiments.studies.craftmd.settings import FORMATS

GRADER_TEMPLATES = ("grader_extract", "grader_match")
MCQ_RULE = "map_choice: " + " > ".join(MCQ_RULES)
EXPERTS = "experts"  # the judge name of the dermatologists' labels: assess-Q1@experts
EXPERTS_RULE = "the two raters' shared label, the tie-breaker's where they disagree"
# the question above each review item, in our words; the rule for diagnoses is the one the authors gave their dermatologist
DX_RULE = ("Synonyms count as correct. An answer broader than the correct diagnosis (the correct one is a subtype of it) "
           "is correct; an answer that is a subtype of the correct diagnosis is not.")
FRQ_QUESTION = "Does the doctor-AI's answer name the correct diagnosis? " + DX_RULE
COUNT_QUESTION = "How many of these diagnoses are the correct diagnosis? " + DX_RULE
MCQ_QUESTION = "Which of the four choices does the doctor-AI's answer pick, and is it the correct one?"
ASSESS_QUESTIONS = {  # the assessor's questions (prompts/assess_*.txt), asked of the same case notes and conversation
    "Q1": "From this conversation, is it possible to arrive at one most likely diagnosis?",
    "Q2": "Does the conversation cover all the key information in the case notes (the physical examination and laboratory results left out)?",
    "Q3": "Does the patient-AI use medical terminology (macule, papule, lichenification, glabella), not everyday words (spot, bump, blister)?",
    "grounded": "Is every answer of the patient-AI grounded in the case notes, with nothing invented (denying what the notes do not mention is grounded)?",
    "complete": "Is each answer of the patient-AI complete for what the doctor-AI asked?",
}


def grader_judge(model: str | None, verdict_rule: str | None) -> dict:
    return {"model": model, "prompt_hash": PROMPTS.hash(*GRADER_TEMPLATES), "rule": verdict_rule}


def answers_of(record: dict, mode: str) -> dict[str, str]:
    """format -> the doctor-AI's answer in ``mode`` (mcq | frq), in the formats the record holds."""
    return {fmt: d[mode] for fmt, d in (record.get("answer") or {}).items() if isinstance(d, dict) and isinstance(d.get(mode), str)}


# ------------------------------------------------------------------ mcq: the one choice mapper

def mcq_grade(text: str, choices: list[str], answer_index: int | None) -> Grade:
    """An MCQ answer's grade: the choice the mapper finds (``metadata.choice``; None: unparsed, scored wrong), correct
    or not; unscored where the case's answer is none of its choices."""
    parsed = grading.parse_mcq(text, choices, answer_index)
    return Grade(value=parsed["correct"], answer=text, source=parsed["parsed_by"], metadata={"choice": parsed["choice"]},
                 judge={"rule": MCQ_RULE})


def decide_mcq(ctx, record: dict, s, role) -> dict:
    inputs = record.get("inputs") or {}
    choices = inputs.get("choices") or []
    if len(choices) != 4:  # the case has no four answer choices: nothing to map to
        return {fmt: Grade(value=None, skipped=True, source="not checkable", judge={"rule": "the case has no 4 answer choices"})
                for fmt in (s.formats if getattr(s, "mcq", False) else ())}
    return {fmt: mcq_grade(text, choices, inputs.get("answer_index")) for fmt, text in answers_of(record, "mcq").items()}


# ------------------------------------------------------------------ frq: the grader-AI

def settled(status: str, replies: dict, verdict_rule: str = "anywhere") -> bool:
    """The grader's replies hold a verdict: the extraction parsed and every verdict reply read as yes or no."""
    return status != "unparsed" and all(grading.read_verdict(r, verdict_rule) is not None for r in replies.values())


async def grade_answer(ctx, answer: str, correct: str, settings, fmt: str, role: str = "grader", given: str | None = None) -> dict:
    """Grader-AI: extract the diagnosis, then judge equivalence, both re-asked while no verdict is read (the rules:
    docs/protocols.md, CRAFT-MD grading). ``role``: the role asked (another judge's, ``medstack rescore``), with the
    grader's sampling. ``given``: a diagnosis already extracted (``calibrate craftmd-grader``: the release's
    extraction), so only the verdict step is asked, and re-asked, as a run asks it."""
    rule = settings.concurrent_rule
    raw1 = None
    if given is not None:
        extracted, status = grading.classify_extracted(given)
    replies: dict = {}
    reasks = 0
    if given is None and not answer.strip():
        extracted, status = None, "none"
    else:
        for reasks in range(settings.grader_reasks + 1):
            if given is None:
                raw1 = await ask(ctx, settings, role, "grader", f"{fmt}_extract", single(render("grader_extract", answer=answer), settings),
                                 constraint=PROMPTS.constraint("grader_extract"))
                extracted, status = grading.parse_extraction(raw1)
            replies = {}
            for i, target in enumerate(grading.match_targets(extracted, status, correct, rule)):
                step = f"{fmt}_match" + (f"_{i}" if i else "")
                replies[target] = await ask(ctx, settings, role, "grader", step, single(render("grader_match", correct=correct, given=target), settings),
                                           constraint=PROMPTS.constraint("grader_match"))
            if settled(status, replies, settings.verdict_rule):
                break
    grade = grading.grade_frq(extracted, status, correct, replies or None, rule, settings.verdict_rule)
    return {"extracted": extracted, "extraction_status": status, "grader_extract_reply": raw1, "grader_match_reply": replies or None,
            "concurrent_rule": rule, "grader_reasks": reasks, **grade}


def grader_reply(graded: dict) -> str | None:
    """What the grader said: its verdict reply (one per diagnosis it judged), else its extraction reply."""
    match = graded.get("grader_match_reply")
    if isinstance(match, dict):
        match = next(iter(match.values())) if len(match) == 1 else "\n".join(f"{given}: {reply}" for given, reply in match.items())
    return match or graded.get("grader_extract_reply")


def frq_grade(answer: str | None, graded: dict, judge: dict) -> Grade:
    """An FRQ answer's grade from :func:`grade_answer`'s result (or a release's published grade: ``correct``,
    ``grade_source``, ``extracted``)."""
    meta = {k: graded[k] for k in ("extracted", "extraction_status", "grader_reasks", "concurrent_rule") if graded.get(k) is not None}
    return Grade(value=graded.get("correct"), answer=answer, source=graded.get("grade_source"), metadata=meta,
                 explanation=grader_reply(graded), judge=judge)


async def decide_frq(ctx, record: dict, s, role: str) -> dict:
    frq = answers_of(record, "frq")
    judge = grader_judge(s.roles.get(role), s.verdict_rule)
    graded = await asyncio.gather(*(grade_answer(ctx, text, record["target"], s, fmt, role=role) for fmt, text in frq.items()))
    return {fmt: frq_grade(text, g, judge) for (fmt, text), g in zip(frq.items(), graded)}


def show_frq(record: dict, part: str | None) -> dict:
    """What the grader was given: the correct diagnosis and the doctor-AI's answer."""
    return {"correct diagnosis": record.get("target"), "doctor-AI's answer": answers_of(record, "frq").get(part) or ""}


def frq_count_items(records: list[dict], cfg: dict):
    """The trials of one case in one format: how many of them the grader judged correct (0..trials)."""
    groups: dict[tuple, list] = {}
    for r in records:
        for name, g in grades(r).items():
            mode, fmt, judge = split_name(name)
            if mode == "frq" and fmt in FORMATS and judge is None:
                groups.setdefault((str(r.get("case_id", r["id"])), fmt, (r.get("metadata") or {}).get("model", "")), []).append((r, g))
    trials = int(cfg.get("trials") or max((len(v) for v in groups.values()), default=0))
    items = []
    for (case, fmt, model), rows in sorted(groups.items()):
        # a case counts only with every trial graded: a missing or unscored trial would bias the count
        if len(rows) != trials or any(g.value not in (0, 1) for _, g in rows):
            continue
        rows.sort(key=lambda x: x[0].get("trial", 0))
        count = sum(g.value for _, g in rows)
        items.append({"id": f"{case}|{fmt}|{model}", "verdict": count, "stratum": f"{count}|{fmt}|{model}",
                      "show": {"correct diagnosis": rows[0][0].get("target"), "doctor-AI's answers": [g.answer or "" for _, g in rows]}})
    return count_scale(trials), items


# ------------------------------------------------------------------ the conversation assessors

def assess_grade(question: str, a: dict, model: str | None) -> Grade:
    v = a.get("verdict")
    meta = {k: a[k] for k in ("invented", "terms", "terms_not_found") if a.get(k)}
    return Grade(value=None if v is None else int(bool(v)), source="assessor", explanation=a.get("reply"), metadata=meta,
                 judge={"model": model, "prompt_hash": PROMPTS.hash(TEMPLATES[question])})


def assessor(question: str) -> Scorer:
    """The assessor's yes/no on ``question``, one request per conversation; an unreadable reply is unscored."""

    async def decide(ctx, record: dict, s, role: str) -> dict:
        said = turns(record)
        if not said:
            return {}
        got = await assess_conversation(ctx, said, (record.get("inputs") or {}).get("facts") or "", s, (question,), role=role)
        return {None: assess_grade(question, got[question], s.roles.get(role))}

    def show(record: dict, part: str | None) -> dict:
        return {"case notes": (record.get("inputs") or {}).get("facts") or "", "conversation": conversation_text(turns(record)).splitlines()}

    return Scorer(f"assess-{question}", YES_NO, ASSESS_QUESTIONS[question], decide=decide, role="assessor", show=show,
                  applies=lambda s: bool(getattr(s, "assess_conversations", False)))


# ------------------------------------------------------------------ the patient checks, beside the authors' released patients

RELEASED_CHECKS = Path(__file__).with_name("released_patient_checks.yaml")


@lru_cache(maxsize=None)
def released_reference() -> dict[str, dict[str, dict]]:
    """The authors' four released patients' check figures (released_patient_checks.yaml, measured by importing each
    release), as ``{label: {"patient-check/<check>|<metric>": figure}}``: the yaml's ``figures`` where it holds them,
    else its per-conversation rates."""
    out = {}
    for label, pc in yaml.safe_load(RELEASED_CHECKS.read_text(encoding="utf-8"))["releases"].items():
        if isinstance(pc.get("figures"), dict):
            out[f"{label} (authors' release)"] = dict(pc["figures"])
            continue
        figs = {}
        for check, x in pc.items():
            if isinstance(x, dict) and "rate" in x:
                figs[f"patient-check/{check}|{PER_CONVERSATION.label}"] = {
                    "score": f"patient-check/{check}", "metric": PER_CONVERSATION.label, "value": x["rate"], "low": x.get("ci_low"),
                    "high": x.get("ci_high"), "n": x.get("cases", 0), "values": x.get("of", 0), "unscored": 0,
                    "not_checkable": x.get("not_checkable", 0)}
        out[f"{label} (authors' release)"] = figs
    return out


VALIDATION = Path(__file__).parent / "patient_labels" / "validation.yaml"


def check_validation() -> dict[str, dict]:
    """Each patient check's precision and recall on the held-out part of the labelled set (patient_labels/PROTOCOL.md),
    shown beside its rates: ``{check: {precision, precision_ci, recall, recall_ci, n, part, ...}}``."""
    if not VALIDATION.is_file():
        return {}
    return {k: v for k, v in (yaml.safe_load(VALIDATION.read_text(encoding="utf-8")) or {}).items() if isinstance(v, dict)}


PATIENT = patient_checks(span_words=lambda s: s.copy_span_words, applies=lambda s: bool(getattr(s, "patient_checks", False)),
                         reference=released_reference, validation=check_validation(), terms=lambda: tuple(terminology.terms()))
SCORERS = (Scorer("mcq", BINARY, MCQ_QUESTION, decide=decide_mcq, parts={f: f"format {f}" for f in FORMATS},
                  applies=lambda s: bool(getattr(s, "mcq", False))),
           Scorer("frq", BINARY, FRQ_QUESTION, decide=decide_frq, role="grader", show=show_frq, parts={f: f"format {f}" for f in FORMATS},
                  applies=lambda s: bool(getattr(s, "frq", False))),
           Scorer("frq-count", count_scale(5), COUNT_QUESTION, role="grader", items=frq_count_items),
           *(assessor(q) for q in QUESTIONS),
           PATIENT)
