"""One process per results directory (docs/protocols.md, Runs): an exclusive lock held for the whole run.

``with RunLock(out):`` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``<out>/.medstack.lock`` and
writes who holds it (host, pid, start time, command line) into the file. A second process on the
same directory is refused at once with :class:`RunDirInUse` (exit 2), naming the holder. The
kernel drops a flock when its holder dies (kill -9 included), so a lock file left behind by a
dead process is simply taken over: its stale contents are overwritten.

Across nodes (a cluster's shared file system, docs/cluster.md): a Linux NFS client (2.6.12 and later)
sends a flock to the server as a whole-file byte-range lock (NFSv4 locking; NFSv3 through lockd), so
the lock holds between nodes, and the server releases the lock of a node that died when its lease
expires. It is node-local where the mount says ``local_lock=flock`` or ``local_lock=all``, on Lustre
without the ``flock`` mount option, and on older clients; there, run one process per folder by hand.
(fcntl byte-range locks would need a descriptor open for writing, which keeps a file system from being
remounted read-only under a run, and are dropped when any descriptor of the file in the process closes.)
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from experiments.core.results import ResultsError, make_results_dir

LOCK_NAME = ".medstack.lock"


class RunDirInUse(ResultsError):
    """Another live process holds the results directory."""


def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


class RunLock:
    """An exclusive, non-blocking lock on a results directory; released on exit (and by the kernel on death)."""

    def __init__(self, out: str | Path):
        self.dir = Path(out)
        self.path = self.dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        make_results_dir(self.dir)
        # held through a read-only descriptor (flock does not need write access), so the run keeps no file open for
        # writing between writes: a file system can then be remounted read-only under it (a fault the tests provoke)
        fd = os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirInUse(self._refusal()) from None
        info = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "since_unix": round(time.time(), 3), "command": " ".join(sys.argv)}
        try:
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(json.dumps(info) + "\n")
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def _refusal(self) -> str:
        h = _holder(self.path)
        pid, host = h.get("pid", "?"), h.get("host", "?")
        wait = f"`tail --pid={pid} -f /dev/null` on {host} waits for it" if pid != "?" else "wait for it"
        return (f"results directory {self.dir} is in use by another medstack process: pid {pid} on host {host}, "
                f"since {h.get('since', '?')}" + (f" ({h['command']})" if h.get("command") else "") + ". "
                f"Wait until it ends ({wait}; the same command then resumes), or pass another --out")

    def release(self) -> None:
        if self._fd is not None:
            try:  # clear the holder's details (the descriptor is read-only; a read-only disk keeps them: harmless)
                with open(self.path, "w", encoding="utf-8"):
                    pass
            except OSError:
                pass
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
