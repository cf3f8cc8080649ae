"""Re-enter the CRAFT-MD authors' dermatologist labels through the review page, and check that
`medstack calibrate RUN_DIR --labels RUN_DIR/reviews` gives today's `calibrate craftmd-grader` figures.

    PYTHONPATH=$PWD .venv/bin/python -m scripts.review_relabel CAL_DIR --labels validation_graderai.csv [--judge grader|published]

CAL_DIR is a results folder of `medstack calibrate craftmd-grader` over the same labels file. The
dermatologist gave one number per case: how many of the 5 diagnoses the grader extracted (one per trial)
are correct. The review item is therefore the case -- the gold answer and the 5 extracted diagnoses, what
the dermatologist saw -- on the count scale 0-5, and the judge's decision is its own count for the case
(``grader``: the judge model's; ``published``: the authors' grader's, for the cases matched in their
release). The whole set is the sample (every stratum at rate 1, no weights), so the agreement must equal
today's figures exactly. The script starts `medstack review` on a free loopback port, opens the page in
headless Chromium (Playwright driving Debian's `chromium`), types each case's count with the keyboard, stops the
server, runs the calibration on the label file and compares. Exit 0 when every figure is equal. The page
knows each case only by its number in the sample (blind); the script, on the researcher's side, reads the
sample file to know which case a number is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from serving.launcher import free_port

REPO = Path(__file__).resolve().parent.parent
CHROMIUM_NAMES = ("chromium", "chromium-browser")  # Debian's package (scripts/setup.sh installs it); never a downloaded build
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
FIGURES = ("n", "exact_agreement", "mean_abs_diff", "trial_agreement_bound", "weighted_kappa_linear", "confusion")


def start_review(run_dir: Path, judge: str, sample: int, reviewer: str, port: int, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """`medstack review` in the background; returns once the page is served (or raises with its output)."""
    proc = subprocess.Popen([sys.executable, "-m", "scripts.cli", "review", str(run_dir), "--judge", judge, "--sample", str(sample),
                             "--reviewer", reviewer, "--port", str(port), *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"medstack review exited {proc.returncode}: {proc.stderr.read()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("medstack review did not start serving within 120 s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def chromium_path() -> str | None:
    """The system Chromium Playwright drives (``playwright install`` downloads browsers, which this project never does)."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def launch(playwright):
    exe = chromium_path()
    if exe is None:
        raise RuntimeError("Chromium is not installed (no `chromium` command): run `make setup` as root, or `apt-get install chromium`")
    return playwright.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)


def item_ids(run_dir: Path, judge: str) -> list[str]:
    """The record ids of the sample in the order shown: item number k of the page is ids[k - 1]."""
    return [it["id"] for it in json.loads((Path(run_dir) / "reviews" / f"sample-{judge}.json").read_text())["items"]]


def current(page) -> int | None:
    """The number (1..N) of the item the page shows; None when every item is done."""
    v = page.evaluate("document.body.dataset.item")
    return int(v) if v else None


def wait_until(page, expression: str, timeout: float = 30) -> None:
    """Poll a JS expression (the page's CSP forbids eval, so Playwright's wait_for_function cannot run there)."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the page never reached: {expression}")
        time.sleep(0.02)


def press_label(page, key: str) -> None:
    """Press one label key and wait until the page has saved it and moved on."""
    before = page.evaluate("[document.body.dataset.labelled, document.body.dataset.item]")
    page.keyboard.press(key)
    wait_until(page, f"document.body.dataset.labelled !== {before[0]!r} || document.body.dataset.item !== {before[1]!r} "
                     "|| document.getElementById('status').textContent.startsWith('not saved')")
    status = page.inner_text("#status")
    if status.startswith("not saved"):
        raise RuntimeError(status)


def enter_all(page, label_of) -> int:
    """Label every open item with ``label_of(item number)`` (a key to press); returns how many."""
    n = 0
    while current(page):
        press_label(page, str(label_of(current(page))))
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--labels", required=True, help="validation_graderai.csv (the file the calibration was made from)")
    ap.add_argument("--judge", default="grader", choices=("grader", "published"))
    ap.add_argument("--reviewer", default="dermatologist")
    ap.add_argument("--screenshot", type=Path, help="PNG of the page at the first item")
    a = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from experiments.tools.calibrate.reviews import calibrate_reviews
    from experiments.studies.craftmd.calibrate_grader import read_labels

    derm = {c["id"]: c["dermatologist"] for c in read_labels(a.labels)["cases"]}
    port = free_port()
    proc = start_review(a.run_dir, a.judge, 1_000_000, a.reviewer, port)
    t0 = time.perf_counter()
    try:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/?reviewer={a.reviewer}")
            page.wait_for_selector('body[data-ready="1"]')
            if a.screenshot:
                page.screenshot(path=str(a.screenshot), full_page=True)
            ids = item_ids(a.run_dir, a.judge)
            n = enter_all(page, lambda k: derm[ids[k - 1]])
            browser.close()
    finally:
        stop(proc)
    print(f"entered {n} labels through the page in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    r = calibrate_reviews(a.run_dir, a.run_dir / "reviews", a.judge)
    mine = r["reviewers"][a.reviewer]["vs_judge"]
    m = json.loads((a.run_dir / "metrics.json").read_text())
    today = m["judge_vs_dermatologist"] if a.judge == "grader" else m["published"]["vs_dermatologist"]
    ok = True
    for k in FIGURES + ("spearman",):
        x, y = (mine[k]["rho"], today[k]["rho"]) if k == "spearman" else (mine[k], today[k])
        same = x == y
        ok &= same
        print(f"{k:24} calibrate craftmd-grader: {json.dumps(y)}  review labels: {json.dumps(x)}  {'equal' if same else 'DIFFERENT'}")
    print("all figures equal" if ok else "figures differ")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
