"""The CRAFT-MD protocol (docs/protocols.md, CRAFT-MD) as plain async steps over the one client: one (case, trial)
is a conversation, a summary and the diagnosis asked in every format as MCQ and FRQ (graded after, by the study's
scorers: experiments/studies/craftmd/scorers.py). Every
request is built as the authors' code builds it (rajpurkarlab/craft-md, src/craftmd.py and src/utils.py), in our own
prompt texts; what a run sends differently is a row of :attr:`experiments.studies.craftmd.settings.CraftSettings.authors_table`.
"""

from __future__ import annotations

import asyncio
import time

from experiments.core.record import record
from experiments.studies.craftmd.data import DEFAULT_QUESTION
from experiments.studies.craftmd.prompts import PROMPTS, render
from experiments.studies.craftmd.settings import CraftSettings
from experiments.core.study import CaseContext
from serving.client import GenConfig
from serving.refs import model_name

TURN_STOPS = ("\nPatient:", "\nDoctor:", "\nPATIENT:", "\nDOCTOR:")  # only with the named deviation turn_stops
SUMMARY_STOPS = ("\n\n", "\nPatient statements", "\nExample", "\nNow this patient")  # only with summary_stops
ANSWER_CUE = "\nAnswer:"  # ends an answer request sent as a text completion (completion_steps), where a base model replies
# Cases whose doctor has no specialty: the authors' "Other" (201 cases), and our loaders' cases without one.
NO_SPECIALTY = {"Other", "unknown", "OSCE"}


def _gen(settings: CraftSettings, key: str, stop=None) -> GenConfig:
    """Sampling for one step; sampled steps get a per-call seed from the case context (so trials differ)."""
    return settings.sampling[key].gen(stop=stop) if stop else settings.sampling[key].gen()


def as_text(messages: list[dict]) -> str:
    """A request as one text prompt (completion_steps): the first and system messages bare, the turns labelled."""
    lines = []
    for i, m in enumerate(messages):
        bare = i == 0 or m["role"] == "system"
        lines.append(m["content"] if bare else f"{'Doctor' if m['role'] == 'assistant' else 'Patient'}: {m['content']}")
    return "\n".join(lines)


async def ask(ctx: CaseContext, settings: CraftSettings, role: str, key: str, step: str, messages: list[dict], stop=None, constraint=None) -> str:
    """One answer / grader / summarizer request: chat, or a text completion of :func:`as_text` for a step in
    ``completion_steps``. ``constraint``: the template's declared reply format (``answers: constrained`` only)."""
    if key in settings.completion_steps:
        prompt = as_text(messages) + (ANSWER_CUE if key == "answer" else "")
        r = await ctx.complete(prompt, role=role, gen=_gen(settings, key, stop), step=step, constraint=constraint)
        return r.text if key == "summarizer" else next((ln.strip() for ln in r.text.splitlines() if ln.strip()), "")
    r = await ctx.chat(messages, role=role, gen=_gen(settings, key, stop), step=step, constraint=constraint)
    return r.text


def single(prompt: str, settings: CraftSettings) -> list[dict]:
    """A one-message request of the grader or summarizer: a system message as the authors' (``lone_system_as_user``: user)."""
    return [{"role": "user" if settings.lone_system_as_user else "system", "content": prompt}]


# ------------------------------------------------------------------ conversation

def identity(specialty: str) -> str:
    """The doctor's first sentence: with the case's specialty, or none for category Other (the authors' rule)."""
    if specialty in NO_SPECIALTY:
        return render("identity_general")
    return render("identity_specialist", specialty=specialty)


def _chat(instructions: dict, transcript: list[dict], speaker: str, empty: str) -> list[dict]:
    """One side's chat: its instructions, the doctor's fixed greeting, then the turns (``speaker``'s as the assistant;
    an empty turn sent as ``empty``: the setting ``empty_turn``, empty as the authors send it)."""
    turns = [{"role": "doctor", "text": render("greeting")}, *transcript]
    return [instructions, *({"role": "assistant" if t["role"] == speaker else "user", "content": t["text"] or empty} for t in turns)]


def doctor_view(transcript: list[dict], case: dict, loop: str = "opensource", empty: str = "") -> list[dict]:
    """The doctor's chat as the authors keep it: instructions a user message (a system one in the GPT loop)."""
    doctor = render("doctor_system", identity=identity(case["specialty"]))
    return _chat({"role": "system" if loop == "gpt" else "user", "content": doctor}, transcript, "doctor", empty)


PATIENT_TEMPLATES = {"authors": "patient_authors", "cautious": "patient_system"}  # the setting patient_prompt


def patient_view(transcript: list[dict], case: dict, empty: str = "", prompt: str = "authors") -> list[dict]:
    """The patient's chat: instructions with the vignette (system; ``prompt``: the setting ``patient_prompt``)."""
    return _chat({"role": "system", "content": render(PATIENT_TEMPLATES[prompt], vignette=case["vignette"])}, transcript, "patient", empty)


def stop_reason_for(doctor_turn: str, marker: str) -> str | None:
    """Termination rules on one doctor turn: the final-diagnosis marker, else no question mark."""
    if marker.lower() in doctor_turn.lower():
        return "final_diagnosis"
    if "?" not in doctor_turn:
        return "no_question"
    return None


async def converse(ctx: CaseContext, case: dict, settings: CraftSettings) -> tuple[list[dict], str]:
    """The patient answers the greeting; then doctor turn, termination check, patient answer — until a rule stops it
    (the turn cap checked right after the doctor's turn, as the authors do: docs/protocols.md, CRAFT-MD). The
    transcript holds the models' turns only; the greeting is the fixed second message of the doctor's chat."""
    stops = TURN_STOPS if settings.turn_stops else None
    transcript: list[dict] = []
    r = await ctx.chat(patient_view([], case, prompt=settings.patient_prompt), role="patient", gen=_gen(settings, "patient", stops), step="patient_opening")
    transcript.append({"role": "patient", "text": (r.text or "").strip(), "turn": 0})
    turn = 0
    while True:
        turn += 1
        r = await ctx.chat(doctor_view(transcript, case, settings.loop, settings.empty_turn), role="clinical", gen=_gen(settings, "doctor", stops), step=f"doctor_turn_{turn}")
        doctor = (r.text or "").strip()
        transcript.append({"role": "doctor", "text": doctor, "turn": turn})
        reason = stop_reason_for(doctor, settings.final_marker) or ("turn_cap" if turn >= settings.max_turns else None)
        if reason:
            return transcript, reason
        r = await ctx.chat(patient_view(transcript, case, settings.empty_turn, settings.patient_prompt), role="patient", gen=_gen(settings, "patient", stops), step=f"patient_turn_{turn}")
        transcript.append({"role": "patient", "text": (r.text or "").strip(), "turn": turn})


def context_turns(transcript: list[dict]) -> list[dict]:
    """The conversation shown when asking in multi-turn form: the doctor's closing turn removed whatever ended it, as
    the authors do; a transcript ending on a patient turn is shown whole."""
    if transcript and transcript[-1]["role"] == "doctor":
        return transcript[:-1]
    return transcript


async def summarize(ctx: CaseContext, transcript: list[dict], settings: CraftSettings) -> str:
    statements = "\n".join(f"- {t['text']}" for t in transcript if t["role"] == "patient" and t["text"])
    prompt = render("summarize", statements=statements or "- (nothing)")
    text = await ask(ctx, settings, "summarizer", "summarizer", "summary", single(prompt, settings), SUMMARY_STOPS if settings.summary_stops else None)
    return clean_summary(text)


def clean_summary(text: str) -> str:
    """The summary as returned (the authors keep it whole), after a repeated 'Case description:' label if any."""
    text = (text or "").strip()
    if "Case description:" in text:
        text = text.rsplit("Case description:", 1)[1]
    return text.strip()


# ------------------------------------------------------------------ asking

def case_question(case: dict) -> str:
    """The case's own question (split off the vignette by the loader as the authors split it), asked in every format."""
    return case.get("question") or DEFAULT_QUESTION


def answer_request(fmt: str, mode: str, case: dict, transcript: list[dict], summary: str, loop: str = "opensource", empty: str = "") -> list[dict]:
    """The clinical model's request for one format and mode, built as the authors' code builds it
    (docs/protocols.md, CRAFT-MD: the formats)."""
    choices = ", ".join(case["choices"])
    if fmt in ("vignette", "summarized"):
        values = {"identity": identity(case["specialty"]), "case": case["vignette"] if fmt == "vignette" else summary,
                  "question": case_question(case), **({"choices": choices} if mode == "mcq" else {})}
        role = "system" if loop == "gpt" and fmt == "vignette" else "user"
        return [{"role": role, "content": render(f"ask_{mode}", **values)}]
    turns = context_turns(transcript) if fmt == "multiturn" else transcript[:1]
    chat = doctor_view(turns, case, loop, empty)
    prompt = render(f"ask_{mode}_after", question=case_question(case), **({"choices": choices} if mode == "mcq" else {}))
    if loop == "gpt":
        return chat + [{"role": "system", "content": prompt}]
    chat[-1] = {**chat[-1], "content": f"{chat[-1]['content']}\n\n{prompt}"}
    return chat


async def ask_answer(ctx: CaseContext, case, transcript, summary, settings, fmt: str, mode: str) -> str:
    """The clinical model's answer in one format and mode (an MCQ with its choices' declared reply format)."""
    request = answer_request(fmt, mode, case, transcript, summary, settings.loop, settings.empty_turn)
    constraint = None
    if mode == "mcq":
        constraint = PROMPTS.constraint("ask_mcq" if fmt in ("vignette", "summarized") else "ask_mcq_after", choices=list(case["choices"]))
    return (await ask(ctx, settings, "clinical", "answer", f"{fmt}_{mode}", request, constraint=constraint)).strip()


PROMPTS_USED = ["identity_specialist", "identity_general", "greeting", "doctor_system", "patient_authors", "patient_system", "summarize", "ask_mcq", "ask_frq",
                "ask_mcq_after", "ask_frq_after", "grader_extract", "grader_match"]


def case_inputs(case: dict, settings: CraftSettings) -> dict:
    """What the case gives the agents (the typed record's ``inputs``): the patient-AI's vignette is its ``facts``; the
    choices where the run asks the MCQ (without, the doctor chooses from none)."""
    return {"question": case_question(case), "facts": case["vignette"], "choices": list(case["choices"]) if settings.mcq else [],
            "answer_index": case["answer_index"] if settings.mcq else None, "specialty": case["specialty"], "dataset": case["dataset"]}


async def solve(ctx: CaseContext, unit: dict, settings: CraftSettings) -> dict:
    """One (case, trial) -> its typed record: the conversation, the summary and every answer, nothing graded. A call
    that gets no answer raises RequestFailed (the runner records the unit as failed)."""
    case, trial = unit["case"], unit["trial"]
    t0 = time.perf_counter()
    needs_dialogue = any(f in settings.formats for f in ("multiturn", "singleturn", "summarized"))
    transcript, stop = (await converse(ctx, case, settings)) if needs_dialogue else ([], None)
    summary = await summarize(ctx, transcript, settings) if "summarized" in settings.formats else None
    t_conv = time.perf_counter() - t0
    modes = [m for m, on in (("mcq", settings.mcq and len(case["choices"]) == 4), ("frq", settings.frq)) if on]
    keys = [(fmt, mode) for fmt in settings.formats for mode in modes]
    said = await asyncio.gather(*(ask_answer(ctx, case, transcript, summary or "", settings, fmt, mode) for fmt, mode in keys))
    answers: dict[str, dict] = {fmt: {} for fmt in settings.formats}
    for (fmt, mode), text in zip(keys, said):
        answers[fmt][mode] = text
    said = [{"role": "doctor", "text": render("greeting"), "turn": 0}, *transcript]  # as spoken: the doctor's fixed greeting first
    return record(unit["id"], case["case_id"], trial=trial, inputs=case_inputs(case, settings), target=case["answer"], transcript=said,
                  answer=answers, metadata={"model": model_name(settings.roles["clinical"]), "source": case.get("source"),
                                            "stop_reason": stop, "n_doctor_turns": sum(t["role"] == "doctor" for t in transcript),
                                            "summary": summary, "prompt_hashes": PROMPTS.hashes(PROMPTS_USED),
                                            "timing": {"conversation_s": round(t_conv, 3), "total_s": round(time.perf_counter() - t0, 3)}})
