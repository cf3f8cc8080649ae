"""AgentClinic requests built as the authors' loop builds them, on our fixture cases (no network, no clone).

The reference is ``main`` of SamuelSchmidgall/AgentClinic's agentclinic.py (its DoctorAgent, PatientAgent,
MeasurementAgent and compare_results). :func:`authors_loop` below restates that loop's structure from a reading of
it, with placeholder words instead of their prompts: per doctor inference, the final-question notice appended to the
last reply on the last one; the doctor's (reply, answer) history; ``DIAGNOSIS READY`` checked before ``REQUEST TEST``;
the measurement agent's and the patient's histories and what each adds to the other's; the moderator's two inputs;
temperature 0.05, max_tokens 200. The same comparison runs their own file on all cases with
``python -m experiments.studies.agentclinic.check_requests AGENTCLINIC_REPO CASES.jsonl`` (docs/protocols.md, AgentClinic).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.studies.agentclinic import check_requests as C

FX = Path(__file__).parent / "fixtures" / "agentclinic" / "cases.jsonl"
CASES = C.load_cases(FX)
SIDE = {"final": "LAST CALL", "budget": r"BUDGET (\d+) USED (\d+)", "sampling": (0.05, 200)}


def authors_loop(osce: dict, query, inferences: int) -> None:
    """The authors' main loop for one case, ``query(agent, system, user)`` standing for their query_model."""
    hist = {"doctor": "", "patient": "", "measurement": ""}
    exams = {**osce["Physical_Examination_Findings"], "tests": osce["Test_Results"]}
    reply = ""
    for i in range(inferences):
        if i == inferences - 1:
            reply += "LAST CALL\n"
        said = query("doctor", f"BUDGET {inferences} USED {i} {osce['Objective_for_Doctor']}", f"{hist['doctor']} | {reply}")
        hist["doctor"] += reply + "\n\n" + said + "\n\n"
        if "DIAGNOSIS READY" in said:
            query("moderator", "SAME?", f"{osce['Correct_Diagnosis']} | {said}")
            return
        if "REQUEST TEST" in said:
            reply = query("measurement", f"READER {exams}", f"{hist['measurement']} | {said}")
            hist["measurement"] += said + "\n\n" + reply + "\n\n"
            hist["patient"] += reply + "\n\n"
        else:
            reply = query("patient", f"PATIENT {osce['Patient_Actor']}", f"{hist['patient']} | {said}")
            hist["patient"] += said + "\n\n" + reply + "\n\n"
            hist["measurement"] += reply + "\n\n"


def their_shapes(case: dict, plan, inferences: int) -> list[dict]:
    script, log = C.Script(plan), []

    def query(agent, system, user):
        log.append(C.shape(agent, system, user, SIDE["sampling"], case["osce"], SIDE))
        return script.reply(agent)

    authors_loop(case["osce"], query, inferences)
    return log


@pytest.mark.parametrize("doctor", list(C.DOCTORS))
@pytest.mark.parametrize("inferences", [20, 4])
def test_our_requests_have_the_authors_structure(doctor, inferences):
    plan = C.DOCTORS[doctor]
    for case in CASES:
        ours, theirs = C.our_shapes(case, plan, C.settings(inferences)), their_shapes(case, plan, inferences)
        assert ours == theirs, case["id"]
        if plan and inferences >= len(plan):  # the diagnosis ends the case at the moderator
            assert ours[-1]["agent"] == "moderator" and sum(x["agent"] == "doctor" for x in ours) == len(plan)
        else:  # the budget ends it: the last doctor line (with the notice) is still answered
            assert ours[-1]["agent"] in ("patient", "measurement") and sum(x["agent"] == "doctor" for x in ours) == inferences
            assert [x["final notice"] for x in ours if x["agent"] == "doctor"] == [False] * (inferences - 1) + [True]


def test_the_comparison_sees_a_changed_history_order_and_a_missing_notice():
    case, plan = CASES[1], C.DOCTORS["never diagnoses"]
    theirs = their_shapes(case, plan, 5)
    swapped = [dict(s, sees=list(reversed(s["sees"]))) for s in theirs]
    assert swapped != theirs and C.our_shapes(case, plan, C.settings(5)) == theirs
    assert C.our_shapes(case, plan, C.settings(6)) != theirs  # one inference more: another request, another budget


def test_shape_reads_the_facts_each_agent_was_given():
    shapes = their_shapes(CASES[0], C.DOCTORS["diagnoses"], 20)
    assert {s["agent"]: s["system holds"] for s in shapes} == {"doctor": ["objective"], "patient": ["patient facts"], "measurement": ["findings"],
                                                               "moderator": []}
    assert [s["correct diagnosis"] for s in shapes if s["agent"] == "moderator"] == [True]
    assert json.dumps(shapes).count('"final notice": true') == 0  # diagnosed before the last inference
