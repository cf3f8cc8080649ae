"""``concurrency: auto``: cases in flight chosen by this machine's device, then lowered to the servers' KV caches.

GPU: 256 per GPU (one vLLM replica saturates at about 256 sequences in flight, ``max-num-seqs``); CPU: 16, what
a 2-vCPU machine sustains without queueing (derivations: serving/bench/README.md, docs/running-studies.md
"One GPU or two"). ``auto`` looks at THIS machine: against a server elsewhere, give a number.
:func:`run_async` runs a command's event loop on uvloop where it is installed, else on asyncio's own.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess

AUTO_PER_GPU = 256
AUTO_CPU = 16
TOKENS_PER_CASE = 2048


def run_async(coro):
    """``asyncio.run(coro)`` on a uvloop event loop when uvloop is installed. At 256 calls in flight the loop's
    own bookkeeping and socket transports were a large share of the runner's CPU per call (profile:
    serving/bench/README.md, "Runner at paper scale")."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def gpu_count() -> int:
    if os.environ.get("MEDSTACK_FORCE_CPU") == "1" or not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0


def resolve_concurrency(value: int | str, gpus: int | None = None) -> int:
    """An integer stays as it is; ``auto`` becomes 256 per GPU, or 16 without one."""
    if value != "auto":
        return int(value)
    n = gpu_count() if gpus is None else gpus
    return AUTO_PER_GPU * n if n > 0 else AUTO_CPU


def kv_bound(limit: int, kv_tokens: list[int | None], log=print) -> int:
    """``auto``'s ``limit`` lowered to the cases the smallest KV cache among the run's servers holds (``kv_tokens``:
    each server's reported capacity, None where it reported none)."""
    known = [k for k in kv_tokens if k]
    if not known:
        return limit
    fits = max(1, min(known) // TOKENS_PER_CASE)
    if fits < limit:
        log(f"concurrency auto: {fits} cases in flight, what a KV cache of {min(known):,} tokens holds at "
            f"{TOKENS_PER_CASE:,} tokens a case (not {limit}: experiments/core/concurrency.py)")
    return min(limit, fits)
