"""MediTOD's scorers (experiments/core/scorers.py), each declared once, over one test turn. NLU and POL: ``joint``
(the turn's tuple set equals the gold's), ``prf`` (precision, recall and F1 over the turn's tuples), ``format`` (the
output could not be read as the task's JSON); with ``--adjudicate-model``, ``adjudicate`` (the grader's verdict on
each non-canonical (gold value, predicted value) pair of the turn, part = the pair's index). NLG: ``rouge``
(ROUGE-1 / ROUGE-L F of the utterance). A POL / NLG request at utterance 0 is sent but not scored (no grades), as the
dataset authors do; a turn whose gold has nothing to score is "not checkable".

The figures are resampled by dialogue (the record's ``case_id``): the turns of one dialogue are not independent. The
run's headline numbers (micro P/R/F1, corpus BLEU, Precision@K) are corpus measures over every turn's ``answer`` and
``target`` (experiments/studies/meditod/metrics.py), beside these per-turn figures.
"""

from __future__ import annotations

from string import Template

from experiments.common.grade import BINARY, FLAG, UNIT, Grade, grades, split_name
from experiments.common.normalize import normalize
from experiments.common.parsing import extract_verdict
from experiments.common.text import rouge
from experiments.core.scorers import Scorer
from experiments.studies.meditod import metrics as M
from experiments.studies.meditod.prompts import prompt_hash, template

RULE = {"rule": "the dataset authors' scorer"}
PARSED = "positive / negative"
NO_VERDICT = "no verdict: not the same"


def scored(r: dict) -> bool:
    """A turn the authors score (not a POL / NLG request at utterance 0)."""
    return bool((r.get("metadata") or {}).get("scored", True)) and r.get("target") is not None


def structured(value_of, source: str):
    """A rule over the one turn's structured scores (NLU / POL), through the authors' scorer."""

    def decide(ctx, r: dict, s, role) -> dict:
        if not scored(r):
            return {}
        one = M.score(s.task, [r["target"]], [r.get("answer")])
        ok = bool(one["scored_turns"])
        return {None: Grade(value=value_of(one) if ok else None, answer=r.get("answer"), source=source, judge=RULE, skipped=not ok)}

    return decide


def decide_rouge(ctx, r: dict, s, role) -> dict:
    if not scored(r):
        return {}
    pred = r.get("answer") if isinstance(r.get("answer"), str) else ""
    value = rouge([normalize(pred, split="punct")], [normalize(r["target"], split="punct")])
    return {None: Grade(value=value, answer=pred, source="rouge-score F", judge=RULE)}


async def decide_adjudicate(ctx, r: dict, s, role: str) -> dict:
    """The grader asked about each non-canonical (gold, predicted) value pair of the turn (step ``adjudicate:<i>``)."""
    if not scored(r):
        return {}
    tmpl, gen = Template(template("adjudicate.txt")), s.sampling.adjudicate.gen()
    judge = {"model": (s.roles or {}).get(role), "prompt_hash": prompt_hash("adjudicate.txt")}
    out = {}
    for i, (a, b) in enumerate(M.adjudication_pairs(s.task, [r["target"]], [r.get("answer")])):
        res = await ctx.complete(tmpl.substitute(a=a.lower(), b=b.lower()), role=role, gen=gen, step=f"adjudicate:{i}")
        verdict = extract_verdict(res.text, ("positive",), ("negative",), anywhere=True)
        out[str(i)] = Grade(value=int(bool(verdict)), answer={"gold": a, "pred": b}, source=PARSED if verdict is not None else NO_VERDICT,
                            explanation=res.text, judge=judge)
    return out


def show(r: dict, part: str | None) -> dict:
    """What the grader was shown: the two values."""
    g = ((r.get("scores") or {}).get(f"adjudicate/{part}") or {}).get("answer") or {}
    return {"gold value": g.get("gold"), "predicted value": g.get("pred")}


def _structured(s) -> bool:
    return s.task in ("nlu", "pol")


SCORERS = (
    Scorer("joint", BINARY, "Does the turn's predicted tuple set equal the gold set (joint accuracy)?",
           decide=structured(lambda one: int(one["joint_accuracy"] == 1.0), "tuple sets equal"), applies=_structured),
    Scorer("prf", UNIT, "Precision, recall and F1 of the turn's predicted tuples against the gold tuples.",
           decide=structured(lambda one: {k: one[k] for k in ("precision", "recall", "f1")}, "tuples, all"), applies=_structured),
    Scorer("format", FLAG, "Could the model's output not be read as the task's JSON (a format error)?",
           decide=structured(lambda one: one["format_errors"], "format error"), applies=_structured),
    Scorer("rouge", UNIT, "ROUGE-1 and ROUGE-L F of the predicted doctor utterance against the gold one.",
           decide=decide_rouge, applies=lambda s: s.task == "nlg"),
    Scorer("adjudicate", BINARY, "Do the gold value and the predicted value mean the same thing?", decide=decide_adjudicate,
           role="grader", show=show, applies=lambda s: bool(s.adjudicate_model) and _structured(s)),
)


def adjudications(r: dict) -> list[dict]:
    """The run's own grader verdicts on a turn's pairs, in order (from its ``adjudicate/<i>`` grades)."""
    judged = []
    for name, g in grades(r).items():
        step, part, who = split_name(name)
        if step == "adjudicate" and who is None and part is not None:
            judged.append((int(part), g))
    return [{**(g.answer or {}), "reply": g.explanation or "", "same": bool(g.value), "parsed": g.source == PARSED} for _, g in sorted(judged)]
