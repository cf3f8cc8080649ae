"""The pieces of DERA-QA's scorers (experiments/studies/dera/scorers.py): the judges' two requests, BERTScore and the
similarity's run-level rule. An unparseable verdict is unscored (None) and counted; a missing answer (every sample
unusable) scores 0 everywhere (experiments/studies/dera/README.md, Metrics).
"""

from __future__ import annotations

import asyncio

from experiments.studies.dera.calls import CaseLog
from experiments.studies.dera.prompts import PROMPTS
from experiments.studies.dera.settings import QASettings
from experiments.common.parsing import extract_bool, extract_number
from experiments.common.text import bertscore_f1

ARMS = ("oneshot", "dera")
_bert_lock = asyncio.Lock()


STEPS = {"accuracy": "accuracy", "bertscore": "bertscore", "exact": "llm-exact", "similarity": "llm-similarity"}  # metric -> score
NO_ANSWER = {"rule": "no answer"}  # every sample unusable: not judged, scored 0


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
    return (None if verdict is None else int(verdict)), ex.text.strip()


async def ask_similarity(log: CaseLog, question: str, gold: str, pred: str, settings: QASettings, arm: str, role: str = "judge") -> tuple[float | None, str]:
    """The LLM similarity judge on one answer: (the raw score, None when unparseable; the reply)."""
    sim = await log.call(f"judge:similarity:{arm}", role, "judge_similarity", settings.sampling.judge_similarity, question=question, gold=gold, predicted=pred)
    score = extract_number(sim.text) if sim.ok else None
    return score, sim.text.strip()
