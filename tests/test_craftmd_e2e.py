"""CRAFT-MD end to end through the real embedded vLLM server: one case, 1 trial, tiny limits."""

from __future__ import annotations

import json
from html import unescape

import pytest

from experiments.common.patient_checks import CHECKS
from experiments.studies.craftmd.scorers import released_reference

pytestmark = pytest.mark.e2e


def test_one_case_through_the_real_server_and_resume(cli, embedded_server, fixtures_dir, tmp_path):
    url = embedded_server["base_url"]
    role = f"embedded@{url}"
    out = tmp_path / "run"
    args = ["run", "craftmd", "--data", str(fixtures_dir / "craftmd" / "cases.csv"), "--limit", "1", "--trials", "1", "--max-turns", "2",
            "--clinical-model", role, "--patient-model", role, "--grader-model", role,
            "--config", "experiments/studies/craftmd/configs/embedded-small.yaml", "--out", str(out)]
    proc = cli(*args, check=True)
    assert "CRAFT-MD run" in proc.stdout
    recs = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 1
    r = recs[0]
    assert r["status"] == "ok", r.get("error")
    assert r["id"] == "case_a/t0" and r["case_id"] == "case_a" and r["trial"] == 0
    assert r["metadata"]["stop_reason"] in ("final_diagnosis", "no_question", "turn_cap")
    # the typed record: the transcript as spoken (the doctor's fixed greeting, then the patient), the case's inputs and target
    assert [t["role"] for t in r["transcript"][:2]] == ["doctor", "patient"] and {t["role"] for t in r["transcript"]} <= {"doctor", "patient"}
    assert r["inputs"]["facts"] and r["target"] and len(r["inputs"]["choices"]) == 4
    assert 1 <= r["metadata"]["n_doctor_turns"] <= 2
    assert set(r["answer"]) == {"vignette", "multiturn", "singleturn", "summarized"}
    for fmt in r["answer"]:
        assert r["scores"][f"mcq/{fmt}"]["value"] in (0, 1)  # unparsed counts as wrong, never missing
        assert "extraction_status" in r["scores"][f"frq/{fmt}"]["metadata"]
    assert r["usage"]["clinical"]["completion_tokens"] > 0 and r["usage"]["total"]["failed"] == 0
    assert all(c["t_end"] >= c["t_start"] and c["step"] for c in r["calls"])  # the call log, for replay
    # the scores hold every decision, made by the scorers after the conversation: the grader's and the choice mapping's
    # per format, the assessor's five questions (real replies, unreadable ones unscored), the patient checks
    scores = r["scores"]
    questions = ("Q1", "Q2", "Q3", "grounded", "complete")
    for fmt, a in r["answer"].items():
        assert scores[f"frq/{fmt}"]["value"] in (0, 1, None) and scores[f"frq/{fmt}"]["judge"]["model"] == role and isinstance(a["frq"], str)
        assert scores[f"mcq/{fmt}"]["value"] in (0, 1) and scores[f"mcq/{fmt}"]["judge"]["rule"].startswith("map_choice") and isinstance(a["mcq"], str)
    assert all(scores[f"assess-{q}"]["value"] in (0, 1, None) and "explanation" in scores[f"assess-{q}"] for q in questions)
    assert sorted(c["step"] for c in r["calls"] if c["role"] == "assessor") == sorted(f"assess_{q}" for q in questions)
    assert all(scores[f"patient-check/{c}"]["value"] in (0, 1, None) for c in CHECKS)
    assert scores["patient-check/empty_turn"]["metadata"]["patient_turns"] >= 1 and scores["patient-check/copies_vignette"]["metadata"]["longest_span"] >= 0
    summary = (out / "summary.md").read_text()
    assert "## Conversation quality" in summary and "### patient-check" in summary and "additions to the protocol" in summary
    # the run's patient beside the authors' four released patients, each rate with its CI, per conversation and per patient turn
    checks = summary.split("### patient-check")[1].split("\n\n")[1].splitlines()
    assert checks[0].startswith("| score | per conversation | per patient turn |") and all(f"{k}: per conversation" in checks[0] for k in released_reference())
    assert "doctor: reached the turn cap in" in summary
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["records"] == 1 and metrics["run"]["requests"] > 0 and "parse_error_rate" in metrics
    assert "server" in metrics["run"]  # the server's own view (/metrics): prefix-cache hit rate, queueing vs prefill
    ident = json.loads((out / "identity.json").read_text())["models"]["clinical"]
    assert ident["argv"] and ident["engine"].startswith("vllm")  # the vLLM command line and version
    if ident.get("device") == "cpu":  # the serving settings and the machine they ran on
        assert ident["serve_settings"]["cpu_threads_bind_resolved"] and ident["machine"]["usable_cpus"]
    # a re-run of the same command resumes: nothing recomputed
    proc = cli(*args, check=True)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["cases_run"] == 0 and metrics["run"]["cases_resumed"] == 1
    assert len((out / "records.jsonl").read_text().splitlines()) == 1
    # compare on it writes the chart and the JSON
    proc = cli("compare", str(out), "--out", str(tmp_path / "cmp"), check=True)
    assert (tmp_path / "cmp" / "accuracy.png").stat().st_size > 0
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["accuracy"]
    assert "(authors' release): per conversation" in (tmp_path / "cmp" / "summary.md").read_text()
    # and the report shows the same figures
    cli("report", str(out), "--out", str(tmp_path / "report.html"), check=True)
    html = unescape((tmp_path / "report.html").read_text())
    assert "<td>patient-check/empty_turn</td><td>per patient turn</td>" in html


def test_meld_one_case(cli, embedded_server, fixtures_dir, tmp_path):
    out = tmp_path / "meld"
    cli("meld", "--model", f"embedded@{embedded_server['base_url']}", "--data", str(fixtures_dir / "craftmd" / "cases.csv"), "--limit", "1", "--out", str(out), check=True)
    rec = json.loads((out / "records.jsonl").read_text().splitlines()[0])
    sim = rec["scores"]["similarity"]["value"]
    assert 0.0 <= sim <= 1.0 and rec["inputs"]["n_words"] == len(rec["target"].split()) and "similarity" not in rec
    m = json.loads((out / "metrics.json").read_text())
    assert m["n"] == 1 and m["share_ge_threshold"] == rec["scores"]["memorized"]["value"] and m["mean_similarity"] == sim


def test_bad_case_file_is_a_clean_error(cli, tmp_path):
    bad = tmp_path / "cases.csv"
    bad.write_text("case_vignette,answer\nx,y\n")
    proc = cli("run", "craftmd", "--data", str(bad), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "cases.csv:1: missing column" in proc.stderr and "Traceback" not in proc.stderr
