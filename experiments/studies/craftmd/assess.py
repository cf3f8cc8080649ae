"""Conversation assessors (setting ``assess_conversations``, an addition to the CRAFT-MD protocol): an LLM (role
``assessor``) asks five yes/no questions of each multi-turn conversation, live and in ``calibrate conversations``
alike (:func:`assess_conversation`). The questions and how replies are read: the study README.
"""

from __future__ import annotations

import asyncio
import re

from experiments.common.parsing import extract_after, extract_verdict
from experiments.studies.craftmd.prompts import PROMPTS, QUESTIONS, TEMPLATES, render
from experiments.studies.craftmd.protocol import ask, single

LABELS = {
    "Q1": "Q1: one most likely diagnosis can be reached",
    "Q2": "Q2: the conversation covers all the vignette's key information",
    "Q3": "Q3: the patient-AI uses medical terminology",
    "grounded": "patient-AI answers grounded in the vignette (nothing invented)",
    "complete": "patient-AI answers complete for what was asked",
}
SPEAKERS = {"doctor": "Doctor-AI", "patient": "Patient-AI"}


def conversation_text(turns: list[tuple[str, str]]) -> str:
    """The conversation as the assessor reads it: one ``Doctor-AI: ...`` / ``Patient-AI: ...`` line per turn."""
    return "\n".join(f"{SPEAKERS.get(role, role)}: {' '.join((text or '').split()) or '(no answer)'}" for role, text in turns)


def request_prompt(question: str, turns: list[tuple[str, str]], vignette: str) -> str:
    return render(TEMPLATES[question], vignette=" ".join((vignette or "").split()), conversation=conversation_text(turns))


def quoted_terms(reply: str | None, turns: list[tuple[str, str]]) -> dict:
    """A Q3 reply (``Terms: a, b`` / ``Terms: None``, the label optional) -> ``{"verdict", "terms"}``: False for None,
    True when every quoted term is in a patient line, else None with ``terms_not_found``."""
    text = extract_after(reply or "", "Terms")
    if text is None:
        text = next((ln.strip() for ln in (reply or "").splitlines() if ln.strip()), "")
    terms = [t for t in (x.strip(" \"'.*`") for x in re.split(r"[,;]", text)) if t]
    if not terms:
        return {"verdict": None, "terms": []}
    if len(terms) == 1 and terms[0].lower() == "none":
        return {"verdict": False, "terms": []}
    patient = " ".join(" ".join((t or "").split()).lower() for role, t in turns if role == "patient")
    missing = [t for t in terms if " ".join(t.split()).lower() not in patient]
    return {"verdict": None if missing else True, "terms": terms, **({"terms_not_found": missing} if missing else {})}


def parse_reply(question: str, reply: str | None, turns: list[tuple[str, str]] = ()) -> dict:
    """An assessor reply -> ``{"verdict": True | False | None, "reply"}`` (+ ``invented`` for the grounding question's No;
    Q3: :func:`quoted_terms` over the conversation's ``turns``)."""
    if question == "Q3":
        return {**quoted_terms(reply, turns), "reply": reply}
    verdict = extract_verdict(reply or "")
    out: dict = {"verdict": verdict, "reply": reply}
    if question == "grounded" and verdict is False:
        out["invented"] = extract_after(reply or "", "Invented")
    return out


async def assess_conversation(ctx, turns: list[tuple[str, str]], vignette: str, settings, questions=QUESTIONS,
                              role: str = "assessor") -> dict[str, dict]:
    """One request per question (step ``assess_<question>``), concurrently, as ``role`` (another judge's: rescore)."""

    async def one(q: str) -> dict:
        reply = await ask(ctx, settings, role, "assessor", f"assess_{q}", single(request_prompt(q, turns, vignette), settings),
                          constraint=PROMPTS.constraint(TEMPLATES[q]))
        return parse_reply(q, reply, turns)

    results = await asyncio.gather(*(one(q) for q in questions))
    return dict(zip(questions, results))
