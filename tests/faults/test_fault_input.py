"""Fault matrix, part 1: faults met before any model is called. Each row provokes the fault for real
through the CLI and asserts the exit code, the one-line message (what and where, and the next step),
that there is no traceback and, where records exist, that none was lost."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, run_cli
from tests.faults.conftest import FAULT_CASES, craftmd_run

DEAD = "http://127.0.0.1:9/v1"  # nothing listens on port 9: every request fails in transport, at once


def no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]


def test_config_not_utf8_names_file_and_byte_offset(tmp_path):
    cfg = tmp_path / "latin1.yaml"
    cfg.write_bytes("trials: 1\n# r\xe9sum\xe9\n".encode("latin-1"))
    proc = run_cli("run", "craftmd", "--data", str(FAULT_CASES), "--model", "embedded", "--config", str(cfg), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    no_traceback(proc)
    assert str(cfg) in proc.stderr and "not UTF-8" in proc.stderr and "byte offset 13" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_config_lora_entry_missing_folder_is_checked_like_the_option_before_anything_is_written(tmp_path):
    cfg = tmp_path / "lora.yaml"
    cfg.write_text(Path("experiments/studies/meditod/configs/nlu_supervised.yaml").read_text() + f"\nlora: {{nlu: {tmp_path / 'no-such-adapter'}}}\n")
    out = tmp_path / "o"
    proc = run_cli("run", "meditod-nlu", "--data", str(FIXTURES / "meditod" / "dialogs.json"), "--model", "embedded",
                   "--mode", "supervised", "--config", str(cfg), "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    no_traceback(proc)
    assert f"{cfg}: lora.nlu" in proc.stderr and "no-such-adapter" in proc.stderr and "adapter_config.json" in proc.stderr
    assert not (out / "config.yaml").exists()


@pytest.mark.parametrize("name", ["--evil", "-x", "a b", "x;rm", "näme"])
def test_adapter_names_are_checked_on_the_option_and_in_config(tmp_path, name, lora_dir):
    proc = run_cli("run", "meditod-nlu", "--data", str(FIXTURES / "meditod" / "dialogs.json"), "--model", "embedded",
                   "--mode", "supervised", f"--lora={name}={lora_dir}", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    no_traceback(proc)
    assert "adapter name" in proc.stderr and "not starting with '-'" in proc.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text(Path("experiments/studies/meditod/configs/nlu_supervised.yaml").read_text() + "\nlora: " + json.dumps({name: str(lora_dir)}) + "\n")
    proc = run_cli("run", "meditod-nlu", "--data", str(FIXTURES / "meditod" / "dialogs.json"), "--model", "embedded",
                   "--mode", "supervised", "--config", str(cfg), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "adapter name" in proc.stderr and f"{cfg}: lora" in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()


def test_serve_lora_name_starting_with_dash_never_reaches_vllm(lora_dir):
    proc = run_cli("serve", "--model", "embedded", f"--lora=--evil={lora_dir}", "--port", "8189")
    assert proc.returncode == 2 and "adapter name '--evil'" in proc.stderr, proc.stderr
    no_traceback(proc)


@pytest.fixture
def lora_dir(tmp_path) -> Path:
    d = tmp_path / "adapter"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    return d


def test_out_below_a_file_names_the_out_path(tmp_path):
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "run"
    proc = run_cli(*craftmd_run(DEAD, out))
    assert proc.returncode == 2, proc.stderr
    no_traceback(proc)
    assert f"--out {out}" in proc.stderr and "is a file" in proc.stderr


@pytest.mark.parametrize("line,expected", [
    ('{"status": "ok", "answer": 1}', "record without an 'id'"),
    ('[1, 2, 3]', "a list, not a record"),
    ('"text"', "a str, not a record"),
])
def test_records_line_that_is_json_but_not_a_record_names_file_and_line(tmp_path, line, expected):
    out = tmp_path / "run"
    first = run_cli(*craftmd_run(DEAD, out, limit=2))  # config.yaml + two failed records (nothing answers)
    assert first.returncode == 3, first.stderr
    before = (out / "records.jsonl").read_text()
    (out / "records.jsonl").write_text(before + line + "\n")
    proc = run_cli(*craftmd_run(DEAD, out, limit=2))
    assert proc.returncode == 2, proc.stderr
    no_traceback(proc)
    assert f"{out / 'records.jsonl'}:3: {expected}" in proc.stderr and "delete that line" in proc.stderr
    assert (out / "records.jsonl").read_text() == before + line + "\n"  # nothing rewritten or lost


def test_non_loopback_host_without_key_is_refused_with_the_ways_out():
    env = {k: v for k, v in os.environ.items() if k != "MEDSTACK_API_KEY"}
    import subprocess

    from tests.conftest import MEDSTACK, REPO

    proc = subprocess.run([*MEDSTACK, "serve", "--model", "embedded", "--host", "0.0.0.0", "--port", "8188"], cwd=REPO,
                          capture_output=True, text=True, env={**env, "COLUMNS": "200"}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    no_traceback(proc)
    for needle in ("--host 0.0.0.0", "--api-key", "$MEDSTACK_API_KEY", "--no-auth"):
        assert needle in proc.stderr
    assert "--port 8188" not in subprocess_ps()  # nothing was started


def test_resume_command_is_printed_verbatim_and_without_the_key(tmp_path):
    out = tmp_path / "run"
    secret = "sk-resume-7a1f0c"
    args = [*craftmd_run(DEAD, out, limit=2), "--set", "formats=[vignette]", "--api-key", secret]
    proc = run_cli(*args)
    assert proc.returncode == 3, proc.stderr
    no_traceback(proc)
    text = " ".join(proc.stderr.split())  # the console may wrap long lines
    assert "--set 'formats=[vignette]'" in text
    assert secret not in proc.stderr + proc.stdout
    assert "$MEDSTACK_API_KEY" in proc.stderr
    summary = (out / "summary.md").read_text()
    assert "--set 'formats=[vignette]'" in summary and secret not in summary
    for f in out.iterdir():
        assert secret not in f.read_text(errors="replace"), f


def test_results_and_home_are_private_by_default_and_shared_with_medstack_umask(tmp_path, medstack_home):
    out = tmp_path / "runs" / "private"
    proc = run_cli(*craftmd_run(DEAD, out, limit=1))
    assert proc.returncode == 3, proc.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o700 and stat.S_IMODE(out.parent.stat().st_mode) == 0o700
    for f in out.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    cache = medstack_home / "cache"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache / "responses.sqlite").stat().st_mode) == 0o600
    # a folder and files from before (0755/0644) are tightened when the run resumes
    os.chmod(out, 0o755)
    os.chmod(out / "records.jsonl", 0o644)
    os.chmod(cache / "responses.sqlite", 0o644)
    run_cli(*craftmd_run(DEAD, out, limit=1))
    assert stat.S_IMODE(out.stat().st_mode) == 0o700 and stat.S_IMODE((out / "records.jsonl").stat().st_mode) == 0o600
    assert stat.S_IMODE((cache / "responses.sqlite").stat().st_mode) == 0o600
    shared = tmp_path / "runs" / "shared"
    proc = run_cli(*craftmd_run(DEAD, shared, limit=1), env={"MEDSTACK_UMASK": "027"})
    assert proc.returncode == 3
    assert stat.S_IMODE(shared.stat().st_mode) == 0o750 and stat.S_IMODE((shared / "records.jsonl").stat().st_mode) == 0o640
    bad = run_cli(*craftmd_run(DEAD, shared, limit=1), env={"MEDSTACK_UMASK": "rw-r"})
    assert bad.returncode == 2 and "MEDSTACK_UMASK" in bad.stderr


def test_serve_startup_timeout_option_and_default_scaling_with_model_and_device():
    from models.registry import resolve_weights
    from serving.launcher import default_startup_timeout, weights_gib

    _, weights = resolve_weights("embedded")
    assert weights_gib(weights) > 0.5  # 270M parameters in float32
    cpu, gpu = default_startup_timeout(weights, on_gpu=False), default_startup_timeout(weights, on_gpu=True)
    assert cpu > 900 and cpu > gpu > 600  # above vLLM's 600 s, which once killed a start 6 s after it became ready
    proc = run_cli("serve", "--model", "embedded", "--port", "8187", "--startup-timeout", "1")
    assert proc.returncode == 2, proc.stderr
    no_traceback(proc)
    assert "did not become healthy within 1 s" in proc.stderr and "--startup-timeout" in proc.stderr
    assert "--port 8187" not in subprocess_ps()  # the half-started server was stopped


def subprocess_ps() -> str:
    import subprocess

    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


@pytest.mark.parametrize("width", [40, 200])
def test_resume_command_is_one_line_at_any_width_and_splits_back_to_the_argv(tmp_path, width):
    """The printed resume command is never folded by the console: the whole line after 'Resume with: ' is the
    command, shell-quoted, and shlex.split gives the argv back."""
    import shlex

    out = tmp_path / "a run dir with spaces" / "r"
    args = [*craftmd_run(DEAD, out, limit=1), "--set", "formats=[vignette]", "--set", "sampling.doctor.temperature=0"]
    proc = run_cli(*args, env={"COLUMNS": str(width)})
    assert proc.returncode == 3, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "Resume with: " in ln]
    assert len(lines) == 1, proc.stderr
    command = lines[0].split("Resume with: ", 1)[1]
    assert len(command) > width or width == 200
    assert shlex.split(command) == ["medstack", *args]
