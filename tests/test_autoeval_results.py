"""The rubric auto-evaluation on the results contract: a record's typed score ``rubric/<criterion>`` is its rating (and
nothing else restates it), a folder written before typed scores (the verdict's fields instead) reads the same through
``registry.open_run``, the review's items keep their ids, and the rubric judge asked again over a stored dialogue
sends only the two judge steps (explain, rate)."""

from __future__ import annotations

import asyncio
import json

from experiments.studies.autoeval.judge import PROMPTS
from experiments.studies.autoeval.scorers import RUBRIC
from experiments.common.grade import grades
from experiments.core import registry
from experiments.core.study import CaseContext
from experiments.tools.review.judges import load_judge
from tests.scripted import ScriptedLLM
from tests.test_autoeval_runner import SCRIPT, Judge, records, run, settings


def test_rubric_scores_review_and_ask(tmp_path):
    out = tmp_path / "ae"
    s = settings(out)
    assert run(s, Judge()).exit_code == 0
    new = records(out)
    for r in new.values():
        g = grades(r)
        assert list(g) == [f"rubric/{r['inputs']['criterion']}"]
        one = g[f"rubric/{r['inputs']['criterion']}"]
        assert "rating" not in r and "raw" not in r and one.answer == r["case_id"]
        assert one.value == {SCRIPT["burning feeling"]: 4, SCRIPT["suddenly weak"]: 1, SCRIPT["lung cancer"]: None}[one.explanation]
        assert one.judge == {"model": "scripted", "prompt_hash": PROMPTS.hash("explain", "example", "rate")}
    assert [grades(r)["rubric/welfare"].value for i, r in new.items() if i.startswith("case-004") and i.endswith("welfare")] == [None]

    # a folder written before typed scores: the same scores through the one reader
    def older(r):  # the verdict's fields beside the rest, no scores, no typed record
        g = grades(r)[f"rubric/{r['inputs']['criterion']}"]
        return {"id": r["id"], "source_id": r["case_id"], "criterion": r["inputs"]["criterion"], "judge": "scripted", "status": "ok",
                "rating": g.value, "scored": g.scored, "raw": g.explanation, "explanation": g.metadata.get("notes"),
                "parse_error": g.metadata.get("parse_error"), "finish_reason": g.metadata.get("finish_reason"),
                "dialogue_chars": g.metadata["dialogue_chars"], "dialogue_truncated": g.metadata["dialogue_truncated"]}

    lines = [json.dumps(older(r)) for r in new.values()]
    (out / "records.jsonl").write_text("\n".join(lines) + "\n")
    ident = json.loads((out / "identity.json").read_text())
    ident.pop("records_schema")
    (out / "identity.json").write_text(json.dumps(ident))
    old = registry.open_run(out)
    upgraded = {r["id"]: r["scores"] for r in old.finished}
    for i, r in new.items():  # the same grades (the dialogue's length, which the older record kept beside them, aside)
        strip = lambda sc: {k: {**g, "metadata": {m: v for m, v in g.get("metadata", {}).items() if not m.startswith("dialogue_")}} for k, g in sc.items()}  # noqa: E731
        assert strip(upgraded[i]) == strip(r["scores"])
    assert old.schema == 1 and all(r["inputs"]["criterion"] and r["case_id"] for r in old.finished)

    # review: one item per rated record, its id the record's, what the judge saw
    j = load_judge(out, "rubric")
    rated = {i: v for i, r in new.items() if (v := grades(r)[f"rubric/{r['inputs']['criterion']}"].value) is not None}
    assert {i["id"]: i["verdict"] for i in j["items"]} == rated and j["scale"]["values"] == [1, 2, 3, 4, 5]
    item = next(i for i in j["items"] if i["id"] == "case-001/trial-0::empathy")
    assert item["stratum"] == "4|empathy" and item["show"]["criterion"] == "Showing Empathy" and item["show"]["dialogue"]

    # ask: another judge over the stored dialogue, step (a) then step (b); nothing else is sent
    rec = new["case-001/trial-0::empathy"]
    other = Judge(script={"burning feeling": "Good: fine\nBad: curt\nSummary: so-so\nRating: 2"})
    ctx = CaseContext(ScriptedLLM(other, roles=("judge",)), rec["id"])
    g = asyncio.run(RUBRIC.run(ctx, rec, s.model_copy(update={"roles": {"judge": "judge-2"}, "out": str(tmp_path / "other")}), "judge"))["rubric/empathy"]
    assert (g.value, g.judge["model"], g.metadata["notes"]["bad"]) == (2, "judge-2", "curt")
    assert [c["step"] for c in ctx.calls] == ["rate"] and {c["role"] for c in ctx.calls} == {"judge"}  # step (a) is the folder's, logged there
    assert other.calls == {"explain": 5, "rate": 1} and len((tmp_path / "other" / "explained_examples.jsonl").read_text().splitlines()) == 5
    assert ctx.calls[-1]["messages"] == rec["calls"][0]["messages"]  # the run's own rating request, word for word
