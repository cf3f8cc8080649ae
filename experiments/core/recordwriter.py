"""Durable record appends off the event loop, with group commit.

``await writer.append(record)`` returns once the record is on disk (fsync'ed). Records that
finish while a write is under way go out together in the next one, in a worker thread: one
commit of the response cache, then their lines, then one fsync. The order is what makes a
crash safe: every answer a record refers to (its calls' cache keys) is committed before the
record is written, so a record never points at an answer the cache lost. The event loop keeps
serving other cases' calls while the disk syncs (at paper scale, 10,000 fsyncs and commits
in the loop itself were the runner's largest cost after the client's).
"""

from __future__ import annotations

import asyncio


class RecordWriter:
    def __init__(self, rundir, cache=None):
        self.rundir = rundir
        self.cache = cache  # serving.cache.ResponseCache or None
        self._queue: list[tuple[dict, asyncio.Future]] = []
        self._draining: asyncio.Task | None = None
        self.writes = 0  # disk writes (each one fsync) — fewer than records when they were grouped

    async def append(self, record: dict) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((record, fut))
        if self._draining is None or self._draining.done():
            self._draining = asyncio.ensure_future(self._drain())
        await fut

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                await asyncio.to_thread(self._write, [r for r, _ in batch])
            except BaseException as e:  # noqa: BLE001 - handed to every waiter, which re-raises it
                for _, f in batch:
                    if not f.done():
                        f.set_exception(e)
                continue
            for _, f in batch:
                if not f.done():
                    f.set_result(None)

    def _write(self, records: list[dict]) -> None:
        if self.cache is not None:
            self.cache.flush()
        self.rundir.append_many(records)
        self.writes += 1
