"""MediTOD's results for the tools over results (experiments/core/study.py, ``StudyResults``): each turn's typed scores,
given by the run (:func:`turn_scores`) and derived the same way for a record written before them (:func:`scores`).

The scores (NLU / POL ``joint``, ``prf``, ``format``; NLG ``rouge``; ``adjudicate/<i>``) are computed by the metrics'
own scorer (:func:`experiments.studies.meditod.metrics.score` on the one turn) and described in experiments/studies/meditod/README.md,
Typed scores; a POL/NLG request at utterance 0 is sent but not scored (no scores). The run's other metrics are corpus
measures over ``prediction`` and ``target``.
"""

from __future__ import annotations

from experiments.common.grade import Grade, grades
from experiments.common.normalize import normalize
from experiments.common.text import rouge
from experiments.core.study import StudyResults
from experiments.studies.meditod import metrics as M
from experiments.studies.meditod.prompts import prompt_hash

RULE = {"rule": "the dataset authors' scorer"}
PARSED = "positive / negative"


def scores(record: dict, settings) -> dict[str, Grade]:
    return turn_scores(record, record.get("task") or settings.task, (settings.roles or {}).get("grader"),
                       record.get("adjudications") or [])


def turn_scores(record: dict, task: str, grader: str | None, judged: list[dict]) -> dict[str, Grade]:
    """The typed scores of one turn (its ``target`` and ``prediction``) and of the grader's verdicts ``judged`` on its
    pairs (``{gold, pred, reply, same, parsed}``)."""
    if not record.get("scored", True) or "target" not in record:
        return {}
    pred = record.get("prediction")
    if task == "nlg":
        gold = normalize(record["target"], split="punct")
        turn = rouge([normalize(pred if isinstance(pred, str) else "", split="punct")], [gold])
        return {"rouge": Grade(value=turn, answer=pred, source="rouge-score F", judge=RULE)}
    one = M.score(task, [record["target"]], [pred])
    scored = bool(one["scored_turns"])
    out = {"joint": Grade(value=int(one["joint_accuracy"] == 1.0) if scored else None, answer=pred, source="tuple sets equal",
                         judge=RULE, skipped=not scored),
           "prf": Grade(value={k: one[k] for k in ("precision", "recall", "f1")} if scored else None, answer=pred,
                        source="tuples, all", judge=RULE, skipped=not scored),
           "format": Grade(value=one["format_errors"] if scored else None, answer=pred, source="format error", judge=RULE,
                           skipped=not scored)}
    judge = {"model": grader, "prompt_hash": prompt_hash("adjudicate.txt")}
    for i, j in enumerate(judged):
        out[f"adjudicate/{i}"] = Grade(value=int(bool(j.get("same"))), answer={"gold": j.get("gold"), "pred": j.get("pred")},
                                       source=PARSED if j.get("parsed") else "no verdict: not the same",
                                       explanation=j.get("reply"), judge=judge)
    return out


def adjudications(record: dict) -> list[dict]:
    """The grader's verdicts on a turn's pairs, in order, from its ``adjudicate/<i>`` scores."""
    judged = sorted((int(n.split("/")[1]), g) for n, g in grades(record).items() if n.startswith("adjudicate/"))
    return [{**g.answer, "reply": g.explanation or "", "same": bool(g.value), "parsed": g.source == PARSED} for _, g in judged]


RESULTS = {task: StudyResults(experiment=f"meditod-{task}", scores=scores) for task in ("nlu", "pol", "nlg")}
