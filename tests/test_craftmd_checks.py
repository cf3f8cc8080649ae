"""The two claims checked against the authors' release, under test on fixtures (the authors' code is not needed):

- ``check_split``: our question split (experiments/studies/craftmd/data.py) against a release folder, on a case file with
  one line per quirk of the authors' rule (docs/protocols.md, CRAFT-MD); the release files hold what their
  splitter returns for each line, and one that differs on purpose.
- ``check_requests``' comparison: the request shapes of one trial on each side, with the scripted doctor of
  check_requests, also one that never stops asking so the turn cap ends the conversation; our side through the
  real client (tests/scripted.py). A stand-in for the authors' loops records what it is asked as theirs does; its
  differences from ours (a turn cap one lower, another max_tokens, a stop sequence, the specialty left out) are found.
"""

from __future__ import annotations

import asyncio
import csv
import json
import shutil
import types
from pathlib import Path

import pytest

from experiments.core.config import load_settings
from experiments.core.study import CaseContext
from experiments.studies.craftmd import check_requests, check_split
from experiments.studies.craftmd.data import DEFAULT_QUESTION, load_csv
from experiments.studies.craftmd.protocol import solve
from experiments.studies.craftmd.settings import CraftSettings
from serving.client import ChatResult
from tests.scripted import ScriptedLLM

FX = Path(__file__).parent / "fixtures" / "craftmd"
SPLIT = FX / "split"


def test_our_split_follows_each_quirk_of_the_authors_rule():
    c = {x["case_id"]: x for x in load_csv(SPLIT / "cases.csv")}
    assert c["case_1"]["question"] == "Is it bad?"  # the FIRST sentence holding "?", not the closing one
    assert c["case_1"]["vignette"].endswith("Which of the following is the most likely diagnosis?")
    assert c["case_2"]["question"] == "Which is the most likely diagnosis?" and "what now?" in c["case_2"]["vignette"]  # last line only
    assert (c["case_3"]["question"], c["case_3"]["question_source"]) == (DEFAULT_QUESTION, "default")
    assert c["case_4"]["question"] == DEFAULT_QUESTION and c["case_4"]["vignette"].endswith("most likely diagnosis?")  # empty last line
    assert (c["case_5"]["vignette"], c["case_5"]["question"]) == ("The mother asks again:", "Is it contagious?")  # every occurrence
    assert (c["case_6"]["vignette"], c["case_6"]["question"]) == ("He has a mole.", 'She says "Is this cancer?"')
    assert (c["case_7"]["vignette"], c["case_7"]["question"]) == ("A rash.", "[Figure] Which is shown?")
    assert (c["case_8"]["vignette"], c["case_8"]["question"]) == ("Since 3 days. 2", ": which is likely?")
    assert c["case_9"]["question"] == "What happened?!?"


def test_check_split_reports_each_difference_and_the_counts(tmp_path, capsys):
    assert check_split.main([str(SPLIT / "cases.csv"), str(SPLIT / "release")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == ["case_10: question differs",
                   "checked 10 case(s) (1 without a release file): 1 question(s) and 0 vignette(s) differ"]
    release = tmp_path / "release"
    shutil.copytree(SPLIT / "release", release)
    (release / "case_10.json").unlink()
    theirs = json.loads((release / "case_9.json").read_text())
    (release / "case_9.json").write_text(json.dumps({**theirs, "case_vignette": theirs["case_vignette"] + " More."}))
    assert check_split.main([str(SPLIT / "cases.csv"), str(release)]) == 1
    assert capsys.readouterr().out.splitlines() == ["case_9: vignette differs",
                                                    "checked 9 case(s) (2 without a release file): 0 question(s) and 1 vignette(s) differ"]
    (release / "case_9.json").write_text(json.dumps(theirs))
    assert check_split.main([str(SPLIT / "cases.csv"), str(release)]) == 0  # the nine quirks: none differs


def test_check_split_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert check_split.main([str(SPLIT / "cases.csv"), str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip().endswith("not a folder (unpack the release archive first)")
    bad = tmp_path / "bad.csv"
    bad.write_text("case_vignette,answer\nx,y\n")
    assert check_split.main([str(bad), str(SPLIT / "release")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing column(s)" in err


# -- check_requests' comparison ------------------------------------------------------------------------------------

CASES_CSV = FX / "requests_cases.csv"
ROWS = {r["case_id"]: r for r in csv.DictReader(CASES_CSV.open(newline="", encoding="utf-8"))}
CASES = {c["case_id"]: c for c in load_csv(CASES_CSV)}


def stand_in(specialty: str | None = None, **changes) -> types.SimpleNamespace:
    """The authors' two loops as check_requests drives them (``craftmd_opensource(case, dir, model, tokenizer,
    num_runs)``, ``craftmd_gpt(case, dir, name, num_runs)``), played by our protocol with ``changes`` to paper.yaml
    (and the case's ``specialty`` replaced); every request goes to check_requests' recorder as (agent, messages, max_tokens)."""

    class Recorded:
        async def chat(self, messages, role="default", gen=None):
            text = "Diagnosis: Gout" if role == "grader" else check_requests.Recorder.call(role, messages, gen.max_tokens)
            return ChatResult(texts=[text], prompt_tokens=1, completion_tokens=1)

        async def complete(self, prompt, role="default", gen=None):
            raise AssertionError("the authors send no text completion")

    def run(case, out_dir, *rest, num_runs=5, loop):
        s = load_settings(CraftSettings, check_requests.CONFIG, {"trials": 1, "loop": loop, **changes})
        c = {**CASES[case[0]], **({"specialty": specialty} if specialty else {})}
        for t in range(num_runs):
            ctx = CaseContext(Recorded(), f"{c['case_id']}/t{t}")
            asyncio.run(solve(ctx, {"id": f"{c['case_id']}/t{t}", "case": c, "trial": t}, s))

    return types.SimpleNamespace(craftmd_opensource=lambda *a, num_runs=5: run(*a, num_runs=num_runs, loop="opensource"),
                                 craftmd_gpt=lambda *a, num_runs=5: run(*a, num_runs=num_runs, loop="gpt"))


def compare(theirs, case_id: str, loop: str, tmp_path: Path, questions: int | None) -> tuple[list[str], ScriptedLLM]:
    """check_requests' comparison of one case; our side through the real client with the same scripted replies."""
    script = check_requests.Script(questions)
    client = ScriptedLLM(lambda role, content, gen: "Verdict: yes" if role == "grader" else script.reply(role, content),
                         roles=("clinical", "patient", "summarizer", "grader"))
    diffs = check_requests.compare_case(theirs, ROWS[case_id], CASES[case_id], loop, tmp_path, questions, client=client)
    return diffs, client


@pytest.mark.parametrize("case_id", sorted(ROWS))
def test_the_same_requests_compare_equal_also_at_the_turn_cap(case_id, tmp_path):
    for loop, questions in (("opensource", 1), ("opensource", None), ("gpt", 1)):
        diffs, client = compare(stand_in(), case_id, loop, tmp_path, questions)
        assert diffs == [], (loop, questions)
        doctor_turns = [c for role, c in client.sent if role == "clinical" and c[-1]["role"] == "user" and "No more questions" not in c[-1]["content"]
                        and len(c) > 1]
        assert len(doctor_turns) == (14 if questions is None else 2)  # the scripted doctor reaches the cap: 14 doctor turns
    assert check_requests.Recorder.log  # the stand-in's requests went through the recorder


def test_each_difference_from_the_authors_requests_is_found(tmp_path):
    cap = compare(stand_in(max_turns=13), "case_s", "opensource", tmp_path, None)[0]
    assert cap == ["request structure", "max_tokens per role"]  # one doctor turn (and one patient turn) fewer at the cap
    assert compare(stand_in(max_turns=13), "case_s", "opensource", tmp_path, 1)[0] == []  # a doctor that concludes never meets it
    tokens = compare(stand_in(sampling={"patient": {"max_tokens": 100}}), "case_q", "opensource", tmp_path, 1)[0]
    assert tokens == ["max_tokens per role"]
    no_specialty = compare(stand_in(specialty="Other"), "case_s", "opensource", tmp_path, 1)[0]
    assert no_specialty == ["request structure"]  # the Dermatology case asked without its specialty


def test_stop_sequences_on_our_side_are_a_difference(tmp_path, monkeypatch):
    real = check_requests.load_settings
    monkeypatch.setattr(check_requests, "load_settings", lambda cls, path, over: real(cls, path, {**over, "turn_stops": True}))
    assert compare(stand_in(), "case_q", "opensource", tmp_path, 1)[0] == ["stop sequences"]
