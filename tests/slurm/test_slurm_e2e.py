"""Sweeps and fine-tunes on a real Slurm (the one-node cluster of conftest.py) with the embedded model.

A 2-entry CRAFT-MD sweep with ``--executor slurm`` as a cluster user runs it: a data set and an authors' release
registered by name (a registry of the test's own, ``MEDSTACK_DATA_REGISTRY``) and fetched into the user's medstack
home, a sweep folder whose path holds a space, a ``squeue`` that fails for a while (nothing submitted twice,
``status`` says "unknown"), one entry job requeued mid-run (``scontrol requeue``), ``sweep status`` polled (its
outputs printed: ``pytest -s`` shows them), one report with every case done once and the release joined;
a job whose input went away fails for good and is recorded with its log's last lines; a 10-step fine-tune
job, requeued after its first checkpoint, resumes and writes its adapter. Each entry job starts its own vLLM
server (about a minute on 2 vCPUs); the entries run one at a time (``--slurm-max-parallel 1``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from experiments.datasets.registry import tree_digest
from tests.conftest import FIXTURES, run_cli

pytestmark = pytest.mark.e2e

CASES = str(FIXTURES / "craftmd" / "cases.csv")
SMALL = ["--data", CASES, "--limit", "3", "--trials", "1", "--formats", "vignette", "--no-frq", "--concurrency", "1",
         "--config", "experiments/studies/craftmd/configs/embedded-small.yaml"]
SLURM = ["--executor", "slurm", "--slurm-max-parallel", "1", "--slurm-cpus", "1", "--slurm-time", "20"]
STATUS_EVERY_S = 5  # seconds between the `sweep status` polls of the running sweep


def _status(env: dict, sweep: Path) -> str:
    p = run_cli("sweep", "status", str(sweep), env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def _row(status: str, label: str) -> list[str]:
    line = next(x for x in status.splitlines() if x.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")]  # entry, model, job, state, cases, restarts


def _records(out: Path) -> list[dict]:
    p = out / "records.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def _user_home(tmp_path: Path) -> tuple[Path, dict]:
    """A user's medstack home (the embedded model linked in) and a data registry of the test's own naming the fixture
    cases and a fixture release of the authors' runs; both fetched by name, as a user fetches on the login node."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to((Path(os.environ["MEDSTACK_HOME"]) / "models").resolve(), target_is_directory=True)
    release = FIXTURES / "craftmd" / "published_demo"
    sets = {"craftmd-fixture-cases": {"license": "test fixture", "format": "CRAFT-MD case CSV", "main": "cases.csv",
                                      "files": [{"name": "cases.csv", "sha256": _sha256(CASES)}]},
            "craftmd-published-fixture": {"license": "test fixture", "format": "folder of per-case JSON", "main": "fixture",
                                          "files": [{"name": "fixture.tar.gz", "sha256": "0" * 64, "unpack": True,
                                                     "tree_sha256": tree_digest(release)}]}}
    (tmp_path / "datasets.yaml").write_text(yaml.safe_dump({"version": 1, "sets": sets}))
    env = {"MEDSTACK_HOME": str(home), "MEDSTACK_DATA_REGISTRY": str(tmp_path / "datasets.yaml")}
    run_cli("data", "fetch", "craftmd-fixture-cases", "--from", CASES, "--no-progress", env=env, check=True)
    run_cli("data", "fetch", "craftmd-published-fixture", "--from", str(release), "--no-progress", env=env, check=True)
    return home, env


def _sha256(path: str) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_sweep_requeued_entry_resumes_to_one_report(slurm_cluster, tmp_path):
    home, user = _user_home(tmp_path)
    down, wrapped = tmp_path / "squeue-down", tmp_path / "bin"
    wrapped.mkdir()  # a squeue earlier on PATH that fails while `down` exists, as a slurmctld that does not answer
    (wrapped / "squeue").write_text(f"#!/bin/sh\nif [ -e '{down}' ]; then\n  echo 'slurm_load_jobs error: Unable to contact slurm controller "
                                    f"(connect failure)' >&2\n  exit 1\nfi\nexec {shutil.which('squeue')} \"$@\"\n")
    (wrapped / "squeue").chmod(0o700)
    env = {**slurm_cluster.env, **user, "PATH": f"{wrapped}:{os.environ['PATH']}"}
    sweep = tmp_path / "sweep dir"  # quoted in every #SBATCH line and shell line of the scripts
    by_name = [x if x != CASES else "craftmd-fixture-cases" for x in SMALL]
    args = ["sweep", "craftmd", "--models", "embedded,embedded", *by_name, "--published", "craftmd-published-fixture",
            "--out", str(sweep), *SLURM]
    t0 = time.monotonic()
    p = run_cli(*args, env=env, check=True)
    err = " ".join(p.stderr.split())
    assert "submitted embedded, embedded-2 as Slurm job array" in err and "| submitted: job" in p.stdout
    script = (sweep / "slurm" / "entries-0.sbatch").read_text()
    print("\n---- the entries' sbatch script\n" + script)
    assert "#SBATCH --array=0-1%1" in script and "#SBATCH --requeue" in script and "#SBATCH --mem=4G" in script
    assert f"#SBATCH --output='{sweep}/slurm/entries-%A_%a.out'" in script
    assert "--gres" not in script and "sweep slurm-job" in script  # the embedded model asks for no GPU (registry gpus: 0)
    jobs = {lbl: e["job"] for lbl, e in json.loads((sweep / "slurm" / "sweep.json").read_text())["entries"].items()}

    down.touch()  # squeue fails: `status` says unknown (never failed), the same command submits nothing and exits 3
    st = _status(env, sweep)
    print("\n---- sweep status while squeue fails\n" + st)
    assert all(_row(st, lbl)[3].startswith("unknown (squeue: slurm_load_jobs error: Unable to contact slurm controller") for lbl in jobs), st
    unsure = run_cli(*args, env=env)
    said = " ".join(unsure.stderr.split())
    assert unsure.returncode == 3 and f"embedded (job {jobs['embedded']}), embedded-2 (job {jobs['embedded-2']}) is unknown" in said, said
    assert "nothing was submitted" in said and "Traceback" not in unsure.stderr
    down.unlink()
    job0 = _row(_status(env, sweep), "embedded")[2]
    early = run_cli(*args, env=env, check=True)  # the same command while the jobs are queued: nothing submitted twice
    assert early.stdout.count("| submitted: job") == 2 and not (sweep / "slurm" / "entries-1.sbatch").exists()
    assert {lbl: e["job"] for lbl, e in json.loads((sweep / "slurm" / "sweep.json").read_text())["entries"].items()} == jobs

    seen, requeued, deadline, polled = [], False, time.monotonic() + 600, 0.0
    while time.monotonic() < deadline:
        # the records file is read every 0.5 s (entry 0's first case, the moment to requeue); `sweep status`, a CLI process
        # of about a CPU-second that the vLLM servers' start-ups on 2 vCPUs compete with, every 5 s and at that moment
        first_case = not requeued and bool(_records(sweep / "embedded"))
        if not first_case and time.monotonic() - polled < STATUS_EVERY_S:
            time.sleep(0.5)
            continue
        st, polled = _status(env, sweep), time.monotonic()
        if not seen or st != seen[-1]:
            seen.append(st)
            print(f"\n---- sweep status at {time.monotonic() - t0:.0f} s\n{st}")
        if first_case:  # entry 0 has finished a case: requeue it mid-run
            assert _row(st, "embedded")[3] == "running" and _row(st, "embedded-2")[3] == "pending", st
            slurm_cluster.requeue(job0)
            requeued = True
        if "join: job" in st and st.rstrip().endswith("done"):
            break
    else:
        raise AssertionError("the sweep did not finish within 600 s:\n" + seen[-1] + (sweep / "embedded" / "slurm-job.log").read_text()[-3000:])
    assert requeued
    final = seen[-1]
    for label in ("embedded", "embedded-2"):
        assert _row(final, label)[3:5] == ["done", "3/3"], final
        recs = _records(sweep / label)
        ids = [r["id"] for r in recs]
        assert len(ids) == len(set(ids)) == 3 and all(r["status"] == "ok" for r in recs)  # every case done once
        m = json.loads((sweep / label / "metrics.json").read_text())
        assert m["case_status"]["finished"] == 3
    assert _row(final, "embedded")[5] == "1"  # restarted once, by the requeue
    log0 = (sweep / "embedded" / "slurm-job.log").read_text()
    assert "restart 0" in log0 and "restart 1" in log0 and "starting vLLM (CPU) for embedded" in log0
    m0 = json.loads((sweep / "embedded" / "metrics.json").read_text())
    assert m0["run"]["cases_resumed"] >= 1  # the requeued job resumed: what finished before the requeue was kept
    assert any("| running |" in s for s in seen) and any(_row(s, "embedded-2")[3] == "pending" for s in seen)
    summary = (sweep / "summary.md").read_text()
    assert summary.count("| finished |") == 2 and "| (published) |" in summary, summary
    assert "fixture-published" in (sweep / "compare" / "summary.md").read_text()
    assert 'id="section-craftmd"' in (sweep / "report.html").read_text()
    for label in ("embedded", "embedded-2"):  # the data set read from the user's home; the job's own holds no data or models
        assert str(home / "data" / "craftmd-fixture-cases" / "cases.csv") in (sweep / label / "config.yaml").read_text()
        assert {x.name for x in (sweep / label / ".home").iterdir()} <= {"cache", "logs", "servers"}

    again = run_cli(*args, env=env, check=True)  # the same command again: nothing to submit, the join runs here
    assert "every entry of" in again.stderr and again.stdout.count("| skipped: finished earlier |") == 2
    assert slurm_cluster.run("squeue", "-h").stdout.strip() == ""


def test_failed_job_recorded_with_its_log(slurm_cluster, tmp_path):
    """Another process holds the entry's results folder (as a run on another node would, through the shared file
    system): the entry job is refused by the run lock before any server starts, fails for good, and `sweep status`
    shows it with the holder named and the job log's last lines."""
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**slurm_cluster.env}
    sweep = tmp_path / "sweep"
    code = ("import sys, time; from experiments.core.runlock import RunLock; RunLock(sys.argv[1]).acquire(); "
            "print('locked', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(sweep / "embedded")], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        run_cli("sweep", "craftmd", "--models", "embedded", *SMALL, "--out", str(sweep), *SLURM, "--slurm-extra", "comment=medstack-test",
                env=env, check=True)
        assert "#SBATCH --comment=medstack-test" in (sweep / "slurm" / "entries-0.sbatch").read_text()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and _row(st := _status(env, sweep), "embedded")[3] != "failed":
            time.sleep(1)
    finally:
        holder.kill()
        holder.wait()
    print("\n---- sweep status of a failed entry\n" + st)
    said = " ".join(st.split())
    assert _row(st, "embedded")[3] == "failed" and "embedded failed:" in st, st
    assert f"is in use by another medstack process: pid {holder.pid}" in said  # the message, then the log's last lines
    assert "== " in st and "starting vLLM" not in (sweep / "embedded" / "slurm-job.log").read_text()


def test_finetune_job_requeued_resumes_and_writes_adapter(slurm_cluster, tmp_path):
    env = {**slurm_cluster.env}
    out = tmp_path / "ft"
    fix = FIXTURES / "finetune"
    p = run_cli("finetune", "meditod-nlu", "--data", str(fix / "dialogs.json"), "--base", "embedded", "--config", str(fix / "test-cpu.yaml"),
                "--max-steps", "10", "--set", "training.batch_size=2", "--set", "training.eval_steps=5",  # half the test recipe's work per step
                "--out", str(out), "--executor", "slurm", "--gpus", "0", "--slurm-cpus", "1", env=env, check=True)
    assert "submitted as Slurm job" in p.stderr
    script = (out / "slurm-job.sbatch").read_text()
    print("\n---- the fine-tune's sbatch script\n" + script)
    assert "#SBATCH --requeue" in script and "finetune slurm-job" in script and "--gres" not in script
    job = json.loads((out / "slurm-job.json").read_text())["job_id"]
    requeued, deadline = False, time.monotonic() + 400
    while time.monotonic() < deadline:
        st = run_cli("finetune", "status", str(out), env=env, check=True).stdout
        if not requeued and list(out.glob("checkpoint-*/trainer_state.json")):  # a whole checkpoint: requeue mid-training
            print("\n---- finetune status before the requeue\n" + st)
            slurm_cluster.requeue(job)
            requeued = True
        if " done;" in st:
            break
        time.sleep(1)
    print("\n---- finetune status at the end\n" + st)
    assert requeued and f"job {job} done; step 10/10" in st and "restarts 1" in st and "adapter:" in st
    m = json.loads((out / "train_metrics.json").read_text())
    assert m["global_step"] == 10 and m["resumed_from"] and "checkpoint-" in m["resumed_from"]
    assert (out / "adapter" / "adapter_model.safetensors").exists()
    assert "restart 1" in (out / "slurm-job.log").read_text()
