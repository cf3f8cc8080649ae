"""CRAFT-MD run settings (YAML -> this class -> run). Every paper number lives in configs/*.yaml."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from experiments.core.config import RunSettings, Sampling

FORMATS = ("vignette", "multiturn", "singleturn", "summarized")
MODES = ("mcq", "frq")
STOP_REASONS = ("final_diagnosis", "no_question", "turn_cap")


class CraftSettings(RunSettings):
    experiment: str = "craftmd"
    name: str | None = None  # run name shown by `compare` (default: the clinical model alias)
    formats: list[str] = list(FORMATS)
    mcq: bool = True
    frq: bool = True
    trials: int = Field(5, ge=1)
    specialty: str | None = None
    max_turns: int = Field(10, ge=1)  # doctor turns per conversation (the turn cap)
    final_marker: str = "Final Diagnosis"
    # concurrent-diagnosis rule of the FRQ grade (SPEC section 3): "zero" = an answer naming several
    # diagnoses scores 0 like "Multiple"; "any" = correct when any named diagnosis matches (the authors' release)
    concurrent_rule: str = "zero"
    roles: dict[str, str] = {"clinical": "embedded", "patient": "embedded", "grader": "embedded", "summarizer": "embedded"}
    sampling: dict[str, Sampling] = {
        "doctor": Sampling(temperature=0.7, max_tokens=96),
        "patient": Sampling(temperature=0.7, max_tokens=64),
        "answer": Sampling(temperature=0.7, max_tokens=48),
        "summarizer": Sampling(temperature=0.0, max_tokens=200),
        "grader": Sampling(temperature=0.0, max_tokens=32),
    }
    # steps sent as plain text completions instead of chat (for base models, e.g. the embedded one):
    # any of answer (the MCQ/FRQ questions), grader, summarizer; the reply's first non-empty line is used
    completion_steps: list[str] = []
    concurrency: Annotated[int, Field(ge=1)] | Literal["auto"] = 16  # "auto": 256 per GPU, 16 on CPU (experiments/core/concurrency.py)

    @field_validator("completion_steps")
    @classmethod
    def _completion_steps(cls, v):
        bad = [x for x in v if x not in ("answer", "grader", "summarizer")]
        if bad:
            raise ValueError(f"unknown completion step(s) {', '.join(bad)}; valid: answer, grader, summarizer")
        return v

    @field_validator("concurrent_rule")
    @classmethod
    def _concurrent_rule(cls, v):
        if v not in ("zero", "any"):
            raise ValueError(f"unknown concurrent_rule {v!r}; valid: zero, any")
        return v

    @field_validator("formats", mode="before")
    @classmethod
    def _formats(cls, v):
        if isinstance(v, str):
            v = [x.strip() for x in v.split(",") if x.strip()]
        bad = [x for x in v if x not in FORMATS]
        if bad:
            raise ValueError(f"unknown format(s) {', '.join(bad)}; valid: {', '.join(FORMATS)}")
        return list(v)

    @field_validator("sampling")
    @classmethod
    def _sampling(cls, v):
        missing = {"doctor", "patient", "answer", "summarizer", "grader"} - set(v)
        if missing:
            raise ValueError(f"sampling needs entries for: {', '.join(sorted(missing))}")
        return v

