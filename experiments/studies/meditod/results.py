"""MediTOD's older records in today's typed shape (experiments/core/record.py): a turn's own fields (``dialog_id``,
``uttr_id``, ``prediction``, ``messages`` / ``prompt``, ``transcript`` of ``{agent, content}``) and, before typed
scores, its ``adjudications`` list. Their grades are the ones the scorers (experiments/studies/meditod/scorers.py)
give today; a grader verdict is kept as it was given.
"""

from __future__ import annotations

from experiments.common.grade import Grade, to_disk
from experiments.core.record import RUNNER_FIELDS, is_typed, record
from experiments.studies.meditod.prompts import prompt_hash
from experiments.studies.meditod.scorers import NO_VERDICT, PARSED, SCORERS

INPUTS = ("dialog_id", "uttr_id", "messages", "prompt", "exemplar_ids")
META = ("task", "mode", "model", "lora", "prompt_hash", "prompt_format", "exemplars_retrieved", "exemplars_kept", "scored", "output",
        "finish_reason", "parse_error")


def upgrade_turn(r: dict, settings) -> dict:
    if is_typed(r):
        return r
    out = record(r["id"], r.get("dialog_id"), inputs={k: r[k] for k in INPUTS if k in r}, target=r.get("target"),
                 transcript=[{"role": t.get("agent") or t.get("role"), "text": t.get("content", t.get("text")) or ""} for t in r.get("transcript") or []],
                 answer=r.get("prediction"), metadata={k: r[k] for k in META if k in r})
    if r.get("scores"):
        out["scores"] = r["scores"]
    else:  # before typed scores: the rules again, the grader's verdicts as the record kept them
        s = settings.model_copy(update={"task": r.get("task") or settings.task})
        grades = {n: g for sc in SCORERS if sc.role is None and sc.applies(s) for n, g in sc.rule(out, s).items()}
        judge = {"model": (settings.roles or {}).get("grader"), "prompt_hash": prompt_hash("adjudicate.txt")}
        for i, j in enumerate(r.get("adjudications") or []):
            grades[f"adjudicate/{i}"] = Grade(value=int(bool(j.get("same"))), answer={"gold": j.get("gold"), "pred": j.get("pred")},
                                              source=PARSED if j.get("parsed", True) else NO_VERDICT, explanation=j.get("reply"), judge=judge)
        out["scores"] = to_disk(grades)
    return {**{k: v for k, v in r.items() if k in RUNNER_FIELDS}, **out}
