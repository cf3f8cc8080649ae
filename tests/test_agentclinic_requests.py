"""AgentClinic requests compared with the authors' loop slot by slot, and the comparison shown able to fail.

The reference is ``main`` of SamuelSchmidgall/AgentClinic's agentclinic.py (its DoctorAgent, PatientAgent,
MeasurementAgent and compare_results). :func:`authors_loop` below restates that loop's structure from a reading of
it, with placeholder words instead of their prompts: per doctor inference, the final-question notice appended to the
last reply on the last one; the doctor's (reply, answer) history; ``DIAGNOSIS READY`` checked before ``REQUEST TEST``;
the measurement agent's and the patient's histories and what each adds to the other's; each agent's facts; the bias
added to the doctor's and the patient's system prompt; the moderator's two inputs and its ``== "yes"``; temperature
0.05, max_tokens 200; whitespace collapsed. The same comparison runs their own file on all cases with
``python -m experiments.studies.agentclinic.check_requests AGENTCLINIC_REPO CASES.jsonl`` (docs/protocols.md, AgentClinic).

Mutated copies of our loop (our protocol.py with one change each) must each make the comparison report differences.
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from experiments.studies.agentclinic import check_requests as C
from experiments.studies.agentclinic import protocol
from experiments.studies.agentclinic import study as study_module
from experiments.studies.agentclinic.settings import DOCTOR_BIASES, PATIENT_BIASES

FX = Path(__file__).parent / "fixtures" / "agentclinic" / "cases.jsonl"
CASES = C.load_cases(FX)
SAYS = {name: f"SAY<{name}>" for names in C.INSTRUCTIONS.values() for name in names}
SIDE = {"final": "LAST CALL", "budget": r"BUDGET (\d+) USED (\d+)", "sampling": (0.05, 200),
        "says": {name: re.escape(text) for name, text in SAYS.items()},
        "biases": {"doctor": {k: f"DOCTOR-BIAS<{k}>" for k in DOCTOR_BIASES if k != "none"},
                   "patient": {k: f"PATIENT-BIAS<{k}>" for k in PATIENT_BIASES if k != "none"}}}
DOCS = Path(__file__).parents[1] / "docs" / "protocols.md"


def authors_loop(osce: dict, query, inferences: int, doctor_bias: str, patient_bias: str) -> bool:
    """The authors' main loop for one case, ``query(agent, system, user)`` standing for their query_model: correct?"""
    def says(agent):
        return " ".join(SAYS[n] for n in C.INSTRUCTIONS[agent])

    def bias(agent, kind):
        return "" if kind == "none" else "\n" + SIDE["biases"][agent][kind] + "\n"

    hist = {"doctor": "", "patient": "", "measurement": ""}
    exams = {**osce["Physical_Examination_Findings"], "tests": osce["Test_Results"]}
    reply = ""
    for i in range(inferences):
        if i == inferences - 1:
            reply += "LAST CALL\n"
        said = query("doctor", f"BUDGET {inferences} USED {i} {says('doctor')}{bias('doctor', doctor_bias)} {osce['Objective_for_Doctor']}",
                     f"{hist['doctor']} | {reply}")
        hist["doctor"] += reply + "\n\n" + said + "\n\n"
        if "DIAGNOSIS READY" in said:
            verdict = query("moderator", says("moderator"), f"{osce['Correct_Diagnosis']} | {said}")
            return verdict.lower() == "yes"
        if "REQUEST TEST" in said:
            reply = query("measurement", f"{says('measurement')} {exams}", f"{hist['measurement']} | {said}")
            hist["measurement"] += said + "\n\n" + reply + "\n\n"
            hist["patient"] += reply + "\n\n"
        else:
            reply = query("patient", f"{says('patient')}{bias('patient', patient_bias)} {osce['Patient_Actor']}", f"{hist['patient']} | {said}")
            hist["patient"] += said + "\n\n" + reply + "\n\n"
            hist["measurement"] += reply + "\n\n"
    return False


def their_shapes(i: int, case: dict, script: C.Script, s) -> list[dict]:
    log = []

    def query(agent, system, user):
        log.append(C.shape(agent, system, user, SIDE["sampling"], case["osce"], SIDE))
        return re.sub(r"\s+", " ", script.reply(agent))

    correct = authors_loop(case["osce"], query, s.inferences, s.doctor_bias, s.patient_bias)
    return log + [{"agent": "verdict", "correct": correct}]


def differing(inferences: int = 20, say=lambda line: None) -> int:
    return sum(C.compare(CASES, their_shapes, inferences, say).values())


@pytest.mark.parametrize("inferences", [20, 4])
def test_our_requests_match_the_authors_slot_by_slot_for_both_doctors_and_every_bias(inferences):
    said = []
    assert differing(inferences, said.append) == 0, said[:3]
    assert len(C.conditions()) == 14 and {k for c in C.conditions() for k in c} == set(DOCTOR_BIASES) | set(PATIENT_BIASES)
    plan = C.DOCTORS["never diagnoses"]
    ours = C.our_shapes(CASES[0], C.Script(plan), C.settings(inferences))
    assert [x["final notice"] for x in ours if x["agent"] == "doctor"] == [False] * (inferences - 1) + [True]
    assert ours[-1] == {"agent": "verdict", "correct": False}


def test_every_slot_is_filled_on_the_fixture():
    ours = C.our_shapes(CASES[0], C.Script(C.DOCTORS["diagnoses"], "Yes"), C.settings(20, "gender", "self_diagnosis"))
    by = {x["agent"]: x for x in ours}
    assert by["doctor"]["bias"] == ["gender"] and by["patient"]["bias"] == ["self_diagnosis"] and by["measurement"]["bias"] == []
    assert by["patient"]["system holds"] and all(p.startswith("Patient_Actor/") for p in by["patient"]["system holds"])
    assert by["doctor"]["system holds"] == ["Objective_for_Doctor"]
    assert by["measurement"]["system holds"] and all(p.split("/")[0] in ("Physical_Examination_Findings", "Test_Results")
                                                     for p in by["measurement"]["system holds"])
    assert by["moderator"]["inputs"] == ["correct diagnosis", "doctor's line"] and by["moderator"]["correct diagnosis"]
    assert {a: by[a]["says"] for a in C.INSTRUCTIONS} == {a: sorted(n) for a, n in C.INSTRUCTIONS.items()}
    assert by["verdict"] == {"agent": "verdict", "correct": True} and not any(x.get("raw whitespace") for x in ours)


def mutant(monkeypatch, old: str, new: str) -> None:
    """Our loop with one change: a copy of protocol.py, edited, put where the comparison and the scorer call it."""
    source = Path(protocol.__file__).read_text(encoding="utf-8")
    assert source.count(old) == 1, old
    module = types.ModuleType("agentclinic_mutant")
    module.__file__ = protocol.__file__
    exec(compile(source.replace(old, new), protocol.__file__, "exec"), module.__dict__)
    monkeypatch.setattr(C.protocol, "solve", module.solve)
    monkeypatch.setattr(study_module, "moderate", module.moderate)


MUTATIONS = {
    "patient facts cut": ('facts=facts(osce["Patient_Actor"])', 'facts=facts(dict(list(osce["Patient_Actor"].items())[:-1]))'),
    "notice one turn early": ("if s.final_notice and i == s.inferences - 1:", "if s.final_notice and i == s.inferences - 2:"),
    "moderator inputs swapped": ("correct=correct, diagnosis=line", "correct=line, diagnosis=correct"),
    "a bias dropped": ('bias=bias_text("doctor", s.doctor_bias)', 'bias=""'),
    "every verdict yes": ('return int(said == "yes")', "return 1"),
    "whitespace kept": ('return re.sub(r"\\s+", " ", r.text or "") if s.collapse_whitespace', 'return re.sub(r"\\s+", " ", r.text or "") if not s.collapse_whitespace'),
    "measurement history not shared": ('history["measurement"] += f"{reply}\\n\\n"', "pass"),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_each_mutated_copy_of_our_loop_is_caught(monkeypatch, name):
    mutant(monkeypatch, *MUTATIONS[name])
    said = []
    assert differing(20, said.append) > 0, name
    assert said and all(" slot " in line or "requests ours" in line for line in said)


def test_prompt_edits_that_change_behaviour_are_caught(monkeypatch):
    """An instruction reworded away (the patient told to reveal its illness; the moderator asked the opposite) is found."""
    real = protocol.PROMPTS.render

    def edited(name, **values):
        text = real(name, **values)
        if name == "patient_system":
            return text.replace("Never name your illness", "Tell the doctor your illness")
        return text.replace("Answer with Yes or No and nothing else", "Answer Yes when they differ") if name == "moderator_system" else text

    monkeypatch.setattr(protocol.PROMPTS, "render", edited)
    said = []
    assert differing(20, said.append) > 0 and any("'says'" in line for line in said)


def test_the_instructions_that_change_behaviour_are_in_our_prompts_and_listed_in_the_docs():
    files = {p.stem: p.read_text(encoding="utf-8") for p in protocol.PROMPTS.folder.glob("*.txt")}
    text = re.sub(r"\$\w+", "7", "\n".join(files.values()))  # the templates, their slots filled
    for agent, names in C.INSTRUCTIONS.items():
        for name in names:
            assert re.search(C.OURS["says"][name], text, re.S), (agent, name)
    docs = DOCS.read_text(encoding="utf-8")
    table = docs[docs.index("| agent | instruction |"):]
    for agent, names in C.INSTRUCTIONS.items():
        for name in names:
            assert re.search(rf"^\| {agent} \| {re.escape(name)} \|", table, re.M), (agent, name)
