"""Fault tests on the real vLLM server: the server dies mid-run, the run is killed -9.

These start their OWN server (the session's shared one must survive), so they cost two extra
server start-ups in `make test`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import MEDSTACK, REPO, run_cli

pytestmark = pytest.mark.e2e

GREEDY = ["--set", "sampling.doctor.temperature=0", "--set", "sampling.patient.temperature=0", "--set", "sampling.answer.temperature=0"]


def records(out: Path) -> dict[str, dict]:
    if not (out / "records.jsonl").exists():
        return {}
    return {r["id"]: r for r in (json.loads(x) for x in (out / "records.jsonl").read_text().splitlines() if x.strip())}


def start_server(port: int) -> None:
    run_cli("serve", "--model", "embedded", "--port", str(port), "--detach", check=True, timeout=1200)


def stop_server() -> None:
    """Kill this test's own server only (the session's shared server has the same alias)."""
    from serving.launcher import kill_group, running_servers, servers_dir

    for rec in running_servers():
        if rec["port"] == PORT["port"]:
            kill_group(rec["pid"])
            (servers_dir() / f"{rec['alias']}-{rec['port']}.json").unlink(missing_ok=True)


PORT: dict = {}


@pytest.fixture
def own_server(medstack_home):
    """A second server on its own port; stopped at the end whatever happened."""
    from serving.launcher import kill_group, free_port, running_servers

    PORT["port"] = free_port()
    start_server(PORT["port"])
    yield f"http://127.0.0.1:{PORT['port']}/v1"
    for rec in running_servers():
        if rec["port"] == PORT["port"]:
            kill_group(rec["pid"])


def craftmd_args(url: str, out: Path, fixtures_dir: Path, *extra: str, limit: int = 4) -> list[str]:
    return ["run", "craftmd", "--data", str(fixtures_dir / "craftmd" / "cases.csv"), "--limit", str(limit), "--trials", "1",
            "--max-turns", "2", "--formats", "vignette,multiturn", "--no-frq", "--model", f"embedded@{url}",
            "--config", "experiments/studies/craftmd/configs/embedded-small.yaml", "--concurrency", "1",
            "--set", "retries=1", "--out", str(out), *extra]


CASES_KILLED = 2


def test_server_killed_mid_run_fails_cases_never_scores_them_and_resume_completes(own_server, fixtures_dir, tmp_path):
    out = tmp_path / "run"
    # two cases (one conversation each, about 47 s on the shared 2 vCPUs): at concurrency 1 the first finishes, the
    # second is mid-conversation when the server dies (failed), the resume completes it, the clean run does both
    args = craftmd_args(own_server, out, fixtures_dir, *GREEDY, limit=CASES_KILLED)
    proc = subprocess.Popen([*MEDSTACK, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    deadline = time.time() + 900
    while not records(out) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert records(out), "no case finished before the deadline"
    stop_server()  # the endpoint dies in the middle of the run
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 3, stderr[-3000:]
    recs = records(out)
    failed = [r for r in recs.values() if r["status"] == "failed"]
    finished = [r for r in recs.values() if r["status"] == "ok"]
    assert failed and finished
    m = json.loads((out / "metrics.json").read_text())
    assert m["records"] == len(finished) and m["case_status"]["finished"] == len(finished)
    assert m["case_status"]["failed"] + m["case_status"]["not_started"] == CASES_KILLED - len(finished)
    summary = (out / "summary.md").read_text()
    assert "failed cases" in summary and "medstack run craftmd" in summary and "Resume with: medstack run craftmd" in stderr
    print(f"server killed: exit {proc.returncode}, finished {len(finished)}, failed {len(failed)}, "
          f"not started {m['case_status']['not_started']}, metrics over {m['records']} records")

    start_server(PORT["port"])  # the endpoint is back: the same command completes every case
    proc = run_cli(*args, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    assert m["case_status"] == {"total": CASES_KILLED, "finished": CASES_KILLED, "failed": 0, "not_started": 0}

    # an uninterrupted run at temperature 0, with an empty cache of its own, scores the same
    fresh_home = tmp_path / "fresh_home"
    fresh_home.mkdir()
    clean = run_cli(*craftmd_args(own_server, tmp_path / "clean", fixtures_dir, *GREEDY, limit=CASES_KILLED), env={"MEDSTACK_HOME": str(fresh_home)}, timeout=1200)
    assert clean.returncode == 0, clean.stderr[-3000:]
    m_clean = json.loads((tmp_path / "clean" / "metrics.json").read_text())
    assert m_clean["run"]["cache_hits"] == 0
    figures = lambda metrics: {(f["score"], f["metric"]): f["value"] for f in metrics["scores"]}  # noqa: E731
    print(f"resumed: {m['case_status']}, figures {figures(m)} == uninterrupted {figures(m_clean)}")
    assert figures(m) == figures(m_clean) and figures(m)


def cache_keys(home: Path) -> set[str]:
    db = home / "cache" / "responses.sqlite"
    if not db.exists():
        return set()
    try:
        with sqlite3.connect(db) as con:
            return {k for (k,) in con.execute("SELECT key FROM responses")}
    except sqlite3.OperationalError:  # the run has created the file but not its table yet
        return set()


def finished_keys(recs: dict[str, dict]) -> set[str]:
    """Cache keys of the calls of finished cases (a resume does not run those cases again)."""
    return {c["cache_key"] for r in recs.values() if r["status"] == "ok" for c in r["calls"]}


@pytest.mark.parametrize("study", ["craftmd", "dera-summarize"])
def test_kill_9_three_times_then_resume_replays_every_answered_call(study, embedded_server, fixtures_dir, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(Path(os.environ["MEDSTACK_HOME"]) / "models", target_is_directory=True)
    env = {**os.environ, "MEDSTACK_HOME": str(home), "COLUMNS": "200"}
    url = embedded_server["base_url"]
    out = tmp_path / "run"
    if study == "craftmd":
        args = craftmd_args(url, out, fixtures_dir)  # sampled doctor/patient/answer turns: cached by their per-call seeds
    else:
        args = ["run", "dera-summarize", "--model", f"embedded@{url}", "--limit", "2", "--out", str(out),
                "--set", "max_turns=4", "--set", "sampling.max_tokens=48", "--set", "gptf1.extraction.max_tokens=32",
                "--set", "gptf1.verification.max_tokens=32", "--concurrency", "2"]
    rng = random.Random(11)
    for attempt in range(3):
        # kill at a random point by progress, not by time (a short run could finish before a timer fires):
        # after 1-3 newly answered calls, and — for the last kill — while some case is mid-conversation
        proc = subprocess.Popen([*MEDSTACK, *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        target = len(cache_keys(home)) + rng.randint(1, 3)
        deadline = time.time() + 900
        while proc.poll() is None and time.time() < deadline:
            answered = cache_keys(home)
            if len(answered) >= target and (attempt < 2 or answered - finished_keys(records(out))):
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the run finished before it could be killed: give it more work"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    answered = cache_keys(home)
    before = records(out)
    done_ids = {i for i, r in before.items() if r["status"] == "ok"}
    keys_of_finished = finished_keys(before)
    proc = subprocess.run([*MEDSTACK, *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    rerun_calls = [c for i, r in records(out).items() if i not in done_ids for c in r["calls"]]
    replayed = {c["cache_key"] for c in rerun_calls if c.get("cached")} & answered
    paid_again = {c["cache_key"] for c in rerun_calls if not c.get("cached")} & answered
    print(f"{study}: answered before the kills {len(answered)}, of finished cases {len(keys_of_finished)}, "
          f"replayed from the cache {len(replayed)}, paid again {len(paid_again)}, "
          f"re-run cache hits {m['run']['cache_hits']}, re-run requests {m['run']['requests']}")
    # every call answered before a kill is replayed, none is paid again (a re-run may also hit the cache on
    # its own repeated greedy calls, e.g. the same extraction prompt in two cases: those are not counted here)
    assert not paid_again
    assert replayed >= answered - keys_of_finished and replayed
    assert m["run"]["cache_hits"] >= len(replayed)
    # an uninterrupted run of the same command (same cache: the same seeds give the same calls) writes the same records
    again = subprocess.run([*MEDSTACK, *[a if a != str(out) else str(tmp_path / "again") for a in args]], cwd=REPO, capture_output=True, text=True, env=env, timeout=1500)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {i: no_clock(r) for i, r in records(out).items()} == {i: no_clock(r) for i, r in records(tmp_path / "again").items()}


def no_clock(r: dict) -> dict:
    """A record without what the clock decides: the call log and usage (latencies), seconds, the study's timing."""
    out = {k: v for k, v in r.items() if k not in ("calls", "usage", "seconds", "timing", "calls_seconds")}
    if isinstance(out.get("metadata"), dict):
        out["metadata"] = {k: v for k, v in out["metadata"].items() if k not in ("timing", "calls_seconds")}
    return out


def test_sigterm_stops_the_server_the_run_started_and_keeps_results(fixtures_dir, tmp_path):
    """`timeout` sends SIGTERM: the vLLM server the run started for itself must not be left running."""
    from serving.launcher import _pid_alive

    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(Path(os.environ["MEDSTACK_HOME"]) / "models", target_is_directory=True)
    env = {**os.environ, "MEDSTACK_HOME": str(home), "COLUMNS": "200"}
    out = tmp_path / "run"
    args = craftmd_args("X", out, fixtures_dir)
    args[args.index("embedded@X")] = "embedded"  # an alias: the run starts a server for itself
    proc = subprocess.Popen([*MEDSTACK, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    servers = home / "servers"
    deadline = time.time() + 1200
    while time.time() < deadline and proc.poll() is None and not records(out):
        time.sleep(0.5)
    assert records(out), "the run finished no case"
    rec = json.loads(next(servers.glob("*.json")).read_text())
    assert oct(next(servers.glob("*.json")).stat().st_mode & 0o777) == "0o600"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    deadline = time.time() + 60
    while _pid_alive(rec["pid"]) and time.time() < deadline:
        time.sleep(0.5)
    assert not _pid_alive(rec["pid"]), "the run's own vLLM server was left running"
    assert all(r["status"] in ("ok", "failed") for r in records(out).values()) and records(out)
