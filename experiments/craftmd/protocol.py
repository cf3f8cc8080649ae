"""The CRAFT-MD protocol as plain async steps over the one client.

One unit of work is a (case, trial): simulate the doctor–patient conversation, summarise the
patient's statements, ask the clinical model for the diagnosis in every format as MCQ and FRQ,
and grade the FRQ answers with the grader-AI. Roles: ``clinical`` (model under test),
``patient``, ``summarizer``, ``grader``.
"""

from __future__ import annotations

import asyncio
import time

from experiments.craftmd import grading
from experiments.craftmd.prompts import PROMPTS, render
from experiments.craftmd.settings import CraftSettings
from experiments.core.study import CaseContext
from serving.client import GenConfig
from serving.refs import model_name

TURN_STOPS = ("\nPatient:", "\nDoctor:", "\nPATIENT:", "\nDOCTOR:")


def _gen(settings: CraftSettings, key: str, stop=None) -> GenConfig:
    """Sampling for one step; sampled steps get a per-call seed from the case context (so trials differ)."""
    return settings.sampling[key].gen(stop=stop)


async def ask(ctx: CaseContext, settings: CraftSettings, role: str, key: str, step: str, prompt: str, stop=None, constraint=None) -> str:
    """One single-prompt step (answer / grader / summarizer): chat, or a text completion when the
    step is listed in ``completion_steps`` (then the first non-empty line of the reply is used).
    ``constraint``: the template's declared reply format (prompts/constraints.yaml), applied by the
    context only with ``answers: constrained``."""
    if key in settings.completion_steps:
        r = await ctx.complete(prompt, role=role, gen=_gen(settings, key, stop), step=step, constraint=constraint)
        return r.text if key == "summarizer" else next((ln.strip() for ln in r.text.splitlines() if ln.strip()), "")
    r = await ctx.chat([{"role": "user", "content": prompt}], role=role, gen=_gen(settings, key, stop), step=step, constraint=constraint)
    return r.text


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


async def converse(ctx: CaseContext, case: dict, settings: CraftSettings) -> tuple[list[dict], str]:
    """Patient opens; then doctor turn, termination check, patient answer — until a rule stops it.

    The turn cap is checked right after the doctor's turn, as the authors do: the doctor's
    ``max_turns``-th turn ends the conversation (``turn_cap``) unanswered, so the transcript always
    ends on a doctor turn, which :func:`context_turns` removes before asking.
    """
    transcript: list[dict] = []
    r = await ctx.chat(patient_view([], case), role="patient", gen=_gen(settings, "patient", TURN_STOPS), step="patient_opening")
    transcript.append({"agent": "patient", "content": clean_turn(r.text), "turn": 0})
    turn = 0
    while True:
        turn += 1
        r = await ctx.chat(doctor_view(transcript, case), role="clinical", gen=_gen(settings, "doctor", TURN_STOPS), step=f"doctor_turn_{turn}")
        doctor = clean_turn(r.text)
        transcript.append({"agent": "doctor", "content": doctor, "turn": turn})
        reason = stop_reason_for(doctor, settings.final_marker) or ("turn_cap" if turn >= settings.max_turns else None)
        if reason:
            return transcript, reason
        r = await ctx.chat(patient_view(transcript, case), role="patient", gen=_gen(settings, "patient", TURN_STOPS), step=f"patient_turn_{turn}")
        transcript.append({"agent": "patient", "content": clean_turn(r.text), "turn": turn})


def context_turns(transcript: list[dict]) -> list[dict]:
    """The conversation shown when asking in multi-turn form: the clinical LLM's closing turn is
    removed, whatever ended the conversation (final diagnosis, no question or the turn cap; SPEC 3:
    the authors always remove it). A transcript ending on a patient turn is shown whole."""
    if transcript and transcript[-1]["agent"] == "doctor":
        return transcript[:-1]
    return transcript


def render_conversation(turns: list[dict]) -> str:
    return "\n".join(f"{t['agent'].capitalize()}: {t['content']}" for t in turns)


async def summarize(ctx: CaseContext, transcript: list[dict], settings: CraftSettings) -> str:
    statements = "\n".join(f"- {t['content']}" for t in transcript if t["agent"] == "patient" and t["content"])
    text = await ask(ctx, settings, "summarizer", "summarizer", "summary", render("summarize", statements=statements or "- (nothing)"), SUMMARY_STOPS)
    return clean_summary(text)


SUMMARY_STOPS = ("\n\n", "\nPatient statements", "\nExample", "\nNow this patient")


def clean_summary(text: str) -> str:
    """The summary paragraph only: text after a repeated 'Case description:' label, up to a blank line."""
    text = (text or "").strip()
    if "Case description:" in text:
        text = text.rsplit("Case description:", 1)[1]
    return text.strip().split("\n\n")[0].strip()


# ------------------------------------------------------------------ asking and grading

def case_question(case: dict) -> str:
    """The case's own question (split off the vignette by the loader), asked in every format."""
    return case.get("question") or "What is the most likely diagnosis?"


def format_context(fmt: str, case: dict, transcript: list[dict], stop_reason: str, summary: str) -> str:
    if fmt == "vignette":
        return render("ask_context_vignette", vignette=case["vignette"])
    if fmt == "multiturn":
        return render("ask_context_multiturn", conversation=render_conversation(context_turns(transcript)))
    if fmt == "singleturn":
        first = next((t["content"] for t in transcript if t["agent"] == "patient"), "")
        return render("ask_context_singleturn", first_message=first)
    return render("ask_context_summarized", summary=summary)


async def ask_mcq(ctx: CaseContext, case, context: str, settings, fmt: str) -> dict:
    c = case["choices"]
    prompt = render("ask_mcq", context=context, question=case_question(case), choice_a=c[0], choice_b=c[1], choice_c=c[2], choice_d=c[3])
    text = await ask(ctx, settings, "clinical", "answer", f"{fmt}_mcq", prompt, constraint=PROMPTS.constraint("ask_mcq", choices=list(c)))
    return grading.parse_mcq(text.strip(), c, case["answer_index"])


async def grade_answer(ctx: CaseContext, answer: str, correct: str, settings, fmt: str) -> dict:
    """Grader-AI: extract the diagnosis (Multiple/None score 0), then judge equivalence (subtype rule).

    Under ``concurrent_rule: any`` an answer naming several concurrent diagnoses is graded per
    diagnosis (one verdict request each) and is correct when any matches; under ``zero`` it scores 0.
    """
    if not answer.strip():
        extracted, status, raw1 = None, "none", None
    else:
        raw1 = await ask(ctx, settings, "grader", "grader", f"{fmt}_extract", render("grader_extract", answer=answer),
                         constraint=PROMPTS.constraint("grader_extract"))
        extracted, status = grading.parse_extraction(raw1)
    rule = settings.concurrent_rule
    replies = {}
    for i, given in enumerate(grading.match_targets(extracted, status, correct, rule)):
        step = f"{fmt}_match" + (f"_{i}" if i else "")
        replies[given] = await ask(ctx, settings, "grader", "grader", step, render("grader_match", correct=correct, given=given),
                                   constraint=PROMPTS.constraint("grader_match"))
    grade = grading.grade_frq(extracted, status, correct, replies or None, rule)
    raw2 = next(iter(replies.values())) if len(replies) == 1 else (replies or None)
    return {"extracted": extracted, "extraction_status": status, "grader_extract_reply": raw1, "grader_match_reply": raw2,
            "concurrent_rule": rule, **grade}


async def ask_frq(ctx: CaseContext, case, context: str, settings, fmt: str) -> dict:
    prompt = render("ask_frq", context=context, question=case_question(case))
    answer = (await ask(ctx, settings, "clinical", "answer", f"{fmt}_frq", prompt)).strip()
    return {"answer": answer, **await grade_answer(ctx, answer, case["answer"], settings, fmt)}


PROMPTS_USED = ["doctor_system", "patient_system", "patient_opening", "summarize", "ask_context_vignette", "ask_context_multiturn",
                "ask_context_singleturn", "ask_context_summarized", "ask_mcq", "ask_frq", "grader_extract", "grader_match"]


async def solve(ctx: CaseContext, unit: dict, settings: CraftSettings) -> dict:
    """One (case, trial) -> one record. A call that gets no answer raises RequestFailed (the runner records the unit as failed)."""
    case, trial = unit["case"], unit["trial"]
    t0 = time.perf_counter()
    needs_dialogue = any(f in settings.formats for f in ("multiturn", "singleturn", "summarized"))
    transcript, stop = (await converse(ctx, case, settings)) if needs_dialogue else ([], None)
    summary = await summarize(ctx, transcript, settings) if "summarized" in settings.formats else None
    t_conv = time.perf_counter() - t0

    do_mcq = settings.mcq and len(case["choices"]) == 4
    jobs, keys = [], []
    for fmt in settings.formats:
        context = format_context(fmt, case, transcript, stop or "", summary or "")
        if do_mcq:
            jobs.append(ask_mcq(ctx, case, context, settings, fmt))
            keys.append((fmt, "mcq"))
        if settings.frq:
            jobs.append(ask_frq(ctx, case, context, settings, fmt))
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
        "source": case.get("source"), "model": model_name(settings.roles["clinical"]), "roles": dict(settings.roles),
        "correct_answer": case["answer"], "choices": case["choices"], "answer_index": case["answer_index"],
        "transcript": transcript, "stop_reason": stop, "n_doctor_turns": sum(t["agent"] == "doctor" for t in transcript),
        "summary": summary, "answers": answers,
        "correct": main.get("correct") if main else None, "correct_metric": f"{main_fmt}.{'mcq' if main is answers[main_fmt].get('mcq') else 'frq'}",
        "parse_errors": parse_errors,
        "timing": {"conversation_s": round(t_conv, 3), "total_s": round(time.perf_counter() - t0, 3)},
        "prompt_hashes": PROMPTS.hashes(PROMPTS_USED),
    }
