"""Scores of QA answers against the gold answer: per case (LLM judges, BERTScore) and per run.

- BERTScore F1 with a local encoder at a chosen layer (experiments.common.text.bertscore_f1;
  ``bertscore_model`` / ``bertscore_layer``, the layer defaulting to bert_score's table).
- LLM exact match: "same medical concept?" -> True/False + explanation (temperature 0).
  An unparseable verdict is unscored (None) and counted.
- LLM similarity: a 0-1 score (temperature 0, max_tokens 100). Over a run, scores outside
  0-1 are set to 0, unless all scores are 100 (a judge answering on a percent scale), in
  which case they are 1 (:func:`normalize_similarity`).
- MCQ accuracy: the voted letter equals ``answer_idx``.
A record keeps them per arm in ``arm_scores`` (its typed ``scores`` are derived from them: experiments/dera/results.py).
A missing answer (every sample unusable or the request failed) scores 0 everywhere.
"""

from __future__ import annotations

import asyncio

from experiments.dera.calls import CaseLog
from experiments.dera.settings import QASettings
from experiments.common.parsing import extract_bool, extract_number
from experiments.common.text import bertscore_f1

ARMS = ("oneshot", "dera")
_bert_lock = asyncio.Lock()


def upgrade(record: dict) -> dict:
    """A DERA-QA record written before typed scores: its per-arm scores (then ``scores``) become ``arm_scores``."""
    old = record.get("scores")
    if "arm_scores" in record or not isinstance(old, dict) or not old or not set(old) <= set(ARMS):
        return record
    return {("arm_scores" if k == "scores" else k): v for k, v in record.items()}


def arm_scores(record: dict) -> dict:
    """{arm: its scores} of a DERA-QA record (an older one's are renamed when it is read: :func:`upgrade`, through the
    reader and the runner)."""
    return record.get("arm_scores") or {}


def normalize_similarity(scores: list[float | None]) -> list[float | None]:
    """Out-of-range scores -> 0, unless all (scored) scores are 100, then all -> 1. None stays None."""
    scored = [s for s in scores if s is not None]
    if scored and all(s == 100 for s in scored):
        return [None if s is None else 1.0 for s in scores]
    return [None if s is None else (s if 0.0 <= s <= 1.0 else 0.0) for s in scores]


async def bertscore(pred: str, gold: str, model_path: str | None, num_layers: int | None = None) -> float:
    async with _bert_lock:  # one encoder, loaded once
        return (await asyncio.to_thread(bertscore_f1, [pred], [gold], model_path, num_layers))[0]


async def ask_exact(log: CaseLog, question: str, gold: str, pred: str, settings: QASettings, arm: str, role: str = "judge") -> tuple[int | None, str]:
    """The LLM exact-match judge on one answer: (verdict 1/0, None when unparseable; the reply)."""
    ex = await log.call(f"judge:exact:{arm}", role, "judge_exact", settings.sampling.judge_exact, question=question, gold=gold, predicted=pred)
    first_line = next((ln for ln in ex.text.splitlines() if ln.strip()), "")
    verdict = extract_bool(first_line) if ex.ok else None  # the prompt asks for the verdict on the first line
    log.parsed(f"judge:exact:{arm}", verdict is not None, ex.error or "no True/False verdict", ex.text)
    return (None if verdict is None else int(verdict)), ex.text.strip()


async def ask_similarity(log: CaseLog, question: str, gold: str, pred: str, settings: QASettings, arm: str, role: str = "judge") -> tuple[float | None, str]:
    """The LLM similarity judge on one answer: (the raw score, None when unparseable; the reply)."""
    sim = await log.call(f"judge:similarity:{arm}", role, "judge_similarity", settings.sampling.judge_similarity, question=question, gold=gold, predicted=pred)
    score = extract_number(sim.text) if sim.ok else None
    log.parsed(f"judge:similarity:{arm}", score is not None, sim.error or "no number in reply", sim.text)
    return score, sim.text.strip()


async def judge_open(log: CaseLog, question: str, gold: str, pred: str | None, settings: QASettings, arm: str) -> dict:
    if not pred:
        return {"answer": pred, "bertscore": 0.0, "exact": 0, "exact_explanation": "no answer", "similarity_raw": 0.0}
    exact, exact_reply = await ask_exact(log, question, gold, pred, settings, arm)
    score, sim_reply = await ask_similarity(log, question, gold, pred, settings, arm)
    return {
        "answer": pred,
        "bertscore": await bertscore(pred, gold, settings.bertscore_model, settings.bertscore_layer),
        "exact": exact,
        "exact_explanation": exact_reply,
        "similarity_raw": score,
        "similarity_reply": sim_reply,
    }


def make_scorer(settings: QASettings):
    async def score(log: CaseLog, q: dict, answers: dict) -> dict:
        if settings.mcq:
            return {arm: {"answer": answers[arm], "accuracy": int(answers[arm] == q["answer_idx"])} for arm in ARMS}
        out = {}
        for arm in ARMS:
            out[arm] = await judge_open(log, q["question_open"], q["answer"], answers[arm], settings, arm)
        return out

    return score
