"""MediTOD's results for the tools over results (experiments/core/study.py, ``StudyResults``): each turn's typed scores.

Rule scores of one scored turn (a POL/NLG request at utterance 0 is sent but not scored: no scores), computed by the
metrics' own scorer (:func:`experiments.meditod.metrics.score` on the one turn, the way the record's ``correct`` and
``f1`` are):

- NLU / POL: ``joint`` (1 when the predicted tuple set equals the gold one), ``prf`` (``{precision, recall, f1}`` over
  all tuples of the turn) and ``format`` (1 for a format error); unscored (None) on a turn the authors' scorer skips
  (an empty gold, a lone slot-less ``inform`` / ``inquire``), which the run's joint accuracy and format-error rate
  count in their denominator as 0.
- NLG: ``rouge`` (``{rouge1, rougeL}`` of the turn after the authors' normalization; the run's ROUGE is their mean).
  BLEU is a corpus measure and BERTScore needs its encoder: both stay run metrics only.
- with ``--adjudicate-model``: ``adjudicate/<i>``, the grader's verdict on the turn's i-th (gold value, predicted value)
  pair (1 = the same), judge = the grader role's model and the hash of ``adjudicate.txt``.
"""

from __future__ import annotations

from experiments.common.grade import Grade
from experiments.common.normalize import normalize
from experiments.common.text import rouge
from experiments.core.study import StudyResults
from experiments.meditod import metrics as M
from experiments.meditod.prompts import prompt_hash

RULE = {"rule": "the dataset authors' scorer"}


def scores(record: dict, settings) -> dict[str, Grade]:
    if not record.get("scored", True) or "target" not in record:
        return {}
    task = record.get("task") or settings.task
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
    judge = {"model": (settings.roles or {}).get("grader"), "prompt_hash": prompt_hash("adjudicate.txt")}
    for i, j in enumerate(record.get("adjudications") or []):
        out[f"adjudicate/{i}"] = Grade(value=int(bool(j.get("same"))), answer={"gold": j.get("gold"), "pred": j.get("pred")},
                                       source="positive / negative" if j.get("parsed") else "no verdict: not the same",
                                       explanation=j.get("reply"), judge=judge)
    return out


RESULTS = {task: StudyResults(experiment=f"meditod-{task}", scores=scores) for task in ("nlu", "pol", "nlg")}
