"""One logged model call per protocol step, and the per-case log every record carries.

``CaseLog.call`` renders a prompt template, sends it as one user message under a role
(``decider`` / ``researcher`` / ``judge``), and keeps everything for the record: template
name and hash, the messages, every completion, tokens, latency, cache hit, error.

Context window: when the server rejects a prompt as longer than the model's context (small
local models have 2k tokens), the call is retried with the oldest dialogue messages left out
of the prompt, one at a time; ``dropped_history`` in the call log says how many. Models with
a long enough context never take this path, so the paper protocol is unchanged for them.

Greedy with n > 1 (the paper's "5 samples at temperature 0"): vLLM rejects n > 1 without
sampling, and greedy completions are identical, so one completion is requested and copied
n times (``greedy_copies`` in the call log). Sampled steps send n in one request with the
case's seed.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Callable

from experiments.dera.prompts import prompt_hash, render
from experiments.dera.settings import Sampling
from serving.client import ChatResult

CONTEXT_ERROR_MARKERS = ("maximum context length", "context length", "too long")


def case_seed(base_seed: int, case_id: str) -> int:
    """A deterministic per-case seed, so sampled requests are reproducible and cacheable."""
    return int(hashlib.sha256(f"{base_seed}:{case_id}".encode()).hexdigest()[:8], 16) % (2**31 - 1)


def is_context_error(error: str | None) -> bool:
    return bool(error) and any(m in error.lower() for m in CONTEXT_ERROR_MARKERS)


class CaseLog:
    """Calls, parse errors and prompt hashes of one case."""

    def __init__(self, client, seed: int):
        self.client = client
        self.seed = seed
        self.calls: list[dict] = []
        self.parse_errors: list[dict] = []
        self.parse_attempts = 0
        self.prompt_hashes: dict[str, str] = {}

    async def call(self, step: str, role: str, template: str, sampling: Sampling, *,
                   history: list | None = None, build: Callable[[list], dict] | None = None, **values) -> ChatResult:
        """Render ``template`` and send it. With ``history`` + ``build(history_tail) -> values`` the
        prompt is rebuilt with fewer old messages if it does not fit the model's context."""
        self.prompt_hashes[template] = prompt_hash(template)
        gen = sampling.gen(self.seed)
        # vLLM refuses n > 1 with greedy decoding; greedy samples are identical, so ask once and copy.
        copies = gen.n if gen.temperature == 0 and gen.n > 1 else 1
        send = gen.replace(n=1) if copies > 1 else gen
        dropped = 0
        while True:
            if build is not None:
                values = {**values, **build((history or [])[dropped:])}
            messages = [{"role": "user", "content": render(template, **values)}]
            result = await self.client.chat(messages, role=role, gen=send)
            if result.ok or not is_context_error(result.error) or build is None or dropped >= len(history or []):
                break
            dropped += 1
        if copies > 1 and result.ok:
            result = replace(result, texts=result.texts * copies, finish_reasons=result.finish_reasons * copies)
        self.calls.append({
            "step": step, "role": role, "prompt": template, "prompt_hash": self.prompt_hashes[template],
            "messages": messages, "texts": result.texts, "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens, "latency": round(result.latency, 3), "cached": result.cached,
            "finish_reasons": result.finish_reasons, "error": result.error, "seed": self.seed,
            "gen": {"temperature": gen.temperature, "top_p": gen.top_p, "max_tokens": gen.max_tokens,
                    "frequency_penalty": gen.frequency_penalty, "n": gen.n},
            **({"dropped_history": dropped} if dropped else {}),
            **({"greedy_copies": copies} if copies > 1 else {}),
        })
        return result

    def parsed(self, step: str, ok: bool, what: str, text: str = "") -> bool:
        """Count one parse attempt; record it when it failed. Returns ``ok``."""
        self.parse_attempts += 1
        if not ok:
            self.parse_errors.append({"step": step, "error": what, "text": (text or "")[:500]})
        return ok

    def usage(self) -> dict:
        return {
            "calls": len(self.calls),
            "failed_calls": sum(1 for c in self.calls if c["error"]),
            "prompt_tokens": sum(c["prompt_tokens"] for c in self.calls),
            "completion_tokens": sum(c["completion_tokens"] for c in self.calls),
            "model_seconds": round(sum(c["latency"] for c in self.calls), 3),
        }

    def unreachable(self) -> bool:
        """True when a request failed in transport (server down / timeouts after all retries)."""
        return any((c["error"] or "").startswith("gave up after") for c in self.calls)

    def fields(self) -> dict:
        """What every record carries from the log."""
        return {"server_unreachable": self.unreachable(), "calls": self.calls, "parse_errors": self.parse_errors, "parse_attempts": self.parse_attempts,
                "prompt_hashes": self.prompt_hashes, "seed": self.seed, "usage": self.usage()}
