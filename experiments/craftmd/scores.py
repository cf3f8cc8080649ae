"""CRAFT-MD's typed scores (experiments/common/grade.py), one per decision a record holds:

- ``frq/<format>``: the grader-AI's verdict on the doctor-AI's FRQ answer (judge: the grader model, the hash of the
  two grader templates, the verdict rule; an imported release's: ``published``, the authors' own grades);
- ``mcq/<format>``: the MCQ answer mapped to a choice (a rule: experiments/common/choice.py);
- ``assess-<Q>``: a conversation assessor's yes (1) / no (0) / unreadable (None) (experiments/craftmd/assess.py);
- ``assess-<Q>@experts``: the paper's dermatologists' label of a released conversation (``import craftmd-experts``,
  ``calibrate conversations``), beside the assessor's where both exist;
- ``patient-check/<check>``: a deterministic patient check flagged the conversation (1) or not (0), or could not check it (None)
  (experiments/craftmd/patient_checks.py);
- ``grader`` / ``published`` (``calibrate craftmd-grader``): per case, the count of correct trials by the judge / the
  authors' grader.

The values are those the metrics read (:func:`experiments.craftmd.metrics.grades`, ``assessment``, ``patient_checks``):
the scores restate the record's own fields, typed, and never change a figure. A live run's records get them from the
runner, an import's at import, a folder written before from the reader's upgrade: all through :func:`scores`.
"""

from __future__ import annotations

from dataclasses import replace

from experiments.common.choice import MCQ_RULES
from experiments.common.grade import Grade, score_name
from experiments.craftmd import metrics
from experiments.craftmd.assess import TEMPLATES
from experiments.craftmd.patient_checks import CHECKS
from experiments.craftmd.prompts import PROMPTS

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


def scores(record: dict, settings) -> dict[str, Grade]:
    """A CRAFT-MD record's typed scores (a live run's, an imported release's, a calibration's conversation)."""
    roles = settings.roles if isinstance(settings.roles, dict) else {}
    published = getattr(settings, "grades", None) == "published"  # an imported release's config
    out: dict[str, Grade] = {}
    for (fmt, mode), g in metrics.grades(record).items():
        if mode == "frq":
            a = record["answers"][fmt][mode]
            judge = {"model": "published"} if published else grader_judge(roles.get("grader"), getattr(settings, "verdict_rule", None))
            out[score_name(mode, fmt)] = replace(g, judge=judge, explanation=grader_reply(a))
        else:
            out[score_name(mode, fmt)] = replace(g, judge={"rule": MCQ_RULE})
    for q, a in (record.get("assessment") or {}).items():
        if isinstance(a, dict):
            out[f"assess-{q}"] = assess_grade(q, a, roles.get("assessor"))
    for q, v in expert_labels(record).items():
        out[score_name(f"assess-{q}", judge=EXPERTS)] = Grade(value=None if v is None else int(bool(v)), source=EXPERTS,
                                                               judge={"model": "dermatologists", "rule": EXPERTS_RULE})
    pc = record.get("patient_checks")
    if isinstance(pc, dict):
        for c in CHECKS:
            if c in pc:
                found = pc[c]
                out[score_name("patient-check", c)] = Grade(  # None: not checkable (the correct answer is no diagnosis)
                    value=None if found is None else int(bool(found)), answer=found if isinstance(found, list) and found else None, source="rule",
                    judge={"rule": f"patient_checks.{c}" + (f" ({pc.get('span_words')} words)" if c == "copies_vignette" else "")})
    return out



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
