"""AgentClinic end to end through the real embedded vLLM server: the 3 fixture cases under the demo config.

The patient, the measurement agent and the moderator are the embedded model on the real server. The doctor is a
scripted OpenAI-shaped endpoint (a question, then a test request, then a diagnosis), because the small embedded
model, as the doctor, wrote no ``REQUEST TEST`` in any of the 3 cases when tried, and the test must see one answered.
"""

from __future__ import annotations

import json
import pytest

from tests.scripted import ChatStub, serve_stub

pytestmark = pytest.mark.e2e


QUESTION = "What brings you in today?"


class _Doctor(ChatStub):
    """The doctor: a question first, a test request once it has an answer, a diagnosis once it has a result."""

    def answer(self, body: dict) -> str:
        user = body["messages"][-1]["content"]
        return "DIAGNOSIS READY: pneumonia" if "REQUEST TEST" in user else "REQUEST TEST: Chest_X-Ray" if QUESTION in user else QUESTION


def test_three_cases_through_the_real_server(cli, embedded_server, fixtures_dir, tmp_path):
    role = f"embedded@{embedded_server['base_url']}"
    doctor = serve_stub(_Doctor)
    out = tmp_path / "run"
    try:
        cli("run", "agentclinic", "--config", "experiments/studies/agentclinic/configs/embedded-demo.yaml", "--data",
            str(fixtures_dir / "agentclinic" / "cases.jsonl"), "--model", role, "--doctor-model",
            f"embedded@http://127.0.0.1:{doctor.server_address[1]}/v1", "--out", str(out), check=True)
    finally:
        doctor.shutdown()
    recs = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in recs) == ["case_0", "case_1", "case_2"] and all(r["status"] == "ok" for r in recs)
    for r in recs:
        agents = [t["role"] for t in r["transcript"]]
        assert agents == ["doctor", "patient", "doctor", "measurement", "doctor"], agents
        result = next(c for c in r["calls"] if c["role"] == "measurement")
        assert "REQUEST TEST: Chest_X-Ray" in result["messages"][1]["content"] and result["texts"][0].strip()  # the real model answered
        assert r["transcript"][3]["text"] == " ".join(result["texts"][0].split())
        assert r["metadata"]["tests_requested"] == 1 and r["metadata"]["stop_reason"] == "diagnosis"
        g = r["scores"]["diagnosis"]  # the moderator scorer's grade, run by the runner after the loop; the moderator is the real model
        assert {n for n in r["scores"] if not n.startswith("patient-check/")} == {"diagnosis"} and g["value"] in (0, 1)
        assert g["judge"]["model"] == role and g["judge"]["rule"] == "exact" and g["answer"] == "DIAGNOSIS READY: pneumonia"
        moderator = [c for c in r["calls"] if c["role"] == "moderator"]
        assert len(moderator) == 1 and r["target"] in moderator[0]["messages"][1]["content"]
        assert g["value"] == int(" ".join(moderator[0]["texts"][0].split()).lower() == "yes")
        assert "Demographics" in r["inputs"]["facts"] and r["transcript"][1]["text"].strip()
    metrics = json.loads((out / "metrics.json").read_text())
    acc = next(f for f in metrics["scores"] if f["score"] == "diagnosis")
    assert acc["n"] == 3 and metrics["tests_requested"] == 3 and metrics["inferences"] == 6
    assert "doctor budget 6 inferences (authors: 20, their default)" in metrics["deviations"]
    summary = (out / "summary.md").read_text()
    assert "# AgentClinic run" in summary and "diagnostic accuracy (moderator)" in summary and "Diagnostic accuracy (moderator)" in summary
    assert "### patient-check" in summary and any(f["score"].startswith("patient-check/") for f in metrics["scores"])  # the real patient's turns, checked
