"""The fine-tuning recipe: one YAML file per paper setting -> a validated :class:`Recipe`.

Sections mirror alignment-handbook's argument groups: ``model`` (which base, how to
load it), ``lora`` (the peft keys), ``data`` (task, files, splits, lengths) and
``training`` (optimiser, schedule, batch, evaluation, checkpoints). Command-line
options override single keys (``training.max_steps=30``); every validation error names
the file and the key and says what was expected.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from experiments.core.config import ConfigError, check_keys, cli, load_settings, read_yaml_mapping
from experiments.core.runlock import RunLock
from models.errors import MedstackError
from models.prompt_format import DEFAULT_FORMAT, RECIPE_DIR, PromptFormat
from models.registry import load_registry

TASKS = ("nlu", "pol", "nlg")
CONFIG_DIR = RECIPE_DIR


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSection(_Section):
    base: str = "embedded"
    """Registry alias of the base model (weights resolved locally, never downloaded)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Training dtype; ``auto`` = float32 on CPU, bfloat16 on GPU."""
    attn_implementation: str | None = None
    """e.g. ``eager`` (recommended for Gemma 3 training) or ``sdpa``; None = transformers' default."""
    load_in_4bit: bool = False
    """QLoRA-style 4-bit NF4 base via bitsandbytes (GPU only; bitsandbytes must be installed)."""
    double_quant: bool = False
    """4-bit only: also quantize the quantization constants (the MediTOD authors: off)."""
    gradient_checkpointing: bool = True
    """Paper: on (trades compute for activation memory); the CPU config turns it off."""

    @field_validator("base")
    @classmethod
    def _known_alias(cls, v: str) -> str:
        known = load_registry()
        if v not in known:
            raise ValueError(f"unknown base model alias {v!r}; known aliases: {', '.join(known)}")
        return v


class LoraSection(_Section):
    r: int = Field(32, ge=1, description="LoRA rank (paper: 32)")
    alpha: int = Field(32, ge=1, description="LoRA alpha (paper: 32)")
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

    @field_validator("target_modules")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one target module is needed, e.g. [q_proj, v_proj]")
        return v


class DataSection(_Section):
    task: Literal["nlu", "pol", "nlg"] = "nlu"
    dialogs: str | None = None
    """MediTOD ``dialogs.json``."""
    splits_dir: str | None = None
    """Folder with ``<split>_ids.json`` (default: the folder of ``dialogs``)."""
    train_split: str = "train"
    valid_split: str | None = "valid"
    """None: no validation loss (and no early stopping)."""
    max_length: int = Field(1024, ge=16, description="prompt + completion tokens; longer prompts lose their oldest history")
    prompt_format: PromptFormat = DEFAULT_FORMAT
    """chat: the base's chat template (the authors'); completion: the messages joined by newlines (the authors'
    rendering for a base without a chat template). `run --mode supervised` sends the same rendering."""
    limit: int | None = Field(None, ge=1, description="use at most N training samples (smoke tests)")
    history_size: int = Field(4, ge=2, description="the authors' history_size (4): the window of each sample "
                              "(experiments/studies/meditod/tasks.py sft_samples)")


class TrainingSection(_Section):
    learning_rate: float = Field(1e-4, gt=0)
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = Field(0.1, ge=0.0, lt=1.0)
    batch_size: int = Field(16, ge=1, description="effective batch = per_device x accumulation x processes")
    per_device_train_batch_size: int = Field(1, ge=1)
    per_device_eval_batch_size: int = Field(1, ge=1)
    # the fields marked cli("--x") are flags of `medstack finetune` (finetune/cli.py; experiments/core/commands.py nested_flags)
    epochs: float = Field(10.0, gt=0, description="Training epochs (paper: 10, with early stopping on the valid loss).",
                          json_schema_extra=cli("--epochs"))
    max_steps: int = Field(-1, description="Stop after N optimizer steps (> 0 overrides epochs; -1: by epochs).", json_schema_extra=cli("--max-steps"))
    optim: str = "adamw_torch"
    """transformers optimizer name; the MediTOD authors: adamw_bnb_8bit (bitsandbytes, GPU)."""
    dataloader_drop_last: bool = False
    """Drop the last incomplete batch (the MediTOD authors: true)."""
    group_by_length: bool = False
    """Batch samples of similar length together (the MediTOD authors: true for POL/NLG)."""
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    logging_steps: int = Field(1, ge=1)
    eval_steps: int | None = Field(None, ge=1, description="None: evaluate once per epoch (or at the end with max_steps)")
    save_steps: int | None = Field(None, ge=1, description="None: same as eval_steps")
    save_total_limit: int = Field(2, ge=1)
    early_stopping_patience: int | None = Field(5, ge=1, description="Stop after P evaluations without a lower valid loss "
                                                "(paper: 5; null: no early stopping).", json_schema_extra=cli("--early-stopping-patience"))
    seed: int = 42

    @model_validator(mode="after")
    def _batch_divisible(self):
        if self.batch_size % self.per_device_train_batch_size:
            raise ValueError(
                f"batch_size {self.batch_size} is not a multiple of per_device_train_batch_size {self.per_device_train_batch_size}"
            )
        return self

    def split(self, world_size: int = 1) -> tuple[int, int]:
        """``batch_size`` (the global batch) -> (per-device batch, accumulation steps) on ``world_size`` processes.

        per_device x accumulation x processes = batch_size. The configured per-device batch is kept when it
        divides; otherwise (more processes than the accumulation allows) it is lowered to the largest size
        that does, so a recipe trains with the same global batch on any number of processes.
        """
        if self.batch_size % world_size:
            raise ConfigError(
                f"training.batch_size {self.batch_size} (the global batch) cannot be split over {world_size} processes; "
                f"use a number of processes that divides it"
            )
        per_process = self.batch_size // world_size
        per_device = max(d for d in range(1, self.per_device_train_batch_size + 1) if per_process % d == 0)
        return per_device, per_process // per_device


class Recipe(_Section):
    version: int = 1
    out: str | None = None
    merge: bool = False
    """Also write a merged (base + adapter) checkpoint to ``<out>/merged``."""
    model: ModelSection = ModelSection()
    lora: LoraSection = LoraSection()
    data: DataSection = DataSection()
    training: TrainingSection = TrainingSection()

    @model_validator(mode="after")
    def _consistent(self):
        if self.training.early_stopping_patience and not self.data.valid_split:
            raise ValueError("training.early_stopping_patience needs data.valid_split (early stopping watches the valid loss); "
                             "set training.early_stopping_patience=null to train without validation")
        return self

    def out_dir(self) -> Path:
        return Path(self.out or f"runs/finetune/meditod-{self.data.task}-{self.model.base}")


def world_size() -> int:
    """Processes of this training (``accelerate launch`` / torchrun set WORLD_SIZE; 1 otherwise)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_rank_zero() -> bool:
    """The process that writes the adapter, the metrics and the log (rank 0, or the only process)."""
    return int(os.environ.get("RANK", "0")) == 0


# set by `launch` for the processes it starts: the launching process holds the out folder's lock for them
OUT_LOCK_HELD_ENV = "MEDSTACK_FINETUNE_OUT_LOCKED"


def out_lock(recipe: Recipe):
    """The runner's lock (experiments/core/runlock.py) on the recipe's ``out`` folder: one training per folder; a second
    process is refused at once (exit 2, naming the holder), so two never interleave checkpoints. Rank 0 takes it, unless
    `launch` already holds it for the processes it started."""
    out = recipe.out_dir()
    if not is_rank_zero() or os.environ.get(OUT_LOCK_HELD_ENV) == str(out.resolve()):
        return contextlib.nullcontext()
    return RunLock(out)


def strip_none(d: dict) -> dict:
    """Drop keys whose value is None (command-line options that were not given), recursively."""
    return {k: strip_none(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}


def merge_overrides(base: dict, extra: dict) -> dict:
    """``extra`` on top of ``base``, section by section (an explicit null in ``extra`` is kept)."""
    merged = dict(base)
    for k, v in extra.items():
        merged[k] = merge_overrides(merged.get(k) or {}, v) if isinstance(v, dict) and isinstance(merged.get(k), (dict, type(None))) else v
    return merged


def load_recipe(path: str | Path | None, overrides: dict | None = None) -> Recipe:
    """YAML file (or defaults) + nested overrides -> Recipe; raises ConfigError naming file and key."""
    data: dict = {}
    if path is not None:
        shipped = ", ".join(sorted(x.name for x in CONFIG_DIR.glob("*.yaml")))
        data = read_yaml_mapping(path, missing_hint=f" (shipped configs: {shipped})", what="sections (model, lora, data, training)")
        check_keys(Recipe, data, path)  # a key the recipe has no place for, by the file's line
    merged = merge_overrides(data, overrides or {})
    # load_settings validates and formats errors as "<file>: invalid settings\n  key.path: message"
    try:
        return load_settings(Recipe, None, merged)
    except ConfigError as e:
        raise ConfigError(str(e).replace("settings:", f"{path or 'recipe'}:", 1)) from None


def require_4bit_support(recipe: Recipe, on_gpu: bool) -> None:
    if not recipe.model.load_in_4bit:
        return
    import importlib.util

    if not on_gpu:
        raise MedstackError("model.load_in_4bit needs a CUDA GPU (bitsandbytes 4-bit kernels); set model.load_in_4bit=false on the CPU")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise MedstackError(
            "model.load_in_4bit is set but bitsandbytes is not installed; `pip install bitsandbytes` on the GPU machine "
            "(see requirements-gpu.txt) or set model.load_in_4bit=false"
        )
