"""The Slurm executors without a Slurm: the #SBATCH lines, job states, resources from the registry, the GPU split,
`sweep status` from the state files, and the options' bad input (one line, exit 2/3). The real Slurm is tests/slurm/."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from experiments.tools.sweep import slurm as sweep_slurm
from models.errors import MedstackError
from serving import launcher, slurm
from tests.conftest import FIXTURES, run_cli


def test_header_asks_for_what_the_options_say(tmp_path):
    opts = slurm.SlurmOptions(partition="gpu", account="proj", time="04:00:00",
                              extra=slurm.parse_extra(["constraint=a100", "mail-type=BEGIN,END", "exclude=n1,n2", "hold"]))
    lines = slurm.header("medstack-x", opts, gpus=2, mem_gb=96, output=tmp_path / "log", array="0-3%2")
    assert lines == ["#SBATCH " + x for x in [
        "--job-name=medstack-x", f"--output={tmp_path / 'log'}", "--open-mode=append", "--nodes=1", "--ntasks=1", "--cpus-per-task=16",
        "--gres=gpu:2", "--mem=96G", "--partition=gpu", "--account=proj", "--time=04:00:00", "--array=0-3%2", "--requeue",
        "--constraint=a100", "--mail-type=BEGIN,END", "--exclude=n1,n2", "--hold"]]  # a value keeps its commas
    cpu = slurm.header("j", slurm.SlurmOptions(), gpus=0, mem_gb=None, output=tmp_path / "l", requeue=False)
    assert "#SBATCH --cpus-per-task=2" in cpu and not any("gres" in x or "mem" in x or "requeue" in x for x in cpu)
    with pytest.raises(MedstackError, match="--slurm-extra"):
        slurm.parse_extra(["=x"])


@pytest.mark.parametrize("kw, option", [({"partition": "gpu\n#SBATCH --x"}, "--slurm-partition"), ({"account": "a\rb"}, "--slurm-account"),
                                        ({"time": "10\n"}, "--slurm-time"), ({"setup": ["module load x\nrm -r y"]}, "--slurm-setup"),
                                        ({"extra": {"comment": "a\x1bb"}}, "--slurm-extra")])
def test_control_characters_refused_naming_the_option(kw, option):
    with pytest.raises(MedstackError, match=f"^{option} .*newline or control character"):
        slurm.SlurmOptions(**kw)
    with pytest.raises(MedstackError, match="^--slurm-extra "):
        slurm.parse_extra(["mail-user=a@b\n#SBATCH --requeue"])


def test_paths_with_spaces_are_quoted_as_sbatch_reads_them(tmp_path):
    folder = tmp_path / "my sweep"
    (hdr,) = [x for x in slurm.header("j", slurm.SlurmOptions(), gpus=0, mem_gb=None, output=folder / "x.out") if "--output" in x]
    assert hdr == f"#SBATCH --output='{folder}/x.out'"
    text = slurm.sbatch_script([hdr], ["echo hi"], chdir=folder, opts=slurm.SlurmOptions(), comment="c")
    assert f"#SBATCH --chdir='{folder}'" in text
    with pytest.raises(MedstackError, match="newline or control character"):
        slurm.header("j", slurm.SlurmOptions(), gpus=0, mem_gb=None, output=tmp_path / "a\nb" / "x.out")


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


def test_servers_on_gpus_of_their_own_are_planned_each_against_its_gpu(monkeypatch):
    """Two 8B servers a job put on GPUs 3 and 5: each is alone on its (idle) GPU, so each gets vLLM's default share; on
    one GPU they split it. A 20 GB GPU holds one of them but not both: refused only when they would share it."""
    asked = []
    monkeypatch.setattr(launcher, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(launcher, "gpu_memory_gib", lambda device=None: asked.append(device) or (20.0, 19.6))
    pair = ["llama3-8b-instruct", "mistral-7b-instruct-v0.2"]
    monkeypatch.setenv("MEDSTACK_GPU_PLAN", "llama3-8b-instruct=3;mistral-7b-instruct-v0.2=5")
    assert launcher.plan_gpu_shares(pair, log=lambda m: None) == {} and asked == ["3", "5"]
    monkeypatch.delenv("MEDSTACK_GPU_PLAN")
    with pytest.raises(MedstackError, match="2 vLLM server"):
        launcher.plan_gpu_shares(pair, log=lambda m: None)
    monkeypatch.setattr(launcher, "gpu_memory_gib", lambda device=None: (79.6, 79.2))
    shares = launcher.plan_gpu_shares(pair, log=lambda m: None)
    assert set(shares) == set(pair) and all(0.3 < f < 0.6 for f in shares.values()) and sum(shares.values()) <= 0.9


@pytest.mark.parametrize("sizes, limit, expected", [
    ([3, 1], 1, [(1, True), (1, True)]),  # fewer than one per array: the arrays one after another
    ([3, 1], 2, [(1, False), (1, False)]), ([3, 1], 4, [(3, False), (1, False)]), ([3, 1], 9, [(3, False), (1, False)]),
    ([4], None, [(None, False)])])
def test_max_parallel_caps_the_sweep_over_its_arrays(monkeypatch, sizes, limit, expected):
    runs = [type("R", (), {"roles": {"clinical": f"m{g}"}})() for g, n in enumerate(sizes) for _ in range(n)]
    monkeypatch.setattr(sweep_slurm, "entry_resources", lambda roles: (1, int(roles["clinical"][1:])))
    arrays = sweep_slurm._arrays(runs, limit)
    assert [len(g) for g, *_ in arrays] == sizes and [(n, chained) for _, n, chained in arrays] == expected


def test_slurm_commands_retried_and_an_unanswered_queue_is_unknown(monkeypatch):
    calls = []

    def fake_run(argv, **kw):
        calls.append(argv[0])
        if len(calls) <= 2:
            raise subprocess.TimeoutExpired(argv, kw.get("timeout"))
        if len(calls) == 3:
            return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n")
        return subprocess.CompletedProcess(argv, 0, "8_0 RUNNING\n8_1 PENDING\n", "")

    monkeypatch.setattr(slurm, "RETRY_DELAYS", (0, 0, 0))
    monkeypatch.setattr(slurm.subprocess, "run", fake_run)
    assert slurm.queue_states(["8_0", "8_1"]) == {"8_0": "RUNNING", "8_1": "PENDING"} and len(calls) == 4
    calls.clear()
    monkeypatch.setattr(slurm.subprocess, "run", lambda argv, **kw: calls.append(1) or subprocess.CompletedProcess(
        argv, 1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"))
    with pytest.raises(slurm.QueueUnknown) as e:
        slurm.queue_states(["8_0"])
    assert len(calls) == 4 and e.value.reason == "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    assert e.value.exit_code == 3
    monkeypatch.setattr(slurm.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n"))
    assert slurm.queue_states(["8_0"]) == {}  # every job asked about has left the queue: an answer
    calls.clear()
    monkeypatch.setattr(slurm.subprocess, "run", lambda argv, **kw: calls.append(argv[0]) or (_ for _ in ()).throw(subprocess.TimeoutExpired(argv, 30)))
    monkeypatch.setattr(slurm, "require_slurm", lambda: None)
    with pytest.raises(slurm.SlurmError, match="the job may be queued"):
        slurm.submit(Path("x.sbatch"), cwd=Path("."))
    assert calls.count("sbatch") == 1 and calls[1:] == ["squeue"] * 4  # it may have submitted: the queue asked (no answer), never run twice


def test_one_job_per_submission_whatever_sbatch_says(monkeypatch):
    """Each submission carries a unique comment; after a failed sbatch the queue is asked for it before sbatch runs
    again. An sbatch that queues and then exits 1 ("Socket timed out"): its job is the one, no second sbatch. One that
    queued nothing: run again, one job."""
    queue: list[tuple[str, str]] = []
    sbatch_calls: list[list[str]] = []

    def fake_run(argv, **kw):
        if argv[0] == "sbatch":
            sbatch_calls.append(argv)
            comment = next(a.split("=", 1)[1] for a in argv if a.startswith("--comment="))
            job = str(500 + len(queue))
            if behaviour.pop(0) == "queue then fail":
                queue.append((job, comment))
                return subprocess.CompletedProcess(argv, 1, "", "sbatch: error: Socket timed out on send/recv operation\n")
            if behaviour and behaviour[0] == "never":  # fails without queuing
                return subprocess.CompletedProcess(argv, 1, "", "sbatch: error: Batch job submission failed\n")
            queue.append((job, comment))
            return subprocess.CompletedProcess(argv, 0, f"{job}\n", "")
        assert argv[:2] == ["squeue", "-h"] and "--me" in argv
        return subprocess.CompletedProcess(argv, 0, "".join(f"{j} {c}\n" for j, c in queue), "")

    monkeypatch.setattr(slurm, "RETRY_DELAYS", (0, 0, 0))
    monkeypatch.setattr(slurm, "require_slurm", lambda: None)
    monkeypatch.setattr(slurm.subprocess, "run", fake_run)
    behaviour = ["queue then fail"]
    assert slurm.submit(Path("x.sbatch"), cwd=Path(".")) == "500" and len(sbatch_calls) == 1 and len(queue) == 1
    behaviour = ["fail", "ok"]
    sbatch_calls.clear()

    def fail_once(argv, **kw):
        if argv[0] == "sbatch" and len(sbatch_calls) == 0:
            sbatch_calls.append(argv)
            return subprocess.CompletedProcess(argv, 1, "", "sbatch: error: Batch job submission failed\n")
        return fake_run(argv, **kw)

    monkeypatch.setattr(slurm.subprocess, "run", fail_once)
    behaviour = ["ok"]
    assert slurm.submit(Path("x.sbatch"), cwd=Path(".")) == "501" and len(sbatch_calls) == 2 and len(queue) == 2
    tokens = {a for call in sbatch_calls for a in call if a.startswith("--comment=")}
    assert len(tokens) == 1  # the retry carries the same token: asked for it, never a second job under another


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

    def no_answer(ids):
        raise slurm.QueueUnknown("slurm_load_jobs error: Socket timed out on send/recv operation")

    monkeypatch.setattr(sweep_slurm, "queue_states", no_answer)  # the queue unread: a job still running is unknown, never failed
    slurm.write_state(sweep / "a" / "slurm-job.json", state="running")
    text = "\n".join(sweep_slurm.status_lines(sweep))
    assert "| a | m1 | 8_0 | unknown (squeue: slurm_load_jobs error: Socket timed out on send/recv operation) | 1/3 | 0 |" in text
    assert "| b | m2 | 8_1 | failed |" in text and "join: job 9 unknown (squeue: " in text  # b said itself that it failed


def test_dry_run_writes_the_scripts_and_runs_no_slurm_command(tmp_path):
    """`--executor slurm --dry-run` with an sbatch, squeue, scontrol and scancel on PATH that record any call: none is
    called; the scripts (in a sweep folder whose path holds a space) and the plan are written; the sbatch commands
    are printed. A value with a newline is refused, naming the option, before anything is written."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "slurm-calls"
    bin_dir.mkdir()
    for name in ("sbatch", "squeue", "scontrol", "scancel"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\nexit 1\n')
        (bin_dir / name).chmod(0o700)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    sweep = tmp_path / "my sweep"
    args = ["sweep", "craftmd", "--models", "embedded,embedded", "--data", str(FIXTURES / "craftmd" / "cases.csv"), "--limit", "2",
            "--trials", "1", "--formats", "vignette", "--no-frq", "--config", "experiments/studies/craftmd/configs/embedded-small.yaml",
            "--executor", "slurm", "--slurm-extra", "mail-type=BEGIN,END", "--slurm-max-parallel", "1", "--out", str(sweep)]
    p = run_cli(*args, "--dry-run", env=env)
    assert p.returncode == 0, p.stderr
    assert not calls.exists(), calls.read_text()
    script = (sweep / "slurm" / "dry-run" / "entries-0.sbatch").read_text()
    assert f"#SBATCH --output='{sweep}/slurm/entries-%A_%a.out'" in script and "#SBATCH --mail-type=BEGIN,END" in script
    assert "#SBATCH --array=0-1%1" in script and "#SBATCH --dependency" not in script
    assert not (sweep / "slurm" / "sweep.json").exists()  # the live plan: only a submission writes it
    plan = json.loads((sweep / "slurm" / "dry-run" / "sweep.json").read_text())
    assert "--dry-run" not in plan["spec"]["args"] and not any(e.get("job") for e in plan["entries"].values())
    said = " ".join(p.stderr.split())
    assert "no Slurm command was run, nothing submitted" in said and "JOB0=$(sbatch --parsable" in said
    assert "--dependency=afterany:$JOB0 " in said and "join.sbatch" in said and p.stdout.count("| dry run: task ") == 2
    assert subprocess.run(["bash", "-n", str(sweep / "slurm" / "dry-run" / "entries-0.sbatch")]).returncode == 0
    bad = run_cli(*args[:-2], "--out", str(tmp_path / "other"), "--slurm-partition", "gpu\n#SBATCH --requeue", "--dry-run", env=env)
    assert bad.returncode == 2 and "--slurm-partition" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "other").exists() and not calls.exists()


def test_bad_options_and_missing_slurm(tmp_path):
    p = run_cli("sweep", "status", str(tmp_path / "nothing"))
    assert p.returncode == 2 and "no Slurm sweep here" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("sweep", "craftmd", "--models", "embedded", "--data", str(FIXTURES / "craftmd" / "cases.csv"), "--executor", "pbs")
    assert p.returncode == 2 and "'--executor'" in p.stderr and "'pbs' is not one of 'local', 'slurm'" in p.stderr
    p = run_cli("finetune", "status", str(tmp_path))
    assert p.returncode == 2 and "no Slurm fine-tune here" in " ".join(p.stderr.split())
    bare = {"PATH": str(tmp_path)}  # no sbatch on PATH: an environment fault, exit 3, naming what is missing
    p = run_cli("sweep", "craftmd", "--models", "embedded", "--data", str(FIXTURES / "craftmd" / "cases.csv"), "--executor", "slurm",
                "--out", str(tmp_path / "s"), env=bare)
    assert p.returncode == 3 and "sbatch, squeue, scontrol not found on PATH" in " ".join(p.stderr.split()), p.stderr
    assert not (tmp_path / "s").exists()


def test_a_plan_cannot_change_under_its_queued_jobs(tmp_path):
    """Submitted with --limit 2 --trials 1 (fake sbatch and squeue: the jobs stay PENDING), then: the same sweep with
    --limit 1 --trials 3 --dry-run leaves the live plan and its scripts byte for byte; submitted for real, it is refused
    (exit 2) naming the queued jobs and the scancel that frees them; the original command still joins its jobs."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "slurm-calls"
    bin_dir.mkdir()
    scripts = {"sbatch": f'echo "sbatch $*" >> {calls}\necho 77\n',
               "squeue": f'echo "squeue $*" >> {calls}\nprintf "77_0 PENDING\\n77_1 PENDING\\n"\n',
               "scontrol": "exit 0\n", "scancel": f'echo "scancel $*" >> {calls}\n'}
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o700)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    sweep = tmp_path / "sweep"
    base = ["sweep", "craftmd", "--models", "embedded,embedded", "--data", str(FIXTURES / "craftmd" / "cases.csv"), "--formats", "vignette",
            "--no-frq", "--config", "experiments/studies/craftmd/configs/embedded-small.yaml", "--executor", "slurm", "--out", str(sweep)]
    p = run_cli(*base, "--limit", "2", "--trials", "1", env=env)
    assert p.returncode == 0, p.stderr
    live = {f.name: f.read_bytes() for f in (sweep / "slurm").iterdir() if f.is_file()}
    assert "sweep.json" in live and json.loads(live["sweep.json"])["entries"]["embedded"]["job"] == "77_0"
    p = run_cli(*base, "--limit", "1", "--trials", "3", "--dry-run", env=env)
    assert p.returncode == 0, p.stderr
    assert {f.name: f.read_bytes() for f in (sweep / "slurm").iterdir() if f.is_file()} == live  # the plan the jobs read, unchanged
    assert "--trials" in json.loads((sweep / "slurm" / "dry-run" / "sweep.json").read_text())["spec"]["args"]
    n_sbatch = calls.read_text().count("sbatch ")
    p = run_cli(*base, "--limit", "1", "--trials", "3", env=env)
    said = " ".join(p.stderr.split())
    assert p.returncode == 2 and "cannot change while its jobs are queued" in said and "embedded: job 77_0" in said and "scancel 77" in said
    assert calls.read_text().count("sbatch ") == n_sbatch and {f.name: f.read_bytes() for f in (sweep / "slurm").iterdir() if f.is_file()} == live
    # a second job of one entry (an sbatch that queued twice): the folder is held by the tracked job, so it leaves
    # without touching the entry's state
    from experiments.core.runlock import RunLock

    state = sweep / "embedded" / "slurm-job.json"
    slurm.write_state(state, state="running", job_id="77_0")
    before = state.read_bytes()
    with RunLock(sweep / "embedded"):
        p = run_cli("sweep", "slurm-job", str(sweep), "embedded", env=env)
    assert state.read_bytes() == before and "in use by another medstack process" in " ".join(p.stderr.split()), p.stderr[-2000:]


def _recording_slurm(tmp_path: Path, sbatch: str) -> tuple[dict, Path]:
    """sbatch, squeue, scontrol, scancel on PATH that log each call; ``sbatch``: the body of the fake sbatch."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "slurm-calls"
    bin_dir.mkdir()
    bodies = {"sbatch": f'echo "sbatch $*" >> {calls}\n{sbatch}', "squeue": f'echo "squeue $*" >> {calls}\n',
              "scontrol": "exit 0\n", "scancel": f'echo "scancel $*" >> {calls}\n'}
    for name, body in bodies.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o700)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, calls


def test_dry_run_without_the_weights_writes_the_scripts_and_the_join_asks_for_little(tmp_path):
    """A Slurm dry run over two 8B models whose weights are not here: a warning naming the fetch, exit 0, the scripts
    written (never an empty slurm/ folder); the join asks for no GPU, 30 minutes, on its own partition. Submitted for
    real, the same sweep is refused (exit 2) before anything is written or any Slurm command runs."""
    env, calls = _recording_slurm(tmp_path, "exit 1\n")
    env.update(MEDSTACK_WEIGHTS=str(tmp_path / "no-weights"), HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(tmp_path / "hf" / "hub"))
    argv = ["sweep", "craftmd", "--models", "llama3-8b-instruct,mistral-7b-instruct-v0.2", "--role", "patient=llama3-8b-instruct",
            "--role", "grader=llama3-8b-instruct", "--data", str(FIXTURES / "craftmd" / "cases.csv"), "--limit", "2", "--trials", "1",
            "--formats", "vignette", "--no-frq", "--executor", "slurm", "--slurm-partition", "gpu", "--slurm-time", "6:00:00",
            "--slurm-join-partition", "cpu"]
    sweep = tmp_path / "sweep"
    p = run_cli(*argv, "--out", str(sweep), "--dry-run", env=env)
    said = " ".join(p.stderr.split())
    assert p.returncode == 0, p.stderr
    assert "the weights of llama3-8b-instruct are not here yet" in said and "medstack models fetch mistral-7b-instruct-v0.2" in said
    assert not calls.exists()
    entries = (sweep / "slurm" / "dry-run" / "entries-0.sbatch").read_text()
    assert "#SBATCH --gres=gpu:" in entries and "#SBATCH --partition=gpu" in entries and "#SBATCH --time=6:00:00" in entries
    join = (sweep / "slurm" / "dry-run" / "join.sbatch").read_text()
    assert "--gres" not in join and "#SBATCH --partition=cpu" in join and "#SBATCH --time=0:30:00" in join and "#SBATCH --cpus-per-task=1" in join
    refused = run_cli(*argv, "--out", str(tmp_path / "real"), env=env)
    assert refused.returncode == 2 and "would fail in its job" in " ".join(refused.stderr.split()), refused.stderr
    assert not (tmp_path / "real" / "slurm").exists() and not calls.exists()


def test_a_refused_submission_says_what_to_check_and_leaves_nothing(tmp_path):
    """sbatch refuses the partition: one line with sbatch's reason (said once), what to check next; no script, plan
    or slurm/ folder is left, so the same command again starts clean."""
    env, calls = _recording_slurm(tmp_path, 'echo "sbatch: fatal: Invalid partition name specified" >&2\nexit 1\n')
    sweep = tmp_path / "sweep"
    p = run_cli("sweep", "craftmd", "--models", "embedded", "--data", str(FIXTURES / "craftmd" / "cases.csv"), "--limit", "1", "--trials", "1",
                "--formats", "vignette", "--no-frq", "--config", "experiments/studies/craftmd/configs/embedded-small.yaml",
                "--executor", "slurm", "--slurm-partition", "nosuch", "--out", str(sweep), env=env)
    said = " ".join(p.stderr.split())
    assert p.returncode == 3 and "Traceback" not in p.stderr, p.stderr
    assert "sbatch: fatal: Invalid partition name specified" in said and "sbatch: sbatch:" not in said
    assert "--partition nosuch" in said and "sinfo" in said and "nothing of it was kept" in said
    assert calls.read_text().count("sbatch ") >= 1
    assert not (sweep / "slurm").exists()


def test_status_names_case_trials_and_a_join_not_submitted(tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    (sweep / "slurm").mkdir(parents=True)
    (sweep / "a").mkdir()
    plan = {"spec": {"study": "craftmd"}, "unit_noun": "case-trials", "join_job": None,
            "entries": {"a": {"model": "m1", "out": str(sweep / "a"), "cases": 10, "job": "8_0"}}}
    (sweep / "slurm" / "sweep.json").write_text(json.dumps(plan))
    monkeypatch.setattr(sweep_slurm, "queue_states", lambda ids: {"8_0": "PENDING"})
    text = "\n".join(sweep_slurm.status_lines(sweep))
    assert "| entry | model | job | state | case-trials | restarts |" in text and "| a | m1 | 8_0 | pending | 0/10 | 0 |" in text
    assert "join: not submitted yet" in text and "join: job -" not in text
