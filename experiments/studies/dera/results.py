"""DERA's older records in today's typed shape (experiments/core/record.py): a QA record that kept its arms' answers
and values under ``scores`` (and a ``correct`` flag), or typed scores beside its own fields; a dialogue record with
its ``gptf1`` dict (and, later, typed scores beside it). Their grades are the ones the scorers
(experiments/studies/dera/scorers.py) give today.
"""

from __future__ import annotations

from experiments.common.grade import Grade, grades, to_disk
from experiments.core.record import RUNNER_FIELDS, is_typed, record
from experiments.studies.dera.prompts import PROMPTS
from experiments.studies.dera.qa import qa_inputs
from experiments.studies.dera.scorers import accuracy_grade, arm_grade, gptf1_grades

QA_META = ("model", "oneshot", "explanation", "stop_reason", "stated_answers", "turns", "final", "answer_changed", "parse_errors",
           "parse_attempts", "prompt_hashes")
DIALOGUE_META = ("task", "model", "reference_raw", "corruption_level", "initial_raw", "scratchpad", "stop_reason", "turns", "final_raw",
                 "final_sections_kept_from_initial", "parse_errors", "parse_attempts", "prompt_hashes")


def _judge(record: dict, settings, template: str) -> dict:
    """Who judged: the judge role's model and the hash of the template, as the record used it when it says."""
    h = (record.get("prompt_hashes") or {}).get(template) or PROMPTS.hash(template)
    return {"model": (settings.roles or {}).get("judge"), "prompt_hash": h}


def arm_grades(arm: str, s: dict, mcq: bool, judge, bertscore: dict) -> dict[str, Grade]:
    """One arm's grades from the values an older record kept for it (``answer``; ``accuracy``, or ``exact``,
    ``similarity_raw``, ``bertscore`` and the judges' replies); ``judge(template)``: who judged with that template."""
    pred = s.get("answer")
    if mcq:
        return {f"accuracy/{arm}": accuracy_grade(pred, s.get("accuracy"))}
    return {f"llm-exact/{arm}": arm_grade("llm-exact", pred, s.get("exact"), s.get("exact_explanation"), judge("judge_exact")),
            f"llm-similarity/{arm}": arm_grade("llm-similarity", pred, s.get("similarity_raw"), s.get("similarity_reply"),
                                               judge("judge_similarity"), {"normalized": "over the run"}),
            f"bertscore/{arm}": arm_grade("bertscore", pred, s.get("bertscore"), judge={"rule": "bertscore F1"}, metadata=bertscore)}


def _turns(transcript) -> list[dict]:
    return [{"role": t.get("agent") or t.get("role"), "text": t.get("content", t.get("text")) or "",
             **{k: v for k, v in t.items() if k not in ("agent", "role", "content", "text")}} for t in transcript or [] if isinstance(t, dict)]


def upgrade_qa(r: dict, settings) -> dict:
    """An older DERA-QA record (its arms' values under ``scores``, or typed scores beside its own fields) typed."""
    if is_typed(r):
        return r
    mcq = bool(r.get("mcq"))
    if r.get("scores") and all(isinstance(g, dict) and "value" in g for g in r["scores"].values()):
        scores = grades(r)
        answers = r.get("answers") or {}
    else:  # before typed scores: per arm {answer, accuracy | exact, similarity_raw, bertscore, the replies}
        bert = {"encoder": getattr(settings, "bertscore_model", None), "layer": getattr(settings, "bertscore_layer", None)}
        arms = {arm: s for arm, s in (r.get("scores") or {}).items() if isinstance(s, dict)}
        scores = {n: g for arm, s in arms.items() for n, g in arm_grades(arm, s, mcq, lambda t: _judge(r, settings, t), bert).items()}
        answers = r.get("answers") or {arm: s.get("answer") for arm, s in arms.items()}
    out = record(r["id"], inputs=qa_inputs(r.get("question"), r.get("options") if mcq else None, r.get("gold")),
                 target=r.get("gold") if mcq else r.get("gold_text") or r.get("gold"), transcript=_turns(r.get("transcript")),
                 answer=answers, scores=to_disk(scores),
                 metadata={**{k: r[k] for k in QA_META if k in r}, **({"gold_text": r.get("gold_text")} if mcq else {})})
    return {**{k: v for k, v in r.items() if k in RUNNER_FIELDS}, **out}


def upgrade_dialogue(r: dict, settings) -> dict:
    """An older summary / care plan / corruption record typed: its GPT-F1 from its ``gptf1`` dict (the concept lists
    kept in each section's grade), judged by whom its typed scores say, where it has them (else the judge role's model)."""
    if is_typed(r):
        return r
    stored = grades(r)
    judge = next((g.judge for n, g in stored.items() if n.startswith("gptf1/") and g.judge), None) or \
        {"model": (settings.roles or {}).get("judge"), "prompt_hash": PROMPTS.hash("gptf1_extract", "gptf1_verify")}
    scores = {**stored, **{f"gptf1/{n}": g for arm, v in (r.get("gptf1") or {}).items() for n, g in gptf1_grades(arm, v, judge).items()}}
    out = record(r["id"], inputs={}, target=r.get("reference"), transcript=_turns(r.get("transcript")),
                 answer={"initial": r.get("initial"), "dera": r.get("final")}, scores=to_disk(scores),
                 metadata={k: r[k] for k in DIALOGUE_META if k in r})
    return {**{k: v for k, v in r.items() if k in RUNNER_FIELDS}, **out}
