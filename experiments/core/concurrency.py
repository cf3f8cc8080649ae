"""``concurrency: auto``: cases (and requests) in flight chosen by the device this machine serves from.

- GPU (``nvidia-smi -L`` lists N GPUs): 256 x N. One vLLM replica per GPU is saturated at about 256
  sequences in flight (``max-num-seqs`` 256, the setting of the published 8B/H100 throughput figure we
  use); a CRAFT-MD case-trial has one call in flight while it converses and up to eight while it is
  asked, so 256 case-trials per replica keep its batch full (derivation: experiments/bench/README.md,
  "Paper scale on a GPU").
- CPU: 16, what a 2-vCPU machine sustains without queueing longer than a call (experiments/bench/README.md).

Once the run's servers are up, ``auto`` is lowered to what their KV caches hold: each server logs its capacity in
tokens (vLLM: "GPU KV cache size: N tokens", serving/launcher.py ``kv_cache_tokens``), and a case in flight holds
about :data:`TOKENS_PER_CASE` of it (an estimate: a CRAFT-MD conversation of 14 doctor turns with its vignette and
prompts). So an 8B model on a 24 GB GPU (about 3 GiB of KV cache, 24k tokens) runs about 12 cases at once instead of
256 that would queue for memory. ``auto`` looks at THIS machine. Against a server elsewhere (``ALIAS@URL``), give a
number.

:func:`run_async` is how a command runs its event loop: on uvloop where it is installed (libuv's loop and
transports in C, in place of asyncio's pure-Python ones), else asyncio's own.
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
    experiments/bench/README.md, "Runner at paper scale")."""
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
