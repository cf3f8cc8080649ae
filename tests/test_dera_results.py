"""DERA on the results contract: every record's result is its typed scores, a folder written before typed scores
(DERA-QA's per-arm values under ``scores`` and a ``correct`` flag) reads the same through ``registry.open_run``, and the
two LLM judges of open-ended DERA-QA, asked again over a stored answer, send only their own judge request."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from experiments.common.grade import grades
from experiments.core import registry
from experiments.core.study import CaseContext
from experiments.studies.dera.results import QA_RESULTS
from experiments.tools.review.judges import load_judge
from tests.scripted import ScriptedLLM
from tests.test_dera_runner import ROLES, SUMMARY_SECTIONS, dialogue_backend, no_bertscore, qa_backend, records, run, settings_for  # noqa: F401

PRF = ("precision", "recall", "f1")


FIELDS = {"accuracy": ("accuracy", None), "llm-exact": ("exact", "exact_explanation"), "llm-similarity": ("similarity_raw", "similarity_reply"),
          "bertscore": ("bertscore", None)}  # the older per-arm fields: step -> (value, the judge's reply)


def per_arm(record: dict) -> dict:
    """The per-arm values an older DERA-QA record kept under ``scores``."""
    out: dict = {}
    for name, g in grades(record).items():
        step, arm = name.split("/")
        value, reply = FIELDS[step]
        out.setdefault(arm, {"answer": g.answer})[value] = g.value
        if reply and g.explanation is not None:
            out[arm][reply] = g.explanation
    return out


def as_before(out: Path) -> None:
    """The folder as it was written before typed scores: no ``scores`` (DERA-QA: its per-arm values there, and the DERA
    arm's ``correct``), identity.json without the records' schema."""
    lines = []
    for r in map(json.loads, (out / "records.jsonl").read_text().splitlines()):
        if r.get("answers"):
            arms = per_arm(r)
            r.update(scores=arms, correct=arms["dera"].get("accuracy", arms["dera"].get("exact")))
        else:
            r.pop("scores")
        lines.append(json.dumps(r))
    (out / "records.jsonl").write_text("\n".join(lines) + "\n")
    ident = json.loads((out / "identity.json").read_text())
    ident.pop("records_schema")
    (out / "identity.json").write_text(json.dumps(ident))


def qa_run(tmp_path, mcq=False, limit=2):
    study, s = settings_for("dera-qa", tmp_path, options={"mcq": True} if mcq else {}, limit=limit)
    outcome, _ = run(study, s, qa_backend())
    assert outcome.exit_code == 0
    return study, s, Path(s.out)


@pytest.mark.parametrize("mcq", [False, True], ids=["open", "mcq"])
def test_qa_typed_scores_are_the_result_and_an_older_folder_reads_the_same(tmp_path, no_bertscore, mcq):
    study, s, out = qa_run(tmp_path, mcq)
    new = records(out)
    metrics = json.loads((out / "metrics.json").read_text())
    for r in new.values():
        assert "correct" not in r and "arm_scores" not in r
        g = grades(r)
        steps = ("accuracy",) if mcq else ("llm-exact", "llm-similarity", "bertscore")
        assert set(g) == {f"{step}/{arm}" for step in steps for arm in ("oneshot", "dera")}
        for arm in ("oneshot", "dera"):
            assert all(g[f"{step}/{arm}"].answer == r["answers"][arm] for step in steps)
            if mcq:
                assert g[f"accuracy/{arm}"].value == int(r["answers"][arm] == r["gold"]) and g[f"accuracy/{arm}"].judge == {"rule": "the voted letter is answer_idx"}
                continue
            assert g[f"llm-exact/{arm}"].judge == {"model": s.roles["judge"], "prompt_hash": r["prompt_hashes"]["judge_exact"]}
            assert g[f"llm-similarity/{arm}"].judge["prompt_hash"] == r["prompt_hashes"]["judge_similarity"]
            assert (g[f"llm-exact/{arm}"].value, g[f"llm-similarity/{arm}"].value) == (1, 0.8)  # qa_backend's judge replies
            assert g[f"llm-exact/{arm}"].explanation.startswith("True")
    as_before(out)
    old = registry.open_run(out)
    assert old.schema == 1 and len(old.finished) == len(new)
    for r in old.finished:
        assert r["scores"] == new[r["id"]]["scores"] and "correct" not in r
    again = study.metrics(old.finished, s)  # the metrics read the same values from the upgraded records
    assert again["arms"] == metrics["arms"] and again["dera_minus_oneshot"] == metrics["dera_minus_oneshot"]


@pytest.mark.parametrize("name,options", [("dera-summarize", {}), ("dera-corrupt", {"corruption_level": 3})])
def test_gptf1_typed_scores_per_arm_and_section(tmp_path, name, options):
    study, s = settings_for(name, tmp_path, options=options, limit=2)
    outcome, _ = run(study, s, dialogue_backend(SUMMARY_SECTIONS))
    assert outcome.exit_code == 0
    out = Path(s.out)
    new = records(out)
    for r in new.values():
        g = grades(r)
        assert {n.split("/")[1] for n in g} == set(r["gptf1"]) and all(n.startswith("gptf1/") for n in g)
        for arm, v in r["gptf1"].items():
            assert g[f"gptf1/{arm}"].value == v["average"] and g[f"gptf1/{arm}"].judge["model"] == s.roles["judge"]
            for sec, x in v["sections"].items():
                assert g[f"gptf1/{arm}/{sec}"].value == ({m: x[m] for m in PRF} if x["scored"] else None)
    as_before(out)
    assert {r["id"]: r["scores"] for r in registry.open_run(out).finished} == {i: r["scores"] for i, r in new.items()}


def test_review_items_and_ask_send_only_the_judge_request(tmp_path, no_bertscore):
    study, s, out = qa_run(tmp_path, limit=1)
    rec = next(iter(records(out).values()))
    # review: as before typed scores, one item per question and arm, the judge's verdict and what it was shown
    exact = load_judge(out, "llm-exact")
    assert [(i["id"], i["verdict"]) for i in exact["items"]] == [(f"{rec['id']}|oneshot", 1), (f"{rec['id']}|dera", 1)]
    assert exact["items"][1]["show"] == {"question": rec["question"], "gold answer": rec["gold_text"], "prediction": rec["answers"]["dera"]}
    assert [i["verdict"] for i in load_judge(out, "llm-similarity")["items"]] == [0.8, 0.8]

    sent = []

    def other(role, content, gen):  # another judge model: disagrees on both
        sent.append(role)
        return "False\nA different drug." if "Answer 1" in content[-1]["content"] else "0.25"

    s2 = s.model_copy(update={"roles": {**s.roles, "judge": "other-judge"}})
    for step, value, reply in (("llm-exact", 0, "False\nA different drug."), ("llm-similarity", 0.25, "0.25")):
        ctx = CaseContext(ScriptedLLM(other, roles=ROLES), rec["id"])
        g = asyncio.run(QA_RESULTS.judge(step).ask(ctx, rec, "dera", s2, "judge"))
        assert (g.value, g.explanation, g.answer, g.judge["model"]) == (value, reply, rec["answers"]["dera"], "other-judge")
        first = next(c for c in rec["calls"] if c["step"] == ctx.calls[0]["step"])  # the run's own request of this judge
        assert [c["step"] for c in ctx.calls] == [first["step"]] and ctx.calls[0]["messages"] == first["messages"]
        assert ctx.calls[0]["gen"] == first["gen"]
    assert sent == ["judge", "judge"]  # no decider or researcher request
    nothing = {**rec, "answers": {**rec["answers"], "dera": None}}  # no answer: nothing to ask
    ctx = CaseContext(ScriptedLLM(other, roles=ROLES), rec["id"])
    assert asyncio.run(QA_RESULTS.judge("llm-exact").ask(ctx, nothing, "dera", s2, "judge")).value == 0 and not ctx.calls
