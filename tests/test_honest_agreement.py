"""Panels and agreement, worked by hand: a binary panel needs a majority of all its members, an ordinal mean is put on
the scale by one rule (review and rescore alike), agreement leaves out the items a rule decided and counts them, a
rescored run repeats its source's deviations, the review page never shows a rescore judge's label, and every JSON
results file is strict (NaN written null and counted)."""

from __future__ import annotations

import json

import pytest

from experiments.common.grade import Grade
from experiments.common.grade import BINARY, RATING, UNIT, count_scale
from experiments.core.scorers import Scorer, by_judge, on_scale, panel_grade, review_items
from experiments.core.results import RunDir, finite, strict_json
from experiments.tools.rescore.run import agreement
from experiments.tools.review.judges import load_judge
from experiments.tools.review.labels import read_labels, sample_tag, write_sample
from experiments.tools.review.page import page_data, render_page
from test_rescore import REF, rescore, toy  # noqa: F401 - the toy fixture

M = {"model": "m"}
RULE = {"rule": "no answer"}


def g(value, judge=M) -> Grade:
    return Grade(value=value, judge=judge)


@pytest.mark.parametrize("values, expected", [
    ([1, 1, None], 1),        # 2 of 3 members: a majority of all
    ([1, 0, None], None),     # 1 of 3: the unreadable member counts against both values
    ([1, None, None], None),  # one member alone never decides
    ([1, None], None),        # 1 of 2: no majority
    ([0, 0, 1], 0),
    ([1, 0], None),           # a tie
    ([None, None], None),
])
def test_a_binary_panel_needs_a_majority_of_all_members(values, expected):
    p = panel_grade([g(v) for v in values], ordinal=False)
    assert p.value == expected and p.judge == {"model": "panel", "rule": "majority"}
    assert [m["value"] for m in p.metadata["members"]] == values


def test_an_ordinal_panel_is_the_mean_of_those_that_scored_and_a_rule_stays_a_rule():
    assert panel_grade([g(2), g(3), g(None)], ordinal=True).value == 2.5
    p = panel_grade([g(0, RULE), g(0, RULE)], ordinal=False)  # every member decided by the rule: so is the panel
    assert p.value == 0 and p.judge == RULE and not by_judge(p)
    assert by_judge(g(1)) and by_judge(Grade(value=1)) and not by_judge(g(0, RULE))
    assert by_judge(g(1, {"model": "panel", "rule": "majority"}))


def test_one_rule_puts_a_mean_on_the_scale():
    # nearest point; halfway goes up
    assert [on_scale(v, RATING) for v in (1.0, 2.5, 3.3333, 3.5, 3.6667, 4.49, 5.0)] == [1, 3, 3, 4, 4, 4, 5]
    assert [on_scale(v, count_scale(3)) for v in (0.5, 1.4999, 2.5)] == [1, 1, 3]
    assert on_scale(1.0, BINARY) == 1 and on_scale(0.0, BINARY) == 0
    assert on_scale(0.37, UNIT) == 0.37
    # review uses it: a panel's mean 2.5 is reviewed as 3 (int() truncated it to 2); a rescore judge's grade that a
    # rule decided (it was never asked) is no item
    judge = Scorer("rate", RATING, "How good?", role="judge")
    recs = [{"id": "a", "scores": {"rate@panel": {"value": 2.5, "judge": M}}},
            {"id": "b", "scores": {"rate@panel": {"value": 3.6667, "judge": M}}},
            {"id": "c", "scores": {"rate@panel": {"value": 1, "judge": RULE}}}]
    _, items = review_items(judge, recs, {}, by="panel")
    assert [(it["id"], it["verdict"]) for it in items] == [("a", 3), ("b", 4)]


def test_agreement_leaves_out_what_a_rule_decided_and_counts_it():
    judge = Scorer("match", BINARY, "Match?", role="judge")
    own = {("1", "x"): g(1), ("2", "x"): g(0, RULE), ("3", "x"): g(0), ("4", "x"): g(1), ("5", "x"): g(None), ("6", "x"): g(1, RULE)}
    new = {("1", "x"): g(1), ("2", "x"): g(0, RULE), ("3", "x"): g(1), ("4", "x"): g(1), ("5", "x"): g(1), ("6", "x"): g(0)}
    a = agreement(own, new, judge)
    # items 1, 3, 4, 6 (item 2: both 0 by rule, no judge decided it, left out; item 5: unscored by the run's judge;
    # item 6: a rule on one side, a judge on the other, kept): 2 of 4 agree
    assert a["n"] == 4 and a["by_rule"] == 1 and a["percent_agreement"] == 50.0 and a["mean_abs_diff"] == 0.5
    # a panel's means on the scale by on_scale: 2.5 -> 3 against 2 (differ), 3.5 -> 4 against 4 (agree); the difference is the mean's
    rated = agreement({("1", None): g(2), ("2", None): g(4)}, {("1", None): g(2.5), ("2", None): g(3.5)}, Scorer("rate", RATING, "?", role="judge"))
    assert (rated["n"], rated["percent_agreement"], rated["mean_abs_diff"], rated["kappa_kind"]) == (2, 50.0, 0.5, "linear-weighted")


def test_strict_json_writes_null_and_counts_what_was_empty(tmp_path):
    empty: list[str] = []
    clean = finite({"a": float("nan"), "b": [1.0, float("inf"), {"c": -float("inf")}], "d": 0.5, "e": None}, empty)
    assert clean == {"a": None, "b": [1.0, None, {"c": None}], "d": 0.5, "e": None} and empty == ["a", "b.1", "b.2.c"]
    assert strict_json({"x": float("nan")}) == '{"x": null}'
    d = RunDir(tmp_path / "run", {"experiment": "x"})
    d.write_metrics({"accuracy": {"mean": float("nan"), "n": 0}, "f1": 0.25})
    text = (tmp_path / "run" / "metrics.json").read_text()
    m = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert m["accuracy"] == {"mean": None, "n": 0} and m["f1"] == 0.25
    assert m["null_metrics"] == {"count": 1, "where": ["accuracy.mean"]}
    d.write_metrics({"f1": 0.25})
    assert "null_metrics" not in json.loads((tmp_path / "run" / "metrics.json").read_text())
    d.append({"id": "r1", "score": float("nan")})
    assert json.loads((tmp_path / "run" / "records.jsonl").read_text()) == {"id": "r1", "score": None}


def test_a_rescored_run_repeats_its_sources_deviations(toy, tmp_path):  # noqa: F811
    app, src, sent, script = toy
    m = json.loads((src / "metrics.json").read_text())
    m["deviations"] = ["sampling.temperature: ours 0.7, the authors' 0"]
    (src / "metrics.json").write_text(json.dumps(m))
    assert rescore(app, src, "--judge", "match", "--judge-model", f"other={REF}", "--out", tmp_path / "r2").exit_code == 0
    assert json.loads((tmp_path / "r2" / "metrics.json").read_text())["deviations"] == m["deviations"]
    summary = (tmp_path / "r2" / "summary.md").read_text()
    assert "unlike the authors' (docs/protocols.md): 1 — sampling.temperature: ours 0.7, the authors' 0." in summary
    assert "none differs" not in summary


def test_the_review_page_never_names_the_rescore_judge(toy, tmp_path):  # noqa: F811
    app, src, sent, script = toy
    out = tmp_path / "r2"
    assert rescore(app, src, "--judge", "match", "--judge-model", f"secretmodel={REF}", "--out", out).exit_code == 0
    j = load_judge(out, "match@secretmodel")
    s = write_sample(out, j, 3, 0)
    items = {it["id"]: it for it in j["items"]}
    for mode in ("file", "server"):
        page = render_page(page_data(out, {**s, "scale": j["scale"]}, items, "ann", mode, "tok"))
        assert "secretmodel" not in page and "embedded" not in page and "<title>medstack review: judge match</title>" in page
    # a line downloaded from that page (the step and the sample's tag) is read as the rescore judge's label
    f = tmp_path / "ann.jsonl"
    f.write_text(json.dumps({"judge": "match", "n": 2, "sample": sample_tag(s), "label": 1, "reviewer": "ann"}) + "\n")
    assert list(read_labels(f, out)["ann"]) == [("match@secretmodel", s["items"][1]["id"])]


def test_a_rescore_says_how_many_items_no_judge_decided(toy, tmp_path):  # noqa: F811
    """A toy record whose p2 the run's own judge left to a rule, and the new judge's ask too: left out, and said."""
    app, src, sent, script = toy
    lines = [json.loads(x) for x in (src / "records.jsonl").read_text().splitlines()]
    for r in lines:
        if r["id"] == "c1":
            r["scores"]["match/p2"] = {"value": 0, "source": "no answer", "judge": RULE}
    (src / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    script["judge"] = lambda role, text: "yes"
    assert rescore(app, src, "--judge", "match", "--judge-model", f"other={REF}", "--out", tmp_path / "r2").exit_code == 0
    a = json.loads((tmp_path / "r2" / "metrics.json").read_text())["rescore"]["agreement"]["other"]
    # c1/p2: the run's rule against the new judge's yes -- a judge decided it on one side, so it counts (6 items)
    assert (a["n"], a["by_rule"]) == (6, 0)
    assert "the items no judge decided (a rule on both sides, e.g. 0 for no answer): other 0." in (tmp_path / "r2" / "summary.md").read_text()


def test_deras_metrics_json_of_scores_with_nothing_scored_is_strict(tmp_path):
    """DERA-QA over no finished question: every figure of its scores is null (a mean over nothing, n = 0), never NaN,
    and metrics.json is strict JSON; a NaN that does reach it (a paired difference over nothing) is written null and counted."""
    from experiments.core.scorers import figures
    from experiments.studies.dera.report import qa_metrics
    from experiments.studies.dera.scorers import QA
    from experiments.studies.dera.settings import QASettings

    m = {**qa_metrics([], QASettings(mcq=True)), "scores": [f.json() for f in figures([], QA, names=["accuracy/oneshot", "accuracy/dera"])]}
    assert "NaN" not in json.dumps(m) and [(f["value"], f["low"], f["n"]) for f in m["scores"]] == [(None, None, 0)] * 2
    assert m["dera_minus_oneshot"] == {"accuracy": None}
    m["dera_minus_oneshot"]["accuracy"] = {"mean_diff": float("nan"), "n": 0}
    d = RunDir(tmp_path / "run", {"experiment": "dera-qa"})
    d.write_metrics(m)
    text = (tmp_path / "run" / "metrics.json").read_text()
    written = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert written["scores"][1] == m["scores"][1] and written["dera_minus_oneshot"]["accuracy"]["mean_diff"] is None
    assert written["null_metrics"] == {"count": 1, "where": ["dera_minus_oneshot.accuracy.mean_diff"]}
