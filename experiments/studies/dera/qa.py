"""DERA for open-ended (and multiple-choice) MedQA, docs/protocols.md, DERA, with the 1-shot baseline in the same run
(the steps, the vote and its tie rule: experiments/studies/dera/README.md, Protocol as implemented).
"""

from __future__ import annotations

from collections import Counter

from experiments.studies.dera.calls import CaseLog
from experiments.studies.dera.data import format_options
from experiments.studies.dera.dialogue import dialogue_text
from experiments.studies.dera.prompts import render
from experiments.studies.dera.settings import QASettings
from experiments.common.choice import pick_letter
from experiments.core.record import record
from experiments.common.parsing import extract_after, has_marker

LABELS = {"researcher": "Teacher", "decider": "Student"}


# -- pure helpers -------------------------------------------------------------------------------

def answer_from_completion(text: str, mcq: bool) -> str | None:
    """The answer a completion gives: a letter (MCQ), else its first non-empty line with an
    ``Answer:`` label, surrounding quotes/spaces and a trailing full stop removed."""
    if not text or not text.strip():
        return None
    if mcq:
        return pick_letter(text, "ABCDE", loose=True)
    line = next(ln for ln in text.strip().splitlines() if ln.strip()).strip()
    labelled = extract_after(line, "answer")
    line = (labelled or line).strip().strip('"“”*').strip()
    line = line[:-1].rstrip() if line.endswith(".") else line
    return line or None


def majority_vote(answers: list[str | None]) -> str | None:
    """Most frequent exact string; ties go to the earliest completion among the top answers. None if no answer."""
    valid = [a for a in answers if a]
    if not valid:
        return None
    counts = Counter(valid)
    top = max(counts.values())
    return next(a for a in valid if counts[a] == top)


def vote_distribution(answers: list[str | None]) -> list[tuple[str, float]]:
    """(answer, share) by decreasing share, ties in order of first appearance; unanswered samples excluded."""
    valid = [a for a in answers if a]
    if not valid:
        return []
    counts = Counter(valid)
    order = {a: i for i, a in reversed(list(enumerate(valid)))}
    return [(a, c / len(valid)) for a, c in sorted(counts.items(), key=lambda kv: (-kv[1], order[kv[0]]))]


def vote_distribution_text(answers: list[str | None]) -> str:
    dist = vote_distribution(answers)
    if not dist:
        return "no usable answers"
    return ", ".join(f"'{a}' {round(100 * s)}%" for a, s in dist)


# -- protocol -----------------------------------------------------------------------------------

def _options_block(q: dict, settings: QASettings) -> str:
    return f"Options: {format_options(q.get('options'))}\n" if settings.mcq else ""


def letter_values(q: dict) -> dict:
    """Placeholder values of the MCQ reply formats (prompts/constraints.yaml): the question's option letters."""
    letters = sorted((q.get("options") or {}).keys()) or list("ABCDE")
    return {"letters": letters, "letter_class": "".join(letters)}


def _oneshot(q: dict, settings: QASettings) -> tuple[str, dict]:
    if settings.mcq:
        return "qa_oneshot_mcq", {"question": q["question_open"] if not q.get("question") else q["question"], "options": format_options(q["options"])}
    return "qa_oneshot", {"question": q["question_open"]}


async def sample_answers(log: CaseLog, step: str, template: str, sampling, settings: QASettings, constraint_values=None, **values) -> dict:
    r = await log.call(step, "decider", template, sampling, constraint_values=constraint_values, **values)
    answers = [answer_from_completion(t, settings.mcq) for t in r.texts]
    for i, a in enumerate(answers):
        log.parsed(f"{step}:{i}", a is not None, r.error or "no answer in completion", r.texts[i] if i < len(r.texts) else "")
    return {"completions": r.texts, "answers": answers, "vote": majority_vote(answers),
            "distribution": vote_distribution(answers), "distribution_text": vote_distribution_text(answers)}


async def run_qa_dialogue(log: CaseLog, q: dict, explanation: str, settings: QASettings) -> dict:
    question = q["question_open"] if not settings.mcq else (q.get("question") or q["question_open"])
    transcript = [{"role": "decider", "text": explanation, "turn": 1}]
    stop_reason = "turn_cap"
    opts = _options_block(q, settings)
    decider_template = "qa_decider_mcq" if settings.mcq else "qa_decider"
    stated: list[str | None] = []

    def history(tail: list[dict]) -> dict:
        return {"dialogue": dialogue_text(tail, LABELS)}

    for _ in range(settings.max_turns):
        turn = len(transcript) + 1
        r = await log.call(f"researcher:{turn}", "researcher", "qa_researcher", settings.sampling.dialogue, history=transcript, build=history,
                           question=question, options_block=opts)
        stop = has_marker(r.text, "STOP")
        transcript.append({"role": "researcher", "text": r.text.strip() or "STOP", "turn": turn})
        if stop:
            stop_reason = "researcher_stop"
            break
        turn += 1
        d = await log.call(f"decider:{turn}", "decider", decider_template, settings.sampling.dialogue, history=transcript, build=history,
                           constraint_values=letter_values(q), question=question, options=format_options(q.get("options")))
        said = extract_after(d.text, "answer")
        if said and settings.mcq:
            said = pick_letter(said, "ABCDE", loose=True)
        log.parsed(f"decider:{turn}", bool(said), "no 'Answer: ...' line", d.text)
        stated.append(said)
        transcript.append({"role": "decider", "text": d.text.strip(), "turn": turn, "answer": said})
    return {"transcript": transcript, "stop_reason": stop_reason, "stated_answers": stated,
            "turns": sum(1 for m in transcript if m["role"] == "researcher")}


def qa_inputs(question: str, options: dict | None, answer_idx: str | None) -> dict:
    """What a question gave the agents: the question and, in a multiple-choice run, the options in letter order
    (``choices``) and the correct one's place (``answer_index``)."""
    letters = list(options or {})
    return {"question": question, **({"choices": [options[k] for k in letters], "answer_index": letters.index(answer_idx)} if letters else {})}


def make_solver(settings: QASettings, model: str):
    """``solve(log, q) -> record`` for one question, its typed record, the arms' answers unjudged (the study's scorers
    judge them after); ``log`` wraps the runner's context of the case (a call that gets no answer raises
    RequestFailed: the case is failed, never scored)."""

    async def solve(log: CaseLog, q: dict) -> dict:
        template, values = _oneshot(q, settings)
        base = await sample_answers(log, "oneshot", template, settings.sampling.answer, settings, constraint_values=letter_values(q), **values)
        opts = _options_block(q, settings)
        question = values["question"]
        ex = await log.call("decider:explain", "decider", "qa_explain", settings.sampling.explain,
                            question=question, options_block=opts, distribution=base["distribution_text"])
        explanation = ex.text.strip() if ex.ok else ""
        dia = await run_qa_dialogue(log, q, explanation or "(no explanation)", settings)
        oneshot_prompt = "\n" + render(template, **values)

        def final_history(tail):
            return {"dialogue": dialogue_text(tail, LABELS), "oneshot": oneshot_prompt}

        final = await sample_answers_with_history(log, settings, dia["transcript"], final_history, template, letter_values(q))
        answers = {"oneshot": base["vote"], "dera": final["vote"]}
        return record(q["id"], inputs=qa_inputs(question, q.get("options") if settings.mcq else None, q.get("answer_idx")),
                      target=q["answer_idx"] if settings.mcq else q["answer"], transcript=dia["transcript"], answer=answers,
                      metadata={"model": model, **({"gold_text": q["answer"]} if settings.mcq else {}), "oneshot": base,
                                "explanation": explanation, "stop_reason": dia["stop_reason"], "stated_answers": dia["stated_answers"],
                                "turns": dia["turns"], "final": final, "answer_changed": answers["oneshot"] != answers["dera"], **log.fields()})

    return solve


async def sample_answers_with_history(log: CaseLog, settings: QASettings, transcript: list[dict], build,
                                      oneshot_template: str = "qa_oneshot", constraint_values: dict | None = None) -> dict:
    # the final prompt is the one-shot prompt with the chat as context: its reply has the one-shot's format
    r = await log.call("decider:final", "decider", "qa_final", settings.sampling.final, history=transcript, build=build,
                       format_of=oneshot_template, constraint_values=constraint_values)
    answers = [answer_from_completion(t, settings.mcq) for t in r.texts]
    for i, a in enumerate(answers):
        log.parsed(f"decider:final:{i}", a is not None, "no answer in completion", r.texts[i])
    return {"completions": r.texts, "answers": answers, "vote": majority_vote(answers),
            "distribution": vote_distribution(answers), "distribution_text": vote_distribution_text(answers),
            "error": r.error}
