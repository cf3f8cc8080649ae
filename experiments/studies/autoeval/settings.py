"""Autoeval run settings (YAML configs/*.yaml -> this class -> run); a field is a flag unless marked NO_FLAG."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from experiments.core.config import NO_FLAG, Flag, RunSettings, Sampling, role_flag
from experiments.core.deviations import Authors, Unpaired

CRITERIA = ["empathy", "concerns", "welfare", "understanding"]


class AutoevalSampling(BaseModel):
    """Sampling of the judge's two steps (``sampling.STEP``)."""

    model_config = ConfigDict(extra="forbid")

    explain: Sampling = Field(Sampling(max_tokens=160), description="Step (a): the judge explains a known rating of each example.")
    rate: Sampling = Field(Sampling(max_tokens=200), description="Step (b): the judge rates the dialogue.")


class AutoevalSettings(RunSettings):
    cli_flags = (
        Flag(("results",), str, "A results directory (or its records.jsonl) whose records carry a 'transcript' (CRAFT-MD, DERA, "
             "MediTOD, ...); same as --data.", ("data",)),
        role_flag("judge", "Judge model (alias of --role judge=REF): registry alias, or ALIAS@URL of a running server.", "-j"),
        Flag(("--max-tokens",), int, "Override max_tokens of both judge steps (explain and rate; >= 1).", ("sampling.explain.max_tokens", "sampling.rate.max_tokens")),
    )

    # every field against the paper's (experiments/core/deviations.py; docs/protocols.md, Auto-evaluation): the paper
    # fixes the protocol (self-CoT, one explained example per rating point, 1-5) but states no sampling or bounds
    authors_table: ClassVar[dict] = {
        "criteria": Unpaired("which of the paper's four criteria are rated: the run's scope"),
        **dict.fromkeys(("criteria_file", "examples", "reference"), Unpaired("the rubric texts, explained examples and reference ratings: "
                                                                             "inputs the paper did not release")),
        "api": Authors("chat", says="the judge asked as a text completion (authors: chat)"),
        **{f"sampling.{step}.{f}": Unpaired("the paper states no sampling for its judge") for step in AutoevalSampling.model_fields
           for f in Sampling.model_fields},
        "stop": Unpaired("the paper states no stop sequences for its judge"),
        "max_dialogue_chars": Unpaired("a bound the paper did not need; each dialogue it cuts is counted as a protocol deviation"),
        "max_note_chars": Unpaired("a bound on each example's explanation, the paper states none"),
    }

    moved_keys: ClassVar[dict] = {"explain": "sampling.explain", "rate": "sampling.rate"}  # older spellings
    out: str | None = Field(None, description="Results directory (default runs/autoeval/<results folder>-<judge model>); "
                            "re-running the same command resumes.")
    roles: dict[str, str] = {"judge": "embedded"}
    criteria: list[str] = Field(CRITERIA, description=f"Comma-separated criteria keys or names (default from config: {','.join(CRITERIA)}).")
    criteria_file: str | None = Field(None, description="YAML of the criteria's rubric texts (default: experiments/studies/autoeval/criteria.yaml).",
                                      json_schema_extra=NO_FLAG)
    examples: str | None = Field(None, description="JSONL of example dialogues with known ratings (id, criterion, rating, transcript), "
                                 "one per rating 1-5 per criterion (default: ours).")
    reference: str | None = Field(None, description="CSV with columns id, criterion, rating: reference ratings for rank agreement (Kendall tau, Spearman).")
    api: Literal["chat", "completion"] = Field("chat", description="chat | completion (completion = raw text prompt ending in 'Good:', for base models).")
    sampling: AutoevalSampling = Field(AutoevalSampling(), description="Sampling of each judge step (sampling.STEP.FIELD, e.g. --set "
                                       "sampling.rate.max_tokens=300).", json_schema_extra=NO_FLAG)
    stop: list[str] = Field(["==="], description="Stop strings of both steps, unless a step sets its own.", json_schema_extra=NO_FLAG)
    max_dialogue_chars: int | None = Field(1600, ge=1, description="Longer dialogues are cut (and counted as cut).", json_schema_extra=NO_FLAG)
    max_note_chars: int = Field(240, ge=1, description="Cap on each Good/Bad/Summary note of a few-shot example.", json_schema_extra=NO_FLAG)
    concurrency: Annotated[int, Field(ge=1)] | Literal["auto"] = 16

