"""MediTOD and MELD on the results contract: each turn's typed rule scores are its result and agree with the run's
metrics, the grader's adjudications are judge scores, and a folder written before typed scores (``correct``, ``f1``
and ``adjudications`` beside the prediction) reads the same through ``registry.open_run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.common.grade import grades
from experiments.core import registry
from experiments.core.results import ConfigView
from experiments.studies.craftmd.meld import meld_scores
from experiments.studies.meditod.prompts import prompt_hash
from experiments.studies.meditod.results import adjudications
from tests.scripted import ScriptedLLM
from tests.test_meditod_runner import adjudication_backend, gold_backend, no_tokenizer, records, run, settings  # noqa: F401


def older(r: dict) -> dict:
    """A record as the code before typed scores wrote it."""
    g, old = grades(r), {k: v for k, v in r.items() if k != "scores"}
    if "joint" in g:
        old.update(correct=g["joint"].value, f1=g["prf"].named("f1"))
    if judged := adjudications(r):
        old["adjudications"] = judged
    return old


def as_before(out: Path) -> dict:
    """The folder as the code before typed scores wrote it (:func:`older`, no schema number); the records as they are."""
    new = records(out)
    (out / "records.jsonl").write_text("".join(json.dumps(older(r)) + "\n" for r in new.values()))
    ident = json.loads((out / "identity.json").read_text())
    ident.pop("records_schema")
    (out / "identity.json").write_text(json.dumps(ident))
    return new


@pytest.mark.parametrize("task", ["nlu", "pol", "nlg"])
def test_turn_scores_agree_with_the_records_and_the_metrics(tmp_path, task):
    s = settings(tmp_path, task)
    outcome = run(task, s, ScriptedLLM(gold_backend(task, junk_ids={"301/4", "301/3"}), roles=("model", "grader")))
    m = outcome.metrics
    out = Path(s.out)
    new = as_before(out)
    scored = [r for r in new.values() if r["scored"]]
    assert all(not r["scores"] for r in new.values() if not r["scored"])  # sent, not scored: no scores
    if task == "nlg":
        rouge = [grades(r)["rouge"].value for r in scored]
        assert sum(x["rouge1"] for x in rouge) / len(rouge) == pytest.approx(m["rouge1"])
        assert sum(x["rougeL"] for x in rouge) / len(rouge) == pytest.approx(m["rougeL"])
    else:
        for r in scored:
            g = grades(r)
            assert "correct" not in r and "f1" not in r and g["joint"].judge == {"rule": "the dataset authors' scorer"}
            if g["joint"].scored and r["id"] not in {"301/4", "301/3"}:  # the stand-in answered the gold
                assert (g["joint"].value, g["prf"].value) == (1, {"precision": 1.0, "recall": 1.0, "f1": 1.0})
        joint = [grades(r)["joint"].value or 0 for r in scored]  # a skipped turn counts 0 over all turns, as the authors'
        assert sum(joint) / len(joint) == pytest.approx(m["joint_accuracy"])
        assert sum(grades(r)["format"].value or 0 for r in scored) == m["format_errors"] > 0
    old = registry.open_run(out)
    assert old.schema == 1 and {r["id"]: r["scores"] for r in old.finished} == {i: r["scores"] for i, r in new.items()}


def test_adjudications_are_judge_scores(tmp_path):
    s = settings(tmp_path, "nlu", limit=1, adjudicate_model="judge")
    run("nlu", s, ScriptedLLM(adjudication_backend(), roles=("model", "grader")))
    rec = records(s.out)["301/1"]
    g = grades(rec)["adjudicate/0"]
    assert g.value == 1 and g.answer == {"gold": "two weeks ago", "pred": "2 weeks back"} and g.explanation == "positive"
    assert g.judge["prompt_hash"] == prompt_hash("adjudicate.txt") and g.judge["model"].startswith("judge")
    assert "adjudications" not in rec and adjudications(rec) == [{"gold": "two weeks ago", "pred": "2 weeks back", "reply": "positive",
                                                                   "same": True, "parsed": True}]
    as_before(Path(s.out))  # an older record's adjudications: the same judge scores
    assert registry.open_run(s.out).finished[0]["scores"] == rec["scores"]


def test_meld_scores():
    rec = {"similarity": 0.97, "memorized": 1, "generation_cut": "a b c"}
    g = meld_scores(rec, ConfigView(threshold=0.95))
    assert (g["similarity"].value, g["memorized"].value, g["memorized"].judge) == (0.97, 1, {"rule": "similarity >= 0.95"})
