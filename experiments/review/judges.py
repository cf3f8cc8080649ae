"""The judge decisions a clinician can review, per kind of results directory (docs/protocols.md, Judge calibration).

A judge *step* names one LLM-judge decision of a run. Each step turns the run's records into
items: ``{"id", "verdict", "stratum", "show"}`` where ``verdict`` is the judge's decision on its
own scale (never sent to the page), ``stratum`` what the sample is stratified by (the verdict and
the format / arm / criterion / model where the run has several) and ``show`` exactly what the
protocol gives the judge (the page shows nothing else). Steps:

CRAFT-MD runs (``experiment: craftmd``)
  ``frq``        one trial's FRQ answer in one format: the grader's match (1) / no match (0).
  ``frq-count``  the trials of one case in one format: how many of them the grader judged correct
                 (0..trials), the design of the authors' dermatologist check.
  ``assess-Q1`` ``assess-Q2`` ``assess-Q3`` ``assess-grounded`` ``assess-complete``
                 one conversation: the conversation assessor's yes (1) / no (0) to that question (runs with
                 ``assess_conversations``; also ``calibrate conversations`` results, the released conversations).
Grader calibrations (``experiment: calibrate-craftmd-grader``)
  ``grader``     per case, how many of the 5 extracted diagnoses the judge found correct (0-5).
  ``published``  the same count by the authors' own grader (cases matched in the release).
Any other kind of run: the judges its study declares (``StudyResults.judges``, experiments/core/judging.py), e.g.
DERA open QA's ``llm-exact`` / ``llm-similarity`` (experiments/dera/results.py) and the autoeval ``rubric``
(experiments/autoeval/results.py).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from experiments.core.judging import review_items
from experiments.core.registry import RESULTS, open_run, results_for
from experiments.craftmd.assess import QUESTIONS as ASSESS_QUESTIONS
from models.errors import DataError

# a scale: kind binary | count | rating | unit; the values a label may take (unit: any number in [0, 1])
BINARY = {"kind": "binary", "values": [1, 0], "names": {"1": "match", "0": "no match"}}


def count_scale(n: int) -> dict:
    return {"kind": "count", "values": list(range(n + 1)), "max": n}


# the question above each item, in our words; the rule for diagnoses is the one the authors gave their dermatologist
_DX_RULE = ("Synonyms count as correct. An answer broader than the correct diagnosis (the correct one is a subtype of it) "
            "is correct; an answer that is a subtype of the correct diagnosis is not.")
QUESTIONS = {
    "frq": "Does the doctor-AI's answer name the correct diagnosis? " + _DX_RULE,
    "count": "How many of these diagnoses are the correct diagnosis? " + _DX_RULE,
    # the conversation assessor's questions (experiments/craftmd/prompts/assess_*.txt), asked of the same case notes and conversation
    "assess-Q1": "From this conversation alone, could one most likely diagnosis be reached (did the doctor-AI stop asking when only one was left)?",
    "assess-Q2": "Does the conversation cover the key information of the case notes (the history; examination and test results are not expected)?",
    "assess-Q3": "Does the patient-AI use medical terminology where a patient would use everyday words?",
    "assess-grounded": "Is every answer of the patient-AI grounded in the case notes, with nothing invented?",
    "assess-complete": "Is each answer of the patient-AI complete for what the doctor-AI asked?",
}
YES_NO = {"kind": "binary", "values": [1, 0], "names": {"1": "yes", "0": "no"}}

ASSESS_STEPS = tuple(f"assess-{q}" for q in ASSESS_QUESTIONS)
STEPS = {
    "craftmd": ("frq", "frq-count", *ASSESS_STEPS),
    "calibrate-craftmd-conversations": ASSESS_STEPS,
    "calibrate-craftmd-grader": ("grader", "published"),
}


def steps_of(experiment: str) -> tuple[str, ...] | None:
    """The judge steps of a kind of run: those above, or the judges its study declares (StudyResults.judges)."""
    declared = results_for(experiment)
    return STEPS.get(experiment) or (tuple(j.step for j in declared.judges) if declared and declared.judges else None)


def experiment_of(run_dir: Path) -> str:
    cfg_path = run_dir / "config.yaml"
    try:
        cfg = yaml.safe_load(cfg_path.read_text()) if cfg_path.exists() else {}
    except yaml.YAMLError as e:
        raise DataError(f"{cfg_path}: not valid YAML ({e})") from None
    return str((cfg or {}).get("experiment") or "") if isinstance(cfg, dict) else ""


def _config(run_dir: Path) -> dict:
    p = run_dir / "config.yaml"
    return (yaml.safe_load(p.read_text()) or {}) if p.exists() else {}


def load_judge(run_dir: str | Path, step: str) -> dict:
    """{"step", "experiment", "scale", "items": [...]} for judge ``step`` of the run; a step the run
    does not have, or a run without any judged item, is bad input naming the folder."""
    p = Path(run_dir)
    run = open_run(p)  # ResultsError (exit 2) for a folder without records.jsonl; older records upgraded by their study
    exp = experiment_of(p)
    steps = steps_of(exp)
    if steps is None:
        kinds = {**STEPS, **{e: tuple(j.step for j in r.judges) for e, r in RESULTS.items() if r.judges}}
        raise DataError(f"{p}: a {exp or 'unknown'} run has no judge to review (reviewable: "
                        + "; ".join(f"{e}: {', '.join(s)}" for e, s in kinds.items()) + ")")
    if step not in steps:
        raise DataError(f"--judge {step}: a {exp} run's judge steps are {', '.join(steps)}")
    judge = results_for(exp).judge(step) if exp not in STEPS else None
    if judge is not None:  # a judge its study declares (experiments/core/judging.py)
        scale, items = review_items(judge, run.finished, run.config, p)
        scale = {**scale, "question": judge.question}
    else:
        scale, items = BUILDERS[step](run.finished, run.config, p)
        scale = {**scale, "question": QUESTIONS["count" if scale["kind"] == "count" else step]}
    if not items:
        raise DataError(f"{p}: no record carries a {step} decision to review")
    ids = [it["id"] for it in items]
    if len(set(ids)) != len(ids):
        raise DataError(f"{p}: two items share an id under --judge {step}")
    return {"step": step, "experiment": exp, "scale": scale, "items": items}


# ------------------------------------------------------------------ CRAFT-MD

def _frq_items(records, cfg, p):
    items = []
    for r in records:
        for fmt, modes in (r.get("answers") or {}).items():
            frq = (modes or {}).get("frq") if isinstance(modes, dict) else None
            if not isinstance(frq, dict) or frq.get("correct") not in (0, 1):
                continue
            items.append({"id": f"{r['id']}|{fmt}", "verdict": int(frq["correct"]), "stratum": f"{frq['correct']}|{fmt}|{r.get('model', '')}",
                          "show": {"correct diagnosis": r.get("correct_answer"), "doctor-AI's answer": frq.get("answer") or ""}})
    return BINARY, items


def _frq_count_items(records, cfg, p):
    groups: dict[tuple, list] = {}
    for r in records:
        for fmt, modes in (r.get("answers") or {}).items():
            frq = (modes or {}).get("frq") if isinstance(modes, dict) else None
            if isinstance(frq, dict):
                groups.setdefault((str(r.get("case_id", r["id"])), fmt, r.get("model", "")), []).append((r, frq))
    trials = int(cfg.get("trials") or max((len(v) for v in groups.values()), default=0))
    items = []
    for (case, fmt, model), rows in sorted(groups.items()):
        # a case counts only with every trial graded: a missing or unscored trial would bias the count
        if len(rows) != trials or any(f.get("correct") not in (0, 1) for _, f in rows):
            continue
        rows.sort(key=lambda x: x[0].get("trial", 0))
        count = sum(f["correct"] for _, f in rows)
        items.append({"id": f"{case}|{fmt}|{model}", "verdict": count, "stratum": f"{count}|{fmt}|{model}",
                      "show": {"correct diagnosis": rows[0][0].get("correct_answer"),
                               "doctor-AI's answers": [f.get("answer") or "" for _, f in rows]}})
    return count_scale(trials), items


def _calibration_items(key: str):
    def build(records, cfg, p):
        trials = max((len(r.get("trials") or []) for r in records), default=0)  # 5 in the authors' file
        items = []
        for r in records:
            # the cases today's calibrate scores: the judge's main row leaves out cases with an unreadable verdict
            v = r.get("judge") if key == "judge" else (r.get("published") or {}).get("count")
            if v is None or (key == "judge" and "judge_unscored_trials" in r):
                continue
            items.append({"id": str(r["id"]), "verdict": int(v), "stratum": str(v),
                          "show": {"correct diagnosis": r.get("gold"),
                                   "diagnoses extracted in the 5 trials": [t.get("extracted") or "" for t in r.get("trials") or []]}})
        return count_scale(trials), items
    return build


def _assess_items(question: str):
    """One conversation per item: the assessor's verdict on ``question``; the page shows what the assessor was given,
    the case notes and the conversation (a live run's with the doctor's fixed greeting first, as the assessor reads it)."""
    def build(records, cfg, p):
        from experiments.craftmd.assess import conversation_text, transcript_turns
        from experiments.craftmd.prompts import render

        live = cfg.get("experiment") == "craftmd"
        items = []
        for r in records:
            v = (((r.get("assessment") or {}).get(question)) or {}).get("verdict")
            if v not in (True, False):
                continue  # not asked, or an unreadable reply (unscored): no decision to check
            turns = transcript_turns(r.get("transcript"))
            if live:
                turns = [("doctor", render("greeting"))] + turns
            items.append({"id": str(r["id"]), "verdict": int(v), "stratum": f"{int(v)}|{r.get('model', '')}",
                          "show": {"case notes": r.get("vignette") or "",
                                   "conversation": conversation_text(turns).splitlines()}})
        return YES_NO, items
    return build


BUILDERS = {"frq": _frq_items, "frq-count": _frq_count_items, "grader": _calibration_items("judge"),
            "published": _calibration_items("published"),
            **{f"assess-{q}": _assess_items(q) for q in ASSESS_QUESTIONS}}
