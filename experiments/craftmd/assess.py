"""Conversation assessors: an LLM (role ``assessor``) asks five yes/no questions of each multi-turn conversation.

An addition to the CRAFT-MD protocol (setting ``assess_conversations``; the paper's automatic protocol has
none): the paper's dermatologists asked Q1-Q3 of 180 conversations (Fig. 3i/3j) and the Methods name two
questions about the patient-AI that were not released. Here each question is one request per conversation,
built from our own template (``prompts/assess_<question>.txt``: the case notes the patient-AI was given and
the whole conversation, closing doctor turn included), answered ``Verdict: Yes`` / ``Verdict: No`` (the
grounding question's No names what was invented):

- ``Q1``: could one most likely diagnosis be reached from the conversation?
- ``Q2``: does the conversation cover the vignette's key information?
- ``Q3``: does the patient-AI use medical terminology?
- ``grounded``: are the patient-AI's answers grounded in the vignette (nothing invented)?
- ``complete``: are the patient-AI's answers complete for what was asked?

The reply is read by the project's one verdict parser (:func:`experiments.common.parsing.extract_verdict`);
a reply it cannot read is ``verdict: None``, counted as unscored, never a No. With ``answers: constrained``
each request carries its declared format (prompts/constraints.yaml). Live runs
(:func:`experiments.craftmd.study.CraftmdStudy.solve`) and the calibration against the released expert
labels (``medstack calibrate conversations``) send the same requests through :func:`assess_conversation`.
"""

from __future__ import annotations

import asyncio

from experiments.common.parsing import extract_after, extract_verdict
from experiments.common.stats import mean_ci
from experiments.craftmd.prompts import PROMPTS, render
from experiments.craftmd.protocol import ask, single

QUESTIONS = ("Q1", "Q2", "Q3", "grounded", "complete")
TEMPLATES = {q: f"assess_{q.lower()}" for q in QUESTIONS}
LABELS = {
    "Q1": "Q1: one most likely diagnosis could be reached",
    "Q2": "Q2: the conversation covers the vignette's key information",
    "Q3": "Q3: the patient-AI uses medical terminology",
    "grounded": "patient-AI answers grounded in the vignette (nothing invented)",
    "complete": "patient-AI answers complete for what was asked",
}
SPEAKERS = {"doctor": "Doctor-AI", "patient": "Patient-AI"}


def conversation_text(turns: list[tuple[str, str]]) -> str:
    """The conversation as the assessor reads it: one ``Doctor-AI: ...`` / ``Patient-AI: ...`` line per turn."""
    return "\n".join(f"{SPEAKERS.get(role, role)}: {' '.join((text or '').split()) or '(no answer)'}" for role, text in turns)


def transcript_turns(transcript: list[dict]) -> list[tuple[str, str]]:
    """A run record's ``transcript`` as ``(role, text)`` turns."""
    return [(t.get("agent") or "?", t.get("content") or "") for t in transcript or []]


def request_prompt(question: str, turns: list[tuple[str, str]], vignette: str) -> str:
    return render(TEMPLATES[question], vignette=" ".join((vignette or "").split()), conversation=conversation_text(turns))


def parse_reply(question: str, reply: str | None) -> dict:
    """An assessor reply -> ``{"verdict": True | False | None, "reply"}`` (+ ``invented`` for the grounding question's No)."""
    verdict = extract_verdict(reply or "")
    out: dict = {"verdict": verdict, "reply": reply}
    if question == "grounded" and verdict is False:
        out["invented"] = extract_after(reply or "", "Invented")
    return out


async def assess_conversation(ctx, turns: list[tuple[str, str]], vignette: str, settings, questions=QUESTIONS,
                              role: str = "assessor") -> dict[str, dict]:
    """One request per question through the case's context (role ``assessor``, or another judge's role, step
    ``assess_<question>``), concurrently; ``settings`` gives ``sampling["assessor"]``, ``completion_steps`` and
    ``lone_system_as_user``."""

    async def one(q: str) -> dict:
        reply = await ask(ctx, settings, role, "assessor", f"assess_{q}", single(request_prompt(q, turns, vignette), settings),
                          constraint=PROMPTS.constraint(TEMPLATES[q]))
        return parse_reply(q, reply)

    results = await asyncio.gather(*(one(q) for q in questions))
    return dict(zip(questions, results))


def question_rates(records: list[dict], key: str = "assessment", group: str = "case_id") -> dict:
    """Per question: the share of Yes over the scored verdicts (mean over ``group`` of the per-group share,
    95 % percentile bootstrap CI over groups, :func:`experiments.common.stats.mean_ci`), with the counts of
    conversations, Yes, No and unscored. Records without ``key`` are left out."""
    out = {}
    for q in QUESTIONS:
        per: dict[str, list[float]] = {}
        yes = no = unscored = 0
        for r in records:
            a = (r.get(key) or {}).get(q)
            if not isinstance(a, dict):
                continue
            v = a.get("verdict")
            if v is None:
                unscored += 1
                continue
            yes, no = yes + bool(v), no + (not v)
            per.setdefault(str(r.get(group, r.get("id"))), []).append(float(bool(v)))
        if not (yes or no or unscored):
            continue
        ci = mean_ci([sum(v) / len(v) for v in per.values()])
        out[q] = {"rate": ci.mean if ci.n else None, "ci_low": ci.low if ci.n else None, "ci_high": ci.high if ci.n else None,
                  "n": ci.n, "conversations": yes + no + unscored, "yes": yes, "no": no, "unscored": unscored}
    return out
