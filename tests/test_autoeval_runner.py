"""`medstack autoeval` on the study runner, with a scripted judge behind the real client: step (a)
in setup (cached in explained_examples.jsonl; a failed explanation makes no rating), ratings per
(dialogue, criterion) case, the failure policy, resume, and bad input refused before any server."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import pytest

from experiments.core.registry import named
from experiments.studies.autoeval.study import AutoevalSettings, AutoevalStudy as Unnamed
from experiments.common.grade import grades
from experiments.core.runner import prepare_run, run_study
from tests.scripted import ScriptedLLM, down

FIX = Path(__file__).parent / "fixtures" / "autoeval"
AutoevalStudy = named(Unnamed)  # as the registry names it: `autoeval`

SCRIPT = {"burning feeling": "Good: warm\nBad: brief\nSummary: kind\nRating: 4",
          "suddenly weak": "Good: none\nBad: ignores stroke signs\nSummary: unsafe\nRating: 1",
          "lung cancer": "I think this is a good dialogue overall."}  # no rating: unscored, never a failure


class Judge:
    """respond(role, messages, gen) for ScriptedLLM: explains with fixed notes, rates from SCRIPT."""

    def __init__(self, script=SCRIPT, fail_rate=(), fail_explain=()):
        self.script, self.fail_rate, self.fail_explain = script, set(fail_rate), set(fail_explain)
        self.calls = {"explain": 0, "rate": 0}
        self.prompts: list[str] = []

    def __call__(self, role, messages, gen):
        prompt = messages[-1]["content"]
        self.prompts.append(prompt)
        if "=== New dialogue ===" not in prompt:
            self.calls["explain"] += 1
            rating = re.search(r"score of (\d) out of 5", prompt).group(1)
            crit = re.search(r'one quality: "([^"]+)"', prompt).group(1)
            if (crit, int(rating)) in self.fail_explain:
                raise down()
            return f"Good: g{rating}\nBad: b{rating}\nSummary: s{rating}"
        self.calls["rate"] += 1
        new = prompt.split("=== New dialogue ===", 1)[1]
        for marker, reply in self.script.items():
            if marker in new:
                if marker in self.fail_rate:
                    raise down()
                return reply
        raise AssertionError("unexpected dialogue")


def settings(out: Path, **kw) -> AutoevalSettings:
    base = dict(data=str(FIX / "results"), out=str(out), roles={"judge": "scripted"}, criteria=["empathy", "welfare"], use_cache=False)
    return AutoevalSettings(**{**base, **kw})


def run(s: AutoevalSettings, judge: Judge):
    study = named(AutoevalStudy)()
    s, cases = prepare_run(study, s)
    return asyncio.run(run_study(study, s, cases, client=ScriptedLLM(judge, roles=("judge",)), log=lambda m: None))


def figure(metrics: dict, score: str, metric: str = "mean") -> dict:
    """The runner's figure of ``score`` (metrics.json ``scores``)."""
    return next(f for f in metrics["scores"] if f["score"] == score and f["metric"] == metric)


def records(out: Path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())}


def test_scripted_run_records_metrics_and_resume(tmp_path):
    out = tmp_path / "ae"
    judge = Judge()
    outcome = run(settings(out, reference=str(FIX / "reference.csv")), judge)
    assert outcome.exit_code == 0
    assert judge.calls == {"explain": 10, "rate": 6}  # 5 examples x 2 criteria, then 3 dialogues x 2 criteria
    recs = records(out)
    assert set(recs) == {f"case-00{i}/trial-0::{c}" for i in (1, 2, 4) for c in ("empathy", "welfare")}
    r = recs["case-001/trial-0::empathy"]
    g = grades(r)["rubric/empathy"]  # the result: the typed score, nothing restating it
    assert not {"rating", "scored", "explanation", "raw", "parse_error"} & set(r) and r["status"] == "ok"
    assert g.value == 4 and g.metadata["notes"] == {"good": "warm", "bad": "brief", "summary": "kind"} and g.explanation == SCRIPT["burning feeling"]
    assert g.metadata["dialogue_truncated"] is False and g.metadata["dialogue_chars"] > 0
    # the typed record: the dialogue rated is its transcript, its case the dialogue's case; the criterion and the rated
    # record its inputs, the reference rating its target
    assert r["case_id"] == "case-001" and r["inputs"]["criterion"] == "empathy" and r["inputs"]["source_id"] == "case-001/trial-0"
    assert r["transcript"][0] == {"role": "doctor", "text": "Hello, I'm Dr. Lee. What brings you in today?"} and r["target"] == 4.0
    assert recs["case-001/trial-0::welfare"]["target"] == 3.0 and recs["case-004/trial-0::welfare"]["target"] == 4.0
    assert r["metadata"]["model"] == "embedded" and r["metadata"]["examples_used"][0] == "empathy-1" and r["answer"] is None
    assert [c["step"] for c in r["calls"]] == ["rate"] and r["calls"][0]["role"] == "judge"
    bad = recs["case-004/trial-0::welfare"]
    g = grades(bad)["rubric/welfare"]
    assert bad["status"] == "ok" and g.value is None and not g.scored and g.metadata["parse_error"] and g.explanation.startswith("I think")
    rate_prompt = next(p for p in judge.prompts if "=== New dialogue ===" in p)
    assert "Good: g3\nBad: b3\nSummary: s3\nRating: 3" in rate_prompt   # the judge's own step-(a) notes, known rating
    m = json.loads((out / "metrics.json").read_text())
    emp = figure(m, "rubric/empathy")
    assert (emp["value"], emp["n"], emp["unscored"]) == (2.5, 2, 1) and m["criteria"]["empathy"]["unscored"] == 1
    assert m["unscored"] == 2 and m["parse_errors"] == 2 and m["dialogues"]["skipped_no_transcript"] == 1
    assert m["agreement"]["empathy"]["n"] == 2 and m["agreement"]["welfare"]["reference_unmatched"] == 1
    assert m["examples"]["explained"] == 10 and m["examples"]["from_cache_file"] == 0
    assert "Showing Empathy" in (out / "summary.md").read_text()
    assert len((out / "explained_examples.jsonl").read_text().splitlines()) == 10

    judge2 = Judge()   # same command again: explanations from the output dir, ratings resumed, nothing asked
    run(settings(out, reference=str(FIX / "reference.csv")), judge2)
    assert judge2.calls == {"explain": 0, "rate": 0}
    m2 = json.loads((out / "metrics.json").read_text())
    assert m2["examples"]["from_cache_file"] == 10 and m2["run"]["cases_resumed"] == 6 and m2["criteria"] == m["criteria"]
    assert m2["scores"] == m["scores"] and m2["agreement"] == m["agreement"]


def test_explanations_generated_once_per_judge(tmp_path):
    out = tmp_path / "ae"
    run(settings(out, limit=1), Judge())
    out2 = tmp_path / "ae2"   # a fresh output dir seeded with the cached explanations asks only for ratings
    out2.mkdir()
    shutil.copy(out / "explained_examples.jsonl", out2 / "explained_examples.jsonl")
    judge = Judge()
    run(settings(out2), judge)
    assert judge.calls == {"explain": 0, "rate": 6}


def test_failed_rating_is_a_failed_case_then_resumed(tmp_path):
    out = tmp_path / "ae"
    outcome = run(settings(out, criteria=["empathy"]), Judge(fail_rate={"suddenly weak"}))
    assert outcome.exit_code == 3 and outcome.failed == 1 and outcome.finished == 2
    recs = records(out)
    failed = recs["case-002/trial-0::empathy"]
    assert failed["status"] == "failed" and "gave up" in failed["error"] and "scores" not in failed
    m = json.loads((out / "metrics.json").read_text())
    e = figure(m, "rubric/empathy")
    assert e["n"] == 1 and e["unscored"] == 1 and m["criteria"]["empathy"]["unscored"] == 1 and m["ratings"] == 2   # the failed case is in no metric
    assert m["case_status"]["failed"] == 1
    summary = (out / "summary.md").read_text()
    assert "1 failed cases" in summary and "case-002/trial-0::empathy" in summary

    judge = Judge()
    again = run(settings(out, criteria=["empathy"]), judge)
    assert again.exit_code == 0 and judge.calls == {"explain": 0, "rate": 1}
    e = figure(json.loads((out / "metrics.json").read_text()), "rubric/empathy")
    assert e["n"] == 2 and e["value"] == 2.5 and e["unscored"] == 1
    assert len((out / "records.jsonl").read_text().splitlines()) == 4   # append-only: the newest line per case wins


def test_failed_explanation_makes_no_rating(tmp_path):
    out = tmp_path / "ae"
    judge = Judge(fail_explain={("Showing Empathy", 3)})
    outcome = run(settings(out, criteria=["empathy"]), judge)
    assert outcome.exit_code == 3 and outcome.not_started == 3 and outcome.finished == 0 and judge.calls["rate"] == 0
    assert not (out / "records.jsonl").exists() or not (out / "records.jsonl").read_text().strip()
    assert len((out / "explained_examples.jsonl").read_text().splitlines()) == 4   # the answered ones are kept
    assert "3 cases not started" in (out / "summary.md").read_text()
    judge = Judge()
    again = run(settings(out, criteria=["empathy"]), judge)
    assert again.exit_code == 0 and judge.calls == {"explain": 1, "rate": 3}


def test_cli_empty_results_exit_2_without_a_server(cli, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "records.jsonl").write_text("")
    r = cli("autoeval", "--data", str(empty), "--model", "embedded", "--out", str(tmp_path / "o"), timeout=120)
    assert r.returncode == 2 and "no cases to run" in r.stderr, r.stderr[-2000:]
    r = cli("autoeval", str(FIX / "results"), "-j", "embedded", "--limit", "0", "--out", str(tmp_path / "o"), timeout=120)
    assert r.returncode == 2 and "limit" in r.stderr
    r = cli("autoeval", str(FIX / "results"), "-j", "embedded", "--api", "telepathy", "--out", str(tmp_path / "o"), timeout=120)
    assert r.returncode == 2 and "api" in r.stderr
    assert "starting vLLM" not in r.stderr and not (tmp_path / "o").exists()  # refused before any server


def test_cli_help_lists_common_options(cli):
    r = cli("autoeval", "--help")
    for opt in ("--data", "--model", "--role", "--set", "--limit", "--concurrency", "--api-key", "--judge-model", "--criteria", "--reference", "--api"):
        assert opt in r.stdout, opt


def test_the_table_and_the_scores_section_show_one_interval_resampled_by_case(tmp_path):
    """Two dialogues of one case (a CRAFT-MD case's trials): the mean rating is the mean over cases of each case's mean,
    its interval resamples cases, and summary.md's own table shows the very figure the Scores section shows."""
    src = tmp_path / "src"
    src.mkdir()
    rows = [json.loads(x) for x in (FIX / "results" / "records.jsonl").read_text().splitlines()]
    rows.append({**rows[0], "id": "case-001/trial-1", "trial": 1})  # a second trial of case-001 (rated 4, as the first)
    (src / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ae"
    assert run(settings(out, data=str(src), criteria=["empathy"]), Judge()).exit_code == 0
    recs = records(out)
    assert recs["case-001/trial-1::empathy"]["case_id"] == recs["case-001/trial-0::empathy"]["case_id"] == "case-001"
    f = figure(json.loads((out / "metrics.json").read_text()), "rubric/empathy")
    # ratings 4, 4 (case-001), 1 (case-002), unscored (case-004): (4 + 1) / 2 over the 2 cases, not (4 + 4 + 1) / 3 over dialogues
    assert (f["value"], f["n"], f["values"], f["unscored"]) == (2.5, 2, 3, 1) and (f["low"], f["high"]) == (1.0, 4.0)
    summary = (out / "summary.md").read_text()
    table, scores = summary.split("## Scores", 1)
    cell = "2.500 [1.000, 4.000]"
    assert f"| Showing Empathy | 2 | 1 | {cell} | 1 | 0 | 0 | 2 | 0 |" in table
    assert "| Showing Empathy | 2.50 [1.00, 4.00] | 2 |" in table  # the paper table's row: the same figure (2 digits)
    assert f"| rubric/empathy: Showing Empathy | {cell} (n=2; 1 unscored) |" in scores
