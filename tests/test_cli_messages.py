"""Smaller things a user meets on the command line, each run as a user runs it (a subprocess): a sample larger than the
data is said; an old config path points to experiments/studies/; a data file of another study's format names what the
study reads; a run refused before it starts leaves no folder; `models fetch` offline says what exists; help and
`serve status` stay whole at 60 and 80 columns; a dry run's interruption speaks of a dry run."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from experiments.datasets.registry import MARKER
from tests.conftest import FIXTURES, MEDSTACK, REPO, run_cli

CASES_CSV = str(FIXTURES / "craftmd" / "cases.csv")


def test_a_sample_larger_than_the_data_is_said(tmp_path):
    r = run_cli("run", "craftmd", "--data", CASES_CSV, "--sample", "5000", "--dry-run", "--out", str(tmp_path / "o"), timeout=120)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stderr.splitlines() if "--sample" in l)
    assert "warning" in line and "5,000" in line and "4 cases" in line


def test_an_old_config_path_points_to_its_new_place(tmp_path):
    r = run_cli("run", "craftmd", "--config", "experiments/craftmd/configs/paper.yaml", "--data", CASES_CSV, "--dry-run",
                "--out", str(tmp_path / "o"), timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--config experiments/studies/craftmd/configs/paper.yaml" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_data_set_of_another_study_names_what_the_study_reads(tmp_path):
    folder = tmp_path / "home" / "data" / "craftmd-cases"  # fetched, as `data fetch` leaves a set
    folder.mkdir(parents=True)
    shutil.copy(CASES_CSV, folder / "usmle_and_derm_dataset.csv")
    (folder / MARKER).write_text("{}")
    r = run_cli("run", "agentclinic", "--data", "craftmd-cases", "--dry-run", "--out", str(tmp_path / "o"),
                env={"MEDSTACK_HOME": str(tmp_path / "home")}, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    said = " ".join(r.stderr.split())
    assert "craftmd-cases is CRAFT-MD case CSV" in said and "run agentclinic reads agentclinic-medqa" in said and "OSCE" in said


def test_a_run_refused_before_it_starts_leaves_no_folder(tmp_path):
    env = {"MEDSTACK_HOME": str(tmp_path / "home"), "MEDSTACK_WEIGHTS": str(tmp_path / "weights"), "HF_HOME": str(tmp_path / "hf")}
    args = ("run", "craftmd", "--data", CASES_CSV, "--limit", "1", "--model", "llama3-8b-instruct")
    r = run_cli(*args, "--out", str(tmp_path / "new"), env=env, timeout=120)
    assert r.returncode == 2 and "weights for 'llama3-8b-instruct' not found" in r.stderr
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "mine"  # a folder that was there before: left as it was found
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    r = run_cli(*args, "--out", str(kept), env=env, timeout=120)
    assert r.returncode == 2 and (kept / "notes.txt").read_text() == "mine"


def test_models_fetch_offline_names_what_exists(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    r = run_cli("models", "fetch", "llama3-8b-instruct", timeout=120,
                env={"MEDSTACK_HOME": str(tmp_path / "home"), "MEDSTACK_WEIGHTS": str(weights), "HF_HOME": str(tmp_path / "hf"),
                     "HF_HUB_OFFLINE": "1", "MEDSTACK_ALLOW_DOWNLOAD": "1"})
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert "nothing was fetched" in r.stderr and ".partial" not in r.stderr and list(weights.iterdir()) == []


@pytest.mark.parametrize("columns", ["60", "80"])
def test_help_keeps_defaults_whole(columns):
    for argv in (["run", "craftmd"], ["serve"], ["run", "agentclinic"]):
        r = run_cli(*argv, "--help", env={"COLUMNS": columns}, timeout=120)
        assert r.returncode == 0 and "…" not in r.stdout, (argv, [l for l in r.stdout.splitlines() if "…" in l])
    text = "".join(run_cli("run", "craftmd", "--help", env={"COLUMNS": columns}).stdout.replace("│", "").split())  # as read, wraps undone
    assert "[default:vignette,multiturn,singleturn,summarized]" in text and "--setsampling.doctor.temperature=0." in text


@pytest.mark.parametrize("columns", ["60", "80"])
def test_serve_status_shows_url_and_log_whole(tmp_path, columns):
    home = tmp_path / "home"
    (home / "servers").mkdir(parents=True)
    log = home / "logs" / "vllm-llama3-8b-instruct-port8123-a-rather-long-name-20261129T040000.log"
    url = "http://127.0.0.1:9/v1"  # nothing listens: not healthy, said at once
    stand_in = subprocess.Popen(["sleep", "60"])
    try:
        (home / "servers" / "llama3-8b-instruct-9.json").write_text(json.dumps(
            {"alias": "llama3-8b-instruct", "base_url": url, "port": 9, "pid": stand_in.pid, "log": str(log), "device": "cuda",
             "dtype": "bfloat16", "gpu_memory_utilization": 0.9}))
        r = run_cli("serve", "status", env={"MEDSTACK_HOME": str(home), "COLUMNS": columns}, timeout=120)
    finally:
        stand_in.kill()
        stand_in.wait()
    assert r.returncode == 0, r.stderr
    lines = [l.strip() for l in r.stdout.splitlines()]
    assert f"url: {url}" in lines and f"log: {log}" in lines and "…" not in r.stdout


def test_a_dry_runs_interruption_speaks_of_a_dry_run(tmp_path):
    fifo = tmp_path / "cases.csv"  # the dry run waits on reading it: stopped there by SIGTERM
    os.mkfifo(fifo)
    proc = subprocess.Popen([*MEDSTACK, "run", "craftmd", "--data", str(fifo), "--dry-run", "--out", str(tmp_path / "o")], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while True:  # until the command has opened the file for reading (its handlers are set by then)
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            assert e.errno == errno.ENXIO and time.time() < deadline and proc.poll() is None
            time.sleep(0.1)
    try:
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(writer)
    assert proc.returncode == 130, err
    assert "dry run" in err and "finished results are kept" not in err
