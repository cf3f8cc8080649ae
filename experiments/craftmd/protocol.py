"""The CRAFT-MD protocol as plain async steps over the one client.

One unit of work is a (case, trial): simulate the doctor–patient conversation, summarise the
patient's statements, ask the clinical model for the diagnosis in every format as MCQ and FRQ,
and grade the FRQ answers with the grader-AI. Roles: ``clinical`` (model under test),
``patient``, ``summarizer``, ``grader``.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from experiments.craftmd import grading
from experiments.craftmd.prompts import hashes, render
from experiments.craftmd.settings import CraftSettings
from serving.client import ChatResult, GenConfig

TURN_STOPS = ("\nPatient:", "\nDoctor:", "\nPATIENT:", "\nDOCTOR:")


class Ledger:
    """Per-record accounting of every call: tokens, latency and errors per role."""

    def __init__(self):
        self.usage = defaultdict(lambda: {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0, "cached": 0})
        self.errors: list[str] = []

    def add(self, role: str, step: str, r: ChatResult) -> ChatResult:
        u = self.usage[role]
        u["requests"] += 1
        u["prompt_tokens"] += r.prompt_tokens
        u["completion_tokens"] += r.completion_tokens
        u["seconds"] = round(u["seconds"] + r.latency, 3)
        u["cached"] += int(r.cached)
        if not r.ok:
            self.errors.append(f"{step}: {r.error}")
        return r


def _gen(settings: CraftSettings, key: str, stop=None) -> GenConfig:
    """Sampling for one step. No per-request seed: seeded sampling crashes the vLLM CPU engine
    (0.32: "CPU Generator does not use offset"), so trials differ by sampling and greedy steps
    (grader, summarizer at temperature 0) are cached."""
    s = settings.sampling[key]
    return GenConfig(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, stop=stop)


async def ask(client, ledger: Ledger, settings: CraftSettings, role: str, key: str, step: str, prompt: str, stop=None) -> tuple[str, ChatResult]:
    """One single-prompt step (answer / grader / summarizer): chat, or a text completion when the
    step is listed in ``completion_steps`` (then the first non-empty line of the reply is used)."""
    if key in settings.completion_steps:
        r = ledger.add(role, step, await client.complete(prompt, role=role, gen=_gen(settings, key, stop)))
        text = r.text if key == "summarizer" else next((ln.strip() for ln in r.text.splitlines() if ln.strip()), "")
        return text, r
    r = ledger.add(role, step, await client.chat([{"role": "user", "content": prompt}], role=role, gen=_gen(settings, key, stop)))
    return r.text, r


def clean_turn(text: str) -> str:
    return (text or "").strip()


# ------------------------------------------------------------------ conversation

def doctor_view(transcript: list[dict], case: dict) -> list[dict]:
    msgs = [{"role": "system", "content": render("doctor_system", specialty=case["specialty"])}]
    for t in transcript:
        msgs.append({"role": "user" if t["agent"] == "patient" else "assistant", "content": t["content"] or "..."})
    return msgs


def patient_view(transcript: list[dict], case: dict) -> list[dict]:
    msgs = [{"role": "system", "content": render("patient_system", vignette=case["vignette"])},
            {"role": "user", "content": render("patient_opening")}]
    for t in transcript:
        msgs.append({"role": "assistant" if t["agent"] == "patient" else "user", "content": t["content"] or "..."})
    return msgs


def stop_reason_for(doctor_turn: str, marker: str) -> str | None:
    """Termination rules on one doctor turn: the final-diagnosis marker, else no question mark."""
    if marker.lower() in doctor_turn.lower():
        return "final_diagnosis"
    if "?" not in doctor_turn:
        return "no_question"
    return None


async def converse(client, case: dict, settings: CraftSettings, trial: int, ledger: Ledger) -> tuple[list[dict], str]:
    """Patient opens; then doctor turn, termination check, patient answer — until a rule stops it."""
    transcript: list[dict] = []
    r = ledger.add("patient", "patient_opening", await client.chat(patient_view([], case), role="patient", gen=_gen(settings, "patient", TURN_STOPS)))
    transcript.append({"agent": "patient", "content": clean_turn(r.text), "turn": 0})
    for turn in range(1, settings.max_turns + 1):
        r = ledger.add("clinical", f"doctor_turn_{turn}", await client.chat(doctor_view(transcript, case), role="clinical", gen=_gen(settings, "doctor", TURN_STOPS)))
        doctor = clean_turn(r.text)
        transcript.append({"agent": "doctor", "content": doctor, "turn": turn})
        if not r.ok:
            return transcript, "error"
        reason = stop_reason_for(doctor, settings.final_marker)
        if reason:
            return transcript, reason
        r = ledger.add("patient", f"patient_turn_{turn}", await client.chat(patient_view(transcript, case), role="patient", gen=_gen(settings, "patient", TURN_STOPS)))
        transcript.append({"agent": "patient", "content": clean_turn(r.text), "turn": turn})
        if not r.ok:
            return transcript, "error"
    return transcript, "turn_cap"


def context_turns(transcript: list[dict], stop_reason: str) -> list[dict]:
    """The conversation shown when asking in multi-turn form: the final-diagnosis turn is removed."""
    if stop_reason == "final_diagnosis" and transcript and transcript[-1]["agent"] == "doctor":
        return transcript[:-1]
    return transcript


def render_conversation(turns: list[dict]) -> str:
    return "\n".join(f"{t['agent'].capitalize()}: {t['content']}" for t in turns)


async def summarize(client, transcript: list[dict], settings: CraftSettings, trial: int, ledger: Ledger) -> str:
    statements = "\n".join(f"- {t['content']}" for t in transcript if t["agent"] == "patient" and t["content"])
    text, _ = await ask(client, ledger, settings, "summarizer", "summarizer", "summary", render("summarize", statements=statements or "- (nothing)"), SUMMARY_STOPS)
    return clean_summary(text)


SUMMARY_STOPS = ("\n\n", "\nPatient statements", "\nExample", "\nNow this patient")


def clean_summary(text: str) -> str:
    """The summary paragraph only: text after a repeated 'Case description:' label, up to a blank line."""
    text = (text or "").strip()
    if "Case description:" in text:
        text = text.rsplit("Case description:", 1)[1]
    return text.strip().split("\n\n")[0].strip()


# ------------------------------------------------------------------ asking and grading

def format_context(fmt: str, case: dict, transcript: list[dict], stop_reason: str, summary: str) -> str:
    if fmt == "vignette":
        return render("ask_context_vignette", vignette=case["vignette"])
    if fmt == "multiturn":
        return render("ask_context_multiturn", conversation=render_conversation(context_turns(transcript, stop_reason)))
    if fmt == "singleturn":
        first = next((t["content"] for t in transcript if t["agent"] == "patient"), "")
        return render("ask_context_singleturn", first_message=first)
    return render("ask_context_summarized", summary=summary)


async def ask_mcq(client, case, context: str, settings, ledger: Ledger, fmt: str) -> dict:
    c = case["choices"]
    prompt = render("ask_mcq", context=context, choice_a=c[0], choice_b=c[1], choice_c=c[2], choice_d=c[3])
    text, r = await ask(client, ledger, settings, "clinical", "answer", f"{fmt}_mcq", prompt)
    out = grading.parse_mcq(text.strip(), c, case["answer_index"])
    if not r.ok:
        out["error"] = r.error
    return out


async def grade_answer(client, answer: str, correct: str, settings, ledger: Ledger, fmt: str) -> dict:
    """Grader-AI: extract the diagnosis (Multiple/None score 0), then judge equivalence (subtype rule)."""
    if not answer.strip():
        extracted, status, raw1 = None, "none", None
    else:
        raw1, _ = await ask(client, ledger, settings, "grader", "grader", f"{fmt}_extract", render("grader_extract", answer=answer))
        extracted, status = grading.parse_extraction(raw1)
    raw2 = None
    if grading.needs_verdict(extracted, status, correct):
        raw2, _ = await ask(client, ledger, settings, "grader", "grader", f"{fmt}_match", render("grader_match", correct=correct, given=extracted))
    grade = grading.grade_frq(extracted, status, correct, raw2)
    return {"extracted": extracted, "extraction_status": status, "grader_extract_reply": raw1, "grader_match_reply": raw2, **grade}


async def ask_frq(client, case, context: str, settings, ledger: Ledger, fmt: str) -> dict:
    prompt = render("ask_frq", context=context)
    text, r = await ask(client, ledger, settings, "clinical", "answer", f"{fmt}_frq", prompt)
    answer = text.strip()
    out = {"answer": answer, **await grade_answer(client, answer, case["answer"], settings, ledger, fmt)}
    if not r.ok:
        out["error"] = r.error
    return out


PROMPTS_USED = ["doctor_system", "patient_system", "patient_opening", "summarize", "ask_context_vignette", "ask_context_multiturn",
                "ask_context_singleturn", "ask_context_summarized", "ask_mcq", "ask_frq", "grader_extract", "grader_match"]


async def solve(client, unit: dict, settings: CraftSettings) -> dict:
    """One (case, trial) -> one record."""
    case, trial = unit["case"], unit["trial"]
    ledger = Ledger()
    t0 = time.perf_counter()
    needs_dialogue = any(f in settings.formats for f in ("multiturn", "singleturn", "summarized"))
    transcript, stop = (await converse(client, case, settings, trial, ledger)) if needs_dialogue else ([], None)
    summary = await summarize(client, transcript, settings, trial, ledger) if "summarized" in settings.formats else None
    t_conv = time.perf_counter() - t0

    do_mcq = settings.mcq and len(case["choices"]) == 4
    jobs, keys = [], []
    for fmt in settings.formats:
        ctx = format_context(fmt, case, transcript, stop or "", summary or "")
        if do_mcq:
            jobs.append(ask_mcq(client, case, ctx, settings, ledger, fmt))
            keys.append((fmt, "mcq"))
        if settings.frq:
            jobs.append(ask_frq(client, case, ctx, settings, ledger, fmt))
            keys.append((fmt, "frq"))
    results = await asyncio.gather(*jobs)
    answers: dict[str, dict] = {fmt: {} for fmt in settings.formats}
    for (fmt, mode), res in zip(keys, results):
        answers[fmt][mode] = res
    if settings.mcq and not do_mcq:
        for fmt in settings.formats:
            answers[fmt]["mcq"] = {"skipped": "case has no 4 answer choices", "correct": None}

    parse_errors = [f"{fmt}.mcq: unparsed choice" for fmt in settings.formats if answers[fmt].get("mcq", {}).get("parsed_by") == "unparsed"]
    parse_errors += [f"{fmt}.frq: {answers[fmt]['frq']['grade_source']}" for fmt in settings.formats
                     if "frq" in answers[fmt] and str(answers[fmt]["frq"]["grade_source"]).startswith("unscored")]
    main_fmt = "multiturn" if "multiturn" in answers else settings.formats[0]
    main = answers[main_fmt].get("mcq") if answers[main_fmt].get("mcq", {}).get("correct") is not None else answers[main_fmt].get("frq", {})
    return {
        "id": unit["id"], "case_id": case["case_id"], "trial": trial, "specialty": case["specialty"], "dataset": case["dataset"],
        "source": case.get("source"), "model": settings.roles["clinical"].partition("@")[0], "roles": dict(settings.roles),
        "correct_answer": case["answer"], "choices": case["choices"], "answer_index": case["answer_index"],
        "transcript": transcript, "stop_reason": stop, "n_doctor_turns": sum(t["agent"] == "doctor" for t in transcript),
        "summary": summary, "answers": answers,
        "correct": main.get("correct") if main else None, "correct_metric": f"{main_fmt}.{'mcq' if main is answers[main_fmt].get('mcq') else 'frq'}",
        "parse_errors": parse_errors, "errors": ledger.errors, "usage": dict(ledger.usage),
        "timing": {"conversation_s": round(t_conv, 3), "total_s": round(time.perf_counter() - t0, 3)},
        "prompt_hashes": hashes(PROMPTS_USED),
    }
