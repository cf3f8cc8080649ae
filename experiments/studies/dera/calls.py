"""DERA's protocol steps over the runner's call log: one prompt template -> one model call.

``CaseLog`` wraps the runner's :class:`~experiments.core.study.CaseContext` of one case;
``CaseLog.call`` renders a template of the DERA prompt set, sends it as one user message under a role
through ``ctx.chat(..., step=step)`` and notes the template name and hash on the call. The call log,
usage, seeds and the failure policy are the runner's; what stays here is DERA's own: parse errors
(counted, scored per the protocol), the templates' hashes, and the two engineering notes of
experiments/studies/dera/README.md: a prompt longer than the model's context is retried with the oldest dialogue
messages left out (``dropped_history``, a protocol deviation: experiments/core/deviations.py), and greedy
n > 1 is one completion copied n times (``greedy_copies``; vLLM rejects n > 1 without sampling).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from experiments.core.config import Sampling
from experiments.studies.dera.prompts import PROMPTS, render
from experiments.core.study import CaseContext, RequestFailed
from serving.client import ChatResult

# vLLM's refusals of a prompt that does not fit: longer than the context, or so long that no output
# token is left (vLLM 0.32 cuts max_tokens to the room left and then refuses 0)
CONTEXT_ERROR_MARKERS = ("maximum context length", "context length", "too long", "max_tokens must be at least 1")


def is_context_error(error: str | None) -> bool:
    return bool(error) and any(m in error.lower() for m in CONTEXT_ERROR_MARKERS)


class CaseLog:
    """DERA's view of one case: templated calls through the runner's context, parse errors, prompt hashes."""

    def __init__(self, ctx: CaseContext):
        self.ctx = ctx
        self.parse_errors: list[dict] = []
        self.parse_attempts = 0
        self.prompt_hashes: dict[str, str] = {}

    async def call(self, step: str, role: str, template: str, sampling: Sampling, *,
                   history: list | None = None, build: Callable[[list], dict] | None = None,
                   constraint_values: dict | None = None, format_of: str | None = None, protocol: dict | None = None,
                   **values) -> ChatResult:
        """Render ``template`` and send it. With ``history`` + ``build(history_tail) -> values`` the
        prompt is rebuilt with fewer old messages if it does not fit the model's context.

        The reply format declared for ``template`` (or for ``format_of``: the final QA answer has the one-shot
        prompt's format) in prompts/constraints.yaml goes with the call, its placeholders filled from
        ``constraint_values``; the runner's context applies it only in runs with ``answers: constrained``.
        ``protocol``: what this request may carry less of than the protocol asks (besides the history, counted here)."""
        self.prompt_hashes[template] = PROMPTS.hash(template)
        constraint = PROMPTS.constraint(format_of or template, **(constraint_values or {}))
        gen = sampling.gen()
        # vLLM refuses n > 1 with greedy decoding; greedy samples are identical, so ask once and copy.
        copies = gen.n if gen.temperature == 0 and gen.n > 1 else 1
        send = gen.replace(n=1) if copies > 1 else gen
        dropped = 0
        while True:
            if build is not None:
                values = {**values, **build((history or [])[dropped:])}
            messages = [{"role": "user", "content": render(template, **values)}]
            start = len(self.ctx.calls)
            try:
                kept = len(history or []) - dropped  # the dialogue messages this prompt carries, of the whole history
                shortfall = {**(protocol or {}), **({"history": (kept, len(history))} if history else {})}
                result = await self.ctx.chat(messages, role=role, gen=send, step=step, constraint=constraint, protocol=shortfall or None)
                break
            except RequestFailed as e:
                self._note(start, step, template, dropped)
                if build is None or dropped >= len(history or []) or not is_context_error(e.error):
                    raise
                dropped += 1
        if copies > 1:
            result = replace(result, texts=result.texts * copies, finish_reasons=result.finish_reasons * copies)
        self._note(start, step, template, dropped, copies)
        return result

    def _note(self, start: int, step: str, template: str, dropped: int, copies: int = 1) -> None:
        """Add DERA's details to the runner's log entry of the call just made."""
        entry = next((c for c in self.ctx.calls[start:] if c.get("step") == step), None)
        if entry is None:
            return
        entry.update({"template": template, "template_hash": self.prompt_hashes[template],
                      **({"dropped_history": dropped} if dropped else {}),
                      **({"greedy_copies": copies} if copies > 1 else {})})

    def parsed(self, step: str, ok: bool, what: str, text: str = "") -> bool:
        """Count one parse attempt; record it when it failed. Returns ``ok``."""
        self.parse_attempts += 1
        if not ok:
            self.parse_errors.append({"step": step, "error": what, "text": (text or "")[:500]})
        return ok

    def fields(self) -> dict:
        """What every record carries from DERA's side (the runner adds calls, usage, status)."""
        return {"parse_errors": self.parse_errors, "parse_attempts": self.parse_attempts, "prompt_hashes": self.prompt_hashes}
