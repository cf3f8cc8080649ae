"""DERA end to end against the real embedded vLLM server: tiny limits and small max_tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from experiments.core.scorers import figure_cell

CONFIGS = Path(__file__).resolve().parent.parent / "experiments" / "studies" / "dera" / "configs"


def small_config(tmp_path: Path, name: str, **changes) -> Path:
    cfg = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    p = tmp_path / f"{name}-small.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


@pytest.mark.e2e
def test_summarize_one_case(cli, embedded_server, fixtures_dir, tmp_path):
    model = f"embedded@{embedded_server['base_url']}"
    cfg = small_config(tmp_path, "summarize", max_turns=2, sampling={"max_tokens": 48},
                       score_sections=["Pertinent Positives"],
                       gptf1={"extraction": {"temperature": 0.0, "max_tokens": 24}, "verification": {"temperature": 0.0, "max_tokens": 12}})
    out = tmp_path / "sum"
    proc = cli("run", "dera-summarize", "--data", str(fixtures_dir / "dera" / "encounters.jsonl"), "--limit", "1",
               "--model", model, "--out", str(out), "--config", str(cfg), check=True)
    assert "GPT-F1" in proc.stdout
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 1 and recs[0]["status"] == "ok" and "error" not in recs[0]
    r = recs[0]
    meta = r["metadata"]
    assert meta["model"] == "embedded" and 1 <= meta["turns"] <= 2 and meta["stop_reason"] in ("researcher_stop", "turn_cap")
    assert r["transcript"][0]["role"] == "researcher" and all(m["role"] in ("researcher", "decider") for m in r["transcript"])
    assert set(r["answer"]["dera"]) == set(r["answer"]["initial"]) and r["calls"][0]["completion_tokens"] > 0
    # the runner's call log, with DERA's template per call; step names unique within the case; the judge after solve
    assert r["calls"][0]["step"] == "decider:initial" and r["calls"][0]["template"] == "summarize_decider_initial"
    assert len({c["step"] for c in r["calls"]}) == len(r["calls"]) and r["usage"]["total"]["calls"] == len(r["calls"])
    assert all(c["gen"]["seed"] is not None for c in r["calls"] if c["gen"]["temperature"] > 0)
    roles = [c["role"] for c in r["calls"]]
    assert "judge" not in roles or set(roles[roles.index("judge"):]) == {"judge"}
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_cases"] == 1 and "parse_error_rate" in metrics and metrics["run"]["completion_tokens"] > 0
    assert metrics["case_status"] == {"total": 1, "finished": 1, "failed": 0, "not_started": 0}
    assert any(f["score"].startswith("gptf1/dera_vs_initial/Pertinent Positives") for f in metrics["scores"])
    assert (out / "summary.md").exists() and (out / "identity.json").exists()
    if "log" in embedded_server:  # the KV cache the server logged at start, what `concurrency: auto` is bounded by
        models = json.loads((out / "identity.json").read_text())["models"]
        assert all(m["kv_cache_tokens"] > 2048 for m in models.values()), models


@pytest.mark.e2e
def test_qa_one_case_and_resume(cli, embedded_server, fixtures_dir, tmp_path):
    model = f"embedded@{embedded_server['base_url']}"
    cfg = small_config(tmp_path, "qa", answer={"max_tokens": 12}, explain={"max_tokens": 24}, dialogue={"max_tokens": 24},
                       max_turns=1, final={"max_tokens": 12}, judge_exact={"max_tokens": 8}, judge_similarity={"max_tokens": 6})
    out = tmp_path / "qa"
    args = ["run", "dera-qa", "--data", str(fixtures_dir / "dera" / "medqa_open.jsonl"), "--model", model,
            "--out", str(out), "--config", str(cfg)]
    proc = cli(*args, "--limit", "1", check=True)
    assert "| 1-shot |" in proc.stdout and "| DERA |" in proc.stdout
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 1 and recs[0]["status"] == "ok"
    r = recs[0]
    assert len(r["metadata"]["oneshot"]["completions"]) == 5 and len(r["metadata"]["final"]["completions"]) == 5
    assert r["transcript"][0]["role"] == "decider" and r["metadata"]["turns"] <= 1
    # the scorers' typed grades are the result; the judge named by its model and prompt, a missing answer 0 by rule
    assert "correct" not in r and {n.split("/")[1] for n in r["scores"]} == {"oneshot", "dera"}
    assert 0.0 <= r["scores"]["bertscore/oneshot"]["value"] <= 1.0
    for arm in ("oneshot", "dera"):
        exact = r["scores"][f"llm-exact/{arm}"]
        assert exact["value"] in (0, 1, None) and exact.get("answer") == r["answer"][arm]
        asked = [c for c in r["calls"] if c["step"] == f"judge:exact:{arm}"]
        assert exact["judge"] == ({"model": r["roles"]["judge"], "prompt_hash": asked[0]["template_hash"]} if r["answer"][arm] else {"rule": "no answer"})
    metrics = json.loads((out / "metrics.json").read_text())
    fig = next(f for f in metrics["scores"] if f["score"] == "bertscore/dera")
    assert fig["n"] == 1 and "bertscore" in metrics["dera_minus_oneshot"]
    assert (out / "summary.md").read_text().count(figure_cell(fig)) >= 2  # the study's table and the Scores section: one figure
    # resume: the finished question is not redone, the next one is added
    proc = cli(*args, "--limit", "2", check=True)
    recs2 = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert [x["id"] for x in recs2] == [r["id"], "medqa_open-00002"]
    m2 = json.loads((out / "metrics.json").read_text())
    assert m2["run"]["cases_resumed"] == 1 and m2["case_status"]["finished"] == 2 and m2["case_status"]["failed"] == 0
