"""Slurm, through its own commands (``sbatch``, ``squeue``, ``scontrol``): job scripts, submission, job states.

medstack submits plain sbatch scripts (no Python submitter): the script is a file a user can read,
``sbatch`` again by hand, and paste into a ticket to the site's admins. This module holds what the
sweep and the fine-tune executors share:

- :class:`SlurmOptions`: the resources and site options (``--slurm-partition`` ... ``--slurm-extra``);
- :func:`sbatch_script`: the ``#SBATCH`` header + body of one script; :func:`submit`: ``sbatch --parsable``;
- :func:`queue_states`: ``squeue`` states of the jobs still in the queue (array tasks one per line);
- :func:`slurm_command`: every Slurm command, retried with backoff while it fails or times out; a scheduler that
  still does not answer is :class:`QueueUnknown` (a fault, never a job state: nothing is resubmitted on it);
- job state files: the job itself writes ``JOB.json`` (running -> done | failed | interrupted, with the
  last lines of its log on failure), so the state is known from the shared file system alone, also on
  a cluster without job accounting (``sacct``).

Locks: every lock medstack holds on a shared folder (a run's ``.medstack.lock``, a sweep's, a fine-tune's)
is the run lock of experiments/core/runlock.py (see its docstring for what holds on NFS).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from models.errors import MedstackError
from models.paths import private_file

# squeue's long state names -> the four medstack shows
QUEUE_STATES = {"PENDING": "pending", "REQUEUED": "pending", "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending",
                "CONFIGURING": "running", "RUNNING": "running", "COMPLETING": "running", "RESIZING": "running",
                "SUSPENDED": "pending", "STOPPED": "pending", "SIGNALING": "running", "STAGE_OUT": "running"}


class SlurmError(MedstackError):
    """Slurm is missing or refused a command (an environment fault: the CLI exits 3)."""

    exit_code = 3


class QueueUnknown(SlurmError):
    """``squeue`` did not answer (after retries): where the jobs are is unknown."""

    def __init__(self, reason: str):
        super().__init__(f"squeue: {reason}")
        self.reason = reason


RETRY_DELAYS = (1, 2, 4)  # seconds between the tries of a Slurm command that fails or times out
TIMEOUT_S = 30


def check_text(option: str, value: str) -> str:
    """A value that goes into a job script: a newline or another control character would end the #SBATCH line (sbatch
    then silently stops reading directives) or add a shell line: refused, naming the option (exit 2)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in str(value)):
        raise MedstackError(f"{option} {str(value)!r}: a newline or control character cannot go into a job script")
    return value


@dataclass
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time: str | None = None  # Slurm's format: MINUTES, HH:MM:SS, D-HH:MM:SS
    max_parallel: int | None = None
    cpus: int | None = None  # per job; default: 8 per GPU, 2 without GPUs
    extra: dict[str, str] = field(default_factory=dict)  # --slurm-extra KEY=VALUE -> #SBATCH --KEY=VALUE
    setup: list[str] = field(default_factory=list)  # shell lines run before medstack (module load ..., source venv)
    python: str | None = None  # the command that runs Python in the job (default: this interpreter)
    join_partition: str | None = None  # the sweep's join job (no GPU; default: ``partition``)

    def __post_init__(self):
        for name in ("partition", "account", "time", "python", "join_partition"):
            if getattr(self, name) is not None:
                check_text(f"--slurm-{name.replace('_', '-')}", getattr(self, name))
        for line in self.setup:
            check_text("--slurm-setup", line)
        for key, value in self.extra.items():
            check_text("--slurm-extra", f"{key}={value}")

    def python_argv(self, python: str) -> list[str]:
        return shlex.split(self.python) if self.python else [python]


def parse_extra(items: list[str]) -> dict[str, str]:
    """``--slurm-extra KEY=VALUE`` (repeatable; the value is kept whole, commas included: ``mail-type=BEGIN,END``)
    -> {KEY: VALUE}; a bare KEY is a flag."""
    out: dict[str, str] = {}
    for item in items or []:
        key, _, value = check_text("--slurm-extra", item).partition("=")
        key = key.strip().lstrip("-")
        if not key or any(c.isspace() or c in "='\"#" for c in key):
            raise MedstackError(f"--slurm-extra {item!r}: give KEY=VALUE, e.g. --slurm-extra constraint=a100 --slurm-extra mail-type=BEGIN,END")
        out[key] = value.strip()
    return out


def require_slurm() -> None:
    missing = [c for c in ("sbatch", "squeue", "scontrol") if shutil.which(c) is None]
    if missing:
        raise SlurmError(f"--executor slurm: {', '.join(missing)} not found on PATH; run this on the cluster's login node "
                         "(or load its Slurm module first), or use --executor local")


def header(name: str, opts: SlurmOptions, *, gpus: int, mem_gb: int | None, output: Path, array: str | None = None,
           requeue: bool = True) -> list[str]:
    """The ``#SBATCH`` lines of one job: what it asks for, where its log goes. Values are quoted as a shell would
    (sbatch reads quotes and backslashes in a directive's value), so a path with spaces stays one value."""
    cpus = opts.cpus or (8 * gpus if gpus else 2)
    lines = [f"--job-name={name}", f"--output={check_text('--out', output)}", "--open-mode=append", "--nodes=1", "--ntasks=1",
             f"--cpus-per-task={cpus}"]
    if gpus:
        lines.append(f"--gres=gpu:{gpus}")
    if mem_gb:
        lines.append(f"--mem={mem_gb}G")
    for key, value in (("partition", opts.partition), ("account", opts.account), ("time", opts.time)):
        if value:
            lines.append(f"--{key}={value}")
    if array:
        lines.append(f"--array={array}")  # 0-N%LIMIT: at most LIMIT of its tasks at once
    if requeue:
        lines.append("--requeue")  # preempted or its node lost: back in the queue; the same job resumes its work
    lines += [f"--{k}={v}" if v else f"--{k}" for k, v in opts.extra.items()]
    return ["#SBATCH " + directive(x) for x in lines]


def directive(option: str) -> str:
    """'--key=value' with the value quoted where it needs it ('--output='/a b/x.out'')."""
    key, sep, value = option.partition("=")
    return key + sep + shlex.quote(value) if sep else key


def sbatch_script(header_lines: list[str], body: list[str], *, chdir: Path, opts: SlurmOptions, comment: str) -> str:
    return "\n".join(["#!/bin/bash", f"# {check_text('comment', comment)}", *header_lines,
                      "#SBATCH " + directive(f"--chdir={check_text('the working folder', chdir)}"), "",
                      "set -euo pipefail", *opts.setup, *body, ""])


def write_script(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    os.chmod(path, 0o700)
    return private_file(path)


def slurm_command(argv: list[str], *, cwd: Path | None = None, retry_timeout: bool = True) -> subprocess.CompletedProcess:
    """Run a Slurm command, again after each of :data:`RETRY_DELAYS` while it fails or does not answer in
    :data:`TIMEOUT_S`; :class:`SlurmError` with its last reason. ``retry_timeout=False``: a command that may have done
    its work before it timed out (``sbatch``) is not run twice."""
    reason = ""
    for delay in (*RETRY_DELAYS, None):
        try:
            p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)
            if p.returncode == 0:
                return p
            reason = (p.stderr.strip() or p.stdout.strip() or f"exit {p.returncode}").splitlines()[-1]
            if "Invalid job id" in reason:  # squeue: every job asked about has left the queue (an answer, not a fault)
                return p
        except subprocess.TimeoutExpired:
            reason = f"no answer within {TIMEOUT_S} s"
            if not retry_timeout:
                break
        except OSError as e:  # not on PATH
            reason = e.strerror or str(e)
            break
        if delay is not None:
            time.sleep(delay)
    raise SlurmError(f"{argv[0]}: {reason}")


def submit(script: Path, *, cwd: Path, args: list[str] = ()) -> str:
    """``sbatch --parsable --comment=TOKEN [ARGS] SCRIPT`` -> the job id (an array's id without a task). Exactly one
    job: ``TOKEN`` is unique to this submission, and after any failure of ``sbatch`` (an exit that may follow a queued
    job: "Socket timed out", a timeout) the queue is asked for it before ``sbatch`` is run again; a job found is the
    one. A queue that cannot be read then: :class:`SlurmError`, nothing run again."""
    require_slurm()
    token = f"medstack-{os.urandom(6).hex()}"
    argv = ["sbatch", "--parsable", f"--comment={token}", *args, str(script)]
    reason = ""
    for delay in (*RETRY_DELAYS, None):
        try:
            p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)
            if p.returncode == 0:
                return p.stdout.strip().split(";")[0]
            reason = (p.stderr.strip() or p.stdout.strip() or f"exit {p.returncode}").splitlines()[-1]
        except subprocess.TimeoutExpired:
            reason = f"no answer within {TIMEOUT_S} s"
        except OSError as e:  # not on PATH
            raise SlurmError(f"sbatch {script} did not submit the job: {e.strerror or e}") from None
        try:
            queued = job_with_comment(token)
        except QueueUnknown as e:
            raise SlurmError(f"sbatch {script} did not answer cleanly ({reason}) and the queue cannot be read ({e}): the job may be "
                             f"queued (its comment is {token}); look with `squeue --me -o '%i %k'` before running the command again") from None
        if queued:
            return queued  # sbatch queued it, then failed to say so
        if delay is not None:
            time.sleep(delay)
    raise SlurmError(f"sbatch {script} did not submit the job: {reason if reason.startswith('sbatch:') else 'sbatch: ' + reason}")


def job_with_comment(token: str) -> str | None:
    """The id of the queued job whose comment is ``token`` (an array's id without a task), or None."""
    try:
        p = slurm_command(["squeue", "-h", "--me", "-o", "%i %k"])
    except SlurmError as e:
        raise QueueUnknown(str(e).removeprefix("squeue: ")) from None
    for line in p.stdout.splitlines() if p.returncode == 0 else []:
        job, _, comment = line.strip().partition(" ")
        if comment.strip() == token:
            return job.split("_")[0]
    return None


def queue_states(job_ids: list[str]) -> dict[str, str]:
    """{job id (``123`` or ``123_4`` for an array task): squeue state} of the jobs still in the queue;
    :class:`QueueUnknown` when ``squeue`` does not answer (missing, failing, timing out), after its retries."""
    ids = sorted({j.split("_")[0] for j in job_ids if j})
    if not ids:
        return {}
    try:
        p = slurm_command(["squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%i %T"])
    except SlurmError as e:
        raise QueueUnknown(str(e).removeprefix("squeue: ")) from None
    out = {}
    for line in p.stdout.splitlines() if p.returncode == 0 else []:  # a finished job is no longer listed
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def shown_state(queued: str | None, written: dict, unknown: str | None = None) -> str:
    """pending | running | done | failed from the queue (when listed) and the job's own state file; ``unknown``
    (squeue's reason) when the queue could not be read: 'unknown (squeue: REASON)' for a job that has not ended."""
    if queued:
        return QUEUE_STATES.get(queued, queued.lower())
    state = written.get("state")
    if state in ("done", "failed"):
        return state
    if state in ("running", "interrupted", "submitted"):
        if unknown is not None:
            return f"unknown (squeue: {unknown})"
        return "failed"  # left the queue without saying how it ended: cancelled, killed at its time limit, or never started
    return "not submitted"


# ------------------------------------------------------------------ the job's own state file

def job_identity() -> dict:
    env = os.environ
    task = env.get("SLURM_ARRAY_TASK_ID")
    job = f"{env['SLURM_ARRAY_JOB_ID']}_{task}" if task and env.get("SLURM_ARRAY_JOB_ID") else env.get("SLURM_JOB_ID", "")
    return {"job_id": job, "slurm_job_id": env.get("SLURM_JOB_ID", ""), "restarts": int(env.get("SLURM_RESTART_COUNT") or 0),
            "host": socket.gethostname()}


def read_state(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def write_state(path: Path, **fields) -> dict:
    """Merge ``fields`` into the JSON state file (written whole to a temporary name, then renamed: never torn)."""
    state = {**read_state(path), **fields, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
    private_file(tmp)
    os.replace(tmp, path)
    return state


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])
