"""The report renders in headless Chromium: transcripts in the DOM, JS filters ran, a real screenshot."""

from __future__ import annotations

import shutil
import subprocess

import json

import numpy as np

from tests.test_review_chromium import HOSTILE

CHROMIUM_FLAGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "Chromium is not installed: run `make setup` (scripts/setup.sh installs Debian's `chromium`)"
    return exe


def _chart(path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([1, 2, 3], [3, 1, 2])
    fig.savefig(path)
    plt.close(fig)


def test_report_renders_in_headless_chromium(fixtures_dir, tmp_path, cli):
    runs = tmp_path / "runs"
    shutil.copytree(fixtures_dir / "report", runs)
    _chart(runs / "craftmd_run" / "accuracy.png")
    html = tmp_path / "report.html"
    p = cli("report", str(runs), "--out", str(html), check=True)
    assert str(html.resolve()) in p.stdout

    exe = chromium()
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run([exe, *CHROMIUM_FLAGS, *profile, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert 'data-ready="1"' in dom  # our script ran
    assert "6 of 6 cases shown" in dom
    for text in ("ZEBRA-PATIENT-LINE", "QUOKKA-RESEARCHER-NOTE", "quit smoking five years ago", "inform_symptom", "HTTP 500: server fell over",
                 "PELICAN-TARGET-ACT", "frq/multiturn", "acute appendicitis"):
        assert text in dom
    for agent in ("doctor", "patient", "decider", "researcher"):
        assert f'class="who">{agent} ' in dom
    assert "data-pwned" not in dom.split("<body", 1)[1].split(">", 1)[0]  # the injected markup did not run
    assert dom.count('src="data:image/png;base64,') == 3  # the run's chart + CRAFT-MD's paper figures (MCQ, FRQ)

    # the JS filters: preset from the address, they hide what does not match
    def shown(fragment: str) -> str:
        d = subprocess.run([exe, *CHROMIUM_FLAGS, *profile, "--dump-dom", html.as_uri() + fragment], capture_output=True, text=True, timeout=120).stdout
        return d.split('id="case-count">', 1)[1].split("<", 1)[0]

    assert shown("#outcome=failed") == "1 of 6 cases shown"
    assert shown("#outcome=incorrect&run=run1") == "1 of 6 cases shown"
    assert shown("#model=embedded-lora") == "1 of 6 cases shown"
    assert shown("#text=quokka") == "1 of 6 cases shown"

    shot = tmp_path / "shot.png"
    subprocess.run([exe, *CHROMIUM_FLAGS, *profile, "--window-size=1280,2000", f"--screenshot={shot}", html.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 30_000
    import matplotlib.image

    img = matplotlib.image.imread(str(shot))
    assert img.shape[0] == 2000 and img.shape[1] == 1280
    assert float(np.std(img[..., :3])) > 0.05  # not a blank page


def test_hostile_transcripts_show_literally_and_run_nothing(fixtures_dir, tmp_path, cli, browser):
    """The report's rule is the review page's: any text a model wrote shows as written. The report puts text in
    HTML (escaped by the template), none in script data; a case whose transcript and answer hold a comment
    opener, a closing script tag, an injected image with onerror and U+2028/U+2029 loads, shows each, runs none."""
    runs = tmp_path / "runs"
    shutil.copytree(fixtures_dir / "report" / "craftmd_run", runs / "craftmd_run")
    rec = {"id": "case-hostile", "model": "embedded", "correct": 0, "answer": HOSTILE[1], "extracted_diagnosis": HOSTILE[2],
           "transcript": [{"agent": "doctor" if k % 2 else "patient", "content": text, "turn": k} for k, text in enumerate(HOSTILE)]}
    with open(runs / "craftmd_run" / "records.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    html = tmp_path / "report.html"
    cli("report", str(runs), "--out", str(html), check=True)
    page = browser.new_page()
    page.goto(html.as_uri())
    page.wait_for_selector('body[data-ready="1"]')  # the report's script ran to its end
    case = page.locator("details.case", has_text="case-hostile")
    text = case.evaluate("e => e.textContent")
    for t in HOSTILE:
        assert t in text, t
    assert page.evaluate("window.__pwned") is None and "PWNED" not in page.title()
    assert case.evaluate("e => e.querySelectorAll('img, script').length") == 0
