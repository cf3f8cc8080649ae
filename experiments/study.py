"""What a study is, for the runner: roles + prompts + cases + a solver + metrics.

A study (DERA, CRAFT-MD, MELD, autoeval, MediTOD, ...) subclasses :class:`Study` and declares:

- ``name``, ``settings_cls`` (a :class:`~experiments.config.RunSettings` subclass), ``roles``
  (the valid role names; ``primary_role`` is the model under test), ``prompts`` (its folder);
- ``load_cases(settings)``: the cases, each a dict with a unique ``id``; bad input raises
  :class:`~models.errors.DataError` naming the file and line/id. Called before any server starts;
- ``solve(ctx, case, settings)``: one case -> one record, every model call made through ``ctx``;
- ``metrics(records, settings)`` and ``summary(metrics, settings)``: over the finished records
  only (a failed case never reaches them).

Everything else (settings, model references and the client, the results directory, resume, the
failure policy, identity, the call log) is the runner's, once, in ``experiments/runner.py``.

:class:`CaseContext` is the one call log. Every call a case makes goes through it and is kept in
the record (role, step, the messages sent, sampling, tokens, start/end times, the call it waited
for), so ``medstack bench --replay`` can replay a run. A call that failed after the client's
retries raises :class:`RequestFailed`: the case is then recorded as failed, never scored.
Sampled calls get a seed derived from (run seed, case id, step, occurrence), which makes them
cacheable: a killed run replays every answered call from the cache and continues mid-conversation.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

from experiments.config import RunSettings
from experiments.prompts import PromptSet
from models.errors import MedstackError
from serving.client import AUTH_MARK, ChatResult, GenConfig, LLMClient

TRANSPORT_MARK = "gave up after"  # the client's message for a request that exhausted its retries


class EndpointAuthError(MedstackError):
    """An endpoint refused our key (HTTP 401/403): fatal for the run, never a failed case (exit 2)."""


class RequestFailed(Exception):
    """A model call that got no answer (server down, timeout, HTTP error): the case fails, it is not scored."""

    def __init__(self, step: str, role: str, error: str):
        super().__init__(f"{step} ({role}): {error}")
        self.step, self.role, self.error = step, role, error

    @property
    def transport(self) -> bool:
        return TRANSPORT_MARK in self.error

    @property
    def auth(self) -> bool:
        return AUTH_MARK in self.error

    def auth_error(self) -> EndpointAuthError:
        return EndpointAuthError(
            f"{self.error} (role {self.role}). The run stops here, without retrying: pass the endpoint's key with "
            "--api-key KEY or $MEDSTACK_API_KEY (the key its server was started with); finished records are kept"
        )


def call_seed(base: int, case_id: str, key: str) -> int:
    return int(hashlib.sha256(f"{base}:{case_id}:{key}".encode()).hexdigest()[:8], 16) % (2**31 - 1)


class CaseContext:
    """One case's access to the models, and the log of every call it made."""

    def __init__(self, client: LLMClient, case_id: str, seed: int = 0):
        self.client = client
        self.case_id = str(case_id)
        self.seed = seed
        self.calls: list[dict] = []
        self._occurrences: Counter = Counter()
        self._last_finished: int | None = None

    async def chat(self, messages: list[dict], *, role: str, gen: GenConfig, step: str) -> ChatResult:
        return await self._call("chat", messages, role, gen, step)

    async def complete(self, prompt: str, *, role: str, gen: GenConfig, step: str) -> ChatResult:
        return await self._call("completion", prompt, role, gen, step)

    async def _call(self, kind: str, content: Any, role: str, gen: GenConfig, step: str) -> ChatResult:
        n = self._occurrences[step]
        self._occurrences[step] += 1
        key = f"{step}#{n}"
        if gen.temperature > 0:  # sampled: a per-call seed makes it reproducible and cacheable
            gen = gen.replace(seed=call_seed(self.seed, self.case_id, key))
        entry: dict = {"index": len(self.calls), "role": role, "step": step, "kind": kind,
                       ("messages" if kind == "chat" else "prompt"): content,
                       "gen": {"temperature": gen.temperature, "top_p": gen.top_p, "max_tokens": gen.max_tokens,
                               "frequency_penalty": gen.frequency_penalty, "n": gen.n,
                               "stop": list(gen.stop) if gen.stop else None, "seed": gen.seed},
                       "after": self._last_finished, "t_start": round(time.time(), 3)}
        self.calls.append(entry)
        send = self.client.chat if kind == "chat" else self.client.complete
        result = await send(content, role=role, gen=gen)
        entry.update({"t_end": round(time.time(), 3), "texts": result.texts, "finish_reasons": result.finish_reasons,
                      "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
                      "latency": round(result.latency, 3), "cached": result.cached, "cache_key": result.key, "error": result.error})
        self._last_finished = entry["index"]
        if not result.ok:
            raise RequestFailed(step, role, result.error or "no answer")
        return result

    def usage(self) -> dict:
        """Per-role and total calls, tokens, model seconds and cache hits of this case."""
        out: dict[str, dict] = {}
        for c in self.calls:
            for key in (c["role"], "total"):
                u = out.setdefault(key, {"calls": 0, "cached": 0, "failed": 0, "prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0})
                u["calls"] += 1
                u["cached"] += int(bool(c.get("cached")))
                u["failed"] += int(bool(c.get("error")))
                u["prompt_tokens"] += c.get("prompt_tokens") or 0
                u["completion_tokens"] += c.get("completion_tokens") or 0
                u["seconds"] = round(u["seconds"] + (c.get("latency") or 0.0), 3)
        return out


class Study:
    """Base class of every study the runner can run (see the module docstring)."""

    name: ClassVar[str] = ""
    settings_cls: ClassVar[type[RunSettings]] = RunSettings
    roles: ClassVar[tuple[str, ...]] = ("default",)
    primary_role: ClassVar[str] = "default"
    prompts: ClassVar[PromptSet | None] = None

    def default_config(self, overrides: dict) -> Path | None:
        """The YAML file used without --config (the paper setting); ``overrides`` are the study options given."""
        return None

    def prepare(self, settings: RunSettings) -> RunSettings:
        """Fill study defaults and check cross-field rules before anything runs (raise ConfigError)."""
        return settings

    def load_cases(self, settings: RunSettings) -> list[dict]:
        raise NotImplementedError

    async def setup(self, client: LLMClient, settings: RunSettings, cases: list[dict], out: Path) -> None:
        """Optional work once per run after the client is open (e.g. a judge's worked examples)."""

    async def solve(self, ctx: CaseContext, case: dict, settings: RunSettings) -> dict:
        raise NotImplementedError

    def metrics(self, records: list[dict], settings: RunSettings) -> dict:
        raise NotImplementedError

    def summary(self, metrics: dict, settings: RunSettings) -> str:
        raise NotImplementedError
