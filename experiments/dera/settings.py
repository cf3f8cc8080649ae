"""Settings of the DERA runs: YAML (configs/*.yaml, one per paper setting) -> pydantic -> run.

Every paper number lives in the YAML files; these classes only give types and defaults.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from experiments.config import RunSettings
from serving.client import GenConfig

SUMMARY_SECTIONS = [
    "Demographics and Social Determinants of Health",
    "Patient Intent",
    "Pertinent Positives",
    "Pertinent Unknowns",
    "Pertinent Negatives",
    "Medical History",
]
REVIEWED_SUMMARY_SECTIONS = ["Pertinent Positives", "Pertinent Negatives", "Pertinent Unknowns", "Medical History"]
CAREPLAN_SECTIONS = ["Medications", "Referrals", "Tests", "Lifestyle", "Supportive Care"]


class Sampling(BaseModel):
    """Sampling settings of one step."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    frequency_penalty: float = 0.0
    n: int = 1

    def gen(self, seed: int | None) -> GenConfig:
        return GenConfig(temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens,
                         frequency_penalty=self.frequency_penalty, n=self.n, seed=seed)


class GptF1Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    extraction: Sampling = Sampling(temperature=0.0, max_tokens=200)
    verification: Sampling = Sampling(temperature=0.0, max_tokens=200)


class DialogueSettings(RunSettings):
    """dera-summarize, dera-careplan and dera-corrupt."""

    task: Literal["summarize", "careplan", "corrupt"] = "summarize"
    sections: list[str] = SUMMARY_SECTIONS
    review_sections: list[str] = REVIEWED_SUMMARY_SECTIONS
    max_turns: int = Field(15, ge=1, description="cap on Researcher + Decider messages in total")
    sampling: Sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens=512)
    corruption_level: int | None = Field(None, ge=1, le=10)
    corrupt_sections: list[str] = REVIEWED_SUMMARY_SECTIONS
    score_sections: list[str] = REVIEWED_SUMMARY_SECTIONS
    gptf1: GptF1Settings = GptF1Settings()


class QASettings(RunSettings):
    """dera-qa (open-ended and multiple-choice)."""

    mcq: bool = False
    split: str | None = None
    answer: Sampling = Sampling(temperature=0.7, max_tokens=50, n=5)
    explain: Sampling = Sampling(temperature=0.0, max_tokens=400)
    dialogue: Sampling = Sampling(temperature=0.3, max_tokens=250, frequency_penalty=0.5)
    max_turns: int = Field(3, ge=0, description="Researcher message + Decider reply = one turn")
    final: Sampling = Sampling(temperature=0.0, max_tokens=100, n=5)
    judge_exact: Sampling = Sampling(temperature=0.0, max_tokens=100)
    judge_similarity: Sampling = Sampling(temperature=0.0, max_tokens=100)
    bertscore_model: str | None = None
