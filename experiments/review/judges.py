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
DERA open QA (``experiment: dera-qa``, open answers)
  ``llm-exact``      per question and arm: the LLM exact-match verdict (0/1).
  ``llm-similarity`` per question and arm: the LLM similarity score (0-1, normalized as reported).
Rubric auto-evaluation (``experiment: autoeval``)
  ``rubric``     per dialogue and criterion: the judge's rating 1-5.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from experiments.autoeval import judge as J
from experiments.autoeval.study import load_dialogues
from experiments.core.results import load_run
from experiments.craftmd.assess import QUESTIONS as ASSESS_QUESTIONS
from experiments.dera.qa_metrics import ARMS, normalize_similarity
from models.errors import DataError

# the study modules (DERA, autoeval) are imported by their builders: loading them costs ~0.7 s that a
# CRAFT-MD review, `calibrate --labels` and `report` need not pay

# a scale: kind binary | count | rating | unit; the values a label may take (unit: any number in [0, 1])
BINARY = {"kind": "binary", "values": [1, 0], "names": {"1": "match", "0": "no match"}}


def count_scale(n: int) -> dict:
    return {"kind": "count", "values": list(range(n + 1)), "max": n}


RATING = {"kind": "rating", "values": [1, 2, 3, 4, 5]}
UNIT = {"kind": "unit", "values": None}

# the question above each item, in our words; the rule for diagnoses is the one the authors gave their dermatologist
_DX_RULE = ("Synonyms count as correct. An answer broader than the correct diagnosis (the correct one is a subtype of it) "
            "is correct; an answer that is a subtype of the correct diagnosis is not.")
QUESTIONS = {
    "frq": "Does the doctor-AI's answer name the correct diagnosis? " + _DX_RULE,
    "count": "How many of these diagnoses are the correct diagnosis? " + _DX_RULE,
    "llm-exact": "Does the prediction give the same answer as the gold answer?",
    "llm-similarity": "How close is the prediction to the gold answer, from 0 (unrelated) to 1 (the same answer)?",
    "rubric": "Rate the doctor in this dialogue on the criterion, from 1 to 5 (the definitions of 5 and 1 are given).",
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
    "dera-qa": ("llm-exact", "llm-similarity"),
    "autoeval": ("rubric",),
}


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
    run = load_run(p)  # ResultsError (exit 2) for a folder without records.jsonl
    exp = experiment_of(p)
    steps = STEPS.get(exp)
    if steps is None:
        raise DataError(f"{p}: a {exp or 'unknown'} run has no judge to review (reviewable: "
                        + "; ".join(f"{e}: {', '.join(s)}" for e, s in STEPS.items()) + ")")
    if step not in steps:
        raise DataError(f"--judge {step}: a {exp} run's judge steps are {', '.join(steps)}")
    scale, items = BUILDERS[step](run["records"], run.get("config") or {}, p)
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


# ------------------------------------------------------------------ DERA open QA

def _dera_items(kind: str):
    def build(records, cfg, p):
        rows = [(r, arm, ((r.get("scores") or {}).get(arm) or {})) for r in records if not r.get("mcq") for arm in ARMS]
        if kind == "exact":
            vals = [s.get("exact") for _, _, s in rows]
        else:  # the similarity as the run reports it: out-of-range scores normalized over the run
            vals = normalize_similarity([s.get("similarity_raw") for _, _, s in rows])
        items = []
        for (r, arm, s), v in zip(rows, vals):
            if v is None or not s.get("answer"):
                continue  # no answer: the judge was not asked
            stratum = str(int(v)) if kind == "exact" else ("high" if v >= 0.5 else "low")
            items.append({"id": f"{r['id']}|{arm}", "verdict": int(v) if kind == "exact" else float(v), "stratum": f"{stratum}|{arm}|{r.get('model', '')}",
                          "show": {"question": r.get("question"), "gold answer": r.get("gold_text") or r.get("gold"), "prediction": s.get("answer")}})
        return (BINARY if kind == "exact" else UNIT), items
    return build


# ------------------------------------------------------------------ rubric auto-evaluation

def _rubric_items(records, cfg, p):
    dialogues = {}
    src = cfg.get("data")
    if src and Path(src).exists():
        dialogues = {d["source_id"]: d["transcript"] for d in load_dialogues(src)[0]}
    criteria = J.load_criteria(cfg.get("criteria_file"))
    items = []
    for r in records:
        if r.get("rating") not in (1, 2, 3, 4, 5):
            continue
        c = criteria.get(str(r.get("criterion")))
        sid = str(r.get("source_id") or "")
        transcript = dialogues.get(sid)
        if transcript is None:
            raise DataError(f"{p}: the dialogue {sid!r} rated in record {r['id']!r} is not in the run's data {src!r}: "
                            "the page shows the dialogue the judge rated")
        items.append({"id": str(r["id"]), "verdict": int(r["rating"]), "stratum": f"{r['rating']}|{r.get('criterion')}",
                      "show": {"criterion": c.name if c else r.get("criterion"), "a 5 means": c.score_5 if c else "",
                               "a 1 means": c.score_1 if c else "",
                               "dialogue": [f"{t.get('agent')}: {t.get('content')}" for t in transcript]}})
    return RATING, items


BUILDERS = {"frq": _frq_items, "frq-count": _frq_count_items, "grader": _calibration_items("judge"),
            "published": _calibration_items("published"), "llm-exact": _dera_items("exact"),
            "llm-similarity": _dera_items("similarity"), "rubric": _rubric_items,
            **{f"assess-{q}": _assess_items(q) for q in ASSESS_QUESTIONS}}
