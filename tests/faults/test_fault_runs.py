"""Fault matrix, part 2: faults met while a run talks to the real keyed vLLM server (embedded model).

Each row provokes the fault for real (a tmpfs filled up or remounted read-only under a running run,
RLIMIT_FSIZE, random bytes in the response cache, a torn records line, a wrong or missing key, a
look at `ps` and at every file while a keyed server serves) and asserts the exit code, the message
and that no finished record was lost.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import MEDSTACK, REPO, run_cli
from tests.faults.conftest import KEY, craftmd_run, ps_args, records

pytestmark = pytest.mark.e2e

WITH_KEY = {"MEDSTACK_API_KEY": KEY}


def no_traceback(proc) -> None:
    assert "Traceback" not in (proc.stderr or "") + (proc.stdout or ""), (proc.stderr or "")[-3000:]


def flat(text: str) -> str:
    return " ".join(text.split())  # the console wraps long lines


def files_under(*roots: Path):
    for root in roots:
        root = Path(root)
        if root.is_file():
            yield root
            continue
        for dirpath, _, names in os.walk(root):  # symlinks (the shared models folder) are not followed
            for n in names:
                p = Path(dirpath) / n
                if p.is_file() and not p.is_symlink():
                    yield p


def grep(needle: str, *roots: Path) -> list[str]:
    return [str(p) for p in files_under(*roots) if needle.encode() in p.read_bytes()]


def popen_run(args: list[str], env: dict | None = None, preexec=None) -> subprocess.Popen:
    return subprocess.Popen([*MEDSTACK, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200", **(env or {})}, preexec_fn=preexec)


def wait_records(out: Path, n: int, proc: subprocess.Popen, timeout: float = 900) -> None:
    deadline = time.time() + timeout
    while len(records(out)) < n and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert len(records(out)) >= n, f"fewer than {n} records before the run ended / the deadline"


def finished_intact(before: dict, out: Path) -> None:
    """Every record finished before the fault is still there, byte for byte the same."""
    now = records(out)
    for cid, rec in before.items():
        assert now.get(cid) == rec, f"finished record {cid} was lost or changed"


# ------------------------------------------------------------------ secrets and exposure

def test_keyed_server_key_is_in_no_process_list_log_record_result_or_report(keyed_server, tmp_path, medstack_home):
    assert KEY not in keyed_server["ps_during_start"] and KEY not in ps_args()
    assert KEY not in keyed_server["stderr"]
    ok, failing = tmp_path / "ok", tmp_path / "failing"
    proc = run_cli(*craftmd_run(keyed_server["url"], ok, limit=2), env=WITH_KEY)
    assert proc.returncode == 0, proc.stderr
    # a run with failures prints and writes the resume command; the key is given on the command line here
    run = popen_run([*craftmd_run(keyed_server["url"], failing, "--no-cache", "--set", "timeout=0.001", "--api-key", KEY, limit=4)])
    seen = []
    while run.poll() is None:
        seen.append(ps_args())
        time.sleep(0.3)
    stdout, stderr = run.communicate()
    assert run.returncode == 3, stderr
    assert KEY not in "".join(seen[1:]), "the key stayed in the process list after start-up"
    assert "Resume with: medstack run craftmd" in flat(stderr) and "$MEDSTACK_API_KEY" in stderr and KEY not in stdout + stderr
    report = tmp_path / "report.html"
    rep = run_cli("report", str(ok), str(failing), "--out", str(report))
    assert rep.returncode == 0, rep.stderr
    assert grep(KEY, medstack_home, ok, failing, report) == []
    ident = json.loads((ok / "identity.json").read_text())["models"]["clinical"]
    assert ident["keyed"] is True and "--api-key" not in (ident.get("argv") or [])
    log = Path(keyed_server["log"]).read_text()
    assert log.startswith("$ ") and "--api-key" not in log.splitlines()[0] and KEY not in log


def non_loopback_address() -> str | None:
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
    except OSError:
        return None
    return next((a for a in out if ":" not in a and not a.startswith("127.")), None)


def test_exposed_keyed_server_answers_nobody_without_the_key(keyed_server):
    addr = non_loopback_address() or "127.0.0.1"
    url = f"http://{addr}:{keyed_server['port']}/v1/models"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url, timeout=30)
    assert e.value.code == 401
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


@pytest.mark.parametrize("key", ["wrong-key", None])
def test_refused_key_stops_the_run_at_once_with_exit_2_naming_the_endpoint(keyed_server, tmp_path, key):
    out = tmp_path / "run"
    first = run_cli(*craftmd_run(keyed_server["url"], out, limit=1), env=WITH_KEY)
    assert first.returncode == 0, first.stderr
    before = records(out)
    env = {k: v for k, v in os.environ.items() if k != "MEDSTACK_API_KEY"}
    env.update({"MEDSTACK_API_KEY": key} if key else {})
    proc = subprocess.run([*MEDSTACK, *craftmd_run(keyed_server["url"], out, "--no-cache", limit=4)], cwd=REPO, capture_output=True,
                          text=True, env={**env, "COLUMNS": "200"}, timeout=600)
    assert proc.returncode == 2, proc.stderr
    no_traceback(proc)
    text = flat(proc.stderr)
    assert f"HTTP 401 from {keyed_server['url']}" in text and "--api-key" in text and "$MEDSTACK_API_KEY" in text
    assert records(out) == before  # no failed case recorded, the finished one kept


# ------------------------------------------------------------------ results directory and cache

def test_torn_records_line_is_moved_aside_on_resume_and_its_case_runs_again(keyed_server, tmp_path):
    out = tmp_path / "run"
    assert run_cli(*craftmd_run(keyed_server["url"], out, limit=2), env=WITH_KEY).returncode == 0
    before = records(out)
    torn = '{"id": "f02/t0", "status": "ok", "answ\n'
    with open(out / "records.jsonl", "a") as f:
        f.write(torn + '{"id": "f03/t0", "sta')  # a torn line that ends in a newline, and a torn tail
    proc = run_cli(*craftmd_run(keyed_server["url"], out, limit=4), env=WITH_KEY)
    assert proc.returncode == 0, proc.stderr
    no_traceback(proc)
    assert f"{out / 'records.jsonl'}: 2 torn line(s) (line 3, 4) moved aside to {out / 'records.jsonl.torn'}" in flat(proc.stderr)
    assert (out / "records.jsonl.torn").read_text() == torn + '{"id": "f03/t0", "sta\n'
    finished_intact(before, out)
    assert sorted(records(out)) == ["f00/t0", "f01/t0", "f02/t0", "f03/t0"]


@contextmanager
def own_home(tmp_path: Path):
    """A MEDSTACK_HOME of its own (its own response cache), sharing the prepared models."""
    home = tmp_path / "home"
    home.mkdir()
    real = Path(os.environ["MEDSTACK_HOME"]) / "models"
    (home / "models").symlink_to(real.resolve(), target_is_directory=True)
    yield home


def test_corrupt_cache_pages_are_found_at_open_moved_aside_and_the_run_goes_on(keyed_server, tmp_path):
    with own_home(tmp_path) as home:
        env = {**WITH_KEY, "MEDSTACK_HOME": str(home)}
        out = tmp_path / "run"
        assert run_cli(*craftmd_run(keyed_server["url"], out, limit=2), env=env).returncode == 0
        before = records(out)
        db = home / "cache" / "responses.sqlite"
        data = bytearray(db.read_bytes())
        rnd = random.Random(25)
        for i in range(100, len(data)):  # everything after the 100-byte header: the pages
            data[i] = rnd.randrange(256)
        db.write_bytes(bytes(data))
        proc = run_cli(*craftmd_run(keyed_server["url"], out, limit=4), env=env)
        assert proc.returncode == 0, proc.stderr
        no_traceback(proc)
        text = flat(proc.stderr)
        assert text.count("is damaged") == 1 and f"the response cache {db} is damaged" in text and "moved aside to" in text
        assert len(list((home / "cache").glob("responses.sqlite.corrupt-*"))) == 1
        finished_intact(before, out)
        assert all(r["status"] == "ok" for r in records(out).values()) and len(records(out)) == 4


def test_cache_that_is_not_a_database_is_moved_aside_for_chat_too(keyed_server, tmp_path):
    with own_home(tmp_path) as home:
        (home / "cache").mkdir()
        (home / "cache" / "responses.sqlite").write_bytes(random.Random(7).randbytes(20000))
        proc = run_cli("chat", "--model", f"embedded@{keyed_server['url']}", "--max-tokens", "4", "Hello",
                       env={**WITH_KEY, "MEDSTACK_HOME": str(home)})
        assert proc.returncode == 0, proc.stderr
        no_traceback(proc)
        assert "is damaged (file is not a database)" in flat(proc.stderr)
        assert list((home / "cache").glob("responses.sqlite.corrupt-*"))


# ------------------------------------------------------------------ disk full, read-only, size limit

def _root() -> bool:
    return os.geteuid() == 0


@contextmanager
def small_fs(path: Path, size: str = "4m"):
    """A tmpfs (root) or a plain folder (others; read-only then comes from chmod)."""
    path.mkdir(parents=True)
    if _root():
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        if _root():
            subprocess.run(["umount", "-l", str(path)], check=False)


def test_disk_full_mid_run_stops_starting_cases_keeps_records_exit_3(keyed_server, tmp_path):
    if not _root():
        pytest.fail("this row needs a tmpfs (root); the RLIMIT_FSIZE row covers a full disk without root")
    with small_fs(tmp_path / "fs") as fs:
        out = fs / "run"
        run = popen_run(craftmd_run(keyed_server["url"], out, "--no-cache", limit=10), env=WITH_KEY)
        wait_records(out, 1, run)
        filler = fs / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)  # fill the disk to the last byte while the run goes on
        for chunk in (65536, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
        os.close(fd)
        before = records(out)
        stdout, stderr = run.communicate(timeout=900)
        assert run.returncode == 3, stderr
        assert "Traceback" not in stdout + stderr, stderr[-3000:]
        text = flat(stderr)
        assert "the run stopped: cannot write" in text and "the disk is full" in text and "Resume with: medstack run craftmd" in text
        finished_intact(before, out)
        assert len(records(out)) < 10
        filler.unlink()
        again = run_cli(*craftmd_run(keyed_server["url"], out, "--no-cache", limit=10), env=WITH_KEY)
        assert again.returncode == 0, again.stderr
        finished_intact(before, out)
        assert len(records(out)) == 10


def test_file_size_limit_mid_run_stops_with_exit_3_and_still_writes_metrics_and_summary(keyed_server, tmp_path):
    out = tmp_path / "run"
    # 4 finished cases first: the cap below (their records + 200 bytes) must leave room for the whole summary.md,
    # which names every deviation of the demo config (~6 kB, more than 2 records)
    assert run_cli(*craftmd_run(keyed_server["url"], out, "--no-cache", limit=4), env=WITH_KEY).returncode == 0
    before = records(out)
    limit = (out / "records.jsonl").stat().st_size + 200  # room for part of one more line: a torn line
    room = (out / "summary.md").stat().st_size + 1000  # the stopped run's summary adds a line or two
    assert room < limit, f"summary.md ({room - 1000} bytes) would not fit under the {limit}-byte cap: start with more cases"

    def cap():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    run = popen_run(craftmd_run(keyed_server["url"], out, "--no-cache", limit=6), env=WITH_KEY, preexec=cap)
    stdout, stderr = run.communicate(timeout=900)
    assert run.returncode == 3, stderr
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    text = flat(stderr)
    assert f"cannot write {out / 'records.jsonl'}: the file size limit was reached" in text and "Resume with:" in text
    finished_intact(before, out)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["stopped_early"] is True and metrics["case_status"]["finished"] == 4
    assert "The run stopped: cannot write" in (out / "summary.md").read_text()
    again = run_cli(*craftmd_run(keyed_server["url"], out, "--no-cache", limit=6), env=WITH_KEY)
    assert again.returncode == 0, again.stderr
    assert "torn line(s) (line 5) moved aside" in flat(again.stderr)
    finished_intact(before, out)
    assert len(records(out)) == 6


def test_read_only_file_system_mid_run_stops_with_exit_3_and_resume_completes(keyed_server, tmp_path):
    with small_fs(tmp_path / "fs", "64m") as fs:
        out = fs / "run"
        run = popen_run(craftmd_run(keyed_server["url"], out, "--no-cache", limit=10), env=WITH_KEY)
        wait_records(out, 1, run)
        if _root():
            for _ in range(50):  # EBUSY while a file is open for writing: try again
                if subprocess.run(["mount", "-o", "remount,ro", str(fs)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("could not remount read-only")
        else:
            os.chmod(out / "records.jsonl", 0o400)
            os.chmod(out, 0o500)
        before = records(out)
        stdout, stderr = run.communicate(timeout=900)
        assert run.returncode == 3, stderr
        assert "Traceback" not in stdout + stderr, stderr[-3000:]
        text = flat(stderr)
        assert "the run stopped: cannot write" in text and ("read-only" in text or "permission denied" in text)
        assert "Resume with: medstack run craftmd" in text
        finished_intact(before, out)
        if _root():
            subprocess.run(["mount", "-o", "remount,rw", str(fs)], check=True)
        else:
            os.chmod(out, 0o700)
            os.chmod(out / "records.jsonl", 0o600)
        again = run_cli(*craftmd_run(keyed_server["url"], out, "--no-cache", limit=10), env=WITH_KEY)
        assert again.returncode == 0, again.stderr
        finished_intact(before, out)
        assert len(records(out)) == 10
