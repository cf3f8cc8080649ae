"""Ctrl-C / SIGTERM mid-run says so on stderr, for a run and for a sweep (typer turns the interrupt into
Exit(130) before our handler sees it: the line was lost)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, MEDSTACK, REPO

CASES = FIXTURES / "craftmd" / "cases.csv"
SMALL = ["--data", str(CASES), "--trials", "2", "--max-turns", "3", "--concurrency", "1",
         "--config", "experiments/studies/craftmd/configs/embedded-small.yaml"]


@pytest.fixture
def slow_endpoint():
    from experiments.tools.bench.runner_scale import InstantEndpoint

    with InstantEndpoint(delay_ms=300) as ep:
        yield ep.base_url


def _interrupt(args: list[str], records: Path) -> tuple[int, str]:
    proc = subprocess.Popen([*MEDSTACK, *args], cwd=REPO, env={**os.environ, "COLUMNS": "80"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and not (records.exists() and records.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before a record was written: the test proves nothing"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        return proc.returncode, err
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_sigterm_mid_run_says_interrupted_on_stderr(slow_endpoint, tmp_path, command):
    model = f"instant@{slow_endpoint}"
    out = tmp_path / "out"
    if command == "run":
        args, records = ["run", "craftmd", "--model", model, *SMALL, "--out", str(out)], out / "records.jsonl"
    else:
        roles = [a for r in ("patient", "grader", "summarizer") for a in ("--role", f"{r}={model}")]
        args, records = ["sweep", "craftmd", "--models", model, *roles, *SMALL, "--out", str(out)], out / "instant" / "records.jsonl"
    code, err = _interrupt(args, records)
    assert code == 130, err
    assert "interrupted: finished results are kept; run the same command again to resume" in err
    assert "Traceback" not in err
    assert records.read_text().strip()  # what finished before the signal is kept
