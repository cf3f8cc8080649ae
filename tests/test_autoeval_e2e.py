"""`medstack autoeval` end to end against the real embedded server: one dialogue, one criterion, tiny max_tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIX = Path(__file__).parent / "fixtures" / "autoeval"


@pytest.mark.e2e
def test_autoeval_one_dialogue_real_judge(cli, embedded_server, tmp_path):
    out = tmp_path / "ae"
    args = ["autoeval", str(FIX / "results"), "--criteria", "empathy", "--limit", "1", "--max-tokens", "24",
            "--judge-model", f"embedded@{embedded_server['base_url']}", "--out", str(out),
            "--reference", str(FIX / "reference.csv")]
    proc = cli(*args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 1
    r = recs[0]
    assert r["id"] == "case-001/trial-0::empathy" and r["status"] == "ok" and r["usage"]["total"]["completion_tokens"] > 0
    assert r["case_id"] == "case-001" and r["target"] == 4.0 and r["transcript"][0]["role"] == "doctor"  # the typed record
    assert [c["step"] for c in r["calls"]] == ["rate"]  # step (a) was the run's set-up
    g = r["scores"]["rubric/empathy"]
    assert g["explanation"] and g["judge"]["model"].startswith("embedded") and "rating" not in r
    # a 270M base model may or may not produce a rating: either a whole 1..5, or unscored with a reason
    assert (g["value"] in (1, 2, 3, 4, 5) and "parse_error" not in g.get("metadata", {})) or (g["value"] is None and g["metadata"]["parse_error"])
    m = json.loads((out / "metrics.json").read_text())
    f = next(f for f in m["scores"] if f["score"] == "rubric/empathy")
    assert f["values"] + f["unscored"] == 1 and m["examples"]["explained"] == 5 and m["examples"]["request_errors"] == 0
    assert m["run"]["completion_tokens"] > 0 and m["agreement"]["empathy"]["reference_unmatched"] == 2
    assert len((out / "explained_examples.jsonl").read_text().splitlines()) == 5
    assert "Showing Empathy" in proc.stdout

    # the same command resumes: no new rating, explanations read back from the output directory
    proc = cli(*args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m2 = json.loads((out / "metrics.json").read_text())
    assert m2["run"]["cases_run"] == 0 and m2["run"]["cases_resumed"] == 1 and m2["examples"]["from_cache_file"] == 5

    # the rubric scorer asked again by the same real model (`rescore`): step (a) and step (b) in the record's call log
    proc = cli("rescore", str(out), "--judge", "rubric", "--judge-model", f"embedded@{embedded_server['base_url']}",
               "--out", str(tmp_path / "re"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (again,) = [json.loads(line) for line in (tmp_path / "re" / "records.jsonl").read_text().splitlines()]
    assert [c["step"] for c in again["calls"]] == ["explain"] * 5 + ["rate"] and "rubric/empathy@embedded" in again["scores"]
