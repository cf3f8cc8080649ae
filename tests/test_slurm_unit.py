"""The Slurm executors without a Slurm: the #SBATCH lines, job states, resources from the registry, the GPU split,
`sweep status` from the state files, and the options' bad input (one line, exit 2/3). The real Slurm is tests/slurm/."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from experiments.sweep import slurm as sweep_slurm
from models.errors import MedstackError
from serving import launcher, slurm
from tests.conftest import FIXTURES, run_cli


def test_header_asks_for_what_the_options_say(tmp_path):
    opts = slurm.SlurmOptions(partition="gpu", account="proj", time="04:00:00", max_parallel=2,
                              extra=slurm.parse_extra(["constraint=a100", "qos=normal,hold"]))
    lines = slurm.header("medstack-x", opts, gpus=2, mem_gb=96, output=tmp_path / "log", array="0-3")
    assert lines == ["#SBATCH " + x for x in [
        "--job-name=medstack-x", f"--output={tmp_path / 'log'}", "--open-mode=append", "--nodes=1", "--ntasks=1", "--cpus-per-task=16",
        "--gres=gpu:2", "--mem=96G", "--partition=gpu", "--account=proj", "--time=04:00:00", "--array=0-3%2", "--requeue",
        "--constraint=a100", "--qos=normal", "--hold"]]
    cpu = slurm.header("j", slurm.SlurmOptions(), gpus=0, mem_gb=None, output=tmp_path / "l", requeue=False)
    assert "#SBATCH --cpus-per-task=2" in cpu and not any("gres" in x or "mem" in x or "requeue" in x for x in cpu)
    with pytest.raises(MedstackError, match="--slurm-extra"):
        slurm.parse_extra(["=x"])


def test_script_file_is_private_and_runnable(tmp_path):
    text = slurm.sbatch_script(["#SBATCH --x=1"], ["echo hi"], chdir=tmp_path, opts=slurm.SlurmOptions(setup=["module load cuda"]), comment="c")
    assert text.splitlines()[:3] == ["#!/bin/bash", "# c", "#SBATCH --x=1"] and f"#SBATCH --chdir={tmp_path}" in text
    assert text.index("module load cuda") < text.index("echo hi")
    p = slurm.write_script(tmp_path / "s.sbatch", text)
    assert stat.S_IMODE(p.stat().st_mode) == 0o700 or stat.S_IMODE(p.stat().st_mode) & 0o077 == 0


@pytest.mark.parametrize("queued, written, shown", [
    ("PENDING", {}, "pending"), ("REQUEUED", {"state": "interrupted"}, "pending"), ("RUNNING", {"state": "running"}, "running"),
    (None, {"state": "done"}, "done"), (None, {"state": "failed"}, "failed"),
    (None, {"state": "running"}, "failed"), (None, {"state": "submitted"}, "failed"), (None, {}, "not submitted")])
def test_shown_state(queued, written, shown):
    assert slurm.shown_state(queued, written) == shown


def test_state_file_merges_and_is_never_torn(tmp_path):
    p = tmp_path / "job.json"
    slurm.write_state(p, state="running", job_id="1_0")
    slurm.write_state(p, state="done")
    st = json.loads(p.read_text())
    assert st["state"] == "done" and st["job_id"] == "1_0" and not list(tmp_path.glob("*.tmp*"))


def test_resources_and_gpu_split_from_the_registry():
    two = {"clinical": "mistral-7b-instruct-v0.2", "patient": "llama3-8b-instruct", "grader": "llama3-8b-instruct"}
    assert sweep_slurm.entry_resources(two) == (2, 96)
    assert sweep_slurm.entry_resources({"clinical": "embedded", "patient": "embedded"}) == (0, 4)
    assert sweep_slurm.entry_resources({"clinical": "embedded", "patient": "llama3-8b-instruct@http://127.0.0.1:9/v1"}) == (0, 4)
    plan = sweep_slurm.gpu_plan(two, "3,5")
    assert plan == {"MEDSTACK_GPU_PLAN": "llama3-8b-instruct=3;mistral-7b-instruct-v0.2=5"}
    assert sweep_slurm.gpu_plan({"clinical": "llama3-8b-instruct"}, "0") == {}  # one model: it sees the job's GPUs
    os.environ["MEDSTACK_GPU_PLAN"] = plan["MEDSTACK_GPU_PLAN"]
    try:
        assert launcher.planned_gpus("mistral-7b-instruct-v0.2") == {"CUDA_VISIBLE_DEVICES": "5"}
        assert launcher.planned_gpus("embedded") == {}
    finally:
        del os.environ["MEDSTACK_GPU_PLAN"]


def test_status_from_state_files(tmp_path, monkeypatch):
    """`sweep status` reads the plan and each job's state file; a failed entry shows its reason and log tail."""
    sweep = tmp_path / "sweep"
    (sweep / "slurm").mkdir(parents=True)
    for label in ("a", "b"):
        (sweep / label).mkdir()
    (sweep / "a" / "records.jsonl").write_text('{"id": "x/t0", "status": "ok"}\n{"id": "y/t0", "status": "failed"}\n')
    (sweep / "b" / "slurm-job.log").write_text("== start\nTraceback-free error: weights missing\n")
    slurm.write_state(sweep / "b" / "slurm-job.json", state="failed", message="weights for 'x' not found", restarts=2)
    plan = {"spec": {"study": "craftmd"}, "join_job": "9",
            "entries": {"a": {"model": "m1", "out": str(sweep / "a"), "cases": 3, "job": "8_0"},
                        "b": {"model": "m2", "out": str(sweep / "b"), "cases": 3, "job": "8_1"}}}
    (sweep / "slurm" / "sweep.json").write_text(json.dumps(plan))
    monkeypatch.setattr(sweep_slurm, "queue_states", lambda ids: {"8_0": "RUNNING", "9": "PENDING"})
    text = "\n".join(sweep_slurm.status_lines(sweep))
    assert "| a | m1 | 8_0 | running | 1/3 | 0 |" in text and "| b | m2 | 8_1 | failed | 0/3 | 2 |" in text
    assert "join: job 9 pending" in text and "b failed: weights for 'x' not found" in text and "    weights missing" in text.replace("Traceback-free error: ", "")


def test_bad_options_and_missing_slurm(tmp_path):
    p = run_cli("sweep", "status", str(tmp_path / "nothing"))
    assert p.returncode == 2 and "no Slurm sweep here" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("sweep", "craftmd", "--models", "embedded", "--data", str(FIXTURES / "craftmd" / "cases.csv"), "--executor", "pbs")
    assert p.returncode == 2 and "--executor 'pbs': local or slurm" in p.stderr
    p = run_cli("finetune", "status", str(tmp_path))
    assert p.returncode == 2 and "no Slurm fine-tune here" in " ".join(p.stderr.split())
    bare = {"PATH": str(tmp_path)}  # no sbatch on PATH: an environment fault, exit 3, naming what is missing
    p = run_cli("sweep", "craftmd", "--models", "embedded", "--data", str(FIXTURES / "craftmd" / "cases.csv"), "--executor", "slurm",
                "--out", str(tmp_path / "s"), env=bare)
    assert p.returncode == 3 and "sbatch, squeue, scontrol not found on PATH" in " ".join(p.stderr.split()), p.stderr
    assert not (tmp_path / "s").exists()
