"""MediTOD run settings (YAML configs/<task>_<mode>.yaml -> this class -> run); a field is a flag unless marked NO_FLAG."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from experiments.core.config import NO_FLAG, Flag, RunSettings, Sampling, cli, move_keys
from experiments.core.deviations import NOT_FIXED, Authors, Unpaired, unset_as

BERTSCORE_ENCODER_HELP = "NLG: local encoder dir for BERTScore (default: all-MiniLM-L6-v2; the MediTOD authors: roberta-large)."
BERTSCORE_LAYER_HELP = "NLG: encoder layer for BERTScore (default: bert_score's table for a known encoder, e.g. roberta-large 17; else the last)."
TASK_DEFAULTS = {"pol": {"sampling": {"turn": {"max_tokens": 192}}}}  # defaults that differ by task (besides experiment: meditod-<task>)
# settings of runs made before ``sampling`` held every step: old key -> new key
MOVES = {"temperature": "sampling.turn.temperature", "max_tokens": "sampling.turn.max_tokens",
         "adjudicate_max_tokens": "sampling.adjudicate.max_tokens"}


def _under(defaults: dict, data: dict) -> dict:
    """``data`` with each key of ``defaults`` it lacks (nested mappings filled key by key; a None in ``data`` stays)."""
    out = dict(data)
    for k, v in defaults.items():
        if k not in out:
            out[k] = v
        elif isinstance(v, dict) and isinstance(out[k], dict):
            out[k] = _under(v, out[k])
    return out


class MeditodSampling(BaseModel):
    """Sampling of each step (``sampling.STEP``)."""

    model_config = ConfigDict(extra="forbid")

    turn: Sampling = Field(Sampling(temperature=0.0, max_tokens=256), description="The model's prediction for one dialogue turn "
                           "(greedy, the authors'); a reply max_tokens cuts is a format error, counted.")
    adjudicate: Sampling = Field(Sampling(temperature=0.0, max_tokens=4), description="The grader's verdict on one non-canonical value pair.")



class MeditodSettings(RunSettings):
    # every field against the dataset authors' released code and configs (experiments/core/deviations.py; docs/protocols.md, MediTOD)
    authors_table: ClassVar[dict] = {
        **dict.fromkeys(("task", "mode"), Unpaired("which of the authors' tasks and baselines the run is")),
        **dict.fromkeys(("splits_dir", "split", "train_split"), Unpaired("which dialogues are evaluated and where exemplars come from: the run's scope")),
        "k": Authors(lambda s: 5 if s.mode == "icl" else NOT_FIXED, says="{ours} in-context exemplars per turn (authors: {authors})"),
        "encoder": Authors(lambda s: "bge-large-en-v1.5" if s.mode == "icl" else NOT_FIXED, same=lambda ours, theirs: theirs in (ours or ""),
                           says="exemplar retrieval encoder {ours} (authors: {authors})", show=unset_as("all-MiniLM-L6-v2, the default")),
        "history_size": Authors(4, says="history_size {ours} (authors: {authors})"),
        "prompt_format": Unpaired("the fine-tuning rendering of the adapter's base model, recorded with the adapter"),
        "sampling.turn.temperature": Authors(0.0, says="temperature {ours} (authors: {authors}, greedy)"),
        "sampling.turn.max_tokens": Unpaired("a generation bound; a reply it cuts is a format error, counted"),
        **dict.fromkeys((f"sampling.turn.{f}" for f in ("top_p", "frequency_penalty", "n", "stop")),
                        Unpaired("left at the server's default, as the authors' greedy decoding")),
        "sampling.adjudicate": Unpaired("the paper's optional LLM adjudication, scored beside exact match"),
        "context_margin": Unpaired("tokens kept free in the model's context; a turn that does not fit is counted"),
        "adjudicate_model": Unpaired("the paper's optional LLM adjudication, scored beside exact match"),
        "bertscore": Unpaired("whether NLG also computes BERTScore: which metrics a run reports"),
        "bertscore_encoder": Authors(lambda s: "roberta-large" if s.task == "nlg" and s.bertscore else NOT_FIXED,
                                     same=lambda ours, theirs: theirs in (ours or ""), says="BERTScore encoder {ours} (authors: {authors})", show=unset_as("all-MiniLM-L6-v2, the default")),
        "bertscore_layer": Unpaired("follows the encoder (bert_score's own table: roberta-large 17, the authors')"),
        "compare": Unpaired("another run put beside this one in summary.md"),
    }

    # old spelling: --max-tokens, now sampling.turn.max_tokens
    cli_flags = (Flag(("--max-tokens",), int, "Generation cap per turn (config default; >= 1).", ("sampling.turn.max_tokens",)),)

    moved_keys: ClassVar[dict] = MOVES

    task: Literal["nlu", "pol", "nlg"] = Field("nlu", description="nlu | pol | nlg: the task (set by the command, e.g. `run meditod-pol`).",
                                               json_schema_extra=NO_FLAG)
    out: str | None = Field(None, description="Results directory (default runs/meditod/<task>-<mode>); re-running the same command resumes.")
    splits_dir: str | None = Field(None, description="Folder with <split>_ids.json (default: the folder of --data).")
    split: str = Field("test", description="Split to evaluate: test (default), valid, or any <name>_ids.json, e.g. an out-of-domain set.")
    train_split: str = Field("train", description="The split in-context exemplars come from.", json_schema_extra=NO_FLAG)
    mode: Literal["icl", "supervised"] = Field("icl", description="icl (chat messages: ontology, retrieved exemplars, test input) or "
                                              "supervised (the fine-tuning rendering + [answer]; --lora NAME=PATH serves an adapter).")
    k: int = Field(5, ge=0, description="In-context exemplars per test turn (paper: 5).")
    encoder: str | None = Field(None, description="Local sentence-transformers dir for in-context exemplar retrieval by last-turn text "
                                "(default: all-MiniLM-L6-v2; the authors: bge-large-en-v1.5).")
    history_size: int = Field(4, ge=2, description="The authors' history_size (4 in every config): sets each task's window (tasks.py).",
                              json_schema_extra=NO_FLAG)
    prompt_format: Literal["chat", "completion"] | None = Field(None, description="Supervised: the fine-tuning rendering (none: the base's "
                                                                "default fine-tuning recipe's).", json_schema_extra=NO_FLAG)
    sampling: MeditodSampling = Field(MeditodSampling(), description="Sampling of each step (sampling.STEP.FIELD; --max-tokens sets "
                                      "sampling.turn.max_tokens).", json_schema_extra=NO_FLAG)
    context_margin: int = Field(8, ge=0, description="Tokens kept free in the model's context besides max_tokens.", json_schema_extra=NO_FLAG)
    adjudicate_model: str | None = Field(None, description="Also score with LLM adjudication of non-canonical values by this model "
                                         "(the grader role: ALIAS or ALIAS@URL; without it no grader runs).",
                                         json_schema_extra=cli("--adjudicate-model", "--grader-model"))
    bertscore: bool = Field(True, description="NLG: skip BERTScore.", json_schema_extra=cli("--no-bertscore"))
    bertscore_encoder: str | None = Field(None, description=BERTSCORE_ENCODER_HELP)
    bertscore_layer: int | None = Field(None, ge=1, description=BERTSCORE_LAYER_HELP)
    compare: str | None = Field(None, description="Results dir of the other mode to put side by side in summary.md.")
    concurrency: int = Field(8, ge=1)
    roles: dict[str, str] = {"model": "embedded"}

    @model_validator(mode="before")
    @classmethod
    def _task_defaults(cls, data):
        if isinstance(data, dict):
            data = move_keys(data, MOVES)  # settings written before ``sampling`` held every step
            task = data.get("task", "nlu")
            return _under({"experiment": f"meditod-{task}", **TASK_DEFAULTS.get(task, {})}, data)
        return data
