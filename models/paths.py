"""Where medstack keeps its state (converted weights, server records, the response cache), and with
which permissions everything we create is written.

Permissions: results hold clinical text and model answers, and our users run on shared servers, so
everything medstack creates is private to the user by default: folders 0700, files 0600. The CLI
sets the process umask once at start (:func:`apply_umask`; child processes such as vLLM inherit
it), which covers every file any library writes for us; :func:`private_dir` / :func:`private_file`
additionally chmod what already existed before (an older cache, a results folder being resumed).
A group that shares results on purpose sets ``MEDSTACK_UMASK`` (octal, e.g. ``027``: the group may
read, others nothing).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from models.errors import MedstackError

UMASK_ENV = "MEDSTACK_UMASK"
DEFAULT_UMASK = 0o077


def configured_umask() -> int:
    """``$MEDSTACK_UMASK`` (octal) or 077. A bad value is reported, not ignored."""
    raw = os.environ.get(UMASK_ENV, "").strip()
    if not raw:
        return DEFAULT_UMASK
    try:
        value = int(raw, 8)
    except ValueError:
        value = -1
    if not 0 <= value <= 0o777:
        raise MedstackError(f"${UMASK_ENV}={raw!r} is not an octal umask such as 077 (private) or 027 (group may read)")
    return value


def apply_umask() -> int:
    """Set the process umask from the setting (once, at CLI start). Returns it."""
    mask = configured_umask()
    os.umask(mask)
    return mask


def _tighten(path: Path, full: int) -> None:
    """chmod ``path`` to ``full`` minus the configured umask, if it is ours and looser than that."""
    try:
        st = path.stat()
        if st.st_uid != os.getuid():
            return
        mode = full & ~configured_umask()
        if stat.S_IMODE(st.st_mode) & ~mode:
            os.chmod(path, stat.S_IMODE(st.st_mode) & mode)
    except OSError:
        pass  # a read-only or foreign file: the write that follows reports the real problem


def private_dir(path: str | Path) -> Path:
    """Create a folder (and parents) we own, readable by this user only (or as $MEDSTACK_UMASK allows)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    _tighten(p, 0o777)
    return p


def private_file(path: str | Path) -> Path:
    """Tighten an existing file we wrote (e.g. one written before this version) to 0600 / $MEDSTACK_UMASK."""
    p = Path(path)
    if p.exists():
        _tighten(p, 0o666)
    return p


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def medstack_home() -> Path:
    """$MEDSTACK_HOME, default ~/.cache/medstack. Created on first use, private."""
    return private_dir(os.environ.get("MEDSTACK_HOME") or Path.home() / ".cache" / "medstack")


USER_HOME_ENV = "MEDSTACK_USER_HOME"


def user_home() -> Path:
    """The medstack home the fetched data sets and the prepared embedded model are read from: $MEDSTACK_HOME, except
    in a sweep's Slurm job, whose own $MEDSTACK_HOME holds only its servers, their logs and its response cache and
    which reads the submitting user's home ($MEDSTACK_USER_HOME, set by the job; docs/cluster.md)."""
    return Path(os.environ[USER_HOME_ENV]) if os.environ.get(USER_HOME_ENV) else medstack_home()


OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def set_offline() -> None:
    """Nothing is fetched from a model hub at run time unless the user explicitly allows it."""
    if os.environ.get("MEDSTACK_ALLOW_DOWNLOAD") != "1":
        for k, v in OFFLINE_ENV.items():
            os.environ.setdefault(k, v)
