"""The pieces of DERA-QA's scorers (experiments/studies/dera/scorers.py): the judges' two requests, BERTScore, the
similarity's run-level rule, and the grades an older record's per-arm values become (:func:`arm_grades`). An
unparseable verdict is unscored (None) and counted; a missing answer (every sample unusable or the request failed)
scores 0 everywhere (experiments/studies/dera/README.md, Metrics).
"""

from __future__ import annotations

import asyncio

from experiments.common.grade import Grade
from experiments.studies.dera.calls import CaseLog
from experiments.studies.dera.prompts import PROMPTS
from experiments.studies.dera.settings import QASettings
from experiments.common.parsing import extract_bool, extract_number
from experiments.common.text import bertscore_f1

ARMS = ("oneshot", "dera")
_bert_lock = asyncio.Lock()


STEPS = {"accuracy": "accuracy", "bertscore": "bertscore", "exact": "llm-exact", "similarity": "llm-similarity"}  # metric -> score
NO_ANSWER = {"rule": "no answer"}  # every sample unusable: not judged, scored 0


def arm_grades(arm: str, s: dict, mcq: bool, judge, bertscore: dict) -> dict[str, Grade]:
    """The typed scores of one arm from its values ``s`` (``answer``; ``accuracy``, or ``exact``, ``similarity_raw``,
    ``bertscore`` and the judges' replies); ``judge(template)``: who judged with that template."""
    answer = s.get("answer")
    if mcq:
        return {f"accuracy/{arm}": Grade(value=s.get("accuracy"), answer=answer, source="letter", judge={"rule": "the voted letter is answer_idx"})}
    asked = bool(answer)
    return {
        f"llm-exact/{arm}": Grade(value=s.get("exact"), answer=answer, source="first line True/False" if asked else "no answer",
                                  explanation=s.get("exact_explanation"), judge=judge("judge_exact") if asked else NO_ANSWER),
        f"llm-similarity/{arm}": Grade(value=s.get("similarity_raw"), answer=answer, source="first number" if asked else "no answer",
                                       explanation=s.get("similarity_reply"), metadata={"normalized": "over the run"} if asked else {},
                                       judge=judge("judge_similarity") if asked else NO_ANSWER),
        f"bertscore/{arm}": Grade(value=s.get("bertscore"), answer=answer, source="bertscore F1" if asked else "no answer",
                                  judge={"rule": "bertscore F1" if asked else "no answer"}, metadata=bertscore if asked else {})}


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
