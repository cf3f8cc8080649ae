"""On-disk response cache shared across runs (SQLite, one row per request key).

The key covers everything that changes the output: model identity (alias, weights
hash, adapter), the messages or prompt, sampling parameters, seed and n. Timeouts and
concurrency are left out. Sampled requests (temperature > 0) are cached only when they
carry a seed, so a cache hit never hides the randomness a protocol asked for.

A damaged cache is found when it is opened (``PRAGMA quick_check``), not case by case: it is
moved aside as ``responses.sqlite.corrupt-<time>`` (said on screen) and a fresh one is used; the
cache only saves calls, so nothing is lost but the saving. A write the disk refuses (full,
read-only) raises :class:`~models.errors.StorageError`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path

import orjson

from models.errors import StorageError
from models.jsontext import loads
from models.paths import medstack_home, private_dir, private_file


def default_cache_path() -> Path:
    return medstack_home() / "cache" / "responses.sqlite"


def request_key(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _dumps(value: dict) -> str:
    """A stored answer's text (orjson: compact JSON, read back equal by either parser)."""
    return orjson.dumps(value).decode()


SIDE_FILES = ("-wal", "-shm", "-journal")


OPEN_BUSY_TRIES = 40  # tries to open a file another process holds (0.05 s, 0.10 s, ... apart: ~40 s)


def _busy(e: sqlite3.Error) -> bool:
    """sqlite's "database is locked" / "busy": another connection holds the file for a moment, nothing is damaged."""
    text = str(e).lower()
    return "locked" in text or "busy" in text


def _storage_error(path: Path, e: sqlite3.Error) -> StorageError | None:
    """sqlite's words for a refused write -> StorageError; None for anything else."""
    text = str(e).lower()
    for marker, why in (("full", "the disk is full"), ("readonly", "the file system or file is read-only"),
                        ("unable to open", "the folder cannot be written"), ("disk i/o", "a disk I/O error")):
        if marker in text:
            return StorageError(f"cannot write the response cache {path}: {why} ({e}); free space or fix the folder, or run with --no-cache")
    return None


class ResponseCache:
    """Every answer is committed as it arrives (``commit_every=1``), so a kill -9 loses none: the next run
    replays every answered call and continues mid-conversation. The database runs in WAL mode with
    ``synchronous=NORMAL``: a commit reaches the OS without an fsync (a commit with fsync cost ~14 ms each,
    in the event loop, at paper scale), which survives any crash of the process; only a power cut can lose
    the last answers, and those are asked again on resume. ``commit_every > 1`` keeps answers in memory
    until :meth:`flush` (or that many, or :meth:`close`) writes them in one transaction, for bulk writers
    that accept losing unflushed answers on a crash. Several processes can share one cache file (WAL).

    In the event loop, :meth:`store` is ``put`` with group commit: it returns once the answer is committed, in
    one transaction with every other answer stored in the same turn of the loop (at 256 requests in flight,
    one commit per answer was 11 % of the runner's CPU)."""

    def __init__(self, path: Path | None = None, log=print, *, commit_every: int = 1):
        self.path = Path(path or default_cache_path())
        self.commit_every = commit_every
        self._pending: dict[str, str] = {}
        private_dir(self.path.parent)
        self._lock = threading.Lock()
        self._waiters: list[asyncio.Future] = []  # store() calls waiting for the next group commit
        self._db = self._open_checked(log)
        self.hits = 0
        self.misses = 0

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: commits survive a killed process without an fsync each
            db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.commit()
            ok = db.execute("PRAGMA quick_check(1)").fetchone()
            for suffix in ("", *SIDE_FILES):
                private_file(f"{self.path}{suffix}")
            if not ok or ok[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {ok[0].strip() if ok else 'no answer'}".replace("\n", " "))
        except BaseException:
            db.close()
            raise
        return db

    def _open_checked(self, log) -> sqlite3.Connection:
        for attempt in range(OPEN_BUSY_TRIES):
            try:
                return self._connect()
            except sqlite3.OperationalError as e:  # another process is setting up the same file: busy, not damaged
                if not _busy(e) or attempt == OPEN_BUSY_TRIES - 1:
                    error = e
                    break
                time.sleep(0.05 * (attempt + 1))
            except sqlite3.Error as e:
                error = e
                break
        if _busy(error):
            raise StorageError(f"the response cache {self.path} stayed locked by another process ({error}); "
                               "wait for it, or run with --no-cache") from None
        refused = _storage_error(self.path, error)
        if refused is not None:
            raise refused from None
        reason = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            self.path.replace(aside)
            for suffix in SIDE_FILES:
                side = Path(f"{self.path}{suffix}")
                if side.exists():
                    side.replace(Path(f"{aside}{suffix}"))
        except OSError as e:
            raise StorageError(f"the response cache {self.path} is damaged ({reason}) and cannot be moved aside ({e.strerror}); "
                               "remove it, or run with --no-cache") from None
        log(f"the response cache {self.path} is damaged ({reason}): moved aside to {aside}; continuing with a fresh cache")
        try:
            return self._connect()
        except sqlite3.Error as e:
            raise (_storage_error(self.path, e) or StorageError(f"cannot open a fresh response cache {self.path}: {e}; run with --no-cache")) from None

    def get(self, key: str) -> dict | None:
        with self._lock:
            value = self._pending.get(key)
            if value is None:
                row = self._db.execute("SELECT value FROM responses WHERE key = ?", (key,)).fetchone()
                value = row[0] if row else None
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        return loads(value)

    def put(self, key: str, value: dict) -> None:
        with self._lock:
            self._pending[key] = _dumps(value)
            if len(self._pending) >= self.commit_every:
                self._flush()

    async def store(self, key: str, value: dict) -> None:
        """:meth:`put` for a caller in the event loop; with ``commit_every=1`` it returns only once the answer is
        committed (so a kill -9 after it loses nothing), together with the answers stored in the same loop turn."""
        if self.commit_every != 1:
            self.put(key, value)
            return
        with self._lock:
            self._pending[key] = _dumps(value)
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        if len(self._waiters) == 1:  # the first of this turn: commit them all once the turn's callbacks have run
            fut.get_loop().call_soon(self._commit_waiters)
        await fut

    def _commit_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        try:
            self.flush()
        except BaseException as e:  # noqa: BLE001 - a refused write (StorageError) goes to every waiter, which re-raises it
            for f in waiters:
                if not f.done():
                    f.set_exception(e)
            return
        for f in waiters:
            if not f.done():
                f.set_result(None)

    def flush(self) -> None:
        """Commit every answer put so far (durable when this returns)."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            try:
                self._db.executemany("INSERT OR REPLACE INTO responses (key, value) VALUES (?, ?)", list(self._pending.items()))
                self._db.commit()
            except sqlite3.Error as e:  # a full or read-only disk: StorageError (the run stops, finished records kept)
                refused = _storage_error(self.path, e)
                if refused is None:
                    raise
                try:
                    self._db.rollback()
                except sqlite3.Error:
                    pass
                raise refused from None
            self._pending.clear()

    def close(self) -> None:
        with self._lock:
            self._flush()
            self._db.close()
