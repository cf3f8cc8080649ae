"""MediTOD's results for the tools over results (experiments/core/study.py, ``StudyResults``): each turn's typed scores,
given by the run (:func:`turn_scores`) and derived the same way for a record written before them (:func:`scores`).

Rule scores of one scored turn (a POL/NLG request at utterance 0 is sent but not scored: no scores), computed by the
metrics' own scorer (:func:`experiments.studies.meditod.metrics.score` on the one turn):

- NLU / POL: ``joint`` (1 when the predicted tuple set equals the gold one), ``prf`` (``{precision, recall, f1}`` over
  all tuples of the turn) and ``format`` (1 for a format error); unscored (None) on a turn the authors' scorer skips
  (an empty gold, a lone slot-less ``inform`` / ``inquire``), which the run's joint accuracy and format-error rate
  count in their denominator as 0.
- NLG: ``rouge`` (``{rouge1, rougeL}`` of the turn after the authors' normalization; the run's ROUGE is their mean).
  BLEU is a corpus measure and BERTScore needs its encoder: both stay run metrics only.
- with ``--adjudicate-model``: ``adjudicate/<i>``, the grader's verdict on the turn's i-th (gold value, predicted value)
  pair (1 = the same), judge = the grader role's model and the hash of ``adjudicate.txt``; the adjudicated metrics
  read them back (:func:`adjudications`).
The run's other metrics are corpus measures over ``prediction`` and ``target`` (README.md says which are which).
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
