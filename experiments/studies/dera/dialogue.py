"""DERA for summaries and care plans (docs/protocols.md, DERA) and the corruption study: the Decider's initial output
(or, for the corruption study, the corrupted reference), the Researcher / Decider dialogue over a scratchpad, the
rewrite (experiments/studies/dera/README.md, Protocol as implemented). Replies that break the tag format are kept as text and
counted as parse errors.
"""

from __future__ import annotations

from experiments.core.record import record
from experiments.studies.dera.calls import CaseLog
from experiments.studies.dera.data import format_chat
from experiments.studies.dera.settings import DialogueSettings
from experiments.common.parsing import extract_tag, extract_tags, has_marker, split_sections

TEMPLATES = {
    "summarize": {"initial": "summarize_decider_initial", "researcher": "summarize_researcher",
                  "reply": "summarize_decider_reply", "final": "summarize_decider_final"},
    "careplan": {"initial": "careplan_decider_initial", "researcher": "careplan_researcher",
                 "reply": "careplan_decider_reply", "final": "careplan_decider_final"},
}
TEMPLATES["corrupt"] = TEMPLATES["summarize"]
STOP_TAG = "STOP"
NO_CHANGE = {"", "none", "no change", "no changes", "nothing", "n/a"}
LABELS = {"researcher": "Researcher", "decider": "Decider"}


def render_sections(sections: dict, names: list[str]) -> str:
    return "\n\n".join(f"{n}: {sections.get(n, '').strip()}" for n in names)


def dialogue_text(messages: list[dict], labels: dict = LABELS) -> str:
    if not messages:
        return "(no messages yet)"
    return "\n".join(f"{labels[m['role']]}: {m['text']}" for m in messages)


def scratchpad_text(lines: list[str], empty: str = "(no corrections were agreed)") -> str:
    return "\n".join(f"- {x}" for x in lines) if lines else empty


SCRATCHPAD_EMPTY_DURING = "(empty: nothing accepted yet)"


def parse_sections(log: CaseLog, step: str, text: str, names: list[str]) -> dict:
    parsed = split_sections(text or "", names)
    missing = [n for n in names if not parsed[n]]
    log.parsed(step, not missing, f"missing sections: {', '.join(missing)}" if missing else "", text)
    return parsed


def parse_researcher(log: CaseLog, step: str, text: str) -> tuple[str, bool]:
    stop = has_marker(text, STOP_TAG)
    msg = extract_tag(text, "RESPONSE")
    if msg is None:
        log.parsed(step, stop, "no [RESPONSE: ...] tag and no [STOP]", text)
        msg = text.strip() or f"[{STOP_TAG}]"
    else:
        log.parsed(step, True, "")
    return msg, stop


def parse_decider(log: CaseLog, step: str, text: str) -> tuple[str, list[str]]:
    msg = extract_tag(text, "RESPONSE")
    pads = extract_tags(text, "SCRATCHPAD")
    problems = []
    if msg is None:
        problems.append("no [RESPONSE: ...] tag")
        msg = text.split("[SCRATCHPAD", 1)[0].strip()
    if not pads and "[SCRATCHPAD" not in text.upper():
        problems.append("no [SCRATCHPAD: ...] tag")
    log.parsed(step, not problems, "; ".join(problems), text)
    accepted = [p for p in pads if p.lower().strip(' ."') not in NO_CHANGE]
    return msg, accepted


async def run_dialogue(log: CaseLog, enc: dict, output: dict, settings: DialogueSettings) -> dict:
    """Steps 2-3: the Researcher/Decider exchange over ``output``; returns transcript, scratchpad, stop reason."""
    t = TEMPLATES[settings.task]
    base = _encounter_values(enc)
    summary = render_sections(output, settings.sections)
    transcript: list[dict] = []
    scratchpad: list[str] = []
    stop_reason = "turn_cap"

    def history(tail: list[dict]) -> dict:
        return {"dialogue": dialogue_text(tail)}

    while len(transcript) < settings.max_turns:
        turn = len(transcript) + 1
        r = await log.call(f"researcher:{turn}", "researcher", t["researcher"], settings.sampling.dialogue, history=transcript, build=history,
                           **base, summary=summary, review_sections=", ".join(settings.review_sections),
                           scratchpad=scratchpad_text(scratchpad, SCRATCHPAD_EMPTY_DURING))
        msg, stop = parse_researcher(log, f"researcher:{turn}", r.text)
        transcript.append({"role": "researcher", "text": msg, "turn": turn, "raw": r.text})
        if stop:
            stop_reason = "researcher_stop"
            break
        if len(transcript) >= settings.max_turns:
            break
        turn += 1
        d = await log.call(f"decider:{turn}", "decider", t["reply"], settings.sampling.dialogue, history=transcript, build=history,
                           **base, summary=summary, scratchpad=scratchpad_text(scratchpad, SCRATCHPAD_EMPTY_DURING))
        reply, accepted = parse_decider(log, f"decider:{turn}", d.text)
        scratchpad.extend(accepted)
        transcript.append({"role": "decider", "text": reply, "turn": turn, "scratchpad": accepted, "raw": d.text})
    return {"transcript": transcript, "scratchpad": scratchpad, "stop_reason": stop_reason, "turns": len(transcript)}


async def rewrite(log: CaseLog, enc: dict, output: dict, scratchpad: list[str], settings: DialogueSettings) -> tuple[dict, str, list[str]]:
    """Step 4: the final rewrite. A section the rewrite lacks keeps its initial text (listed)."""
    r = await log.call("decider:final", "decider", TEMPLATES[settings.task]["final"], settings.sampling.dialogue,
                       **_encounter_values(enc), summary=render_sections(output, settings.sections), scratchpad=scratchpad_text(scratchpad))
    parsed = parse_sections(log, "decider:final", r.text if r.ok else "", settings.sections)
    kept = [s for s in settings.sections if not parsed[s]]
    return {s: parsed[s] or output.get(s, "") for s in settings.sections}, r.text, kept


def _encounter_values(enc: dict) -> dict:
    return {"age": enc["age"], "sex": enc["sex"], "chief_complaint": enc["chief_complaint"], "chat": format_chat(enc["chat"])}


async def initial_output(log: CaseLog, enc: dict, settings: DialogueSettings) -> tuple[dict, str]:
    t = TEMPLATES[settings.task]
    r = await log.call("decider:initial", "decider", t["initial"], settings.sampling.dialogue, **_encounter_values(enc))
    return parse_sections(log, "decider:initial", r.text if r.ok else "", settings.sections), r.text


async def corrupt(log: CaseLog, enc: dict, reference: dict, settings: DialogueSettings) -> tuple[dict, str]:
    """Corrupt only ``corrupt_sections`` of the reference; other sections stay as they were.
    The prompt carries the chat and the summary instructions, so errors can be made against the source."""
    r = await log.call("corrupt", "decider", "corrupt", settings.sampling.dialogue, **_encounter_values(enc), level=settings.corruption_level,
                       corrupt_sections=", ".join(settings.corrupt_sections),
                       summary=render_sections(reference, settings.sections))
    parsed = split_sections(r.text if r.ok else "", settings.sections)  # all headings, so none bleeds into another
    missing = [s for s in settings.corrupt_sections if not parsed[s]]
    log.parsed("corrupt", not missing, f"missing sections: {', '.join(missing)}", r.text)
    return {s: (parsed.get(s) or reference.get(s, "")) if s in settings.corrupt_sections else reference.get(s, "")
            for s in settings.sections}, r.text


def make_solver(settings: DialogueSettings, model: str):
    """``solve(log, enc) -> record`` for one encounter, its typed record: the initial (or corrupted) output and DERA's
    rewrite its answer, the reference (the corruption study's uncorrupted summary, or the encounter's reference
    summary) its target; GPT-F1 is the study's scorer, after. ``log`` wraps the runner's context of the case (a call
    that gets no answer raises RequestFailed: the runner records the case as failed)."""

    async def solve(log: CaseLog, enc: dict) -> dict:
        meta: dict = {"task": settings.task, "model": model}
        reference = enc.get("reference_summary") if isinstance(enc.get("reference_summary"), dict) else None
        if settings.task == "corrupt":
            reference, ref_raw = await initial_output(log, enc, settings)
            start, start_raw = await corrupt(log, enc, reference, settings)
            meta.update({"reference_raw": ref_raw, "corruption_level": settings.corruption_level})
        else:
            start, start_raw = await initial_output(log, enc, settings)
        dia = await run_dialogue(log, enc, start, settings)
        final, final_raw, kept = await rewrite(log, enc, start, dia["scratchpad"], settings)
        meta.update({"initial_raw": start_raw, "scratchpad": dia["scratchpad"], "stop_reason": dia["stop_reason"], "turns": dia["turns"],
                     "final_raw": final_raw, "final_sections_kept_from_initial": kept, **log.fields()})
        return record(enc["id"], inputs={k: enc.get(k) for k in ("age", "sex", "chief_complaint", "chat")}, target=reference,
                      transcript=dia["transcript"], answer={"initial": start, "dera": final}, metadata=meta)

    return solve
