"""A real one-node Slurm (Debian's slurm-wlm + munge) in a private folder, for the tests.

    with SlurmCluster(tmp_dir) as c:      # munged, slurmctld, slurmd started; stopped (and waited for) on exit
        env = c.env                       # SLURM_CONF for sbatch / squeue / scontrol
        c.run("sinfo")

The node is this machine (its CPUs and memory), without cgroups (``ProctrackType=proctrack/linuxproc``,
``TaskPlugin=task/none``). munged runs with ``--force`` and its own socket, key, pid and log files in the
folder; slurm.conf names that socket (``AuthInfo=socket=...``), so clients and daemons use it and no
system munge or slurm configuration is touched. slurmctld and slurmd run in the foreground (``-D -f CONF``)
as children of this process, on free ports with their own pid, state and spool files. Needs root (slurmd
runs jobs as the submitting user) and the binaries `make setup` installs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if not (shutil.which(b) or Path("/usr/sbin", b).exists())]


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 4096


class SlurmCluster:
    def __init__(self, root: Path, partition: str = "debug"):
        self.root = Path(root)
        self.partition = partition
        self.node = socket.gethostname().split(".")[0]
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------------ start
    def start(self, timeout: float = 60) -> "SlurmCluster":
        r = self.root
        for d in ("state", "spool", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(r, 0o700)
        sock = r / "munge" / "munge.sock"
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        self.procs["munged"] = subprocess.Popen(
            [_which("munged"), "--force", "--foreground", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={r / 'munge' / 'munged.pid'}", f"--log-file={r / 'munge' / 'munged.log'}",
             f"--seed-file={r / 'munge' / 'munged.seed'}"],
            stdout=subprocess.DEVNULL, stderr=open(r / "munge" / "munged.err", "w"))
        self._wait(lambda: sock.exists(), 20, "munged did not create its socket", r / "munge" / "munged.err")
        cpus, mem = os.cpu_count() or 1, max(1024, _mem_mb() - 2048)
        self.conf.write_text("\n".join([
            "ClusterName=medstacktest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}", f"SlurmdLogFile={r / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=2",
            "MpiDefault=none", "SwitchType=switch/none", "ReturnToService=2",
            "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
            "KillWait=15", "MinJobAge=600", "InactiveLimit=0", "SlurmdTimeout=120", "SlurmctldTimeout=120",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        for name in ("slurmctld", "slurmd"):
            args = [_which(name), "-D", "-f", str(self.conf)] + (["-i"] if name == "slurmctld" else [])
            self.procs[name] = subprocess.Popen(args, env=self.env, stdout=open(r / f"{name}.out", "w"), stderr=subprocess.STDOUT)
            if name == "slurmctld":
                self._wait(lambda: self.run("scontrol", "ping", check=False).returncode == 0, timeout,
                           "slurmctld did not answer `scontrol ping`", r / "slurmctld.log")
        self._wait(self._node_idle, timeout, "the node did not come up idle", r / "slurmd.log")
        return self

    def _node_idle(self) -> bool:
        p = self.run("sinfo", "-h", "-N", "-o", "%t", check=False)
        return p.returncode == 0 and p.stdout.strip() in ("idle", "mix", "alloc")

    def _wait(self, ok, timeout: float, what: str, log: Path) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                break
            time.sleep(0.3)
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
        self.stop()
        raise RuntimeError(f"{what} (folder {self.root}); {log.name}:\n{tail}")

    # ------------------------------------------------------------------ use
    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        p = subprocess.run([_which(args[0]), *args[1:]], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode:
            raise RuntimeError(f"{' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
        return p

    def requeue(self, job: str, timeout: float = 60) -> None:
        """``scontrol requeue JOB`` (SIGTERM to the job, back to the queue), then eligible at once: Slurm keeps a requeued
        job ineligible for about two minutes (its EligibleTime, measured 121 s here), which a test need not wait out."""
        self.run("scontrol", "requeue", job)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip() == "PENDING":
                self.run("scontrol", "update", f"JobId={job}", "StartTime=now")
                return
            time.sleep(0.3)
        raise RuntimeError(f"job {job} did not go back to PENDING within {timeout:.0f} s of `scontrol requeue`")

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Cancel what is left, stop the daemons (slurmd, slurmctld, munged) and wait for them."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "-u", "root", check=False) if shutil.which("scancel") else None
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
