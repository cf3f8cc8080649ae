"""The judge decisions a clinician can review, per kind of results directory (docs/protocols.md, Judge calibration).

A judge *step* names one LLM-judge decision of a run. Each step turns the run's records into
items: ``{"id", "verdict", "stratum", "show"}`` where ``verdict`` is the judge's decision on its
own scale (never sent to the page), ``stratum`` what the sample is stratified by (the verdict and
the format / arm / criterion / model where the run has several) and ``show`` exactly what the
protocol gives the judge (the page shows nothing else). A study that declares its judges
(``StudyResults.judges``, experiments/core/judging.py) is reviewed from them: CRAFT-MD's, in
experiments/craftmd/judges.py. Steps:

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
from experiments.core.judging import review_items
from experiments.core.registry import RESULTS, open_run, results_for
from experiments.dera.qa_metrics import ARMS, normalize_similarity
from models.errors import DataError

# the study modules (DERA, autoeval) are imported by their builders: loading them costs ~0.7 s that a
# CRAFT-MD review, `calibrate --labels` and `report` need not pay

# a scale: kind binary | count | rating | unit; the values a label may take (unit: any number in [0, 1])
BINARY = {"kind": "binary", "values": [1, 0], "names": {"1": "match", "0": "no match"}}
RATING = {"kind": "rating", "values": [1, 2, 3, 4, 5]}
UNIT = {"kind": "unit", "values": None}

# the question above each item, in our words (a study that declares its judges says its own: Judge.question)
QUESTIONS = {
    "llm-exact": "Does the prediction give the same answer as the gold answer?",
    "llm-similarity": "How close is the prediction to the gold answer, from 0 (unrelated) to 1 (the same answer)?",
    "rubric": "Rate the doctor in this dialogue on the criterion, from 1 to 5 (the definitions of 5 and 1 are given).",
}

STEPS = {  # the kinds of runs whose study does not declare its judges (StudyResults.judges) yet
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
    run = open_run(p).as_dict()  # ResultsError (exit 2) for a folder without records.jsonl; older records with their typed scores
    exp = experiment_of(p)
    declared = results_for(exp)
    steps = tuple(j.step for j in declared.judges) if declared and declared.judges else STEPS.get(exp)
    if steps is None:
        reviewable = {**STEPS, **{e: tuple(j.step for j in r.judges) for e, r in RESULTS.items() if r.judges}}
        raise DataError(f"{p}: a {exp or 'unknown'} run has no judge to review (reviewable: "
                        + "; ".join(f"{e}: {', '.join(s)}" for e, s in reviewable.items()) + ")")
    if step not in steps:
        raise DataError(f"--judge {step}: a {exp} run's judge steps are {', '.join(steps)}")
    if declared and declared.judges:
        judge = declared.judge(step)
        scale, items = review_items(judge, run["records"], run.get("config") or {}, p)
        scale = {**scale, "question": judge.question}
    else:
        scale, items = BUILDERS[step](run["records"], run.get("config") or {}, p)
        scale = {**scale, "question": QUESTIONS[step]}
    if not items:
        raise DataError(f"{p}: no record carries a {step} decision to review")
    ids = [it["id"] for it in items]
    if len(set(ids)) != len(ids):
        raise DataError(f"{p}: two items share an id under --judge {step}")
    return {"step": step, "experiment": exp, "scale": scale, "items": items}


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


BUILDERS = {"llm-exact": _dera_items("exact"), "llm-similarity": _dera_items("similarity"), "rubric": _rubric_items}
