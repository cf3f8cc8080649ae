"""AgentClinic through the generic tools, every role a scripted OpenAI-shaped endpoint (no model server): `run`,
`--sample`, `rescore --judge diagnosis`, `compare` and the review items of its moderator, with no tool told of it."""

from __future__ import annotations

import json
import shutil

import pytest

from experiments.tools.review.judges import load_judge
from experiments.tools.review.labels import write_sample
from experiments.core.scorers import review_items
from experiments.core.registry import open_run, study_of
from experiments.datasets.registry import MARKER
from tests.scripted import ChatStub, serve_stub


class _Clinic(ChatStub):
    """Each agent told apart by its system prompt: the doctor asks, requests an MRI, then says migraine; the moderator
    says 'Yes' for Migraine and 'No.' otherwise."""

    def answer(self, body: dict) -> str:
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if "Dr. Agent" in system:
            said = "DIAGNOSIS READY: migraine" if "REQUEST TEST" in user else "REQUEST TEST: MRI" if "brings you" in user else "What brings you in?"
        elif "test results" in system:
            said = "RESULTS: normal"
        elif "same disease" in system:
            said = "Yes" if "Migraine" in user else "No."
        else:
            said = "I have a headache."
        return said


@pytest.fixture(scope="module")
def clinic():
    srv = serve_stub(_Clinic)
    yield f"embedded@http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


def test_run_rescore_compare_and_review_items(cli, clinic, fixtures_dir, tmp_path):
    run = tmp_path / "run"
    cli("run", "agentclinic", "--data", str(fixtures_dir / "agentclinic" / "cases.jsonl"), "--model", clinic, "--out", str(run), check=True)
    recs = [json.loads(l) for l in (run / "records.jsonl").read_text().splitlines()]
    assert {r["id"]: r["scores"]["diagnosis"]["value"] for r in recs} == {"case_0": 1, "case_1": 0, "case_2": 0}
    assert all([t["role"] for t in r["transcript"]] == ["doctor", "patient", "doctor", "measurement", "doctor"] for r in recs)
    assert all(r["answer"].startswith("DIAGNOSIS READY") and r["target"] and r["inputs"]["facts"] for r in recs)  # the typed record
    summary = (run / "summary.md").read_text()
    assert "| diagnostic accuracy (moderator) | 0.333 [0.000, 1.000]" in summary and "| **GPT-4 (paper)** | AgentClinic-MedQA | – | – | 0.522 |" in summary
    assert "| diagnosis | 0.333 [0.000, 1.000] (n=3) |" in summary  # the Scores section: the same figure, the same interval
    # the simulated-patient checks, a scorer the study declares: nothing flagged in "I have a headache.", per conversation and
    # per patient turn; a check that needs answer choices is not checkable (AgentClinic's doctor chooses from none), never 0
    pc = {k: v for r in recs for k, v in r["scores"].items() if k.startswith("patient-check/")}
    assert pc["patient-check/leaks_diagnosis"]["value"] == 0 and pc["patient-check/leaks_diagnosis"]["metadata"] == {"turns": 0, "patient_turns": 1}
    assert pc["patient-check/names_other_choice"] == {"value": None, "source": "not checkable", "skipped": True, "judge": {"rule": "patient_checks.names_other_choice"}}
    assert "| patient-check/names_other_choice: the patient names another answer choice before the doctor's final turn | not checkable (3 records) | not checkable (3 records) |" in summary
    figs = {(f["score"], f["metric"]): f for f in json.loads((run / "metrics.json").read_text())["scores"]}
    assert figs[("patient-check/empty_turn", "per patient turn")]["value"] == 0 and figs[("patient-check/names_other_choice", "per conversation")]["not_checkable"] == 3
    # the moderator's decisions as review items: what it was shown, nothing else
    opened = open_run(run)
    judge = next(s for s in study_of(opened).scorers if s.name == "diagnosis")
    scale, items = review_items(judge, opened.records, opened.config)
    assert scale.kind == "binary" and sorted((i["id"], i["verdict"]) for i in items) == [("case_0", 1), ("case_1", 0), ("case_2", 0)]
    assert items[0]["show"].keys() == {"correct diagnosis", "doctor's line"}
    # a clinician's labels of a sample of them, and the moderator held to them (`calibrate reviews`)
    write_sample(run, load_judge(run, "diagnosis"), 3, 0)
    (run / "reviews" / "derm.jsonl").write_text("".join(json.dumps({"judge": "diagnosis", "item": i, "reviewer": "derm", "label": v}) + "\n"
                                                        for i, v in (("case_0", 1), ("case_1", 1), ("case_2", 0))))
    cli("calibrate", "reviews", str(run), "--labels", str(run / "reviews"), "--n-boot", "200", check=True)
    vs = json.loads((run / "reviews" / "calibration-diagnosis.json").read_text())["reviewers"]["derm"]["vs_judge"]
    assert vs["n"] == 3 and vs["exact_agreement"] == 2 / 3  # the clinician takes case_1's line as the diagnosis; the moderator did not
    # another moderator over the stored diagnosis lines, and its agreement with the run's
    cli("rescore", str(run), "--judge", "diagnosis", "--judge-model", clinic, "--out", str(tmp_path / "rescore"), check=True)
    assert "| embedded | 3 | 100.0% |" in (tmp_path / "rescore" / "summary.md").read_text()
    cli("compare", str(run), "--out", str(tmp_path / "cmp"), check=True)
    assert "| diagnosis | 0.333 [0.000, 1.000] (n=3) |" in (tmp_path / "cmp" / "summary.md").read_text()
    # --sample keeps the set's mix of the patients' sex
    proc = cli("run", "agentclinic", "--data", str(fixtures_dir / "agentclinic" / "cases.jsonl"), "--sample", "2", "--dry-run",
               "--out", str(tmp_path / "dry"), check=True)
    said = proc.stdout + proc.stderr
    assert "stratified by sex" in said and "1 female, 1 male" in said and "dry run: 12 request(s) of 2 cases" in said  # the stand-ins: a question, a test, a diagnosis, its verdict


class _Polite(_Clinic):
    """The moderator says 'Yes.' for Migraine: a no by the authors' rule (the whole reply must be 'yes'), a yes by its first word."""

    def answer(self, body: dict) -> str:
        said = super().answer(body)
        return "Yes." if said == "Yes" else said


def test_a_second_moderator_scorer_is_run_rescored_reviewed_and_calibrated(cli, fixtures_dir, tmp_path):
    """``diagnosis-first-word``, one declaration in the study's folder: `run --scorers` asks it beside the paper's
    ``diagnosis``; `rescore`, `review` and `calibrate reviews` take it like any scorer."""
    srv = serve_stub(_Polite)
    model = f"embedded@http://127.0.0.1:{srv.server_address[1]}/v1"
    try:
        run = tmp_path / "run"
        cli("run", "agentclinic", "--data", str(fixtures_dir / "agentclinic" / "cases.jsonl"), "--model", model, "--out", str(run),
            "--scorers", "diagnosis-first-word", check=True)
        recs = {r["id"]: r for r in map(json.loads, (run / "records.jsonl").read_text().splitlines())}
        assert {i: (r["scores"]["diagnosis"]["value"], r["scores"]["diagnosis-first-word"]["value"]) for i, r in recs.items()} == \
            {"case_0": (0, 1), "case_1": (0, 0), "case_2": (0, 0)}
        assert sum(c["step"] == "moderator" for r in recs.values() for c in r["calls"]) == 6  # each scorer asks the moderator once per case
        summary = (run / "summary.md").read_text()
        assert "| diagnosis-first-word | 0.333 [0.000, 1.000] (n=3) |" in summary and "| diagnosis | 0.000 [0.000, 0.000] (n=3) |" in summary
        bad = cli("run", "agentclinic", "--data", str(fixtures_dir / "agentclinic" / "cases.jsonl"), "--scorers", "nope", "--dry-run", "--out", str(tmp_path / "x"))
        assert bad.returncode == 2 and "its optional scorers: diagnosis-first-word" in bad.stderr
        cli("rescore", str(run), "--judge", "diagnosis-first-word", "--judge-model", model, "--out", str(tmp_path / "re"), check=True)
        assert "| embedded | 3 | 100.0% |" in (tmp_path / "re" / "summary.md").read_text()
        write_sample(run, load_judge(run, "diagnosis-first-word"), 3, 0)
        (run / "reviews" / "derm.jsonl").write_text("".join(json.dumps({"judge": "diagnosis-first-word", "item": i, "reviewer": "derm", "label": v}) + "\n"
                                                            for i, v in (("case_0", 1), ("case_1", 0), ("case_2", 0))))
        cli("calibrate", "reviews", str(run), "--labels", str(run / "reviews"), "--judge", "diagnosis-first-word", "--n-boot", "200", check=True)
        vs = json.loads((run / "reviews" / "calibration-diagnosis-first-word.json").read_text())["reviewers"]["derm"]["vs_judge"]
        assert vs["n"] == 3 and vs["exact_agreement"] == 1.0
    finally:
        srv.shutdown()


def test_the_extended_set_is_listed_and_read_by_name(cli, fixtures_dir, tmp_path):
    """`--data agentclinic-medqa-ext` resolves through the registry the study folder's datasets.yaml joins."""
    env = {"MEDSTACK_HOME": str(tmp_path / "home")}
    rows = {row["name"]: row for row in json.loads(cli("data", "list", "--json", env=env, check=True).stdout)}
    assert {"agentclinic-medqa", "agentclinic-medqa-ext"} <= rows.keys()
    args = ("run", "agentclinic", "--data", "agentclinic-medqa-ext", "--dry-run", "--out", str(tmp_path / "dry"))
    r = cli(*args, env=env)
    assert r.returncode == 2 and "agentclinic-medqa-ext is registered but not fetched yet" in r.stderr
    # fetched (here the fixture's cases in its folder, as `data fetch` leaves a set): the name reads them
    folder = tmp_path / "home" / "data" / "agentclinic-medqa-ext"
    folder.mkdir(parents=True)
    shutil.copy(fixtures_dir / "agentclinic" / "cases.jsonl", folder / "agentclinic_medqa_extended.jsonl")
    (folder / MARKER).write_text("{}")
    r = cli(*args, env=env, check=True)
    assert "dry run: 18 request(s) of 3 cases" in r.stdout + r.stderr


class _Swayed(_Clinic):
    """A doctor told of cancer in its prompt (a doctor bias) diagnoses cancer; the moderator says 'Yes' only where the
    doctor's line names the correct disease (migraine, case_0's). A patient's bias changes nothing the doctor says."""

    def answer(self, body: dict) -> str:
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if "Dr. Agent" in system and "cancer" in system and "REQUEST TEST" in user:
            return "DIAGNOSIS READY: cancer"
        if "same disease" in system:
            correct, _, said = user.partition("What the doctor said:")
            return "Yes" if "Migraine" in correct and "migraine" in said.lower() else "No"
        return super().answer(body)


def test_compare_tells_bias_runs_apart_computes_the_bias_effect_and_tests_only_shared_cases(cli, fixtures_dir, tmp_path):
    """Three AgentClinic runs as a user runs them (no bias over 12 cases, a doctor bias over 3 of them, a patient bias
    over all 12), then `medstack compare`: each run named by its bias, the bias a column, each bias run's accuracy
    over the unbiased run's with its interval beside the paper's figure, and paired differences only over shared cases,
    with no p-value below 10 of them."""
    cases = tmp_path / "cases.jsonl"
    cases.write_text((fixtures_dir / "agentclinic" / "cases.jsonl").read_text() * 4)  # case_0 .. case_11; every third a migraine
    srv = serve_stub(_Swayed)
    model = f"embedded@http://127.0.0.1:{srv.server_address[1]}/v1"
    try:
        for out, extra in (("base", []), ("doc", ["--doctor-bias", "recency", "--limit", "3"]), ("pat", ["--patient-bias", "self_diagnosis"])):
            cli("run", "agentclinic", "--data", str(cases), "--model", model, "--out", str(tmp_path / out), *extra, check=True)
        assert "# AgentClinic run: embedded doctor_bias=recency" in (tmp_path / "doc" / "summary.md").read_text()
        proc = cli("compare", *(str(tmp_path / x) for x in ("base", "doc", "pat")), "--out", str(tmp_path / "cmp"), check=True)
    finally:
        srv.shutdown()
    summary = (tmp_path / "cmp" / "summary.md").read_text()
    assert summary in proc.stdout
    # the runs told apart: the name and a column per setting that differs
    assert "| run | cases | doctor_bias | patient_bias | path |" in summary
    assert f"| embedded doctor_bias=recency | 3 | recency | none | {tmp_path / 'doc'} |" in summary
    assert f"| embedded patient_bias=self_diagnosis | 12 | none | self_diagnosis | {tmp_path / 'pat'} |" in summary
    # the bias effects: 0 of case_0's 1 right with the doctor bias (over the 3 shared cases); 4 of 4 with the patient's
    assert ("| bias effect on diagnostic accuracy | embedded doctor_bias=recency | doctor_bias=recency | embedded | 0.0 [0.0, 0.0] | 3 | "
            "GPT-4 95.7, Mixtral 74.2 (doctor cognitive biases) |") in summary
    assert ("| bias effect on diagnostic accuracy | embedded patient_bias=self_diagnosis | patient_bias=self_diagnosis | embedded | "
            "100.0 [100.0, 100.0] | 12 | GPT-4 93.9, Mixtral 90.0 (patient cognitive biases) |") in summary
    # paired differences: words, the shared cases, no p-value from 3 of them, one from 12
    assert ("| diagnostic accuracy (moderator) | embedded | embedded doctor_bias=recency | 3 (only in a: 9; only in b: 0) | "
            "0.333 [0.000, 1.000] | – (fewer than 10 shared cases) | – |") in summary  # case_0..2: right, wrong, wrong against three wrong
    assert "| diagnostic accuracy (moderator) | embedded | embedded patient_bias=self_diagnosis | 12 (only in a: 0; only in b: 0) | 0.000 [0.000, 0.000] | 1.0000 |" in summary
    assert "| patient check: no reply: a patient turn missing from the transcript (empty), not a patient behaviour | embedded | embedded patient_bias=self_diagnosis | 12 " in summary
    # the report over the same runs: the same settings columns and the same effects
    cli("report", *(str(tmp_path / x) for x in ("base", "doc", "pat")), "--out", str(tmp_path / "report.html"), check=True)
    html = (tmp_path / "report.html").read_text()
    assert "<thead><tr><th>run</th><th>doctor_bias</th><th>patient_bias</th></tr></thead>" in html
    assert ("<td>embedded doctor_bias=recency</td><td>doctor_bias=recency</td><td>embedded</td><td>0.0 [0.0, 0.0]</td><td>3</td>"
            "<td>GPT-4 95.7, Mixtral 74.2 (doctor cognitive biases)</td>") in html
    paired = json.loads((tmp_path / "cmp" / "paired.json").read_text())
    assert {(e["run"], e["ratio"], e["n_shared"]) for e in paired["effects"]} == {("embedded doctor_bias=recency", 0.0, 3),
                                                                               ("embedded patient_bias=self_diagnosis", 1.0, 12)}
