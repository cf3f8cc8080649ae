"""`medstack import craftmd-experts`: the authors' expert labels read, combined and summarised.

Fixture tests/fixtures/craftmd/experts/ (the release's layout, written by make_fixture.py there): two sheets
(GPT-4, GPT-3.5), four cases each. Rater d1 labelled case_1-3, d2 case_2-4 (case_2 and case_3 by both),
d3 answers only where d1 and d2 disagree. Labels (Q1, Q2, Q3), worked by hand:

GPT-4     d1            d2            d3        combined
case_1    Y Y N         -             -         Y Y N
case_2    Y N N         Y Y N         . Y .     Y Y N   (Q2 disagree -> d3 Y)
case_3    N N Y         N N Y         -         N N Y
case_4    -             Y Y N         -         Y Y N
          -> Q1 3/4 = 75 %, Q2 3/4 = 75 %, Q3 1/4 = 25 %
GPT-3.5
case_1    N N N         -             -         N N N
case_2    N Y N         "yes " Y N    N . .     N Y N   (Q1 disagree -> d3 N)
case_3    N N N         N N Y         . . N     N N N   (Q3 disagree -> d3 N)
case_4    -             Y N N         -         Y N N
          -> Q1 1/4 = 25 %, Q2 1/4 = 25 %, Q3 0/4 = 0 %; Q3 overall 1/8 = 12.5 %

McNemar GPT-4 vs GPT-3.5, paired by case: Q1 (Y,N) (Y,N) (N,N) (Y,Y): 2 discordant, both GPT-4 yes
-> exact two-sided p = 2 * 0.5^2 = 0.5; Q2 (Y,N) (Y,Y) (N,N) (Y,N): the same, p = 0.5.
Agreement of d1 and d2 on the dual-labelled cases: GPT-4 Q1 2/2, Q2 1/2, Q3 2/2; GPT-3.5 Q1 1/2, Q2 2/2,
Q3 1/2; three disagreements, all broken by d3.
"""

from __future__ import annotations

import json
import shutil

import pytest

from experiments.common.stats import mcnemar_test
from experiments.studies.craftmd.experts import (combine, expert_metrics, import_experts, load_expert_labels, truncate)
from models.errors import DataError
from tests.conftest import FIXTURES, run_cli

EXPERTS = FIXTURES / "craftmd" / "experts"


def by_id(convs):
    return {c.id: c for c in convs}


def test_labels_are_combined_as_the_authors_did():
    convs = by_id(load_expert_labels(EXPERTS))
    assert len(convs) == 8
    assert convs["gpt-4/case_2"].combined == {"Q1": True, "Q2": True, "Q3": False}
    assert convs["gpt-3.5/case_2"].combined == {"Q1": False, "Q2": True, "Q3": False}
    assert convs["gpt-3.5/case_3"].combined == {"Q1": False, "Q2": False, "Q3": False}
    assert convs["gpt-4/case_4"].raters.keys() == {"d2"} and not convs["gpt-4/case_4"].dual
    assert convs["gpt-4/case_3"].dual
    # without the tie-breaker a disagreement stays unlabelled (never guessed)
    assert combine({"d1": {"Q1": True}, "d2": {"Q1": False}})["Q1"] is None


def test_conversation_text_becomes_a_transcript():
    t = by_id(load_expert_labels(EXPERTS))["gpt-4/case_1"].transcript
    assert [x["role"] for x in t] == ["doctor", "patient", "doctor", "patient", "doctor"]
    assert t[1]["text"] == "I have itchy flaky patches on my elbows."
    assert t[-1] == {"role": "doctor", "text": "**Final Diagnosis:** Psoriasis", "turn": 2}


def test_figures_worked_by_hand():
    m = expert_metrics(load_expert_labels(EXPERTS), n_boot=200)
    assert [m["rates"]["gpt-4"][q]["pct"] for q in ("Q1", "Q2", "Q3")] == [75.0, 75.0, 25.0]
    assert [m["rates"]["gpt-3.5"][q]["pct"] for q in ("Q1", "Q2", "Q3")] == [25.0, 25.0, 0.0]
    assert m["overall"]["Q3"]["pct"] == 12.5 and m["overall"]["Q3"]["n"] == 8
    for q in ("Q1", "Q2"):
        t = m["mcnemar_exact"][f"{q}|gpt-4|gpt-3.5"]
        assert t["n_pairs"] == 4 and t["table"][0][1] == 2 and t["table"][1][0] == 0
        assert t["p_value"] == pytest.approx(0.5)
    got = {(a["model"], a["question"]): (a["agree"], a["n"]) for a in m["agreement"].values()}
    assert got == {("gpt-4", "Q1"): (2, 2), ("gpt-4", "Q2"): (1, 2), ("gpt-4", "Q3"): (2, 2),
                   ("gpt-3.5", "Q1"): (1, 2), ("gpt-3.5", "Q2"): (2, 2), ("gpt-3.5", "Q3"): (1, 2)}
    assert sum(a["tie_broken"] for a in m["agreement"].values()) == 3


def test_exact_mcnemar_gives_the_published_supplementary_p_values():
    # the paper's Q1 pairs: GPT-4 vs GPT-3.5 has 12 vs 2 discordant cases, GPT-3.5 vs LLaMA-2 7 vs 5
    # (counts from the release); the exact binomial test gives Supplementary Table 18's 0.0129 and 0.7744
    a = [1] * 12 + [0] * 2 + [1] * 19 + [0] * 12
    b = [0] * 12 + [1] * 2 + [1] * 19 + [0] * 12
    assert truncate(mcnemar_test(a, b, exact=True)["p_value"]) == "0.0129"
    a = [1] * 7 + [0] * 5 + [0] * 33
    b = [0] * 7 + [1] * 5 + [0] * 33
    assert truncate(mcnemar_test(a, b, exact=True)["p_value"]) == "0.7744"
    # 28 discordant pairs: the automatic choice would use chi-square; exact=True must not
    a, b = [0] * 28, [1] * 28
    assert mcnemar_test(a, b, exact=True)["exact"] and not mcnemar_test(a, b)["exact"]
    assert truncate(0.999999) == "0.9999" and truncate(0.00012) == "0.0001" and truncate(0.00004) == "< 0.0001"
    assert truncate(0.0001) == "0.0001"


def test_import_writes_records_metrics_and_a_summary_beside_published_values(tmp_path):
    out = tmp_path / "experts"
    m = import_experts(EXPERTS, out, n_boot=200)
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 8 and recs[0]["transcript"] and [recs[0]["scores"][f"assess-{q}@experts"]["value"] for q in ("Q1", "Q2", "Q3")] == [1, 1, 0]
    assert json.loads((out / "metrics.json").read_text())["rates"]["gpt-4"]["Q1"]["pct"] == 75.0
    s = (out / "summary.md").read_text()
    assert "| GPT-4 | 75.00 [" in s and "| 53.33 |" in s            # ours beside the paper's Fig. 3i value
    assert "| all 8 | 12.50 [" in s and "| 7.22 |" in s
    assert "| Q1 | GPT-4 | GPT-3.5 | 4 | 2 | 0 | 0.5000 | 0.0129 |" in s
    assert "| GPT-3.5 | 1/2 | 2/2 | 1/2 |" in s
    # the column holds the released labels recomputed (no model's output); a pair the sources lack says so
    assert "| model | released labels, recomputed: % yes [95% CI] (yes/n) | published % |" in s and "| GPT-4 | not in our sources |" not in s
    assert "| Q2 | GPT-4 | GPT-3.5 | 4 |" in s and "| 0.0001 |" in s and s.count("| not in our sources |") >= 2
    assert m["conversations"] == 8
    # a second import into the same folder resumes: no record twice
    import_experts(EXPERTS, out, n_boot=200)
    assert len((out / "records.jsonl").read_text().splitlines()) == 8


def test_bad_workbooks_are_one_line_errors(tmp_path):
    with pytest.raises(DataError, match="missing validation_clinicallm_patientai_tiebreak_d3.xlsx"):
        bad = tmp_path / "missing"
        shutil.copytree(EXPERTS, bad)
        (bad / "validation_clinicallm_patientai_tiebreak_d3.xlsx").unlink()
        load_expert_labels(bad)
    torn = tmp_path / "torn"
    shutil.copytree(EXPERTS, torn)
    (torn / "validation_clinicalllm_patientai_d1.xlsx").write_bytes(b"PK\x03\x04 not really a workbook")
    with pytest.raises(DataError, match=r"d1\.xlsx: not a readable \.xlsx"):
        load_expert_labels(torn)


def test_a_cell_that_is_not_yes_or_no_names_file_sheet_row(tmp_path):
    import openpyxl

    bad = tmp_path / "bad"
    shutil.copytree(EXPERTS, bad)
    wb = openpyxl.load_workbook(bad / "validation_clinicalllm_patientai_d2.xlsx")
    wb["GPT-3.5"]["H8"] = "maybe"
    wb.save(bad / "validation_clinicalllm_patientai_d2.xlsx")
    with pytest.raises(DataError, match=r"d2\.xlsx \[GPT-3\.5\] row 8, Q2: expected yes, no or blank, found 'maybe'"):
        load_expert_labels(bad)


def test_cli_import_and_its_error_exit(tmp_path):
    ok = run_cli("import", "craftmd-experts", str(EXPERTS), "--out", str(tmp_path / "o"))
    assert ok.returncode == 0, ok.stderr
    assert "Supplementary Table 18" in ok.stdout and (tmp_path / "o" / "summary.md").is_file()
    bad = run_cli("import", "craftmd-experts", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o2"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "nowhere" in bad.stderr and "craftmd-expert-labels" in bad.stderr
