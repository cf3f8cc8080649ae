"""AgentClinic end to end through the real embedded vLLM server: the 3 fixture cases under the demo config.

Every agent is the embedded model on the real server. The demo holds the doctor's first reply to a question, its
second to a test request and its third to a diagnosis by their reply formats (``doctor_actions``, a demo deviation:
the small model, free, wrote no ``REQUEST TEST`` in any of the 3 cases), so the real patient, measurement agent and
moderator each answer.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e


def test_three_cases_through_the_real_server(cli, embedded_server, fixtures_dir, tmp_path):
    role = f"embedded@{embedded_server['base_url']}"
    out = tmp_path / "run"
    cli("run", "agentclinic", "--config", "experiments/studies/agentclinic/configs/embedded-demo.yaml", "--data",
        str(fixtures_dir / "agentclinic" / "cases.jsonl"), "--model", role, "--out", str(out), check=True)
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in recs) == ["case_0", "case_1", "case_2"] and all(r["status"] == "ok" for r in recs)
    for r in recs:
        roles = [t["role"] for t in r["transcript"]]
        assert roles == ["doctor", "patient", "doctor", "measurement", "doctor"], roles
        doctor = [c for c in r["calls"] if c["role"] == "doctor"]
        assert [c["constraint"]["applied"] for c in doctor] == [True] * 3 and all(c["texts"][0].strip() for c in doctor)  # the real doctor wrote them
        assert doctor[0]["texts"][0].strip().endswith("?") and "REQUEST TEST:" in doctor[1]["texts"][0]
        result = next(c for c in r["calls"] if c["role"] == "measurement")
        assert "REQUEST TEST:" in result["messages"][1]["content"] and result["texts"][0].strip()  # the real measurement agent answered
        assert r["transcript"][3]["text"] == " ".join(result["texts"][0].split())
        assert r["metadata"]["tests_requested"] == 1 and r["metadata"]["stop_reason"] == "diagnosis"
        g = r["scores"]["diagnosis"]  # the moderator scorer's grade: the real model's verdict, held to Yes / No
        assert {n for n in r["scores"] if not n.startswith("patient-check/")} == {"diagnosis"} and g["value"] in (0, 1)
        assert g["judge"]["model"] == role and g["judge"]["rule"] == "exact" and g["answer"].startswith("DIAGNOSIS READY:")
        moderator = [c for c in r["calls"] if c["role"] == "moderator"]
        assert len(moderator) == 1 and r["target"] in moderator[0]["messages"][1]["content"]
        assert g["value"] == int(" ".join(moderator[0]["texts"][0].split()).lower() == "yes")
        assert "Demographics" in r["inputs"]["facts"] and r["transcript"][1]["text"].strip()
    metrics = json.loads((out / "metrics.json").read_text())
    acc = next(f for f in metrics["scores"] if f["score"] == "diagnosis")
    assert acc["n"] == 3 and metrics["tests_requested"] == 3 and metrics["inferences"] == 6
    said = " ".join(metrics["deviations"])
    assert "doctor budget 6 inferences (authors: 20, their default)" in said and "the doctor's action per turn fixed to" in said
    summary = (out / "summary.md").read_text()
    assert "# AgentClinic run" in summary and "diagnostic accuracy (moderator)" in summary and "Diagnostic accuracy (moderator)" in summary
    assert "### patient-check" in summary and any(f["score"].startswith("patient-check/") for f in metrics["scores"])  # the real patient's turns, checked
