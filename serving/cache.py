"""On-disk response cache shared across runs (SQLite, one row per request key).

The key covers everything that changes the output: model identity (alias, weights
hash, adapter), the messages or prompt, sampling parameters, seed and n. Timeouts and
concurrency are left out. Sampled requests (temperature > 0) are cached only when they
carry a seed, so a cache hit never hides the randomness a protocol asked for.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path

from models.paths import medstack_home


def default_cache_path() -> Path:
    return medstack_home() / "cache" / "responses.sqlite"


def request_key(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class ResponseCache:
    """``put`` keeps answers in memory until :meth:`flush` (or ``commit_every`` of them, or :meth:`close`) writes
    them in one transaction: one commit per put cost ~14 ms of fsync each, in the event loop, at paper scale.
    The study runner flushes before it appends a record, so every answer a record refers to is committed
    first; a crash can only lose answers no record refers to yet (they are asked again on resume). The
    write lock is held only for the flush itself, so several processes can share one cache file (WAL)."""

    def __init__(self, path: Path | None = None, *, commit_every: int = 256):
        self.path = Path(path or default_cache_path())
        self.commit_every = commit_every
        self._pending: dict[str, str] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self._db.commit()
        self.hits = 0
        self.misses = 0

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
        return json.loads(value)

    def put(self, key: str, value: dict) -> None:
        with self._lock:
            self._pending[key] = json.dumps(value)
            if len(self._pending) >= self.commit_every:
                self._flush()

    def flush(self) -> None:
        """Commit every answer put so far (durable when this returns)."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._db.executemany("INSERT OR REPLACE INTO responses (key, value) VALUES (?, ?)", list(self._pending.items()))
            self._db.commit()
            self._pending.clear()

    def close(self) -> None:
        with self._lock:
            self._flush()
            self._db.close()
