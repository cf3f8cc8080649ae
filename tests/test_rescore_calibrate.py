"""A judge panel is one judge for review and calibration: `medstack review RUN2 --judge match@panel` samples the panel's
verdicts (a tie is no item), and `calibrate` holds them against a reviewer's labels. Uses the toy judged study and
the rescore of tests/test_rescore.py; `load_judge`'s ``STEP@JUDGE`` is the generic review's (experiments/tools/review)."""

from __future__ import annotations

import pytest

from experiments.tools.calibrate.reviews import calibrate_reviews
from experiments.common.grade import grades
from experiments.tools.review.judges import load_judge
from experiments.tools.review.labels import append_label, write_sample
from test_rescore import PARTS, REF, records, rescore, toy  # noqa: F401 - the toy fixture


def test_a_panel_is_reviewed_and_calibrated_as_one_judge(toy, tmp_path):  # noqa: F811
    app, src, sent, script = toy
    # a 2:1 panel: c1 matches, c2 and c3 do not; judge3 disagrees on c3 only
    script["judge"] = lambda role, text: "yes" if " c1 " in text or (role == "judge3" and " c3 " in text) else "no"
    out = tmp_path / "panel"
    assert rescore(app, src, "--judge", "match", "--panel", f"a={REF},b={REF},c={REF}", "--out", out).exit_code == 0
    panel = {f"{i}|{p}": grades(rec)[f"match/{p}@panel"].value for i, rec in records(out).items() for p in PARTS}
    j = load_judge(out, "match@panel")
    assert {it["id"]: it["verdict"] for it in j["items"]} == panel and j["scale"]["kind"] == "binary"
    s = write_sample(out, j, 100, 0)
    assert len(s["items"]) == 6
    wrong = "c2|p1"  # the reviewer says c2/p1 matches: 5 of 6 labels agree with the panel
    for it in s["items"]:
        label = 1 - panel[it["id"]] if it["id"] == wrong else panel[it["id"]]
        append_label(out, "ann", {"judge": "match@panel", "item": it["id"], "label": label, "skipped": False, "comment": ""})
    r = calibrate_reviews(out, out / "reviews", "match@panel", n_boot=200)
    vs = r["reviewers"]["ann"]["vs_judge"]
    assert vs["n"] == 6 and vs["exact_agreement"] == pytest.approx(5 / 6)
    assert (out / "reviews" / "calibration-match@panel.json").exists()
