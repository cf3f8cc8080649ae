"""MediTOD end to end against the real embedded vLLM server (tiny limits, small max_tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FX = Path(__file__).parent / "fixtures" / "meditod"
DATA = FX / "dialogs.json"

pytestmark = pytest.mark.e2e


def _model(server) -> str:
    return f"embedded@{server['base_url']}"


@pytest.mark.parametrize("task, max_tokens", [("nlu", 48), ("pol", 40), ("nlg", 24)])
def test_run_icl_each_task(cli, embedded_server, tmp_path, task, max_tokens):
    out = tmp_path / f"{task}-icl"
    args = ["run", f"meditod-{task}", "--data", str(DATA), "--model", _model(embedded_server), "--limit", "2", "--k", "2",
            "--max-tokens", str(max_tokens), "--out", str(out), "--no-cache"]
    if task == "nlg":
        args.append("--no-bertscore")
    r = cli(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and m["turns"] == sum(r["metadata"]["scored"] for r in recs) and m["case_status"]["failed"] == 0
    assert m["turns"] == (2 if task == "nlu" else 1)          # POL/NLG: utterance 0 is sent but not scored (the authors')
    assert all(r["inputs"]["messages"][0]["role"] == "system" and r["inputs"]["messages"][-1]["role"] == "user" for r in recs)
    assert all(r["status"] == "ok" and r["usage"]["total"]["completion_tokens"] > 0 and r["metadata"]["exemplars_kept"] >= 1
               and r["metadata"]["model"] == "embedded" for r in recs)
    assert m["run"]["output_tokens_per_s"] > 0
    key = "bleu2" if task == "nlg" else "f1"
    assert 0.0 <= m[key] <= (100.0 if task == "nlg" else 1.0)
    if task != "nlg":   # unparseable output is counted, never fatal
        assert m["format_errors"] == sum(r["metadata"]["parse_error"] for r in recs if r["metadata"]["scored"] and r["target"] != [{"intent": "inform"}])
    assert f"# MediTOD {task.upper()}" in r.stdout
    assert (out / "summary.md").read_text().startswith(f"# MediTOD {task.upper()}")
    if task != "nlu":
        return
    # resume: a second run asks nothing new
    r2 = cli(*args)
    assert r2.returncode == 0, r2.stderr[-3000:]
    m2 = json.loads((out / "metrics.json").read_text())
    assert m2["run"]["cases_resumed"] == 2 and m2["run"]["cases_run"] == 0
    assert len((out / "records.jsonl").read_text().splitlines()) == 2


def test_run_supervised_with_lora_adapter(cli, embedded_server, lora_adapter, tmp_path):
    out = tmp_path / "nlu-supervised"
    r = cli("run", "meditod-nlu", "--data", str(DATA), "--mode", "supervised", "--lora", f"test-lora={lora_adapter}",
            "--model", _model(embedded_server), "--limit", "2", "--max-tokens", "24", "--out", str(out), "--no-cache")
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and all(r["status"] == "ok" and r["inputs"]["prompt"].endswith("[output]\n[answer]") and r["metadata"]["lora"] == "test-lora"
                                  for r in recs)
    ident = json.loads((out / "identity.json").read_text())
    assert "test-lora" in json.dumps(ident)


def test_run_bad_split_is_a_message(cli, tmp_path):
    r = cli("run", "meditod-nlu", "--data", str(DATA), "--split", "ood", "--model", "embedded@http://127.0.0.1:9/v1", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "ood_ids.json: file does not exist" in r.stderr
