"""DERA's scorers (experiments/core/scorers.py), each declared once. DERA-QA, per arm (``oneshot``, ``dera``):
``accuracy`` (MCQ: the voted letter is the answer's), ``llm-exact`` and ``llm-similarity`` (the judge, open-ended:
an arm without an answer is 0 by the rule "no answer", nothing asked), ``bertscore`` (F1 with the run's local encoder).
The similarity's scale is the run's: out-of-range values are 0 unless every value is 100 (then 1), a rule over the
whole run that every table applies, so summary.md, the paper table, compare and the report show one value. Summaries,
care plans and the corruption study: ``gptf1`` (the judge's concept extraction and verification, per arm and section).
The names and what each holds: experiments/studies/dera/README.md, Records and results.
"""

from __future__ import annotations

from experiments.common.grade import BINARY, UNIT, Grade, Scale, grades, split_name
from experiments.core.scorers import Scorer
from experiments.studies.dera import gptf1
from experiments.studies.dera.calls import CaseLog
from experiments.studies.dera.prompts import PROMPTS
from experiments.studies.dera import qa_metrics
from experiments.studies.dera.qa_metrics import ARMS, NO_ANSWER, ask_exact, ask_similarity, normalize_similarity

PRF = ("precision", "recall", "f1")


def show(record: dict, part: str | None) -> dict:
    """What both judges were given: the question, the gold answer and the arm's prediction."""
    return {"question": (record.get("inputs") or {}).get("question"), "gold answer": record.get("target"),
            "prediction": (record.get("answer") or {}).get(part)}


def _judge(s, role: str, template: str) -> dict:
    return {"model": (s.roles or {}).get(role), "prompt_hash": PROMPTS.hash(template)}


SOURCES = {"llm-exact": "first line True/False", "llm-similarity": "first number", "bertscore": "bertscore F1"}


def accuracy_grade(pred: str | None, value: int | None) -> Grade:
    return Grade(value=value, answer=pred, source="letter", judge={"rule": "the voted letter is answer_idx"})


def arm_grade(step: str, pred: str | None, value=None, reply: str | None = None, judge: dict | None = None, metadata: dict | None = None) -> Grade:
    """One arm's grade of an open-ended QA scorer: ``value`` as decided, or, for an arm without an answer (every sample
    unusable), 0 by the rule "no answer", nothing asked."""
    if not pred:
        return Grade(value=0 if step == "llm-exact" else 0.0, answer=pred, source="no answer", judge=NO_ANSWER,
                     explanation="no answer" if step == "llm-exact" else None)
    return Grade(value=value, answer=pred, source=SOURCES[step], explanation=reply, judge=judge or {}, metadata=metadata or {})


def decide_accuracy(ctx, r: dict, s, role) -> dict:
    return {arm: accuracy_grade(r["answer"].get(arm), int(r["answer"].get(arm) == r["target"])) for arm in ARMS}


def judged(step: str):
    """``llm-exact`` / ``llm-similarity``: the judge asked about each arm's answer."""
    exact = step == "llm-exact"
    template = "judge_exact" if exact else "judge_similarity"

    async def decide(ctx, r: dict, s, role: str) -> dict:
        log, out = CaseLog(ctx), {}
        question, gold = (r.get("inputs") or {}).get("question"), r.get("target")
        for arm in ARMS:
            pred = (r.get("answer") or {}).get(arm)
            value, reply = await (ask_exact if exact else ask_similarity)(log, question, gold, pred, s, arm, role) if pred else (None, None)
            out[arm] = arm_grade(step, pred, value, reply, _judge(s, role, template), None if exact else {"normalized": "over the run"})
        return out

    return decide


async def decide_bertscore(ctx, r: dict, s, role) -> dict:
    out = {}
    for arm in ARMS:
        pred = (r.get("answer") or {}).get(arm)
        value = await qa_metrics.bertscore(pred, r["target"], s.bertscore_model, s.bertscore_layer) if pred else None
        out[arm] = arm_grade("bertscore", pred, value, judge={"rule": "bertscore F1"}, metadata={"encoder": s.bertscore_model, "layer": s.bertscore_layer})
    return out


def mcq(s) -> bool:
    return bool(getattr(s, "mcq", False))


def open_ended(s) -> bool:
    return not mcq(s)


ARM_PARTS = {"oneshot": "the 1-shot self-consistency answer", "dera": "the DERA answer"}
QA = (Scorer("accuracy", BINARY, "Is the voted letter the correct option?", decide=decide_accuracy, parts=ARM_PARTS, applies=mcq),
      Scorer("llm-exact", BINARY, "Does the prediction give the same answer as the gold answer?", decide=judged("llm-exact"), role="judge",
             show=show, parts=ARM_PARTS, applies=open_ended),
      Scorer("llm-similarity", Scale("unit", normalise=normalize_similarity),
             "How close is the prediction to the gold answer, from 0 (unrelated) to 1 (the same answer)?", decide=judged("llm-similarity"),
             role="judge", show=show, parts=ARM_PARTS, applies=open_ended),
      Scorer("bertscore", UNIT, "BERTScore F1 of the prediction against the gold answer (the run's local encoder and layer).",
             decide=decide_bertscore, parts=ARM_PARTS, applies=open_ended))


# ------------------------------------------------------------------ GPT-F1 of summaries and care plans

def gptf1_grades(arm: str, g: dict, judge: dict) -> dict[str, Grade]:
    """One arm's GPT-F1 (:func:`~experiments.studies.dera.gptf1.score_summary`) as grades: ``<arm>`` (the average over the
    scored sections) and ``<arm>/<section>`` (P/R/F1, None when unscored; the concept lists and what was found kept)."""
    out = {arm: Grade(value=g.get("average"), source="mean over the scored sections", judge=judge)}
    for s, v in (g.get("sections") or {}).items():
        evidence = {k: v[k] for k in ("gt_concepts", "pred_concepts", "gt_found_in_pred", "pred_found_in_gt", "concepts_cut", "reason") if v.get(k)}
        out[f"{arm}/{s}"] = Grade(value={m: v.get(m) for m in PRF} if v.get("scored") else None, judge=judge, metadata=evidence)
    return out


def comparisons(r: dict, task: str) -> list[tuple[str, dict, dict]]:
    """(arm, ground truth, prediction) of the GPT-F1 comparisons a record allows: the corruption study's initial
    (corrupted) and DERA outputs against the uncorrupted reference; else DERA against the initial output, and both
    against a reference summary where the encounter has one."""
    answer, target = r.get("answer") or {}, r.get("target")
    out = [] if task == "corrupt" else [("dera_vs_initial", answer.get("initial") or {}, answer.get("dera") or {})]
    if isinstance(target, dict):
        out += [("initial", target, answer.get("initial") or {}), ("dera", target, answer.get("dera") or {})]
    return out


async def decide_gptf1(ctx, r: dict, s, role: str) -> dict:
    log, cache, out = CaseLog(ctx), {}, {}
    judge = _judge(s, role, "gptf1_extract") | {"prompt_hash": PROMPTS.hash("gptf1_extract", "gptf1_verify")}
    settings = gptf1.GptF1.of(s)
    for arm, gt, pred in comparisons(r, s.task):
        scored = await gptf1.score_summary(log, gt, pred, s.score_sections, settings, label=arm, concept_cache=cache, role=role)
        out.update(gptf1_grades(arm, scored, judge))
    return out


def show_gptf1(record: dict, part: str | None) -> dict:
    """What the judge compared for ``part`` (``arm/section``): the section's text in the reference and in the prediction."""
    arm, _, section = (part or "").partition("/")
    gt, pred = next(((g, p) for a, g, p in comparisons(record, (record.get("metadata") or {}).get("task")) if a == arm), ({}, {}))
    return {"reference": gt.get(section, ""), "prediction": pred.get(section, "")}


def gptf1_items(records: list[dict], config: dict) -> tuple[Scale, list[dict]]:
    """Review items: one per scored section of each comparison (``arm/section``), its F1 the verdict, the two texts
    the judge compared what a reviewer sees (an arm's average is no decision of the judge's)."""
    items = []
    for r in records:
        for name, g in grades(r).items():
            step, part, by = split_name(name)
            if step == "gptf1" and by is None and part and "/" in part and g.named("f1") is not None:
                f1 = float(g.named("f1"))
                items.append({"id": f"{r['id']}|{part}", "verdict": f1, "show": show_gptf1(r, part),
                              "stratum": f"{'high' if f1 >= 0.5 else 'low'}|{part}|{(r.get('metadata') or {}).get('model') or ''}"})
    return UNIT, items


GPTF1 = Scorer("gptf1", UNIT, "GPT-F1: how many of the reference section's medical concepts the prediction holds, and of its "
               "concepts the reference (precision, recall, F1 per section; the average over the scored sections).",
               decide=decide_gptf1, role="judge", show=show_gptf1, items=gptf1_items,
               parts={"initial": "the initial output (the corruption study: the corrupted summary) against the reference",
                      "dera": "the DERA output against the reference",
                      "dera_vs_initial": "the DERA output against the initial output (how much the dialogue changed it)"})
