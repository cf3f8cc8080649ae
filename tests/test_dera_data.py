"""DERA data loading, bad input through the CLI, metrics and summary tables (no model calls)."""

from __future__ import annotations

import json

import pytest

from experiments.common.grade import to_disk
from experiments.core.scorers import figure_cell, figures
from experiments.studies.dera import report
from experiments.studies.dera.data import load_encounters, load_medqa
from experiments.studies.dera.qa_metrics import normalize_similarity
from experiments.studies.dera.scorers import GPTF1, QA
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


def with_scores(metrics: dict, records: list[dict], scorers) -> dict:
    """The study's metrics with the scores' figures, as the runner adds them (experiments/core/runner.py)."""
    return {**metrics, "scores": [f.json() for f in figures([r for r in records if "error" not in r], scorers)]}


def test_qa_metrics_and_table():
    recs = [_qa_record(1, 0.5, 0.7, 0, 1, 0.2, 0.9), _qa_record(2, 0.6, 0.6, 1, None, 7, 0.5), {"id": "q3", "error": "boom"}]
    m = with_scores(report.qa_metrics(recs, QASettings()), recs, QA)
    assert m["n_cases"] == 3 and m["case_errors"] == 1 and m["parse_error_rate"] == 0.25
    assert "arms" not in m  # the scores' figures are the runner's, not the study's
    fig = {f["score"]: f for f in m["scores"]}
    assert fig["bertscore/oneshot"]["value"] == pytest.approx(0.55)
    assert fig["llm-exact/dera"]["value"] == 1.0 and fig["llm-exact/dera"]["unscored"] == 1
    assert fig["llm-similarity/oneshot"]["value"] == pytest.approx(0.1)  # 7 -> 0, by the similarity's scale
    assert m["dera_minus_oneshot"]["bertscore"]["mean_diff"] == pytest.approx(0.1)
    assert m["dera_minus_oneshot"]["exact"]["n"] == 1
    assert m["dera_minus_oneshot"]["similarity"]["mean_diff"] == pytest.approx((0.9 - 0.2 + 0.5 - 0.0) / 2)  # normalised, paired
    table = report.qa_summary(m, QASettings(), "dera-qa")
    assert f"| 1-shot | {figure_cell(fig['bertscore/oneshot'])} |" in table and "| DERA | 0.650 [" in table and "DERA − 1-shot" in table
    assert figure_cell(fig["llm-exact/dera"]) in table and "1 unscored" in figure_cell(fig["llm-exact/dera"])


def _dialogue_record(i, arms: dict) -> dict:
    """A corruption study's record: ``arms`` = {arm: {section: f1 or None (unscored)}}, their grades as the gptf1 scorer gives them."""
    from experiments.studies.dera.scorers import gptf1_grades

    def arm(sections):
        scored = [f for f in sections.values() if f is not None]
        return {"sections": {x: {"scored": f is not None, "precision": f, "recall": f, "f1": f} for x, f in sections.items()},
                "average": {m: sum(scored) / len(scored) if scored else None for m in ("precision", "recall", "f1")}}

    return {"id": f"e{i}", "case_id": f"e{i}", "calls": [], "metadata": {"turns": 3, "stop_reason": "researcher_stop", "scratchpad": ["x"],
                                                                         "parse_attempts": 1, "parse_errors": []},
            "scores": to_disk({f"gptf1/{n}": g for a, v in arms.items() for n, g in gptf1_grades(a, arm(v), {"model": "judge"}).items()})}


def test_corruption_table():
    s = DialogueSettings(task="corrupt", corruption_level=7)
    rec = _dialogue_record(1, {"initial": dict.fromkeys(s.score_sections, 0.5), "dera": dict.fromkeys(s.score_sections, 1.0)})
    m = with_scores(report.dialogue_metrics([rec], s), [rec], (GPTF1,))
    assert "gptf1" not in m and m["dera_minus_initial_f1"]["mean_diff"] == 0.5
    text = report.dialogue_summary(m, s, "dera-corrupt")
    assert "corruption level 7/10" in text and "| 7 | **Average** | 0.500 | 0.500 | 0.500 [0.500, 0.500] (n=1) | 1.000 |" in text


def test_gptf1_average_is_each_encounters_mean_over_its_scored_sections():
    """Hand-worked: e1 scores A 1.0 and B not at all (average 1.0), e2 A 0.0 and B 0.5 (average 0.25). The average row
    is the mean of the encounters' averages, 0.625 (resampled by encounter), not the mean of the section means (0.5)."""
    s = DialogueSettings(task="corrupt", corruption_level=5, score_sections=["A", "B"])
    recs = [_dialogue_record(1, {"initial": {"A": 1.0, "B": None}, "dera": {"A": 1.0, "B": None}}),
            _dialogue_record(2, {"initial": {"A": 0.0, "B": 0.5}, "dera": {"A": 0.0, "B": 0.5}})]
    m = with_scores(report.dialogue_metrics(recs, s), recs, (GPTF1,))
    fig = {f["score"]: f for f in m["scores"]}
    assert fig["gptf1/dera[f1]"]["value"] == pytest.approx(0.625) and fig["gptf1/dera[f1]"]["n"] == 2
    assert (fig["gptf1/dera/A[f1]"]["value"], fig["gptf1/dera/B[f1]"]["value"]) == (0.5, 0.5) and fig["gptf1/dera/B[f1]"]["unscored"] == 1
    assert "gptf1/dera/B" not in fig  # e1's unscored B is counted by B's P, R and F1 figures, not a row of its own
    text = report.dialogue_summary(m, s, "dera-corrupt")
    assert f"| **Average** | 0.625 | 0.625 | {figure_cell(fig['gptf1/initial[f1]'])} |" in text
    assert "| B | 0.500 | 0.500 | 0.500 [0.500, 0.500] (n=1; 1 unscored) |" in text
