"""`medstack import craftmd` as a user runs it: the case set's choices and specialties by default (said), a refusal naming
--cases when the files lack them and the set is not fetched, and a short summary on the terminal, numbers formatted."""

from __future__ import annotations

import re
import shutil

from experiments.datasets.registry import MARKER
from tests.conftest import FIXTURES, run_cli

RELEASE = str(FIXTURES / "craftmd" / "published_demo")  # files without choices or specialties


def test_without_cases_and_without_the_case_set_the_import_is_refused_naming_cases(tmp_path):
    r = run_cli("import", "craftmd", RELEASE, "--name", "gpt-4", "--out", str(tmp_path / "imp"), env={"MEDSTACK_HOME": str(tmp_path / "home")})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--cases" in r.stderr and "medstack data fetch craftmd-cases" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "imp").exists()


def test_the_fetched_case_set_is_used_and_the_terminal_gets_a_short_summary(tmp_path):
    folder = tmp_path / "home" / "data" / "craftmd-cases"  # fetched, as `data fetch` leaves a set
    folder.mkdir(parents=True)
    shutil.copy(FIXTURES / "craftmd" / "cases.csv", folder / "usmle_and_derm_dataset.csv")
    (folder / MARKER).write_text("{}")
    out = tmp_path / "imp"
    r = run_cli("import", "craftmd", RELEASE, "--name", "gpt-4", "--out", str(out), env={"MEDSTACK_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    assert "from the fetched craftmd-cases" in r.stderr
    assert len(r.stdout.splitlines()) <= 8 and "#" not in r.stdout and "|" not in r.stdout  # no markdown summary
    assert f"summary: {out / 'summary.md'}" in r.stdout and (out / "summary.md").is_file()
    assert "unknown" not in r.stdout and re.search(r"specialties: [1-9]", r.stdout)
    assert not re.search(r"\d\.\d{4,}", r.stdout)  # numbers formatted, no raw floats
    assert re.search(r"MCQ accuracy: vignette \d+\.\d %", r.stdout)
    summary = (out / "summary.md").read_text()
    assert not re.search(r"rate 0\.\d{4,}", summary) and "mean doctor turns: None" not in summary
