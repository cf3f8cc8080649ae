"""Run cases concurrently into a results directory, with resume and a progress bar.

Every experiment is: load cases -> for each case not yet done, ``await solve(case)`` ->
append the record as soon as it finishes. The run's sustained throughput (output
tokens/s over wall time), requests and cache hits are returned for metrics.json.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from typing import Awaitable, Callable, Iterable

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from experiments.results import RunDir
from serving.client import LLMClient


async def run_cases(
    cases: Iterable[dict],
    solve: Callable[[dict], Awaitable[dict]],
    rundir: RunDir,
    client: LLMClient,
    *,
    concurrency: int = 16,
    id_key: str = "id",
    description: str = "cases",
) -> dict:
    """Solve every case not already in ``rundir``; return run statistics."""
    done = rundir.done_ids()
    todo = [c for c in cases if str(c[id_key]) not in done]
    sem = asyncio.Semaphore(concurrency)
    failures = 0
    t0 = time.perf_counter()

    async def one(case: dict, progress: Progress, task) -> None:
        nonlocal failures
        async with sem:
            try:
                record = await solve(case)
            except Exception as e:  # a bug in one case is recorded, not fatal for the run
                failures += 1
                record = {id_key: case[id_key], "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            record.setdefault(id_key, case[id_key])
            rundir.append(record)
            progress.advance(task)

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task(f"{description} ({len(done)} already done)", total=len(todo))
        await asyncio.gather(*(one(c, progress, task) for c in todo))
    wall = time.perf_counter() - t0
    usage = client.usage_summary()
    total = usage["total"]
    return {
        "cases_run": len(todo),
        "cases_resumed": len(done),
        "case_errors": failures,
        "wall_seconds": round(wall, 2),
        "requests": total["requests"],
        "failed_requests": total["failed"],
        "cache_hits": total["cache_hits"],
        "prompt_tokens": total["prompt_tokens"],
        "completion_tokens": total["completion_tokens"],
        "output_tokens_per_s": round(total["completion_tokens"] / wall, 2) if wall > 0 else None,
        "concurrency": concurrency,
        "usage_by_role": usage,
    }
