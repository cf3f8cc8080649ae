"""Results folders written before typed scores (tests/fixtures/old_runs: three real runs with the embedded model, made by
the code of that time) read with today's code: the one reader upgrades every record through its study (typed scores
equal to the fields the metrics read; DERA-QA's per-arm values and `correct` flag replaced by them), the study's
metrics over the upgraded records equal the metrics.json the run wrote, and review, rescore's dry run and the report serve them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.common.grade import grades
from experiments.core import registry
from experiments.tools.review.judges import load_judge
from tests.conftest import FIXTURES, run_cli

OLD = FIXTURES / "old_runs"
RUNS = ("craftmd", "dera-qa", "meditod-nlu")


# what a run's metrics hold that is not a function of its records: the encoder's path on the machine that ran it, and a
# context budget the study reads from the server once it is up
MACHINE = {"path", "context_budget"}


def _same(a, b) -> bool:
    """Equal as JSON (a NaN mean over no cases equals NaN), without the machine's own values."""
    def plain(v):
        return {k: plain(x) for k, x in v.items() if k not in MACHINE} if isinstance(v, dict) else v
    return json.dumps(plain(a), sort_keys=True) == json.dumps(plain(b), sort_keys=True)


@pytest.mark.parametrize("name", RUNS)
def test_an_old_folder_reads_with_typed_scores_and_its_metrics_recompute_unchanged(name):
    run = registry.open_run(OLD / name)
    assert run.schema == 1 and run.finished and not run.failed  # written before the records had a schema number
    for r in run.finished:
        assert grades(r), f"{name} record {r['id']} has no typed scores after the upgrade"
    study = registry.study_of(run)
    config = {k: v for k, v in run.config.items() if k != "prompt_files"}  # the prompts' hashes: the run folder's, not a setting
    settings = study.settings_cls.model_validate(config)  # the old config's flat sampling keys read into sampling.STEP
    old = json.loads((OLD / name / "metrics.json").read_text())
    records = sorted(run.finished, key=lambda r: r["id"])  # the cases' order (the runner scores in it; the file is in finishing order)
    new = study.metrics(records, settings)
    assert new and all(_same(new[k], old.get(k)) for k in new), [k for k in new if not _same(new[k], old.get(k))]


def test_old_craftmd_records_score_as_their_answers():
    run = registry.open_run(OLD / "craftmd")
    seen = 0
    for r in run.finished:
        g = grades(r)
        for fmt, modes in r["answers"].items():
            if "frq" in modes:
                assert g[f"frq/{fmt}"].value == modes["frq"]["correct"] and g[f"frq/{fmt}"].judge["model"] == "embedded"
                seen += 1
    assert seen >= 2
    items = load_judge(OLD / "craftmd", "frq")["items"]
    assert len(items) == seen and {it["verdict"] for it in items} <= {0, 1}


def test_old_dera_qa_records_read_their_per_arm_values_as_typed_scores():
    raw = [json.loads(x) for x in (OLD / "dera-qa" / "records.jsonl").read_text().splitlines() if x.strip()]
    assert all("dera" in r["scores"] and "correct" in r for r in raw)  # as the old code wrote them
    run = registry.open_run(OLD / "dera-qa")
    for old, r in zip(sorted(raw, key=lambda x: x["id"]), sorted(run.finished, key=lambda x: x["id"])):
        assert "correct" not in r and "arm_scores" not in r
        g = grades(r)
        assert set(g) == {f"{step}/{arm}" for step in ("llm-exact", "llm-similarity", "bertscore") for arm in old["scores"]}
        for arm, s in old["scores"].items():
            assert (g[f"llm-exact/{arm}"].value, g[f"llm-similarity/{arm}"].value, g[f"bertscore/{arm}"].value) == \
                (s["exact"], s["similarity_raw"], s["bertscore"])
            assert g[f"llm-exact/{arm}"].answer == s["answer"] and g[f"llm-exact/{arm}"].explanation == s["exact_explanation"]
        assert g["llm-exact/dera"].value == old["correct"]
    assert load_judge(OLD / "dera-qa", "llm-exact")["items"]


def test_old_folders_report_and_rescore_dry_run(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(OLD, runs, ignore=shutil.ignore_patterns("README.md"))
    p = run_cli("report", str(runs), "--out", str(tmp_path / "report.html"))
    assert p.returncode == 0, p.stderr
    html = (tmp_path / "report.html").read_text()
    assert "frq/vignette" in html and "llm-exact/dera" in html  # the typed scores of the upgraded records, per case
    p = run_cli("rescore", str(runs / "craftmd"), "--judge", "frq", "--judge-model", "embedded@http://127.0.0.1:9/v1",
                "--out", str(tmp_path / "rescored"), "--dry-run")
    assert p.returncode == 0, p.stderr
    steps = {json.loads(x)["step"] for x in (tmp_path / "rescored" / "dry-run.jsonl").read_text().splitlines() if x.strip()}
    assert steps and all(s.endswith("_match") or s.endswith("_extract") for s in steps), steps  # the grader's requests only
    assert not (runs / "craftmd" / "scores").exists() and "scores" not in (runs / "craftmd" / "records.jsonl").read_text()
