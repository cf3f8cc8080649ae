"""`medstack review` and `calibrate --labels` without a browser: the sample, the label files, the blind page
data, the server's key and input checks, the judges of each study, bad input, the report's section.
(The page itself is driven in Chromium in test_review_chromium.py.)"""

from __future__ import annotations

import json
import re
import shutil
import socket
import stat

import pytest

from experiments.tools.calibrate.reviews import calibrate_reviews
from experiments.tools.review.judges import load_judge
from experiments.tools.review.labels import append_label, read_labels, sample_tag, stratified_sample, write_sample
from experiments.tools.review.page import _hosts, make_app, page_data, render_page
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
    assert set(data["items"][0]) == {"n", "show"} and [i["n"] for i in data["items"]] == list(range(1, 13))
    assert '"correct":' not in json.dumps(data["items"])
    html = render_page(data)
    assert "grade_source" not in html and "</script><" not in html.split('id="review-data">', 1)[1].split("</script>", 1)[0]


def _dera_run(tmp_path):
    """A DERA-QA run whose folder, model and arms are names a reviewer must not see."""
    d = tmp_path / "PLATYPUS-trial-run"
    d.mkdir()
    (d / "config.yaml").write_text("experiment: dera-qa\nname: PLATYPUS-trial-run\nroles: {clinical: medgemma-hidden-27b}\n")
    rows = [{"id": f"q{k}", "model": "medgemma-hidden-27b", "mcq": False, "question": f"What causes finding {k}?", "gold_text": "Y", "gold": "Y",
             "scores": {"oneshot": {"answer": "Z", "exact": 0, "similarity_raw": 0.2}, "dera": {"answer": "Y", "exact": 1, "similarity_raw": 0.9}}}
            for k in range(3)]
    (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


async def test_served_and_exported_pages_name_no_model_arm_run_or_record(run, tmp_path, cli):
    """Blind in fact: the page knows items by number; ids (which carry the model, the arm, the format), the run's
    folder and name appear nowhere in what the server sends or the exported file holds."""
    from aiohttp.test_utils import TestClient, TestServer

    dera = _dera_run(tmp_path)
    cases = [(dera, "llm-exact", ["medgemma-hidden-27b", "oneshot", "dera", "PLATYPUS", "q0|", "q1|"]),
             (run, "frq-count", ["embedded", "craftmd_run", "vignette", "multiturn", "c1|", "c2|"])]
    for rd, step, hidden in cases:
        j = load_judge(rd, step)
        ids = [i["id"] for i in j["items"]]
        assert any(h in "".join(ids) for h in hidden)  # the ids do carry these names
        s = write_sample(rd, j, 100, 0)
        async with TestClient(TestServer(make_app(rd, s, {i["id"]: i for i in j["items"]}, "alice", None))) as c:
            served = await (await c.get("/")).text()
        out = tmp_path / f"{step}.html"
        cli("review", str(rd), "--judge", step, "--sample", "100", "--export", str(out), check=True)
        for page in (served, out.read_text()):
            assert '"n": 1' in page and "<title>medstack review: judge " + step + "</title>" in page
            for name in hidden:
                assert not re.search(re.escape(name) if "|" in name else rf"(?i)\b{re.escape(name)}\b", page), (step, name)
            assert not any(i in page for i in ids)


def test_hostile_text_round_trips_through_the_page_data():
    """for_script: the JSON inside <script> cannot end the element or open a comment, and parses back to the same text."""
    from models.jsontext import for_script

    text = "a <!-- b </script><script>x=1</script> <img src=x onerror=alert(1)> & c \u2028 d \u2029 e --> \ud800"
    out = for_script({"t": text, "<k>": [text]})
    assert not set(out) & {"<", ">", "&", "\u2028", "\u2029"} and out.isascii()
    assert "\\u003c!--" in out and "\\u003c/script\\u003e" in out and "\\u2028" in out
    assert json.loads(out) == {"t": text, "<k>": [text]}


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


# the fixture's 12 grader decisions (tests/test_review_chromium.py), items i1..i12 in this order; judge J:
#   i1  c1/t0|vignette 1   i2  c1/t1|vignette 1   i3  c2/t0|vignette 1    i4  c2/t1|vignette 1    i5  c3/t0|vignette 0    i6  c3/t1|vignette 0
#   i7  c1/t0|multiturn 1  i8  c1/t1|multiturn 0  i9  c2/t0|multiturn 1   i10 c2/t1|multiturn 0   i11 c3/t0|multiturn 0   i12 c3/t1|multiturn 0
ITEMS = ["c1/t0|vignette", "c1/t1|vignette", "c2/t0|vignette", "c2/t1|vignette", "c3/t0|vignette", "c3/t1|vignette",
         "c1/t0|multiturn", "c1/t1|multiturn", "c2/t0|multiturn", "c2/t1|multiturn", "c3/t0|multiturn", "c3/t1|multiturn"]
J = [1, 1, 1, 1, 0, 0, 1, 0, 1, 0, 0, 0]
ALICE = [1, 1, 1, 1, 1, 0, 1, 1, 1, 0, 0, 0]  # J with i5 and i8 flipped
BOB = [0, 1, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0]  # J with i1, i5 and i11 flipped
CAROL = {0: 0, 7: 1, 10: 0}  # the tiebreaker labels only the items alice and bob disagree on: i1, i8, i11


def _two_reviewers(run, carol=False):
    write_sample(run, load_judge(run, "frq"), 12, 0)  # the whole run: every weight N_h/n_h is 1, the plain formulas
    for who, labels in (("alice", ALICE), ("bob", BOB)) + ((("carol", [CAROL.get(k) for k in range(12)]),) if carol else ()):
        for item, v in zip(ITEMS, labels):
            if v is not None:
                append_label(run, who, {"judge": "frq", "item": item, "label": v, "skipped": False, "comment": ""})


def test_two_reviewers_each_inter_rater_and_consensus_with_what_it_set_aside(run):
    """By hand (Cohen's kappa, p_e from the margins; J has six 1s, so any p_e against J is 1/2):
    alice vs J: 10 of 12 agree (i5, i8 differ) -> exact 5/6; alice has eight 1s: p_e = 8/12*6/12 + 4/12*6/12 = 1/2,
                kappa = (5/6 - 1/2) / (1/2) = 2/3.
    bob vs J:   9 of 12 (i1, i5, i11 differ) -> exact 3/4, p_e = 1/2, kappa = (3/4 - 1/2) / (1/2) = 1/2.
    alice vs bob: they differ on i1, i8, i11 -> exact 9/12 = 3/4; margins alice 8/12 ones, bob 7/12 ones:
                p_e = 8/12*7/12 + 4/12*5/12 = 76/144 = 19/36, kappa = (27/36 - 19/36) / (17/36) = 8/17.
    consensus: the 9 items they agree on (3 set aside): i2 1, i3 1, i4 1, i5 1, i6 0, i7 1, i9 1, i10 0, i12 0 against J
                1,1,1,0,0,1,1,0,0: only i5 differs -> exact 8/9; consensus 6/9 ones, J 5/9 ones:
                p_e = 6/9*5/9 + 3/9*4/9 = 42/81 = 14/27, kappa = (24/27 - 14/27) / (13/27) = 10/13.
    The consensus (8/9, 10/13) reads better than either reviewer (5/6, 2/3; 3/4, 1/2): the items set aside are
    where the judge is most often wrong, which is why the count set aside is stated beside it."""
    _two_reviewers(run)
    r = calibrate_reviews(run, run / "reviews", n_boot=200)
    a, b = r["reviewers"]["alice"]["vs_judge"], r["reviewers"]["bob"]["vs_judge"]
    assert (a["n"], a["exact_agreement"], a["weighted"]) == (12, 10 / 12, False) and abs(a["weighted_kappa_linear"] - 2 / 3) < 1e-12
    assert b["n"] == 12 and b["exact_agreement"] == 9 / 12 and abs(b["weighted_kappa_linear"] - 1 / 2) < 1e-12
    (ir,) = r["inter_rater"]
    assert (ir["a"], ir["b"], ir["n"], ir["exact_agreement"]) == ("alice", "bob", 12, 9 / 12) and abs(ir["weighted_kappa_linear"] - 8 / 17) < 1e-12
    c = r["consensus"]
    assert (c["items_all_labelled"], c["majority"], c["tie_broken"], c["set_aside"], c["tiebreak"]) == (12, 9, 0, 3, None)
    assert c["vs_judge"]["n"] == 9 and abs(c["vs_judge"]["exact_agreement"] - 8 / 9) < 1e-12
    assert abs(c["vs_judge"]["weighted_kappa_linear"] - 10 / 13) < 1e-12
    md = (run / "reviews" / "calibration-frq.md").read_text()
    rows = [line.split(" | ")[0].lstrip("| ") for line in md.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows == ["judge vs alice", "judge vs bob", "alice vs bob (inter-rater)",
                    "judge vs consensus of alice, bob (9 of 12 items by majority; 3 set aside for disagreement)"]
    assert "flatters the judge" in md and "--tiebreak NAME" in md


def test_a_third_reviewer_breaks_the_ties(run, cli):
    """carol decides i1 (0), i8 (1), i11 (0); the consensus is then, over all 12 items,
    C = 0,1,1,1,1,0,1,1,1,0,0,0 against J = 1,1,1,1,0,0,1,0,1,0,0,0: i1, i5, i8 differ -> exact 9/12 = 3/4;
    C has seven 1s, J six: p_e = 7/12*6/12 + 5/12*6/12 = 1/2, kappa = (3/4 - 1/2) / (1/2) = 1/2.
    carol vs J on her 3 items: only i11 agrees -> exact 1/3. alice vs bob is unchanged; carol is in no pair."""
    _two_reviewers(run, carol=True)
    p = cli("calibrate", str(run), "--labels", str(run / "reviews"), "--tiebreak", "carol", "--n-boot", "200", check=True)
    assert "judge vs consensus of alice, bob (9 of 12 items by majority; 3 decided by carol; none set aside)" in p.stdout
    r = json.loads((run / "reviews" / "calibration-frq.json").read_text())
    c = r["consensus"]
    assert (c["majority"], c["tie_broken"], c["set_aside"], c["tiebreak"]) == (9, 3, 0, "carol")
    assert c["vs_judge"]["n"] == 12 and c["vs_judge"]["exact_agreement"] == 9 / 12 and abs(c["vs_judge"]["weighted_kappa_linear"] - 1 / 2) < 1e-12
    assert r["reviewers"]["carol"]["tiebreaker"] is True and abs(r["reviewers"]["carol"]["vs_judge"]["exact_agreement"] - 1 / 3) < 1e-12
    assert [(x["a"], x["b"]) for x in r["inter_rater"]] == [("alice", "bob")]
    assert "judge vs carol (tiebreaker)" in p.stdout
    for bad, msg in ((["--tiebreak", "dave"], "--tiebreak dave: no label of judge frq by dave"),):
        q = cli("calibrate", str(run), "--labels", str(run / "reviews"), *bad)
        assert q.returncode == 2 and msg in q.stderr and "Traceback" not in q.stderr
    (run / "reviews" / "bob.jsonl").unlink()
    q = cli("calibrate", str(run), "--labels", str(run / "reviews"), "--tiebreak", "carol")
    assert q.returncode == 2 and "needs two other reviewers" in q.stderr


def test_offline_labels_name_items_by_number_and_sample(run, tmp_path):
    s = write_sample(run, load_judge(run, "frq"), 8, 0)
    tag = sample_tag(s)
    f = tmp_path / "alice.jsonl"
    f.write_text(json.dumps({"judge": "frq", "n": 3, "sample": tag, "label": 1, "skipped": False, "comment": "", "reviewer": "alice"}) + "\n")
    assert list(read_labels(f, run)["alice"]) == [("frq", s["items"][2]["id"])]
    with pytest.raises(DataError, match="read it with the run"):
        read_labels(f)
    f.write_text(json.dumps({"judge": "frq", "n": 3, "sample": "0123456789abcdef", "label": 1, "reviewer": "alice"}) + "\n")
    with pytest.raises(DataError, match=r"alice.jsonl:1: these labels were entered on another sample"):
        read_labels(f, run)
    f.write_text(json.dumps({"judge": "frq", "n": 9, "sample": tag, "label": 1, "reviewer": "alice"}) + "\n")
    with pytest.raises(DataError, match=r"alice.jsonl:1: item number 9 is not in 1..8"):
        read_labels(f, run)


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
    (src / "records.jsonl").write_text(json.dumps({"id": "d1", "case_id": "d1", "inputs": {}, "metadata": {},  # a typed record
                                                   "transcript": [{"role": "doctor", "text": "Hello"}, {"role": "patient", "text": "Hi"}]}) + "\n")
    ae = tmp_path / "ae"
    ae.mkdir()
    (ae / "config.yaml").write_text(f"experiment: autoeval\ndata: {src}\n")
    (ae / "records.jsonl").write_text(json.dumps({"id": "d1::empathy", "source_id": "d1", "criterion": "empathy", "rating": 4}) + "\n")
    j = load_judge(ae, "rubric")
    assert j["scale"]["values"] == [1, 2, 3, 4, 5] and j["items"][0]["show"]["dialogue"] == ["doctor: Hello", "patient: Hi"]
    assert j["items"][0]["show"]["a 5 means"] and "rating" not in j["items"][0]["show"]


def _token(html: str) -> str:
    return json.loads(html.split('id="review-data">', 1)[1].split("</script>", 1)[0])["token"]


async def test_server_key_and_input_checks(run):
    from aiohttp.test_utils import TestClient, TestServer

    j = load_judge(run, "frq")
    s = write_sample(run, j, 8, 0)
    app = make_app(run, s, {i["id"]: i for i in j["items"]}, "alice", "s3cret")
    async with TestClient(TestServer(app)) as c:
        assert (await c.get("/")).status == 401
        r = await c.get("/?key=s3cret&reviewer=bob")
        html = await r.text()
        assert r.status == 200 and '"reviewer": "bob"' in html
        h = {"X-Review-Key": "s3cret", "X-Review-Token": _token(html)}
        assert (await c.post("/api/label", json={"reviewer": "bob", "item": 1, "label": 1}, headers={"X-Review-Token": h["X-Review-Token"]})).status == 401
        bad = await c.post("/api/label", json={"reviewer": "bob", "item": 1, "label": 7}, headers=h)
        assert bad.status == 400 and "not on the judge's scale" in (await bad.json())["error"]
        for nope in ("nope", 0, 9, s["items"][0]["id"], True):  # item numbers 1..8 only: a record id is not one
            assert (await c.post("/api/label", json={"reviewer": "bob", "item": nope, "label": 1}, headers=h)).status == 400
        assert (await c.post("/api/label", json={"reviewer": "../x", "item": 1, "label": 1}, headers=h)).status == 400
        ok = await c.post("/api/label", json={"reviewer": "bob", "item": 1, "label": 1, "comment": "fine"}, headers=h)
        assert ok.status == 200
    line = json.loads((run / "reviews" / "bob.jsonl").read_text())
    # the server writes the record id of item 1 (the sample's first), which the page never saw
    assert line["item"] == s["items"][0]["id"] and line["label"] == 1 and line["comment"] == "fine" and "s3cret" not in json.dumps(line)


async def test_server_takes_writes_only_from_its_own_page(run):
    """No key on loopback, yet: a cross-site form post, a rebinding Host, a missing token or a form body write nothing."""
    from aiohttp.test_utils import TestClient, TestServer

    j = load_judge(run, "frq")
    s = write_sample(run, j, 8, 0)
    labels = run / "reviews" / "alice.jsonl"
    async with TestClient(TestServer(make_app(run, s, {i["id"]: i for i in j["items"]}, "alice", None))) as c:
        here = f"127.0.0.1:{c.port}"
        page = await c.get("/")
        token = _token(await page.text())
        body = json.dumps({"reviewer": "alice", "item": 1, "label": 1})
        # what an evil page's form can send: text/plain, its own Origin, no token (it cannot read ours)
        forged = await c.post("/api/label", data=body, headers={"Content-Type": "text/plain", "Origin": "http://evil.example"})
        assert forged.status == 403 and "evil.example" in (await forged.json())["error"]
        # even with the token (were it leaked), a foreign Origin is refused
        assert (await c.post("/api/label", data=body, headers={"Content-Type": "application/json", "Origin": "http://evil.example",
                                                               "X-Review-Token": token})).status == 403
        assert (await c.post("/api/label", data=body, headers={"Content-Type": "text/plain"})).status == 403  # no Origin, no token
        assert (await c.post("/api/label", data=body, headers={"Content-Type": "text/plain", "X-Review-Token": token})).status == 415
        # DNS rebinding: evil.example resolving to 127.0.0.1; the browser sends Host: evil.example:PORT
        rebound = await c.get("/", headers={"Host": f"evil.example:{c.port}"})
        assert rebound.status == 421 and "psoriasis" not in (await rebound.text()).lower()
        assert (await c.post("/api/label", data=body, headers={"Host": f"evil.example:{c.port}", "Content-Type": "application/json",
                                                               "X-Review-Token": token})).status == 421
        assert (await c.get("/", headers={"Host": "127.0.0.1:1"})).status == 421  # another port
        assert not labels.exists()
        # the page's own request: its token, JSON, its Origin; on loopback also as localhost and [::1]
        for name in (here, f"localhost:{c.port}", f"[::1]:{c.port}"):
            assert (await c.get("/", headers={"Host": name})).status == 200
        own = await c.post("/api/label", data=body, headers={"Content-Type": "application/json", "X-Review-Token": token, "Origin": f"http://{here}"})
        assert own.status == 200
    assert [json.loads(x)["item"] for x in labels.read_text().splitlines()] == [s["items"][0]["id"]]
    # off loopback: the interface's address (a wildcard bind is no name) or the name bound; never localhost
    assert _hosts("0.0.0.0", ("10.1.2.3", 8765)) == {"10.1.2.3:8765"}
    assert _hosts("review.lan", ("10.1.2.3", 8765)) == {"review.lan:8765", "10.1.2.3:8765"}
    assert _hosts("::", ("fe80::1%eth0", 8765, 0, 2)) == {"[fe80::1]:8765"}


def test_cli_bad_input_and_environment(run, cli, fixtures_dir, tmp_path):
    p = cli("review", str(run), "--judge", "rubric", "--sample", "3")
    assert p.returncode == 2 and "--judge rubric: a craftmd run's judge steps are mcq, frq, frq-count, assess-Q1" in p.stderr and "Traceback" not in p.stderr
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
    # a label file saved in Latin-1 ("é" is byte 0xe9): one line naming the file and line, exit 2
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"judge": "frq", "item": "c1/t0|vignette", "reviewer": "a", "label": 1}\n'
                      b'{"judge": "frq", "item": "c1/t1|vignette", "reviewer": "a", "label": 1, "comment": "ecz\xe9ma"}\n')
    p = cli("calibrate", str(run), "--labels", str(latin))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [f"error: {latin}:2: not UTF-8 text (byte 0xe9 at column 88); save the file as UTF-8"]


def test_report_shows_the_calibration_beside_the_paper_tables(run, tmp_path):
    from experiments.tools.report.build import build_report

    verdict = {i["id"]: i["verdict"] for i in load_judge(run, "frq")["items"]}
    write_sample(run, load_judge(run, "frq"), 8, 0)
    _label_all(run, "alice", lambda i: 1 if i.endswith("multiturn") else verdict[i])
    _label_all(run, "bob", lambda i: verdict[i])
    calibrate_reviews(run, run / "reviews", n_boot=200)
    html = build_report([str(run)], tmp_path / "r.html").read_text()
    section = html.split('id="section-craftmd"', 1)[1].split("</section>", 1)[0]
    assert "Judge calibration against clinicians" in section and "<td>judge vs alice</td><td>8</td><td>0.667 [0.667, 0.667]</td>" in section
    assert "alice vs bob (inter-rater)" in section and section.index("FRQ accuracy") < section.index("Judge calibration against clinicians")
