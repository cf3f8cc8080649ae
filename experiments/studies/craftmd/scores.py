"""CRAFT-MD's typed scores (experiments/common/grade.py), one per decision a record holds (the names and what each
holds: the study README, "Records"). A run's grading and an import put them in the record's ``scores``; a record
written before (``records_schema`` 1) holds its grades in its own fields, which :func:`scores` reads into the same
Grades, through the same functions, when the reader upgrades it.
"""

from __future__ import annotations

from experiments.common.choice import MCQ_RULES
from experiments.common.grade import Grade, grades, score_name
from experiments.common.patient_checks import patient_check_grades
from experiments.studies.craftmd.prompts import PROMPTS, TEMPLATES

GRADER_TEMPLATES = ("grader_extract", "grader_match")
MCQ_RULE = "map_choice: " + " > ".join(MCQ_RULES)
EXPERTS = "experts"  # the judge name of the dermatologists' labels: assess-Q1@experts
EXPERTS_RULE = "the two raters' shared label, the tie-breaker's where they disagree"


def grader_judge(model: str | None, verdict_rule: str | None) -> dict:
    return {"model": model, "prompt_hash": PROMPTS.hash(*GRADER_TEMPLATES), "rule": verdict_rule}


def grader_reply(frq: dict) -> str | None:
    """What the grader said: its verdict reply (one per diagnosis it judged), else its extraction reply."""
    match = frq.get("grader_match_reply")
    if isinstance(match, dict):
        match = "\n".join(f"{given}: {reply}" for given, reply in match.items())
    return match or frq.get("grader_extract_reply")


def assess_grade(question: str, a: dict, model: str | None) -> Grade:
    v = a.get("verdict")
    return Grade(value=None if v is None else int(bool(v)), source="assessor", explanation=a.get("reply"),
                 metadata={"invented": a["invented"]} if a.get("invented") else {},
                 judge={"model": model, "prompt_hash": PROMPTS.hash(TEMPLATES[question])})


def expert_labels(record: dict) -> dict[str, bool | None]:
    """The dermatologists' label per question: ``experts`` (calibrate conversations) or ``expert_label_<Q>`` (the import)."""
    if isinstance(record.get("experts"), dict):
        return dict(record["experts"])
    flat = {k.removeprefix("expert_label_"): v for k, v in record.items() if k.startswith("expert_label_")}
    return {q: None if v is None else v == "yes" for q, v in flat.items()}


GRADED = ("correct", "grade_source", "parsed_by", "extraction_status", "grader_reasks")  # an answer's fields its Grade holds


def answer_grade(mode: str, a: dict, judge: dict | None = None) -> Grade:
    """An answer's grade from the grading step's fields (``correct``, ``grade_source`` of an FRQ / ``parsed_by`` of an
    MCQ, the FRQ grader's extraction status and re-asks); ``judge``: the FRQ's grader (the MCQ's is the mapping rule)."""
    frq = mode == "frq"
    return Grade(value=a.get("correct"), answer=a.get("answer"), source=a["grade_source"] if "grade_source" in a else a.get("parsed_by"),
                 skipped=bool(a.get("skipped")), metadata={"extraction_status": a.get("extraction_status"), "grader_reasks": int(a.get("grader_reasks") or 0)},
                 explanation=grader_reply(a) if frq else None, judge=judge if frq else {"rule": MCQ_RULE})


def graded(mode: str, a: dict, judge: dict | None = None) -> tuple[dict, Grade]:
    """An answer as the record keeps it (what was said and extracted), and its grade."""
    return {k: v for k, v in a.items() if k not in GRADED}, answer_grade(mode, a, judge)


def conversation_grades(record: dict, assessor: str | None) -> dict[str, Grade]:
    """The grades of a record's conversation: the assessor's verdicts, the experts' labels, the patient checks."""
    out = {f"assess-{q}": assess_grade(q, a, assessor) for q, a in (record.get("assessment") or {}).items() if isinstance(a, dict)}
    for q, v in expert_labels(record).items():
        out[score_name(f"assess-{q}", judge=EXPERTS)] = Grade(value=None if v is None else int(bool(v)), source=EXPERTS,
                                                               judge={"model": "dermatologists", "rule": EXPERTS_RULE})
    return {**out, **(patient_check_grades(record["patient_checks"]) if isinstance(record.get("patient_checks"), dict) else {})}


def scores(record: dict, settings) -> dict[str, Grade]:
    """A CRAFT-MD record's typed scores: those its grading stored, or, for a record written before typed scores (or
    by a calibration that keeps its verdicts in its own fields), derived from its fields by the same functions."""
    if record.get("scores"):
        return grades(record)
    roles = settings.roles if isinstance(settings.roles, dict) else {}
    published = getattr(settings, "grades", None) == "published"  # an imported release's config
    judge = {"model": "published"} if published else grader_judge(roles.get("grader"), getattr(settings, "verdict_rule", None))
    out = {score_name(mode, fmt): answer_grade(mode, a, judge) for fmt, d in (record.get("answers") or {}).items() for mode, a in d.items()}
    return {**out, **conversation_grades(record, roles.get("assessor"))}


def calibration_scores(record: dict, settings) -> dict[str, Grade]:
    """A grader calibration's case: the judge's count of correct trials (None with an unreadable verdict) and the
    authors' grader's count where the case was matched in their release."""
    out = {}
    if record.get("status") != "failed":
        unscored = "judge_unscored_trials" in record
        out["grader"] = Grade(value=None if unscored else record.get("judge"), answer=[t.get("extracted") for t in record.get("trials") or []],
                              judge={"model": settings.judge, "prompt_hash": settings.prompt_hash, "rule": settings.concurrent_rule})
    if isinstance(record.get("published"), dict):
        out["published"] = Grade(value=record["published"].get("count"), judge={"model": "published"})
    return out
