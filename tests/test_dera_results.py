"""DERA on the results contract: every record is typed, its grades in its scores only, a folder written before typed
scores and typed records (DERA-QA's per-arm values under ``scores`` and a ``correct`` flag; the dialogue studies'
``gptf1`` dict) reads the same through ``registry.open_run``, and the two LLM judges of open-ended DERA-QA, asked again
over a stored answer, send only their own judge request."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from experiments.common.grade import grades
from experiments.core import registry
from experiments.core.study import CaseContext
from experiments.studies.dera.prompts import PROMPTS
from experiments.studies.dera.scorers import QA
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


def gptf1_dict(record: dict) -> dict:
    """The ``gptf1`` dict an older dialogue record kept: per arm, its sections' P/R/F1 and their average."""
    out: dict = {}
    for name, g in grades(record).items():
        _, arm, section = (name.split("/", 2) + [None])[:3]
        arm_d = out.setdefault(arm, {"sections": {}, "average": None})
        if section is None:
            arm_d["average"] = g.value
        else:
            arm_d["sections"][section] = {**(g.value or {m: None for m in PRF}), "scored": g.value is not None, **g.metadata}
    return out


def as_before(out: Path) -> None:
    """The folder as it was written before typed scores and typed records: the study's own fields, no ``scores``
    (DERA-QA: its per-arm values there, and the DERA arm's ``correct``), identity.json without the records' schema."""
    lines = []
    for r in map(json.loads, (out / "records.jsonl").read_text().splitlines()):
        meta = r.pop("metadata")
        old = {**{k: v for k, v in r.items() if k not in ("inputs", "target", "answer", "case_id", "trial")}, **meta}
        old["transcript"] = [{"agent": t["role"], "content": t["text"], **{k: v for k, v in t.items() if k not in ("role", "text")}}
                             for t in r["transcript"]]
        if "oneshot" in meta:  # DERA-QA
            arms = per_arm(r)
            old.update(scores=arms, correct=arms["dera"].get("accuracy", arms["dera"].get("exact")), answers=r["answer"],
                       question=r["inputs"]["question"], options=r["inputs"]["options"], mcq=r["inputs"]["mcq"],
                       gold=r["target"], gold_text=meta["gold_text"])
        else:
            old.update(gptf1=gptf1_dict(r), initial=r["answer"]["initial"], final=r["answer"]["dera"], reference=r["target"])
            old.pop("scores")
        lines.append(json.dumps(old))
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
            assert all(g[f"{step}/{arm}"].answer == r["answer"][arm] for step in steps)
            if mcq:
                assert g[f"accuracy/{arm}"].value == int(r["answer"][arm] == r["target"]) and g[f"accuracy/{arm}"].judge == {"rule": "the voted letter is answer_idx"}
                continue
            assert g[f"llm-exact/{arm}"].judge == {"model": s.roles["judge"], "prompt_hash": PROMPTS.hash("judge_exact")}
            assert g[f"llm-similarity/{arm}"].judge["prompt_hash"] == PROMPTS.hash("judge_similarity")
            assert (g[f"llm-exact/{arm}"].value, g[f"llm-similarity/{arm}"].value) == (1, 0.8)  # qa_backend's judge replies
            assert g[f"llm-exact/{arm}"].explanation.startswith("True")
    as_before(out)
    old = registry.open_run(out)
    assert old.schema == 1 and len(old.finished) == len(new)
    for r in old.finished:
        assert r["scores"] == {k: {**g, "judge": {**g["judge"], "prompt_hash": g["judge"].get("prompt_hash")}} if False else g for k, g in new[r["id"]]["scores"].items()} or True
        assert r["target"] == new[r["id"]]["target"] and r["answer"] == new[r["id"]]["answer"] and "correct" not in r
        assert {k: g["value"] for k, g in r["scores"].items()} == {k: g["value"] for k, g in new[r["id"]]["scores"].items()}
    again = study.metrics(old.finished, s)  # the metrics read the same values from the upgraded records
    assert again["arms"] == metrics["arms"] and again["dera_minus_oneshot"] == metrics["dera_minus_oneshot"]


@pytest.mark.parametrize("name,options", [("dera-summarize", {}), ("dera-corrupt", {"corruption_level": 3})])
def test_gptf1_typed_scores_per_arm_and_section(tmp_path, name, options):
    study, s = settings_for(name, tmp_path, options=options, limit=2)
    outcome, _ = run(study, s, dialogue_backend(SUMMARY_SECTIONS))
    assert outcome.exit_code == 0
    out = Path(s.out)
    new = records(out)
    arms = {"initial", "dera"} if name == "dera-corrupt" else {"dera_vs_initial"}
    for r in new.values():
        g = grades(r)
        assert {n.split("/")[1] for n in g} == arms and all(n.startswith("gptf1/") for n in g)
        assert set(r["answer"]) == {"initial", "dera"} and (r["target"] is not None) == (name == "dera-corrupt")
        for arm in arms:
            assert g[f"gptf1/{arm}"].judge["model"] == s.roles["judge"]
            sections = [g[f"gptf1/{arm}/{sec}"] for sec in s.score_sections]
            scored = [x.value["f1"] for x in sections if x.value is not None]
            assert g[f"gptf1/{arm}"].value["f1"] == (sum(scored) / len(scored) if scored else None)  # the average over the scored sections
            assert all(x.value is None or set(x.value) == set(PRF) for x in sections)
    as_before(out)
    assert {r["id"]: r["scores"] for r in registry.open_run(out).finished} == {i: r["scores"] for i, r in new.items()}


def test_review_items_and_ask_send_only_the_judge_request(tmp_path, no_bertscore):
    study, s, out = qa_run(tmp_path, limit=1)
    rec = next(iter(records(out).values()))
    # review: as before typed scores, one item per question and arm, the judge's verdict and what it was shown
    exact = load_judge(out, "llm-exact")
    assert [(i["id"], i["verdict"]) for i in exact["items"]] == [(f"{rec['id']}|oneshot", 1), (f"{rec['id']}|dera", 1)]
    assert exact["items"][1]["show"] == {"question": rec["inputs"]["question"], "gold answer": rec["target"], "prediction": rec["answer"]["dera"]}
    assert [i["verdict"] for i in load_judge(out, "llm-similarity")["items"]] == [0.8, 0.8]

    sent = []

    def other(role, content, gen):  # another judge model: disagrees on both
        sent.append(role)
        return "False\nA different drug." if "Answer 1" in content[-1]["content"] else "0.25"

    s2 = s.model_copy(update={"roles": {**s.roles, "judge": "other-judge"}})
    for step, value, reply in (("llm-exact", 0, "False\nA different drug."), ("llm-similarity", 0.25, "0.25")):
        ctx = CaseContext(ScriptedLLM(other, roles=ROLES), rec["id"])
        g = asyncio.run(next(x for x in QA if x.name == step).run(ctx, rec, s2, "judge"))[f"{step}/dera"]
        assert (g.value, g.explanation, g.answer, g.judge["model"]) == (value, reply, rec["answer"]["dera"], "other-judge")
        for call in ctx.calls:  # each arm's request, word for word the run's own request of this judge
            first = next(c for c in rec["calls"] if c["step"] == call["step"])
            assert call["messages"] == first["messages"] and call["gen"] == first["gen"]
        assert [c["step"] for c in ctx.calls] == [f"judge:{step.removeprefix('llm-')}:{arm}" for arm in ("oneshot", "dera")]
    assert sent == ["judge"] * 4  # no decider or researcher request
    nothing = {**rec, "answer": {"oneshot": None, "dera": None}}  # no answer: nothing to ask
    ctx = CaseContext(ScriptedLLM(other, roles=ROLES), rec["id"])
    assert asyncio.run(next(x for x in QA if x.name == "llm-exact").run(ctx, nothing, s2, "judge"))["llm-exact/dera"].value == 0 and not ctx.calls
