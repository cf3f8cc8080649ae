"""`medstack review` and `calibrate --labels` without a browser: the sample, the label files, the blind page
data, the server's key and input checks, the judges of each study, bad input, the report's section.
(The page itself is driven in Chromium in test_review_chromium.py.)"""

from __future__ import annotations

import json
import shutil
import socket
import stat

import pytest

from experiments.calibrate.reviews import calibrate_reviews
from experiments.review.judges import load_judge
from experiments.review.labels import append_label, read_labels, stratified_sample, write_sample
from experiments.review.page import make_app, page_data, render_page
from models.errors import DataError


@pytest.fixture
def run(fixtures_dir, tmp_path):
    d = tmp_path / "craftmd_run"
    shutil.copytree(fixtures_dir / "review" / "craftmd_run", d)
    return d


def test_item_weights_equal_repeating_items():
    from experiments.common.stats import count_agreement, rater_agreement, stratified_bootstrap

    a, b, w = [0, 1, 2, 2], [0, 2, 2, 1], [3, 1, 2, 1]
    rep_a = [x for x, k in zip(a, w) for _ in range(k)]
    rep_b = [y for y, k in zip(b, w) for _ in range(k)]
    weighted, repeated = count_agreement(a, b, 2, weights=w), count_agreement(rep_a, rep_b, 2)
    for k in ("exact_agreement", "mean_abs_diff", "trial_agreement_bound", "weighted_kappa_linear"):
        assert abs(weighted[k] - repeated[k]) < 1e-12, k
    assert weighted["confusion"] == repeated["confusion"] and weighted["n"] == 4
    assert rater_agreement([1, 0], [1, 0], [0, 1], rank=False)["spearman"] is None
    stat = lambda idx: {"mean": sum(a[i] for i in idx) / len(idx)}
    assert stratified_bootstrap(stat, ["x", "x", "y", "y"], n_boot=50) == stratified_bootstrap(stat, ["x", "x", "y", "y"], n_boot=50)


def test_sample_is_stratified_reproducible_and_weighted(run):
    items = load_judge(run, "frq")["items"]
    a, b = stratified_sample(items, 8, 0), stratified_sample(items, 8, 0)
    assert a == b and stratified_sample(items, 8, 1)["items"] != a["items"]
    assert {k: (v["N"], v["n"], v["weight"]) for k, v in a["strata"].items()} == {
        "0|multiturn|embedded": (4, 2, 2.0), "0|vignette|embedded": (2, 2, 1.0), "1|multiturn|embedded": (2, 2, 1.0), "1|vignette|embedded": (4, 2, 2.0)}
    # 10 of 12: two strata are exhausted at 2, the other two take 3 each
    ten = stratified_sample(items, 10, 0)["strata"]
    assert sorted(v["n"] for v in ten.values()) == [2, 2, 3, 3]
    everything = stratified_sample(items, 99, 0)
    assert len(everything["items"]) == 12 and {i["weight"] for i in everything["items"]} == {1.0}


def test_sample_file_written_once_and_another_size_refused(run):
    j = load_judge(run, "frq")
    s = write_sample(run, j, 8, 0)
    path = run / "reviews" / "sample-frq.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE((run / "reviews").stat().st_mode) == 0o700
    assert "verdict" not in path.read_text() and write_sample(run, j, 8, 0) == s
    with pytest.raises(DataError, match="sample-frq.json holds a sample of 8 with seed 0"):
        write_sample(run, j, 6, 0)


def test_page_data_is_blind(run):
    j = load_judge(run, "frq")
    s = write_sample(run, j, 12, 0)
    data = page_data(run, s, {i["id"]: i for i in j["items"]}, "alice", "server")
    assert set(data["items"][0]) == {"id", "show"} and '"correct":' not in json.dumps(data["items"])
    html = render_page(data)
    assert "grade_source" not in html and "</script><" not in html.split('id="review-data">', 1)[1].split("</script>", 1)[0]


def test_labels_last_line_wins_torn_tail_ignored_bad_line_named(run, tmp_path):
    for label in (1, 0):
        append_label(run, "alice", {"judge": "frq", "item": "c1/t0|vignette", "label": label, "skipped": False, "comment": ""})
    f = run / "reviews" / "alice.jsonl"
    with open(f, "a") as fh:
        fh.write('{"judge": "frq", "ite')  # a kill mid-write
    got = read_labels(run / "reviews")
    assert got["alice"][("frq", "c1/t0|vignette")]["label"] == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"judge": "frq"\n{"judge": "frq", "item": "x", "reviewer": "a", "label": 1}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: not valid JSON"):
        read_labels(bad)


def _label_all(run, reviewer, fn, step="frq"):
    s = json.loads((run / "reviews" / f"sample-{step}.json").read_text())
    for it in s["items"]:
        append_label(run, reviewer, {"judge": step, "item": it["id"], "label": fn(it["id"]), "skipped": False, "comment": ""})


def test_weights_undo_the_oversampling(run):
    """Hand-worked in test_review_chromium.py's docstring: over the 12 decisions exact 2/3, kappa 1/3."""
    verdict = {i["id"]: i["verdict"] for i in load_judge(run, "frq")["items"]}
    write_sample(run, load_judge(run, "frq"), 8, 0)
    _label_all(run, "alice", lambda i: 1 if i.endswith("multiturn") else verdict[i])
    r = calibrate_reviews(run, run / "reviews", n_boot=200)
    a = r["reviewers"]["alice"]["vs_judge"]
    assert abs(a["exact_agreement"] - 2 / 3) < 1e-12 and abs(a["weighted_kappa_linear"] - 1 / 3) < 1e-12 and a["weighted"]
    assert "consensus" not in r and (run / "reviews" / "calibration-frq.md").read_text().count("judge vs alice") == 1


def test_count_judge_uses_the_trial_bound(run):
    j = load_judge(run, "frq-count")
    assert {k: v for k, v in j["scale"].items() if k != "question"} == {"kind": "count", "values": [0, 1, 2], "max": 2}
    assert j["scale"]["question"].startswith("How many of these diagnoses")
    assert {i["id"]: i["verdict"] for i in j["items"]} == {"c1|multiturn|embedded": 1, "c1|vignette|embedded": 2, "c2|multiturn|embedded": 1,
                                                            "c2|vignette|embedded": 2, "c3|multiturn|embedded": 0, "c3|vignette|embedded": 0}
    write_sample(run, j, 6, 0)
    _label_all(run, "derm", lambda i: 2 if i.startswith("c1") else 0, step="frq-count")
    r = calibrate_reviews(run, run / "reviews", "frq-count", n_boot=200)["reviewers"]["derm"]["vs_judge"]
    # (derm, judge): c1 (2,1) (2,2), c2 (0,1) (0,2), c3 (0,0) (0,0): |diff| 1,0,1,2,0,0 -> exact 3/6, MAE 4/6,
    # bound mean((2 - |diff|) / 2) = (1 + 2 + 1 + 0 + 2 + 2) / 2 / 6 = 8/12
    assert r["exact_agreement"] == 3 / 6 and r["mean_abs_diff"] == 4 / 6 and abs(r["trial_agreement_bound"] - 8 / 12) < 1e-12


def test_dera_and_autoeval_judges(tmp_path):
    dera = tmp_path / "dera"
    dera.mkdir()
    (dera / "config.yaml").write_text("experiment: dera-qa\n")
    rec = {"id": "q1", "model": "m", "mcq": False, "question": "What causes X?", "gold_text": "Y", "gold": "Y",
           "scores": {"oneshot": {"answer": "Z", "exact": 0, "similarity_raw": 0.2}, "dera": {"answer": "Y", "exact": 1, "similarity_raw": 0.9}}}
    (dera / "records.jsonl").write_text(json.dumps(rec) + "\n")
    ex = load_judge(dera, "llm-exact")
    assert ex["scale"]["kind"] == "binary" and [(i["id"], i["verdict"]) for i in ex["items"]] == [("q1|oneshot", 0), ("q1|dera", 1)]
    assert ex["items"][1]["show"] == {"question": "What causes X?", "gold answer": "Y", "prediction": "Y"}
    sim = load_judge(dera, "llm-similarity")
    assert sim["scale"]["kind"] == "unit" and [i["verdict"] for i in sim["items"]] == [0.2, 0.9]
    write_sample(dera, sim, 2, 0)
    _label_all(dera, "ann", lambda i: 0.5, step="llm-similarity")
    r = calibrate_reviews(dera, dera / "reviews", n_boot=200)["reviewers"]["ann"]["vs_judge"]
    assert abs(r["mean_abs_diff"] - 0.35) < 1e-12

    src = tmp_path / "src"
    src.mkdir()
    (src / "records.jsonl").write_text(json.dumps({"id": "d1", "transcript": [{"agent": "doctor", "content": "Hello"}, {"agent": "patient", "content": "Hi"}]}) + "\n")
    ae = tmp_path / "ae"
    ae.mkdir()
    (ae / "config.yaml").write_text(f"experiment: autoeval\ndata: {src}\n")
    (ae / "records.jsonl").write_text(json.dumps({"id": "d1::empathy", "source_id": "d1", "criterion": "empathy", "rating": 4}) + "\n")
    j = load_judge(ae, "rubric")
    assert j["scale"]["values"] == [1, 2, 3, 4, 5] and j["items"][0]["show"]["dialogue"] == ["doctor: Hello", "patient: Hi"]
    assert j["items"][0]["show"]["a 5 means"] and "rating" not in j["items"][0]["show"]


async def test_server_key_and_input_checks(run):
    from aiohttp.test_utils import TestClient, TestServer

    j = load_judge(run, "frq")
    s = write_sample(run, j, 8, 0)
    app = make_app(run, s, {i["id"]: i for i in j["items"]}, "alice", "s3cret")
    async with TestClient(TestServer(app)) as c:
        assert (await c.get("/")).status == 401
        r = await c.get("/?key=s3cret&reviewer=bob")
        assert r.status == 200 and '"reviewer": "bob"' in await r.text()
        item = s["items"][0]["id"]
        h = {"X-Review-Key": "s3cret"}
        assert (await c.post("/api/label", json={"reviewer": "bob", "item": item, "label": 1})).status == 401
        bad = await c.post("/api/label", json={"reviewer": "bob", "item": item, "label": 7}, headers=h)
        assert bad.status == 400 and "not on the judge's scale" in (await bad.json())["error"]
        assert (await c.post("/api/label", json={"reviewer": "bob", "item": "nope", "label": 1}, headers=h)).status == 400
        assert (await c.post("/api/label", json={"reviewer": "../x", "item": item, "label": 1}, headers=h)).status == 400
        ok = await c.post("/api/label", json={"reviewer": "bob", "item": item, "label": 1, "comment": "fine"}, headers=h)
        assert ok.status == 200
    line = json.loads((run / "reviews" / "bob.jsonl").read_text())
    assert line["item"] == item and line["label"] == 1 and line["comment"] == "fine" and "s3cret" not in json.dumps(line)


def test_cli_bad_input_and_environment(run, cli, fixtures_dir, tmp_path):
    p = cli("review", str(run), "--judge", "rubric", "--sample", "3")
    assert p.returncode == 2 and "--judge rubric: a craftmd run's judge steps are frq, frq-count" in p.stderr and "Traceback" not in p.stderr
    p = cli("review", str(fixtures_dir / "report" / "dera_run"), "--judge", "frq", "--sample", "3")
    assert p.returncode == 2 and "has no judge to review" in p.stderr
    p = cli("review", str(run), "--judge", "frq", "--sample", "3", "--host", "0.0.0.0", env={"MEDSTACK_API_KEY": ""})
    assert p.returncode == 2 and "--host 0.0.0.0 makes the server reachable" in p.stderr
    p = cli("review", str(run), "--judge", "frq", "--sample", "3", "--reviewer", "-x")
    assert p.returncode == 2 and "reviewer name '-x' is not allowed" in p.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        p = cli("review", str(run), "--judge", "frq", "--sample", "3", "--port", str(busy.getsockname()[1]))
    assert p.returncode == 3 and "cannot listen" in p.stderr and "Traceback" not in p.stderr
    p = cli("calibrate", str(run), "--labels", str(tmp_path / "none"))
    assert p.returncode == 2 and "none: no such file or directory" in p.stderr
    (tmp_path / "l.jsonl").write_text(json.dumps({"judge": "frq-count", "item": "c1", "reviewer": "a", "label": 1}) + "\n")
    p = cli("calibrate", str(run), "--labels", str(tmp_path / "l.jsonl"))
    assert p.returncode == 2 and "sample-frq-count.json: no review sample of judge frq-count" in p.stderr


def test_report_shows_the_calibration_beside_the_paper_tables(run, tmp_path):
    from experiments.report.build import build_report

    verdict = {i["id"]: i["verdict"] for i in load_judge(run, "frq")["items"]}
    write_sample(run, load_judge(run, "frq"), 8, 0)
    _label_all(run, "alice", lambda i: 1 if i.endswith("multiturn") else verdict[i])
    _label_all(run, "bob", lambda i: verdict[i])
    calibrate_reviews(run, run / "reviews", n_boot=200)
    html = build_report([str(run)], tmp_path / "r.html").read_text()
    section = html.split('id="section-craftmd"', 1)[1].split("</section>", 1)[0]
    assert "Judge calibration against clinicians" in section and "<td>judge vs alice</td><td>8</td><td>0.667 [0.667, 0.667]</td>" in section
    assert "alice vs bob (inter-rater)" in section and section.index("FRQ accuracy") < section.index("Judge calibration against clinicians")
