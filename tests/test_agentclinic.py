"""AgentClinic's loop with a scripted stand-in model: the doctor's budget, test routing, the diagnosis line, the
moderator's verdict rules, the bias instructions, the case reader and the run's metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from experiments.studies.agentclinic.protocol import NO_DIAGNOSIS, PROMPTS, bias_text, solve, verdict
from experiments.studies.agentclinic.settings import DOCTOR_BIASES, PATIENT_BIASES, AgentClinicSettings
from experiments.studies.agentclinic.study import AgentClinicStudy, load_cases, run_metrics
from experiments.common.grade import aggregate, grades
from experiments.core.registry import named
from experiments.core.scorers import score_record
from experiments.core.study import CaseContext
from models.errors import DataError
from tests.scripted import ScriptedLLM

FX = Path(__file__).parent / "fixtures" / "agentclinic" / "cases.jsonl"
CASES = load_cases(FX)
ROLES = ("doctor", "patient", "measurement", "moderator")


def run(case, doctor_lines, moderator="Yes", **settings):
    """One case through the real loop; the doctor says ``doctor_lines`` in turn (then keeps asking)."""
    said = iter(doctor_lines)

    def respond(role, messages, gen):
        if role == "doctor":
            return next(said, "Any other symptoms?")
        return {"patient": "It hurts a lot.", "measurement": "RESULTS: glucose 412 mg/dL", "moderator": moderator}[role]

    s = AgentClinicSettings(data="-", roles={r: "scripted" for r in ROLES}, **settings)
    ctx = CaseContext(ScriptedLLM(respond, roles=ROLES), case["id"], answers=s.answers)

    async def solve_and_score():  # as the runner does: the loop, then the study's scorers over its record
        return await score_record(named(AgentClinicStudy)().scorers_for(s), ctx, await solve(ctx, case, s), s)

    return asyncio.run(solve_and_score()), ctx.calls


def test_the_budget_ends_a_case_without_a_diagnosis_which_is_wrong_unmoderated():
    record, calls = run(CASES[0], [], inferences=3)
    assert [c["role"] for c in calls] == ["doctor", "patient"] * 3  # as theirs: the last doctor line is still answered
    doctor = [c for c in calls if c["role"] == "doctor"]
    assert ["made 0 so far" in d["messages"][0]["content"] for d in doctor] == [True, False, False]
    assert ["made 2 so far" in d["messages"][0]["content"] for d in doctor] == [False, False, True]
    assert all("make 3 requests in all" in d["messages"][0]["content"] for d in doctor)
    notice = PROMPTS.render("final_notice")
    assert [notice in d["messages"][1]["content"] for d in doctor] == [False, False, True]  # only the last request
    g = grades(record)["diagnosis"]
    assert (g.value, g.source, g.judge) == (0, NO_DIAGNOSIS, {"rule": NO_DIAGNOSIS})
    meta = record["metadata"]
    assert meta["stop_reason"] == "budget" and record["answer"] is None and meta["doctor_inferences"] == 3


def test_request_test_goes_to_the_measurement_agent_and_its_result_to_both_histories():
    record, calls = run(CASES[2], ["How long?", "REQUEST TEST: Blood glucose", "Thirsty?"], inferences=4)
    assert [c["role"] for c in calls] == ["doctor", "patient", "doctor", "measurement", "doctor", "patient", "doctor", "patient"]
    measurement = calls[3]["messages"]
    assert "412 mg/dL" in measurement[0]["content"] and "Thin, dry mucous membranes" in measurement[0]["content"]  # exam + tests
    assert "REQUEST TEST: Blood glucose" in measurement[1]["content"] and "It hurts a lot." in measurement[1]["content"]
    assert "RESULTS: glucose 412 mg/dL" in calls[4]["messages"][1]["content"]  # the doctor reads the result next
    patient = calls[5]["messages"]
    assert "RESULTS: glucose 412 mg/dL" in patient[1]["content"] and "REQUEST TEST" not in patient[1]["content"]
    assert "412" not in patient[0]["content"] and "Type 1 diabetes" not in json.dumps([c["messages"] for c in calls if c["role"] != "measurement"])
    assert record["metadata"]["tests_requested"] == 1 and [t["role"] for t in record["transcript"]][:4] == ["doctor", "patient", "doctor", "measurement"]


def test_diagnosis_ready_ends_the_loop_and_the_moderator_sees_the_whole_line_and_the_answer():
    line = "Her symptoms fit. DIAGNOSIS READY: migraine without aura"
    record, calls = run(CASES[0], ["Where?", line], inferences=20)
    assert [c["role"] for c in calls] == ["doctor", "patient", "doctor", "moderator"]
    user = calls[-1]["messages"][1]["content"]
    assert line in user and "Migraine" in user
    g = grades(record)["diagnosis"]
    assert g.value == 1 and g.answer == line and g.explanation == "Yes" and g.judge["model"] == "scripted" and g.judge["rule"] == "exact"
    assert record["answer"] == line and record["metadata"]["stop_reason"] == "diagnosis" and record["target"] == "Migraine"
    assert '"Demographics": "28-year-old woman"' in record["inputs"]["facts"] and [t["role"] for t in record["transcript"]] == ["doctor", "patient", "doctor"]
    assert {n.split("/")[0] for n in record["scores"]} == {"diagnosis", "patient-check"}  # the moderator and the patient checks


@pytest.mark.parametrize("reply, exact, first_word", [("yes", 1, 1), ("Yes", 1, 1), ("Yes.", 0, 1), (" yes", 0, 1), ("No", 0, 0),
                                                      ("no, they differ", 0, 0), ("Perhaps", 0, None), ("", 0, None)])
def test_moderator_verdict_rules(reply, exact, first_word):
    assert verdict(reply, "exact") == exact and verdict(reply, "first_word") == first_word


def test_an_unreadable_moderator_reply_is_unscored_and_counted_not_fatal():
    s = AgentClinicSettings(data="-", verdict_rule="first_word")
    records = [run(CASES[0], ["DIAGNOSIS READY: migraine"], moderator="Perhaps", verdict_rule="first_word")[0],
               run(CASES[1], ["DIAGNOSIS READY: pneumonia"], moderator="Yes.", verdict_rule="first_word")[0],
               run(CASES[2], [], inferences=2, verdict_rule="first_word")[0]]
    assert [grades(r)["diagnosis"].value for r in records] == [None, 1, 0]
    m = run_metrics(records, s)
    acc = aggregate(records, "diagnosis")
    assert (acc.n, acc.value, acc.unscored) == (2, 0.5, 1)  # the unscored reply is left out, the no-diagnosis counted wrong
    assert (m["diagnosed"], m["no_diagnosis"], m["moderator_unscored"], m["rules_disagree"]) == (2, 1, 1, 2)  # 'Yes.': no / yes; 'Perhaps': no / unscored
    exact = run(CASES[1], ["DIAGNOSIS READY: pneumonia"], moderator="Yes.")[0]
    assert grades(exact)["diagnosis"].value == 0  # the authors' rule: only exactly 'yes'


def test_every_bias_kind_adds_one_instruction_to_its_agent_only():
    for kind in DOCTOR_BIASES[1:]:
        assert bias_text("doctor", kind).strip() and "$group" not in bias_text("doctor", kind)
    for kind in PATIENT_BIASES[1:]:
        assert bias_text("patient", kind).strip() and "$group" not in bias_text("patient", kind)
    assert bias_text("doctor", "none") == ""
    assert "poorly ranked medical school" in bias_text("patient", "education") and "little education" in bias_text("doctor", "education")
    _, calls = run(CASES[0], [], inferences=1, doctor_bias="confirmation", patient_bias="self_diagnosis")
    doctor, patient = calls[0]["messages"][0]["content"], calls[1]["messages"][0]["content"]
    assert bias_text("doctor", "confirmation").strip() in doctor and bias_text("patient", "self_diagnosis").strip() in patient
    assert "cancer" not in run(CASES[0], [], inferences=1)[1][0]["messages"][0]["content"]


def test_cases_are_read_with_ids_and_strata_and_bad_lines_are_named(tmp_path):
    assert [(c["id"], c["sex"], c["correct_diagnosis"]) for c in CASES] == [
        ("case_0", "female", "Migraine"), ("case_1", "male", "Community-acquired pneumonia"), ("case_2", "male", "Type 1 diabetes mellitus")]
    assert AgentClinicStudy.strata == ("sex",)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(FX.read_text().splitlines()[0] + "\n" + json.dumps({"OSCE_Examination": {"Patient_Actor": {}}}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: .*Objective_for_Doctor"):
        load_cases(bad)
    with pytest.raises(DataError, match="no such file"):
        load_cases(tmp_path / "none.jsonl")


def test_settings_against_the_authors():
    from experiments.core.config import load_settings
    from experiments.core.deviations import settings_deviations, uncovered

    paper = load_settings(AgentClinicSettings, Path("experiments/studies/agentclinic/configs/paper.yaml"), {})
    assert settings_deviations(paper) == [] and uncovered(AgentClinicSettings) == []
    demo = load_settings(AgentClinicSettings, Path("experiments/studies/agentclinic/configs/embedded-demo.yaml"), {})
    assert "doctor budget 6 inferences (authors: 20, their default)" in settings_deviations(demo)


def test_the_extended_set_joins_the_registry_from_the_study_folder_pinned_like_the_global_ones(monkeypatch):
    from experiments.datasets.registry import REGISTRY_FILE, load_registry

    monkeypatch.delenv("MEDSTACK_DATA_REGISTRY", raising=False)
    assert "agentclinic-medqa-ext" not in load_registry(REGISTRY_FILE)  # only the folder's datasets.yaml declares it
    ext = load_registry()["agentclinic-medqa-ext"]
    assert ext.main == "agentclinic_medqa_extended.jsonl" and [f.size for f in ext.files] == [414177]
    assert ext.files[0].sha256 == "54a024eb2705c6c55d1988766adf4ab02ea7bbe2a28f843107b740032200f232"


def test_the_moderator_is_the_one_constrained_step():
    _, calls = run(CASES[0], ["DIAGNOSIS READY: migraine"], answers="constrained")
    [moderator] = [c for c in calls if c["role"] == "moderator"]
    assert moderator["gen"]["structured"] == {"choice": ["Yes", "No"]} and moderator["format_ok"] == [True]
    assert all("structured" not in c["gen"] for c in calls if c["role"] != "moderator")
    free = [c for c in run(CASES[0], ["DIAGNOSIS READY: migraine"])[1] if c["role"] == "moderator"][0]
    assert "structured" not in free["gen"] and free["constraint"]["applied"] is False


def test_the_figure_code_setting_runs_as_their_code_of_may_2024_did():
    """figure-code.yaml: no final notice, replies used as written, the moderator at temperature 0, each difference
    from their HEAD named in the deviations."""
    from experiments.core.config import load_settings
    from experiments.core.deviations import settings_deviations

    s = load_settings(AgentClinicSettings, Path("experiments/studies/agentclinic/configs/figure-code.yaml"), {})
    said = " ".join(settings_deviations(s))
    for part in ("final-request notice False", "whitespace collapsed False", "moderator temperature 0 (authors: 0.05)", "doctor max_tokens 1024"):
        assert part in said, part
    assert "13 May to 1 June 2024" in said and s.inferences == 20
    head, head_calls = run(CASES[0], [], inferences=2)
    old, old_calls = run(CASES[0], [], inferences=2, final_notice=False, collapse_whitespace=False)
    notice = PROMPTS.render("final_notice")
    assert notice in head_calls[2]["messages"][1]["content"] and not any(notice in c["messages"][1]["content"] for c in old_calls)
    spaced = run(CASES[0], ["DIAGNOSIS READY:\n  migraine"], collapse_whitespace=False)[0]
    raw = run(CASES[0], ["DIAGNOSIS READY: migraine"], moderator="Yes\n\n", collapse_whitespace=False)[0]["scores"]["diagnosis"]
    assert raw["explanation"] == "Yes\n\n" and raw["value"] == 0  # the moderator's reply as written, read by their rule
    assert run(CASES[0], ["DIAGNOSIS READY: migraine"], moderator="Yes\n\n")[0]["scores"]["diagnosis"]["explanation"] == "Yes "
    assert spaced["answer"] == "DIAGNOSIS READY:\n  migraine" and run(CASES[0], ["DIAGNOSIS READY:\n  migraine"])[0]["answer"] == "DIAGNOSIS READY: migraine"


def test_the_demo_doctor_actions_are_formats_the_server_accepts_and_bounded():
    """Each action's format passes the constraint checks (no repetition vLLM cannot compile) and bounds its reply, so
    a small model's reply ends within the demo's max_tokens; the dry run's stand-in replies take the same branches."""
    import re

    from experiments.studies.agentclinic.protocol import ACTIONS, doctor_action

    s = AgentClinicSettings(data="-", doctor_actions=["ask", "test", "diagnose"], answers="constrained")
    assert [doctor_action(s, i).spec for i in range(4)] == [ACTIONS["ask"], ACTIONS["test"], ACTIONS["diagnose"], ACTIONS["diagnose"]]
    for action, fits, too_long in [("ask", "Where does it hurt, and since when?", "you're" * 30 + "?"),
                                   ("test", "REQUEST TEST: Chest_X-Ray", "REQUEST TEST: Chest X-Ray " + "_" * 200),
                                   ("diagnose", "DIAGNOSIS READY: community-acquired pneumonia", "DIAGNOSIS READY: [diagnosis]")]:
        assert re.fullmatch(ACTIONS[action], fits) and not re.fullmatch(ACTIONS[action], too_long), action
