"""CRAFT-MD protocol logic against a scripted stand-in client (no server)."""

from __future__ import annotations

import asyncio

from experiments.core.registry import named
from experiments.studies.craftmd.metrics import grades, run_metrics
from experiments.studies.craftmd.protocol import context_turns, converse, solve, stop_reason_for
from experiments.studies.craftmd.study import CraftmdStudy, units_for
from experiments.studies.craftmd.settings import CraftSettings
from experiments.core.scorers import score_record
from experiments.core.study import CaseContext
from serving.client import ChatResult

CASE = {"case_id": "case_x", "vignette": "A 30-year-old woman has silvery scaly plaques on her elbows.", "question": "Which is the most likely diagnosis?", "choices": ["Plaque psoriasis", "Eczema", "Tinea", "Lichen planus"],
        "answer": "Plaque psoriasis", "answer_index": 0, "specialty": "Dermatology", "dataset": "fixture"}


class Scripted:
    """Answers by role and prompt kind; records every call."""

    def __init__(self, doctor_turns, *, mcq="A", frq="Psoriasis", extract="Diagnosis: Psoriasis", verdict="Verdict: Yes"):
        self.doctor_turns = list(doctor_turns)
        self.mcq, self.frq, self.extract, self.verdict = mcq, frq, extract, verdict
        self.calls = []

    async def chat(self, messages, role="default", gen=None):
        self.calls.append((role, messages))
        last = messages[-1]["content"]
        if role == "clinical" and not is_answer(messages):
            text = self.doctor_turns.pop(0) if self.doctor_turns else "Anything else?"
        elif role == "clinical":
            text = self.mcq if is_mcq(last) else self.frq
        elif role == "patient":
            text = f"patient reply {sum(r == 'patient' for r, _ in self.calls)}"
        elif role == "summarizer":
            text = "A woman reports scaly elbow patches.\n\nPatient statements:\n- more"
        elif role == "grader":
            text = self.extract if "copy out the diagnosis" in last else self.verdict
        else:
            raise AssertionError(role)
        return ChatResult(texts=[text], prompt_tokens=10, completion_tokens=3)

    def asks(self, kind):
        """The clinical model's answer requests (each as one text) that contain ``kind``."""
        texts = ["\n".join(x["content"] for x in m) for r, m in self.calls if r == "clinical" and is_answer(m)]
        return [t for t in texts if kind in t]

    def multiturn_asks(self):
        """Answer requests that continue the doctor's chat past the patient's first reply (multi-turn form)."""
        return ["\n".join(x["content"] for x in m) for r, m in self.calls if r == "clinical" and is_answer(m) and len(m) > 3]


def is_answer(messages) -> bool:
    """An answer request: one message (vignette / summarized) or the doctor's chat ending in the question."""
    return len(messages) == 1 or "No more questions now." in messages[-1]["content"]


def is_mcq(text: str) -> bool:
    return "Possible answers:" in text or "\nOptions:" in text


def settings(**kw):
    return CraftSettings(**{"max_turns": 3, "trials": 2, **kw})


def run(client, s=None, case=CASE, unit_id="case_x/t0"):
    """solve(), then the study's scorers, through one CaseContext, as the runner calls them; the record gets the context's usage."""
    s = s or settings()
    ctx = CaseContext(client, unit_id)

    async def both():
        rec = await solve(ctx, {"id": unit_id, "case": case, "trial": 0}, s)
        return await score_record(named(CraftmdStudy)().scorers_for(s), ctx, rec, s)

    return {**asyncio.run(both()), "usage": ctx.usage()}


def test_stop_rules_on_one_turn():
    assert stop_reason_for("**Final Diagnosis:** Psoriasis", "Final Diagnosis") == "final_diagnosis"
    assert stop_reason_for("final diagnosis: psoriasis?", "Final Diagnosis") == "final_diagnosis"
    assert stop_reason_for("You have psoriasis.", "Final Diagnosis") == "no_question"
    assert stop_reason_for("How old are you?", "Final Diagnosis") is None


def test_conversation_ends_on_final_diagnosis():
    c = Scripted(["How old are you?", "**Final Diagnosis:** Plaque psoriasis", "never asked?"])
    transcript, stop = asyncio.run(converse(CaseContext(c, "case_x/t0"), CASE, settings()))
    assert stop == "final_diagnosis"
    assert [t["role"] for t in transcript] == ["patient", "doctor", "patient", "doctor"]
    assert [t["turn"] for t in transcript] == [0, 1, 1, 2]
    assert transcript[-1]["text"].startswith("**Final Diagnosis:**")


def test_conversation_ends_on_turn_without_question_mark():
    c = Scripted(["Where is the rash?", "It is psoriasis."])
    transcript, stop = asyncio.run(converse(CaseContext(c, "case_x/t0"), CASE, settings()))
    assert stop == "no_question" and transcript[-1] == {"role": "doctor", "text": "It is psoriasis.", "turn": 2}


def test_conversation_ends_at_turn_cap():
    c = Scripted(["Q1?", "Q2?", "Q3?", "Q4?", "Q5?"])
    transcript, stop = asyncio.run(converse(CaseContext(c, "case_x/t0"), CASE, settings(max_turns=3)))
    assert stop == "turn_cap"
    assert [t["role"] for t in transcript] == ["patient", "doctor", "patient", "doctor", "patient", "doctor"]
    # as the authors do: the cap is checked right after the doctor's third turn, which the patient never answers
    assert transcript[-1] == {"role": "doctor", "text": "Q3?", "turn": 3}
    assert sum(r == "patient" for r, _ in c.calls) == 3  # the opening and two answers


def test_turn_cap_closing_question_is_removed_before_asking():
    c = Scripted(["Q1?", "Q2?", "Q3?"])
    rec = run(c, settings(max_turns=3))
    assert rec["metadata"]["stop_reason"] == "turn_cap" and rec["metadata"]["n_doctor_turns"] == 3  # the record keeps all three
    multiturn_asks = c.multiturn_asks()
    assert len(multiturn_asks) == 2  # MCQ and FRQ
    for a in multiturn_asks:
        assert "Q2?" in a and "patient reply 3" in a and "Q3?" not in a


def test_doctor_sees_patient_as_user_and_patient_sees_doctor_as_user():
    c = Scripted(["How old are you?", "**Final Diagnosis:** X"])
    asyncio.run(converse(CaseContext(c, "case_x/t0"), CASE, settings()))
    doctor_calls = [m for r, m in c.calls if r == "clinical"]
    # the authors' open-model loop: instructions as the first user message, then the doctor's own greeting
    assert [m["role"] for m in doctor_calls[1]] == ["user", "assistant", "user", "assistant", "user"]
    patient_calls = [m for r, m in c.calls if r == "patient"]
    assert CASE["vignette"] in patient_calls[0][0]["content"] and "Dermatology" in doctor_calls[0][0]["content"]
    assert patient_calls[1][-1] == {"role": "user", "content": "How old are you?"}


def test_final_diagnosis_turn_is_removed_before_asking():
    transcript = [{"role": "patient", "text": "p", "turn": 0}, {"role": "doctor", "text": "Q?", "turn": 1},
                  {"role": "patient", "text": "a", "turn": 1}, {"role": "doctor", "text": "**Final Diagnosis:** Z", "turn": 2}]
    assert context_turns(transcript) == transcript[:3]
    assert context_turns(transcript[:3]) == transcript[:3]  # ends on a patient turn: nothing to remove
    c = Scripted(["Do you have nail pits?", "**Final Diagnosis:** Secretpsoriasis"])
    rec = run(c)
    multiturn_asks = c.multiturn_asks()
    assert len(multiturn_asks) == 2  # MCQ and FRQ
    for a in multiturn_asks:
        assert "Do you have nail pits?" in a and "Secretpsoriasis" not in a
    assert rec["transcript"][-1]["text"] == "**Final Diagnosis:** Secretpsoriasis"  # kept in the record


def test_record_shape_and_scores():
    c = Scripted(["How long?", "**Final Diagnosis:** Psoriasis"], mcq="Plaque psoriasis", frq="Psoriasis", extract="Diagnosis: Psoriasis", verdict="Verdict: Yes")
    rec = run(c)
    assert rec["id"] == "case_x/t0" and rec["case_id"] == "case_x" and rec["trial"] == 0 and rec["inputs"]["specialty"] == "Dermatology"
    assert rec["metadata"]["stop_reason"] == "final_diagnosis" and rec["metadata"]["n_doctor_turns"] == 2
    assert rec["inputs"]["facts"] == CASE["vignette"] and rec["target"] == "Plaque psoriasis" and rec["inputs"]["choices"] == CASE["choices"]
    # the typed record's transcript as spoken: the doctor's fixed greeting first
    assert [t["role"] for t in rec["transcript"][:2]] == ["doctor", "patient"] and rec["transcript"][0]["turn"] == 0
    # kept whole, as the authors keep it (no blank-line cut without the named deviation summary_stops)
    assert rec["metadata"]["summary"] == "A woman reports scaly elbow patches.\n\nPatient statements:\n- more"
    assert set(rec["answer"]) == {"vignette", "multiturn", "singleturn", "summarized"}
    g = grades(rec)
    for fmt, a in rec["answer"].items():
        assert g[(fmt, "mcq")].metadata["choice"] == 0 and g[(fmt, "mcq")].value == 1 and g[(fmt, "mcq")].answer == a["mcq"] == "Plaque psoriasis"
        # 'Psoriasis' vs 'Plaque psoriasis': lexically broader, but the grader was asked and said yes
        assert g[(fmt, "frq")].metadata["extracted"] == "Psoriasis" and g[(fmt, "frq")].value == 1 and g[(fmt, "frq")].source == "grader"
        assert g[(fmt, "frq")].judge["model"] == "embedded" and g[(fmt, "frq")].explanation == "Verdict: Yes"
        assert a == {"mcq": "Plaque psoriasis", "frq": "Psoriasis"}  # what was said; the grades are the record's scores only
    assert rec["usage"]["clinical"]["calls"] == 2 + 8 and rec["usage"]["grader"]["calls"] == 8
    assert set(rec["metadata"]["prompt_hashes"]) >= {"doctor_system", "patient_system", "grader_extract", "grader_match"}


def test_grader_multiple_and_none_score_zero_and_skip_step_two():
    for reply, status in (("Multiple", "multiple"), ("Diagnosis: None", "none")):
        c = Scripted(["Done."], extract=reply)
        rec = run(c, settings(formats="vignette", mcq=False))
        frq = grades(rec)[("vignette", "frq")]
        assert frq.metadata["extraction_status"] == status and frq.value == 0
        assert not any("Decide whether" in m[-1]["content"] for r, m in c.calls if r == "grader")


def test_unparsed_mcq_and_unscored_frq_are_counted():
    c = Scripted(["Done."], mcq="I cannot tell", frq="Heart attack", extract="Diagnosis: Heart attack", verdict="maybe")
    rec = run(c, settings(formats="vignette"))
    g = grades(rec)
    assert g[("vignette", "mcq")].value == 0 and g[("vignette", "frq")].value is None
    assert run_metrics([rec])["parse_errors"] == 2  # the unparsed choice and the unscored verdict


def test_vignette_only_runs_no_conversation_and_osce_cases_skip_mcq():
    c = Scripted([])
    rec = run(c, settings(formats=["vignette"]))
    assert rec["transcript"] == [{"role": "doctor", "text": rec["transcript"][0]["text"], "turn": 0}] and rec["metadata"]["stop_reason"] is None
    osce = {**CASE, "choices": [], "answer_index": None}
    rec = run(Scripted([]), settings(formats=["vignette"]), case=osce, unit_id="o/t0")
    g = grades(rec)
    assert g[("vignette", "mcq")].value is None and g[("vignette", "mcq")].skipped and g[("vignette", "mcq")].source == "not checkable"
    assert "mcq" not in rec["answer"]["vignette"]  # nothing was asked
    assert g[("vignette", "frq")].value == 1


def test_record_model_is_the_clinical_alias():
    s = settings(formats=["vignette"], roles={"clinical": "mistral@http://127.0.0.1:9/v1", "patient": "embedded", "grader": "embedded"})
    rec = run(Scripted([]), s)
    assert rec["metadata"]["model"] == "mistral"


def test_units_per_case_and_trial():
    units = units_for([CASE, {**CASE, "case_id": "case_y"}], 2)
    assert [u["id"] for u in units] == ["case_x/t0", "case_x/t1", "case_y/t0", "case_y/t1"]


class ScriptedCompletion(Scripted):
    """Also answers text completions; replies start with a newline and run on, as a base model's do."""

    async def complete(self, prompt, role="default", gen=None):
        self.calls.append((role, [{"role": "completion", "content": prompt}]))
        if role == "clinical":
            text = "\n\nScarlet fever\nWhich of these" if is_mcq(prompt) else "\nScarlet fever\nDiagnosis: x"
        elif role == "grader":
            text = " Scarlet fever\n\nDoctor's answer:" if "copy out the diagnosis" in prompt else " Yes\nCorrect:"
        else:
            text = " A boy has a rash.\n\nPatient statements:"
        return ChatResult(texts=[text], prompt_tokens=10, completion_tokens=3)


def test_completion_steps_use_text_completion_and_first_line():
    case = {**CASE, "choices": ["Measles", "Scarlet fever", "Kawasaki disease", "Rubella"], "answer": "Scarlet fever", "answer_index": 1}
    c = ScriptedCompletion(["Done."])
    s = settings(completion_steps=["answer", "grader", "summarizer"])
    rec = run(c, s, case=case, unit_id="x/t0")
    kinds = {(r, m[0]["role"]) for r, m in c.calls}
    assert ("clinical", "user") in kinds and ("patient", "system") in kinds  # the dialogue stays chat
    assert ("grader", "completion") in kinds and ("summarizer", "completion") in kinds and ("grader", "user") not in kinds
    for fmt, a in rec["answer"].items():
        assert a["mcq"] == "Scarlet fever" and grades(rec)[(fmt, "mcq")].value == 1
        assert a["frq"] == "Scarlet fever" and grades(rec)[(fmt, "frq")].value == 1 and grades(rec)[(fmt, "frq")].source == "exact"
    assert rec["metadata"]["summary"] == "A boy has a rash.\n\nPatient statements:"  # cut only by the server's stops (summary_stops)


def test_closing_turn_without_question_mark_is_removed_too():
    c = Scripted(["Do you have nail pits?", "You have psoriasis, friend."])
    rec = run(c)
    assert rec["metadata"]["stop_reason"] == "no_question"
    multiturn_asks = c.multiturn_asks()
    assert len(multiturn_asks) == 2  # MCQ and FRQ
    for a in multiturn_asks:
        assert "Do you have nail pits?" in a and "psoriasis, friend" not in a


def test_case_question_goes_to_the_doctor_never_to_the_patient():
    case = {**CASE, "vignette": "A 50-year-old man has a painless rash.", "question": "What is the best next step in management?"}
    c = Scripted(["Where?", "**Final Diagnosis:** X"])
    run(c, case=case)
    patient_prompts = [m[0]["content"] for r, m in c.calls if r == "patient"]
    assert all("next step" not in p and "painless rash" in p for p in patient_prompts)
    asks = c.asks("")
    assert len(asks) == 8 and all("What is the best next step in management?" in a for a in asks)
