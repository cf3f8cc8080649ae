"""Report: flattening metrics, outcomes, escaping, robustness to odd records and bad input."""

from __future__ import annotations

import shutil

import pytest

from experiments.tools.report.build import build_report, case_view, metric_tables, outcome
from experiments.tools.report.collect import find_runs
from models.errors import MedstackError


def test_metric_tables_flatten_nested_metrics():
    tables = metric_tables({"accuracy": 0.5, "n": 4, "by_condition": {"a": {"acc": 0.5, "n": 2}, "b": {"acc": 1.0}},
                            "run": {"wall_seconds": 3.0, "usage_by_role": {"total": {"requests": 2}}}, "levels": [{"c": 1}, {"c": 2}]})
    by = {t["title"]: t for t in tables}
    assert by["overview"]["rows"] == [["accuracy", "0.5"], ["n", "4"]]
    assert by["by_condition"]["columns"] == ["", "acc", "n"] and by["by_condition"]["rows"][1] == ["b", "1", "-"]
    assert by["run"]["rows"] == [["wall_seconds", "3"]] and by["run.usage_by_role"]["rows"] == [["total", "2"]]
    assert by["levels"]["rows"] == [["1"], ["2"]]


def test_outcome_from_typed_scores_only():
    def rec(**scores):
        return {"scores": {k.replace("_at_", "@"): v if isinstance(v, dict) else {"value": v} for k, v in scores.items()}}

    cases = [(rec(frq=1, mcq=1), "correct"), (rec(frq=0), "incorrect"), (rec(frq=1, mcq=0), "mixed"), (rec(rubric=4), "rated"),
             (rec(nlu={"value": {"precision": 1, "recall": 0}}), "rated"), (rec(frq=None, frq_at_panel=1), "unscored"),
             (rec(frq={"value": 1, "skipped": True}), "unscored"), ({"correct": 1, "rating": 5}, "unscored"),
             ({**rec(frq=1), "error": "x"}, "failed"), ({"status": "failed"}, "failed")]
    assert [outcome(r) for r, _ in cases] == [o for _, o in cases]


def test_case_view_for_any_study():
    c = case_view({"id": 7, "transcript": [{"agent": "doctor", "content": "hi", "turn": 0}, {"role": "patient", "text": "ok"}],
                   "inputs": {"question": "Q?"}, "answer": {"intent": "x"}, "target": "y",
                   "metadata": {"extracted_diagnosis": "flu", "odd": [1, {"z": None}]}, "calls": [{"step": "ask", "messages": []}],
                   "scores": {"frq": {"value": 1, "answer": "flu", "judge": {"model": "m", "prompt_hash": "abc"}}}}, "m")
    assert c["id"] == "7" and c["model"] == "m" and [t["agent"] for t in c["turns"]] == ["doctor", "patient"]  # either spelling of a turn
    assert '"intent": "x"' in c["answer"] and c["target"] == "y" and c["outcome"] == "correct" and c["inputs"] == [["question", "Q?"]]
    assert c["scores"] == [["frq", "1", "m prompt abc", "flu"]]
    assert '"extracted_diagnosis": "flu"' in c["rest"] and '"odd"' in c["rest"] and "transcript" not in c["rest"] and "scores" not in c["rest"]
    assert c["n_calls"] == 1 and '"step": "ask"' in c["calls"]


def test_report_escapes_model_output(fixtures_dir, tmp_path):
    out = build_report([str(fixtures_dir / "report")], tmp_path / "r.html")
    html = out.read_text()
    assert "ZEBRA-PATIENT-LINE" in html and "QUOKKA-RESEARCHER-NOTE" in html
    assert '<script>document.body.setAttribute("data-pwned"' not in html and "<img src=x" not in html
    assert "&lt;script&gt;document.body.setAttribute(" in html
    assert html.count("<script>") == 1  # only our own inline script
    # the index: case-001 correct, case-002 incorrect (old records: their typed scores derived on reading), case-003 failed
    assert "<td>1</td><td>1</td><td>0</td><td>0</td><td>0</td><td>1</td><td>frq/multiturn 0.5; mcq/vignette 1</td>" in html
    assert "http://" not in html.replace("http://127.0.0.1:8011/v1", "") and "https://" not in html  # nothing fetched


def test_broken_records_become_a_warning_and_bad_paths_fail(fixtures_dir, tmp_path, cli):
    run = tmp_path / "runs" / "broken"
    shutil.copytree(fixtures_dir / "report" / "dera_run", run)
    with open(run / "records.jsonl", "a") as f:
        f.write("{not json\n")
    html = build_report([str(tmp_path / "runs")], tmp_path / "r.html").read_text()
    assert "records.jsonl:4" in html and "warning" in html
    with pytest.raises(MedstackError, match="no results directories"):
        find_runs([str(_empty(tmp_path))])
    p = cli("report", str(tmp_path / "missing"), "--out", str(tmp_path / "x.html"))
    assert p.returncode == 2 and "no such file" in p.stderr and "Traceback" not in p.stderr


def _empty(tmp_path):
    d = tmp_path / "empty" / "sub"
    d.mkdir(parents=True)
    return d.parent
