"""The review page driven in real headless Chromium (Playwright driving Debian's `chromium`; `make setup`
installs both, and a missing one FAILS these tests), then `medstack calibrate RUN_DIR --labels` over what was
entered. The page knows items by number only; the test, like a researcher, reads the sample file to know
which record a number is.

Fixture tests/fixtures/review/craftmd_run: 3 cases x 2 trials, FRQ graded in two formats = 12 grader
decisions, strata (verdict | format | model): 1|vignette N=4, 0|vignette N=2, 1|multiturn N=2,
0|multiturn N=4. `--sample 8` takes 2 per stratum (equal allocation), so the weights N_h/n_h are 2, 1, 1, 2.

Reviewer alice says "match" to every multiturn answer and agrees with the grader on every vignette one:
she disagrees exactly on stratum 0|multiturn (the grader said no match). By hand, with the weights
(each item standing for N_h/n_h items of the run, i.e. over the 12 decisions):
  exact agreement = (12 - 4) / 12 = 2/3 (unweighted over the 8 sampled items it would be 6/8)
  MAE (0/1 labels) = 1/3
  Cohen's kappa: table (alice x grader) match/match 4+2 = 6, match/no 4, no/no 2, no/match 0 of 12:
  p_o = 8/12, p_e = (10/12)(6/12) + (2/12)(6/12) = 1/2, kappa = (2/3 - 1/2) / (1/2) = 1/3.
Reviewer bob agrees with the grader everywhere: exact 1, kappa 1; alice vs bob (inter-rater) = alice vs
the grader (2/3, kappa 1/3); their consensus (a label both gave) sets aside alice's 2 disagreements --
on the 6 items left, where both agree with the grader, it reads 1.0, and says so: "2 set aside".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat

import pytest

from scripts.review_relabel import current, enter_all, free_port, item_ids, press_label, start_review, stop, wait_until

VERDICTS = {  # the fixture's grader decisions (what the page must NOT show)
    "c1/t0|vignette": 1, "c1/t1|vignette": 1, "c2/t0|vignette": 1, "c2/t1|vignette": 1, "c3/t0|vignette": 0, "c3/t1|vignette": 0,
    "c1/t0|multiturn": 1, "c1/t1|multiturn": 0, "c2/t0|multiturn": 1, "c2/t1|multiturn": 0, "c3/t0|multiturn": 0, "c3/t1|multiturn": 0,
}


def alice(item: str) -> str:
    return "m" if item.endswith("multiturn") or VERDICTS[item] else "n"


def bob(item: str) -> str:
    return "1" if VERDICTS[item] else "0"


@pytest.fixture
def run(fixtures_dir, tmp_path):
    d = tmp_path / "craftmd_run"
    shutil.copytree(fixtures_dir / "review" / "craftmd_run", d)
    return d


def _labels(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _hand_worked(r):
    a = r["reviewers"]["alice"]["vs_judge"]
    assert a["n"] == 8 and a["weighted"] is True
    assert abs(a["exact_agreement"] - 2 / 3) < 1e-12 and abs(a["mean_abs_diff"] - 1 / 3) < 1e-12
    assert abs(a["weighted_kappa_linear"] - 1 / 3) < 1e-12
    assert a["confusion"] == [[2, 0], [4, 6]]  # rows alice 0/1, columns grader 0/1, in run items (weighted)
    lo, hi = a["ci95"]["exact_agreement"]
    assert lo <= a["exact_agreement"] <= hi


def test_label_reload_kill_two_reviewers_and_calibrate(run, browser, cli, tmp_path):
    port = free_port()
    proc = start_review(run, "frq", 8, "alice", port)
    try:
        sample = json.loads((run / "reviews" / "sample-frq.json").read_text())  # written before the first item
        order = [s["id"] for s in sample["items"]]
        assert len(order) == 8 and {s["weight"] for s in sample["items"]} == {1.0, 2.0}

        page = browser.new_page(viewport={"width": 1100, "height": 800})
        url = f"http://127.0.0.1:{port}/?reviewer=alice"
        page.goto(url)
        page.wait_for_selector('body[data-ready="1"]')
        html = page.content()
        assert "verdict" not in json.dumps(json.loads(page.evaluate("document.getElementById('review-data').textContent"))["items"])  # blind: no verdict, no stratum
        assert "stratum" not in html and not any(i in html for i in order) and current(page) == 1  # items by number only
        for k, item in enumerate(order[:5], 1):
            assert current(page) == k
            press_label(page, alice(item))
        labels_file = run / "reviews" / "alice.jsonl"
        assert len(_labels(labels_file)) == 5 and stat.S_IMODE(labels_file.stat().st_mode) == 0o600

        page.reload()
        page.wait_for_selector('body[data-ready="1"]')
        assert page.evaluate("document.body.dataset.labelled") == "5" and current(page) == 6
        assert page.inner_text("#progress-text").startswith("5 of 8 labelled")
        assert page.evaluate("document.getElementById('bar').style.width") == "62.5%"

        page.keyboard.press("s")  # skip item 6, go back to it, comment, label it
        wait_until(page, 'document.body.dataset.item === "7"')
        page.keyboard.press("b")
        assert current(page) == 6
        page.keyboard.press("c")
        page.keyboard.type("hesitant: subtype?")
        page.keyboard.press("Escape")
        press_label(page, alice(order[5]))
        assert enter_all(page, lambda k: alice(order[k - 1])) == 2
        assert "8 of 8 labelled" in page.inner_text("#progress-text")
        rows = _labels(labels_file)
        assert [r["item"] for r in rows] == order[:6] + [order[5]] + order[6:]
        assert rows[5]["skipped"] is True and rows[6]["label"] in (0, 1) and rows[6]["comment"] == "hesitant: subtype?"

        # a second reviewer, independently, on the same sample; the server is killed half-way
        page2 = browser.new_page()
        page2.goto(f"http://127.0.0.1:{port}/?reviewer=bob")
        page2.wait_for_selector('body[data-ready="1"]')
        assert current(page2) == 1 and page2.evaluate("document.body.dataset.labelled") == "0"
        for item in order[:3]:
            press_label(page2, bob(item))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc = start_review(run, "frq", 8, "alice", port)
        page2.reload()
        page2.wait_for_selector('body[data-ready="1"]')
        assert page2.evaluate("document.body.dataset.labelled") == "3" and current(page2) == 4
        assert enter_all(page2, lambda k: bob(order[k - 1])) == 5
    finally:
        stop(proc)

    p = cli("calibrate", str(run), "--labels", str(run / "reviews"), check=True)
    assert "judge vs alice | 8 | 0.667" in p.stdout and "alice vs bob (inter-rater)" in p.stdout
    r = json.loads((run / "reviews" / "calibration-frq.json").read_text())
    _hand_worked(r)
    b = r["reviewers"]["bob"]["vs_judge"]
    assert b["exact_agreement"] == 1 and b["weighted_kappa_linear"] == 1
    (ir,) = r["inter_rater"]
    assert (ir["a"], ir["b"]) == ("alice", "bob") and abs(ir["weighted_kappa_linear"] - 1 / 3) < 1e-12 and abs(ir["exact_agreement"] - 2 / 3) < 1e-12
    c = r["consensus"]
    assert (c["items_all_labelled"], c["majority"], c["set_aside"]) == (8, 6, 2) and c["vs_judge"]["exact_agreement"] == 1
    assert "judge vs consensus of alice, bob (6 of 8 items by majority; 2 set aside for disagreement)" in p.stdout

    shots = os.environ.get("MEDSTACK_SCREENS")  # where a person wants the page's picture (not in the repo)
    if shots:
        page.screenshot(path=os.path.join(shots, "review-page-done.png"), full_page=True)


def test_exported_page_downloads_labels_that_calibrate_reads(run, browser, cli, tmp_path):
    page_file = tmp_path / "review.html"
    p = cli("review", str(run), "--judge", "frq", "--sample", "8", "--export", str(page_file), check=True)
    assert str(page_file.resolve()) in p.stdout
    text = page_file.read_text()
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text  # nothing from the network
    order = item_ids(run, "frq")
    assert not any(i in text for i in order)
    ctx = browser.new_context(accept_downloads=True)
    page = ctx.new_page()
    page.goto(page_file.as_uri())
    page.wait_for_selector('body[data-ready="1"]')
    page.fill("#reviewer", "alice")
    page.dispatch_event("#reviewer", "change")
    page.locator("body").click(position={"x": 5, "y": 5})
    for _ in range(5):
        press_label(page, alice(order[current(page) - 1]))
    page.reload()  # labels stay in the browser
    page.wait_for_selector('body[data-ready="1"]')
    page.fill("#reviewer", "alice")
    page.dispatch_event("#reviewer", "change")
    assert page.evaluate("document.body.dataset.labelled") == "5"
    page.locator("body").click(position={"x": 5, "y": 5})
    assert enter_all(page, lambda k: alice(order[k - 1])) == 3
    with page.expect_download() as dl:
        page.keyboard.press("d")
    assert dl.value.suggested_filename == "alice.jsonl"
    got = tmp_path / "alice.jsonl"
    dl.value.save_as(str(got))
    ctx.close()
    assert len(got.read_text().splitlines()) == 8
    cli("calibrate", str(run), "--labels", str(got), check=True)
    _hand_worked(json.loads((run / "reviews" / "calibration-frq.json").read_text()))


@pytest.fixture
def derm_cal(fixtures_dir, tmp_path):
    """Today's `calibrate craftmd-grader` on the fixture-sized dermatologist file (scripted judge, the published release)."""
    import asyncio

    from experiments.studies.craftmd.calibrate_grader import calibrate_grader
    from tests.test_calibrate import ScriptedJudge

    csv = fixtures_dir / "craftmd" / "validation_graderai_small.csv"
    m = asyncio.run(calibrate_grader("scripted", str(csv), tmp_path / "cal", rule="zero", client=ScriptedJudge(),
                                     published=str(fixtures_dir / "craftmd" / "published_release"), log=lambda *_: None))
    return csv, tmp_path / "cal", m


def test_relabel_dermatologist_fixture_reproduces_calibrate(derm_cal, browser):
    """The fixture-sized CRAFT-MD dermatologist check: today's calibrate and the same counts typed through the
    page give identical figures (scripts/review_relabel.py does this on the authors' whole file)."""
    from experiments.tools.calibrate.reviews import calibrate_reviews
    from experiments.studies.craftmd.calibrate_grader import read_labels

    csv, cal, m = derm_cal
    derm = {c["id"]: c["dermatologist"] for c in read_labels(csv)["cases"]}
    for judge, today in (("grader", m["judge_vs_dermatologist"]), ("published", m["published"]["vs_dermatologist"])):
        port = free_port()
        proc = start_review(cal, judge, 1000, "derm", port)
        try:
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/?reviewer=derm")
            page.wait_for_selector('body[data-ready="1"]')
            assert page.locator("#scale button").count() == 6  # the count scale 0-5
            shown = page.inner_text("#item")
            assert "diagnoses extracted in the 5 trials" in shown.lower()
            ids = item_ids(cal, judge)
            assert enter_all(page, lambda k: derm[ids[k - 1]]) == today["n"]
        finally:
            stop(proc)
        mine = calibrate_reviews(cal, cal / "reviews", judge, n_boot=200)["reviewers"]["derm"]["vs_judge"]
        for k in ("n", "exact_agreement", "mean_abs_diff", "trial_agreement_bound", "weighted_kappa_linear", "confusion"):
            assert mine[k] == today[k], k
        assert mine["spearman"]["rho"] == today["spearman"]["rho"] and mine["weighted"] is False


# model output is untrusted: text that ends a <script>, opens a comment, injects an element, or is a JS line break
PWN = "window.__pwned = (window.__pwned || 0) + 1; document.title = 'PWNED'"
HOSTILE = ["<!-- an open comment, and what follows must still show", "</script><script>" + PWN + "</script> after the script",
           f'<img src=x onerror="{PWN}"> after the image', "line\u2028separator\u2029paragraph", "&amp; &lt;b&gt; -- typed as entities"]


def hostile_run(tmp_path):
    """A CRAFT-MD run (one trial, one format) whose answers and diagnoses are the hostile texts."""
    d = tmp_path / "hostile"
    d.mkdir()
    (d / "config.yaml").write_text("version: 1\nexperiment: craftmd\ntrials: 1\nformats: [vignette]\nroles: {clinical: embedded, grader: embedded}\n")
    rows = [{"id": f"h{k}", "case_id": f"h{k}", "trial": 0, "model": "embedded", "correct_answer": HOSTILE[(k + 1) % len(HOSTILE)],
             "answers": {"vignette": {"frq": {"answer": text, "extracted": text, "correct": k % 2}}}} for k, text in enumerate(HOSTILE)]
    (d / "records.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return d


def _shows_every_text_literally(page, run_dir):
    page.wait_for_selector('body[data-ready="1"]')  # the data parsed: JSON.parse did not throw
    ids = item_ids(run_dir, "frq")
    for k in range(1, len(HOSTILE) + 1):
        assert current(page) == k
        k_rec = int(ids[k - 1].split("|")[0][1:])
        shown = page.evaluate("document.getElementById('item').textContent")
        assert HOSTILE[k_rec] in shown and HOSTILE[(k_rec + 1) % len(HOSTILE)] in shown, (k, shown)
        press_label(page, "m")
    assert current(page) is None
    assert page.evaluate("window.__pwned") is None and page.title() == "medstack review: judge frq"
    assert page.evaluate("document.querySelectorAll('#item img, #item script').length") == 0


def test_hostile_text_shows_literally_and_runs_nothing(tmp_path, browser, cli):
    run_dir = hostile_run(tmp_path)
    port = free_port()
    proc = start_review(run_dir, "frq", 100, "alice", port)
    try:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{port}/?reviewer=alice")
        _shows_every_text_literally(page, run_dir)
    finally:
        stop(proc)
    assert len((run_dir / "reviews" / "alice.jsonl").read_text().splitlines()) == len(HOSTILE)

    out = tmp_path / "hostile.html"
    cli("review", str(run_dir), "--judge", "frq", "--sample", "100", "--export", str(out), check=True)
    page = browser.new_page()
    page.goto(out.as_uri())
    _shows_every_text_literally(page, run_dir)
