"""DERA data loading, bad input through the CLI, metrics and summary tables (no model calls)."""

from __future__ import annotations

import json

import pytest

from experiments.common.grade import to_disk
from experiments.studies.dera import report
from experiments.studies.dera.data import load_encounters, load_medqa
from experiments.studies.dera.qa_metrics import normalize_similarity
from experiments.studies.dera.settings import DialogueSettings, QASettings
from models.errors import DataError


def test_load_fixtures(fixtures_dir):
    encs = load_encounters(fixtures_dir / "dera" / "encounters.jsonl")
    assert [e["id"] for e in encs] == ["sample-001", "sample-002"] and encs[0]["chat"][0]["speaker"] == "doctor"
    med = load_encounters(fixtures_dir / "dera" / "meditod_dialogs.json")
    assert med[0]["id"] == "901" and len(med[0]["chat"]) == 4 and med[0]["chat"][1]["speaker"] == "patient"
    qs = load_medqa(fixtures_dir / "dera" / "medqa_open.jsonl", mcq=True)
    assert qs[0]["id"] == "medqa_open-00001" and qs[0]["answer_idx"] == "B"


@pytest.mark.parametrize("line,needle", [
    ('{"id": "a", "age": 3, "sex": "m", "chat": [{"speaker": "d", "text": "hi"}]}', "lacks chief_complaint"),
    ('{"id": "a", "age": 3, "sex": "m", "chief_complaint": "x", "chat": []}', "non-empty list"),
    ('{"id": "a", "age": 3, "sex": "m", "chief_complaint": "x", "chat": [{"speaker": "d"}]}', "chat turn 0"),
    ('{"id": "a", "age": 3,', "not valid JSON"),
])
def test_bad_encounters_name_file_and_line(tmp_path, line, needle):
    good = '{"id": "ok", "age": 3, "sex": "m", "chief_complaint": "x", "chat": [{"speaker": "d", "text": "hi"}]}'
    p = tmp_path / "enc.jsonl"
    p.write_text(good + "\n\n" + line + "\n")
    with pytest.raises(DataError) as e:
        load_encounters(p)
    assert f"{p}:3" in str(e.value) and needle in str(e.value)


def test_bad_medqa_names_line(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text(json.dumps({"question_open": "q?", "answer": "a"}) + "\n" + json.dumps({"question_open": "q?"}) + "\n")
    with pytest.raises(DataError, match=r"q.jsonl:2: question lacks answer"):
        load_medqa(p, mcq=False)
    with pytest.raises(DataError, match=r"q.jsonl:1: question lacks options, answer_idx"):
        load_medqa(p, mcq=True)


def test_cli_bad_input_exits_2(cli, tmp_path):
    p = tmp_path / "enc.jsonl"
    p.write_text('{"id": "a", "age": 3, "sex": "m", "chief_complaint": "x", "chat": []}\n')
    proc = cli("run", "dera-summarize", "--data", str(p), "--model", "embedded@http://127.0.0.1:9/v1", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and f"{p}:1" in proc.stderr and "Traceback" not in proc.stderr
    q = tmp_path / "q.jsonl"
    q.write_text("not json\n")
    proc = cli("run", "dera-qa", "--data", str(q), "--model", "embedded@http://127.0.0.1:9/v1", "--out", str(tmp_path / "o2"))
    assert proc.returncode == 2 and f"{q}:1" in proc.stderr
    proc = cli("run", "dera-corrupt", "--help")
    assert proc.returncode == 0 and "--level" in proc.stdout


def test_similarity_normalization():
    assert normalize_similarity([0.5, 3.0, -1.0, None]) == [0.5, 0.0, 0.0, None]
    assert normalize_similarity([100, 100.0]) == [1.0, 1.0]
    assert normalize_similarity([100, 0.5]) == [0.0, 0.5]


def _qa_record(i, o_bs, d_bs, o_ex, d_ex, o_sim, d_sim):
    return {"id": f"q{i}", "case_id": f"q{i}", "calls": [],
            "metadata": {"answer_changed": o_bs != d_bs, "turns": 1, "stop_reason": "turn_cap", "parse_attempts": 4, "parse_errors": [{}]},
            "scores": {f"{step}/{arm}": {"value": v} for arm, vals in (("oneshot", (o_bs, o_ex, o_sim)), ("dera", (d_bs, d_ex, d_sim)))
                       for step, v in zip(("bertscore", "llm-exact", "llm-similarity"), vals)}}


def test_qa_metrics_and_table():
    recs = [_qa_record(1, 0.5, 0.7, 0, 1, 0.2, 0.9), _qa_record(2, 0.6, 0.6, 1, None, 7, 0.5), {"id": "q3", "error": "boom"}]
    m = report.qa_metrics(recs, QASettings())
    assert m["n_cases"] == 3 and m["case_errors"] == 1 and m["parse_error_rate"] == 0.25
    assert m["arms"]["oneshot"]["bertscore"]["mean"] == pytest.approx(0.55)
    assert m["arms"]["dera"]["exact"]["mean"] == 1.0 and m["arms"]["dera"]["exact"]["unscored"] == 1
    assert m["arms"]["oneshot"]["similarity"]["mean"] == pytest.approx(0.1)  # 7 -> 0
    assert m["dera_minus_oneshot"]["bertscore"]["mean_diff"] == pytest.approx(0.1)
    assert m["dera_minus_oneshot"]["exact"]["n"] == 1
    table = report.qa_summary(m, QASettings(), "dera-qa")
    assert "| 1-shot | 0.550" in table and "| DERA | 0.650" in table and "DERA − 1-shot" in table


def test_corruption_table():
    s = DialogueSettings(task="corrupt", corruption_level=7)

    def sec(f1):
        return {"scored": True, "precision": f1, "recall": f1, "f1": f1}

    from experiments.studies.dera.scorers import gptf1_grades

    gptf1 = {"initial": {"sections": {x: sec(0.5) for x in s.score_sections}, "average": {"f1": 0.5}},
             "dera": {"sections": {x: sec(1.0) for x in s.score_sections}, "average": {"f1": 1.0}}}
    rec = {"id": "e", "case_id": "e", "calls": [], "metadata": {"turns": 3, "stop_reason": "researcher_stop", "scratchpad": ["x"],
                                                                "parse_attempts": 1, "parse_errors": []},
           "scores": to_disk({f"gptf1/{n}": g for arm, v in gptf1.items() for n, g in gptf1_grades(arm, v, {"model": "judge"}).items()})}
    m = report.dialogue_metrics([rec], s)
    assert m["gptf1"]["initial"]["average"]["f1"] == 0.5 and m["gptf1"]["dera"]["average"]["f1"] == 1.0
    text = report.dialogue_summary(m, s, "dera-corrupt")
    assert "corruption level 7/10" in text and "| 7 | **Average** | 0.500" in text

