"""CRAFT-MD's results contract (``StudyResults``) for each kind of its results folders (a run or imported release, the
expert import, the two calibrations): judges to review and rescore, comparison, released runs, the report's lines.
"""

from __future__ import annotations

from pathlib import Path

from experiments.common.grade import Grade
from experiments.core.commands import resolve_data
from experiments.core.judging import BINARY, YES_NO, Judge, count_scale
from experiments.core.study import StudyResults
from experiments.studies.craftmd import metrics
from experiments.studies.craftmd.compare import run_compare
from experiments.studies.craftmd.importer import import_folder
from experiments.studies.craftmd.assess import LABELS, QUESTIONS, assess_conversation, conversation_text, transcript_turns
from experiments.common.patient_checks import CHECKS, DESCRIPTIONS
from experiments.studies.craftmd.prompts import render
from experiments.studies.craftmd.protocol import grade_answer
from experiments.studies.craftmd.report_views import conversation_tables, conversations_calibration_tables, grader_calibration_tables
from experiments.studies.craftmd.scores import answer_grade, assess_grade, calibration_scores, grader_judge, scores

# the question above each review item, in our words; the rule for diagnoses is the one the authors gave their dermatologist
DX_RULE = ("Synonyms count as correct. An answer broader than the correct diagnosis (the correct one is a subtype of it) "
           "is correct; an answer that is a subtype of the correct diagnosis is not.")
FRQ_QUESTION = "Does the doctor-AI's answer name the correct diagnosis? " + DX_RULE
COUNT_QUESTION = "How many of these diagnoses are the correct diagnosis? " + DX_RULE
ASSESS_QUESTIONS = {  # the assessor's questions (prompts/assess_*.txt), asked of the same case notes and conversation
    "Q1": "From this conversation, is it possible to arrive at one most likely diagnosis?",
    "Q2": "Does the conversation cover all the key information in the case notes (the physical examination and laboratory results left out)?",
    "Q3": "Does the patient-AI use medical terminology (macule, papule, lichenification, glabella), not everyday words (spot, bump, blister)?",
    "grounded": "Is every answer of the patient-AI grounded in the case notes, with nothing invented (denying what the notes do not mention is grounded)?",
    "complete": "Is each answer of the patient-AI complete for what the doctor-AI asked?",
}


# ------------------------------------------------------------------ judges: what each was shown, and asking it again

def frq_answer(record: dict, fmt: str | None) -> dict:
    frq = ((record.get("answers") or {}).get(fmt) or {}).get("frq")
    return frq if isinstance(frq, dict) else {}


def show_frq(record: dict, part: str | None, config: dict) -> dict:
    """What the grader was given: the correct diagnosis and the doctor-AI's answer."""
    return {"correct diagnosis": record.get("correct_answer"), "doctor-AI's answer": frq_answer(record, part).get("answer") or ""}


async def ask_frq(ctx, record: dict, part: str | None, settings, role: str) -> Grade:
    """The grader's requests again (extraction, then a verdict per diagnosis; re-asked as the run re-asks) over the
    stored FRQ answer of format ``part``, with the run's grader prompts, sampling and verdict rule."""
    answer = frq_answer(record, part).get("answer") or ""
    graded = {"answer": answer, **await grade_answer(ctx, answer, record["correct_answer"], settings, part, role=role)}
    return answer_grade("frq", graded, grader_judge(settings.roles[role], settings.verdict_rule))


def frq_count_items(records: list[dict], cfg: dict, path: Path) -> tuple[dict, list[dict]]:
    """The trials of one case in one format: how many of them the grader judged correct (0..trials)."""
    groups: dict[tuple, list] = {}
    for r in records:
        for (fmt, mode), g in metrics.grades(r).items():
            if mode == "frq":
                groups.setdefault((str(r.get("case_id", r["id"])), fmt, r.get("model", "")), []).append((r, g))
    trials = int(cfg.get("trials") or max((len(v) for v in groups.values()), default=0))
    items = []
    for (case, fmt, model), rows in sorted(groups.items()):
        # a case counts only with every trial graded: a missing or unscored trial would bias the count
        if len(rows) != trials or any(g.value not in (0, 1) for _, g in rows):
            continue
        rows.sort(key=lambda x: x[0].get("trial", 0))
        count = sum(g.value for _, g in rows)
        items.append({"id": f"{case}|{fmt}|{model}", "verdict": count, "stratum": f"{count}|{fmt}|{model}",
                      "show": {"correct diagnosis": rows[0][0].get("correct_answer"),
                               "doctor-AI's answers": [g.answer or "" for _, g in rows]}})
    return count_scale(trials), items


def assessed_turns(record: dict, live: bool) -> list[tuple[str, str]]:
    """The conversation as the assessor read it: a live run's with the doctor's fixed greeting first."""
    turns = transcript_turns(record.get("transcript"))
    return [("doctor", render("greeting"))] + turns if live else turns


def assess_judge(question: str, live: bool) -> Judge:
    """The assessor's yes/no on ``question``: one conversation per item (an unreadable reply is no item)."""

    def show(record: dict, part: str | None, config: dict) -> dict:
        return {"case notes": record.get("vignette") or "", "conversation": conversation_text(assessed_turns(record, live)).splitlines()}

    def items(records: list[dict], cfg: dict, path: Path) -> tuple[dict, list[dict]]:
        out = []
        for r in records:
            v = (((r.get("assessment") or {}).get(question)) or {}).get("verdict")
            if v not in (True, False):
                continue  # not asked, or an unreadable reply (unscored): no decision to check
            out.append({"id": str(r["id"]), "verdict": int(v), "stratum": f"{int(v)}|{r.get('model', '')}", "show": show(r, None, cfg)})
        return YES_NO, out

    async def ask(ctx, record: dict, part: str | None, settings, role: str) -> Grade:
        """The assessor's request for ``question`` again over the stored conversation, with the run's template and sampling."""
        got = await assess_conversation(ctx, assessed_turns(record, live), record.get("vignette") or "", settings, (question,), role=role)
        return assess_grade(question, got[question], settings.roles[role])

    return Judge(f"assess-{question}", YES_NO, ASSESS_QUESTIONS[question], role="assessor", show=show, items=items, ask=ask)


def calibration_judge(step: str, key: str) -> Judge:
    """``calibrate craftmd-grader``: per case of the dermatologist set, how many of its 5 extracted diagnoses the judge
    (``grader``) or the authors' grader (``published``) found correct."""

    def items(records: list[dict], cfg: dict, path: Path) -> tuple[dict, list[dict]]:
        trials = max((len(r.get("trials") or []) for r in records), default=0)  # 5 in the authors' file
        out = []
        for r in records:
            # the cases the calibration scores: the judge's main row leaves out cases with an unreadable verdict
            v = r.get("judge") if key == "judge" else (r.get("published") or {}).get("count")
            if v is None or (key == "judge" and "judge_unscored_trials" in r):
                continue
            out.append({"id": str(r["id"]), "verdict": int(v), "stratum": str(v),
                        "show": {"correct diagnosis": r.get("gold"),
                                 "diagnoses extracted in the 5 trials": [t.get("extracted") or "" for t in r.get("trials") or []]}})
        return count_scale(trials), out

    return Judge(step, count_scale(5), COUNT_QUESTION, role="grader", items=items)


# ------------------------------------------------------------------ the report's lines

REPORT_FIELDS = ("assessment", "patient_checks", "experts")  # the record fields report_case draws


def _yes_no(v) -> str:
    return "yes" if v is True else "no" if v is False else "unscored"


def _short(text, n: int):
    return text[:n] + " ..." if isinstance(text, str) and len(text) > n else text


def report_case(record: dict) -> list[tuple[str, str]]:
    """A record's conversation checks, one row each: the assessor's verdicts (with the experts' label where the
    conversation is a released one) and the patient checks, with the turns and what was found."""
    rows = []
    experts = record.get("experts") or {}
    for q in QUESTIONS:
        a = (record.get("assessment") or {}).get(q)
        if isinstance(a, dict):
            said = _yes_no(a.get("verdict")) + (f" (invented: {a['invented']})" if a.get("invented") else "")
            rows.append((f"assessor: {LABELS[q]}", said + (f"; experts: {_yes_no(experts[q])}" if q in experts else "")))
    pc = record.get("patient_checks")
    if isinstance(pc, dict):
        for c in (c for c in CHECKS if c in pc):  # a record checked before a check existed lacks it
            v = pc[c]
            if v is None:
                detail = "not checkable (the correct answer is not a diagnosis)"
            elif c == "copies_vignette":
                detail = "; ".join(f"patient turn {x['patient_turn']}: {x['words']} words: \u201c{_short(x['span'], 120)}\u201d" for x in v) or "no"
            elif c == "empty_turn":
                detail = ", ".join(f"patient turn {n}" for n in v) or "no"
            else:
                detail = "; ".join(f"patient turn {x['patient_turn']}: {x.get('named') or x.get('said')}" for x in v) or "no"
            rows.append((f"patient check: {DESCRIPTIONS[c].format(n=pc.get('span_words'))}", detail))
    return rows


# ------------------------------------------------------------------ released runs, comparison

PUBLISHED = ("craftmd-published-gpt4_1106", "craftmd-published-gpt3_1106", "craftmd-published-mistral-v2", "craftmd-published-llama2-7b")  # experiments/datasets/datasets.yaml


def import_published(name: str, dest: Path, cases: str | None) -> dict:
    """One of the authors' released runs (a registered data set name) into ``dest``, named ``<release>-published``."""
    return import_folder(Path(resolve_data(name)), f"{name.removeprefix('craftmd-published-')}-published", dest, cases)


# ------------------------------------------------------------------ the kinds of results folders

def live_judges(live: bool) -> tuple[Judge, ...]:
    return tuple(assess_judge(q, live) for q in QUESTIONS)


CRAFTMD = StudyResults(
    experiment="craftmd", scores=scores, compare=run_compare, published=PUBLISHED, import_published=import_published,
    report_case=report_case, report_fields=REPORT_FIELDS, report_run=conversation_tables,
    judges=(Judge("frq", BINARY, FRQ_QUESTION, role="grader", show=show_frq, ask=ask_frq),
            Judge("frq-count", count_scale(5), COUNT_QUESTION, role="grader", items=frq_count_items),
            *live_judges(True)))
EXPERTS_IMPORT = StudyResults(experiment="craftmd-experts", scores=scores, report_case=report_case, report_fields=REPORT_FIELDS)
CALIBRATE_CONVERSATIONS = StudyResults(experiment="calibrate-craftmd-conversations", scores=scores, judges=live_judges(False),
                                       report_case=report_case, report_fields=REPORT_FIELDS, report_run=conversations_calibration_tables)
CALIBRATE_GRADER = StudyResults(experiment="calibrate-craftmd-grader", scores=calibration_scores,
                                judges=(calibration_judge("grader", "judge"), calibration_judge("published", "published")),
                                report_run=grader_calibration_tables)
