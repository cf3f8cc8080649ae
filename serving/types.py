"""The plain data of a request, importable without the HTTP client (configuration builds these; the client sends them)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

DTYPES = ("auto", "float32", "bfloat16", "float16")  # vLLM --dtype values medstack accepts
# what kind of failure a request's error is: transport (retries exhausted: refused, dropped, timeout, 429/5xx),
# status (a 4xx: the request itself is wrong) or auth (401/403: the key was refused; the runner stops the run)
ErrorKind = Literal["transport", "status", "auth"]


@dataclass(frozen=True)
class GenConfig:
    """Output-affecting sampling settings (all part of the cache key)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    frequency_penalty: float = 0.0
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    # vLLM structured outputs: the JSON of the `structured_outputs` request field ({"choice"|"regex"|"json"|"grammar": ...}),
    # set by CaseContext for a step with a declared format in runs with `answers: constrained`; None = free text
    structured: str | None = None

    def replace(self, **kw) -> "GenConfig":
        return replace(self, **kw)

    def key_fields(self) -> dict:
        """The fields of the cache key; ``structured`` only when set, so free-text keys are those of earlier versions."""
        out = shallow_dict(self)
        if out["structured"] is None:
            del out["structured"]
        return out


def shallow_dict(obj) -> dict:
    """A dataclass's fields as a dict, values shared (``asdict`` deep-copies every value: ~0.3 ms a call at
    paper scale for what is serialised at once)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}
