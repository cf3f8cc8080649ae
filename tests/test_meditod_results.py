"""MediTOD and MELD on their scorers: each turn's rule grades agree with the run's metrics, the grader's
adjudications are a model scorer's grades, and a folder written before typed records (the turn's own fields, and
before typed scores ``correct``, ``f1`` and ``adjudications`` beside the prediction) reads the same through
``registry.open_run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.common.grade import grades, to_disk
from experiments.core import registry
from experiments.core.record import FIELDS
from experiments.core.results import ConfigView
from experiments.studies.craftmd.meld import SCORERS as MELD
from experiments.studies.meditod.prompts import prompt_hash
from experiments.studies.meditod.scorers import adjudications
from tests.scripted import ScriptedLLM
from tests.test_meditod_runner import adjudication_backend, gold_backend, no_tokenizer, records, run, settings  # noqa: F401


def older(r: dict) -> dict:
    """A record as the code before typed records and typed scores wrote it: the turn's own fields."""
    g = grades(r)
    old = {k: v for k, v in r.items() if k not in ("scores", "inputs", "metadata", "answer", "case_id", "trial", "transcript")}
    old.update({**r["inputs"], **r["metadata"], "prediction": r["answer"],
                "transcript": [{"agent": t["role"], "content": t["text"], "turn": i} for i, t in enumerate(r["transcript"])]})
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
    scored = [r for r in new.values() if r["metadata"]["scored"]]
    assert all(not r["scores"] for r in new.values() if not r["metadata"]["scored"])  # sent, not scored: no scores
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
    typed = lambda r: {k: r[k] for k in FIELDS}  # noqa: E731
    assert old.schema == 1 and {r["id"]: typed(r) for r in old.finished} == {i: typed(r) for i, r in new.items()}  # as written today


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


def test_meld_scorers():
    rec = {"answer": "a b c d", "target": "a b c e", "scores": {}}
    s = ConfigView(threshold=0.7)
    for sc in MELD:
        rec["scores"].update(to_disk(sc.rule(rec, s)))
    g = grades(rec)
    assert (g["similarity"].value, g["memorized"].value, g["memorized"].judge) == (pytest.approx(6 / 7), 1, {"rule": "similarity >= 0.7"})  # one edit in 7 characters
