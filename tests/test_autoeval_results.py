"""The rubric auto-evaluation on the results contract: a record's typed score ``rubric/<criterion>`` is its rating (and
nothing else restates it), folders written in the older shapes read as the same typed records through
``registry.open_run``, the review's items keep their ids and show what the judge saw, and the rubric judge asked again
over a stored dialogue sends only the two judge steps (explain, rate), through the record's call log."""

from __future__ import annotations

import asyncio
import json
import shutil

from experiments.studies.autoeval.judge import PROMPTS
from experiments.studies.autoeval.scorers import RUBRIC
from experiments.common.grade import grades
from experiments.core import registry
from experiments.core.scorers import review_items
from experiments.core.study import CaseContext
from experiments.tools.review.judges import load_judge
from tests.scripted import ChatStub, ScriptedLLM, serve_stub
from tests.test_autoeval_runner import FIX, SCRIPT, Judge, records, run, settings


RUNNER = ("status", "calls", "usage", "roles", "served_dtype", "seconds", "answer_formats", "protocol")


def test_rubric_scores_review_and_ask(tmp_path):
    out = tmp_path / "ae"
    s = settings(out)
    assert run(s, Judge()).exit_code == 0
    new = records(out)
    for r in new.values():
        g = grades(r)
        assert list(g) == [f"rubric/{r['inputs']['criterion']}"]
        one = g[f"rubric/{r['inputs']['criterion']}"]
        assert "rating" not in r and "raw" not in r and one.answer == r["inputs"]["source_id"]
        assert one.value == {SCRIPT["burning feeling"]: 4, SCRIPT["suddenly weak"]: 1, SCRIPT["lung cancer"]: None}[one.explanation]
        assert one.judge == {"model": "scripted", "prompt_hash": PROMPTS.hash("explain", "example", "rate")}
    assert [grades(r)["rubric/welfare"].value for i, r in new.items() if i.startswith("case-004") and i.endswith("welfare")] == [None]

    # folders written in the two older shapes read as the same typed records through the one reader (the dialogue, its
    # case and the criterion's definitions read again from the run's data and criteria)
    def older(r, typed_scores: bool):
        """1: the verdict's fields beside the rest, no scores; 2: the typed score beside the study's fields"""
        g = grades(r)[f"rubric/{r['inputs']['criterion']}"]
        fields = {"id": r["id"], "source_id": r["inputs"]["source_id"], "criterion": r["inputs"]["criterion"], "criterion_name": r["inputs"]["criterion_name"],
                  "judge": "scripted", "model": "embedded", "correct": 1, "status": "ok", "examples_used": r["metadata"]["examples_used"],
                  "turns": r["metadata"]["turns"], "prompt_hash": "0123456789abcdef", "finish_reason": g.metadata.get("finish_reason"),
                  "dialogue_chars": g.metadata["dialogue_chars"], "dialogue_truncated": g.metadata["dialogue_truncated"]}
        if typed_scores:
            kept = {k: v for k, v in g.metadata.items() if k not in ("dialogue_chars", "dialogue_truncated", "finish_reason")}
            return {**fields, "scores": {f"rubric/{r['inputs']['criterion']}": {**g.to_json(), "metadata": kept}}}
        return {**fields, "rating": g.value, "scored": g.scored, "raw": g.explanation, "explanation": g.metadata.get("notes"),
                "parse_error": g.metadata.get("parse_error")}

    typed = {i: {k: v for k, v in r.items() if k not in RUNNER} for i, r in new.items()}
    for typed_scores in (False, True):
        old_dir = tmp_path / f"old{int(typed_scores)}"
        shutil.copytree(out, old_dir)
        (old_dir / "records.jsonl").write_text("".join(json.dumps(older(r, typed_scores)) + "\n" for r in new.values()))
        ident = json.loads((old_dir / "identity.json").read_text())
        ident.pop("records_schema")
        (old_dir / "identity.json").write_text(json.dumps(ident))
        old = registry.open_run(old_dir)
        assert old.schema == 1 and {r["id"]: {k: v for k, v in r.items() if k not in RUNNER} for r in old.finished} == typed

    # review: one item per rated record, its id the record's, what the judge saw
    j = load_judge(out, "rubric")
    rated = {i: v for i, r in new.items() if (v := grades(r)[f"rubric/{r['inputs']['criterion']}"].value) is not None}
    assert {i["id"]: i["verdict"] for i in j["items"]} == rated and j["scale"]["values"] == [1, 2, 3, 4, 5]
    item = next(i for i in j["items"] if i["id"] == "case-001/trial-0::empathy")
    assert item["stratum"] == "4|empathy" and item["show"]["criterion"] == "Showing Empathy" and item["show"]["dialogue"][0].startswith("doctor: Hello")
    assert set(item["show"]) == {"criterion", "a 5 means", "a 1 means", "dialogue"}  # what the judge was shown, no verdict

    # asked again over the stored record (a rescore): step (a) then step (b), all through the record's own call log
    rec = new["case-001/trial-0::empathy"]
    other = Judge(script={"burning feeling": "Good: fine\nBad: curt\nSummary: so-so\nRating: 2"})
    ctx = CaseContext(ScriptedLLM(other, roles=("judge",)), rec["id"])
    before = (out / "explained_examples.jsonl").read_text()
    g = asyncio.run(RUBRIC.run(ctx, rec, s.model_copy(update={"roles": {"judge": "judge-2"}}), "judge"))["rubric/empathy"]
    assert (g.value, g.judge["model"], g.metadata["notes"]["bad"]) == (2, "judge-2", "curt")
    assert [c["step"] for c in ctx.calls] == ["explain"] * 5 + ["rate"] and {c["role"] for c in ctx.calls} == {"judge"}
    assert other.calls == {"explain": 5, "rate": 1} and (out / "explained_examples.jsonl").read_text() == before  # the run's folder untouched
    assert ctx.calls[-1]["messages"] == rec["calls"][0]["messages"]  # the run's own rating request, word for word


class _Rater(ChatStub):
    """An OpenAI-shaped judge: explains any known rating; rates a dialogue with a doctor who says sorry 5, others 2."""

    def answer(self, body: dict) -> str:
        prompt = body["messages"][-1]["content"]
        if "=== New dialogue ===" not in prompt:
            return "Good: listens\nBad: brief\nSummary: as rated"
        return "Good: kind\nBad: none\nSummary: warm\nRating: " + ("5" if "sorry" in prompt.split("=== New dialogue ===", 1)[1] else "2")


def test_a_run_its_rescore_and_review_through_the_command_line(cli, tmp_path):
    """The rubric scorer in a run, asked again by `rescore` (step (a) and step (b) per record, through its call log; the
    source folder never written), and `review`'s items of both judges."""
    srv = serve_stub(_Rater)
    judge = f"embedded@http://127.0.0.1:{srv.server_address[1]}/v1"
    try:
        run_dir, re_dir = tmp_path / "run", tmp_path / "re"
        cli("autoeval", str(FIX / "results"), "--judge-model", judge, "--criteria", "empathy", "--out", str(run_dir), check=True)
        ran = records(run_dir)
        assert {i: grades(r)["rubric/empathy"].value for i, r in ran.items()} == \
            {"case-001/trial-0::empathy": 5, "case-002/trial-0::empathy": 2, "case-004/trial-0::empathy": 2}
        assert all([c["step"] for c in r["calls"]] == ["rate"] for r in ran.values())  # step (a) was the run's set-up
        before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
        cli("rescore", str(run_dir), "--judge", "rubric", "--judge-model", judge, "--out", str(re_dir), check=True)
        assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
        again = records(re_dir)
        for i, r in again.items():
            g = grades(r)
            assert g["rubric/empathy@embedded"].value == g["rubric/empathy"].value == ran[i]["scores"]["rubric/empathy"]["value"]
            assert [c["step"] for c in r["calls"]] == ["explain"] * 5 + ["rate"] and r["calls"][-1]["messages"] == ran[i]["calls"][0]["messages"]
        assert not (re_dir / "explained_examples.jsonl").exists()
        # review: the run's judge and the rescore's, one item per rated record, what the judge was shown
        for folder, by in ((run_dir, None), (re_dir, "embedded")):
            opened = registry.open_run(folder)
            scale, items = review_items(RUBRIC, opened.finished, opened.config, by=by)
            assert scale.kind == "rating" and len(items) == 3 and {i["verdict"] for i in items} == {5, 2}
            assert all(i["show"]["criterion"] == "Showing Empathy" and i["show"]["dialogue"] for i in items)
    finally:
        srv.shutdown()
