"""One process per results directory: an exclusive ``flock`` on ``<out>/.medstack.lock`` held for the whole run.

The holder (host, pid, start time, command line) is written into the file; a second process is refused with
:class:`RunDirInUse` (exit 2). The kernel drops a flock when its holder dies, so a stale file is taken over.
Which file systems hold it across nodes, and why the file may be opened for writing: docs/cluster.md ("Locks").
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from experiments.core.results import ResultsError, check_owner, make_results_dir

LOCK_NAME = ".medstack.lock"


class RunDirInUse(ResultsError):
    """Another live process holds the results directory."""


class LockUnsupported(ResultsError):
    """The folder's file system refuses the lock (NFS without a lock manager, a mount without locks)."""



def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


class RunLock:
    """An exclusive, non-blocking lock on a results directory; released on exit (and by the kernel on death)."""

    def __init__(self, out: str | Path, kind: str | None = None, formerly: tuple[str, ...] = ()):
        """``kind``: the results the holder writes; a folder holding another kind's is refused before the lock file
        is made in it (experiments.core.results.check_owner: nothing of another command's folder changes)."""
        self.dir = Path(out)
        self.path = self.dir / LOCK_NAME
        self.kind, self.formerly = kind, formerly
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        check_owner(self.dir, self.kind, self.formerly)
        make_results_dir(self.dir)
        # first through a read-only descriptor, so a local run keeps no file open for writing between writes (a file
        # system can then be remounted read-only under it: a fault the tests provoke); where the file system emulates
        # flock with a byte-range lock (NFS) an exclusive lock needs a descriptor open for writing: EBADF, then that
        for mode in (os.O_RDONLY, os.O_RDWR):
            fd = os.open(self.path, mode | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                os.close(fd)
                raise RunDirInUse(self._refusal()) from None
            except OSError as e:
                os.close(fd)
                if e.errno == errno.EBADF and mode == os.O_RDONLY:
                    continue
                raise LockUnsupported(f"{self.dir}: its file system refuses the lock medstack holds on a folder in use "
                                      f"({errno.errorcode.get(e.errno, e.errno)}: {e.strerror}); nothing was run. Use a folder on "
                                      "a file system that holds flock locks (a local disk; NFS with its lock manager; Lustre "
                                      "mounted with -o flock): docs/cluster.md, Locks") from None
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
