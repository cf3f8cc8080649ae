"""Fine-tuning on several processes: ``accelerate launch`` of :mod:`finetune.sft` (DDP or FSDP).

``medstack finetune meditod-<task> --processes N [--fsdp]`` writes the resolved recipe to
``OUT/recipe.yaml`` and runs, printing it first::

    accelerate launch --config_file finetune/accelerate_ddp.yaml --num_processes N --main_process_port P \\
        -m finetune.sft OUT/recipe.yaml

The same command works on GPUs (one process per GPU, NCCL) and on the CPU (N processes, gloo): the
accelerate files say ``MULTI_GPU``/``FSDP``, which makes accelerate start the processes with torchrun;
inside, the Trainer runs with ``use_cpu`` when there is no GPU, so accelerate picks ``MULTI_CPU`` with
the gloo backend. ``training.batch_size`` is the global batch: every process derives its per-device
batch and gradient accumulation from the number of processes (:meth:`TrainingSection.split`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from experiments.core.config import ConfigError
from finetune.data import split_file
from finetune.recipe import OUT_LOCK_HELD_ENV, Recipe, out_lock
from models.errors import DataError, MedstackError
from serving.launcher import free_port

FINETUNE_DIR = Path(__file__).parent
ACCELERATE_CONFIGS = {"ddp": FINETUNE_DIR / "accelerate_ddp.yaml", "fsdp": FINETUNE_DIR / "accelerate_fsdp.yaml"}


def launch_argv(recipe_path: Path, processes: int, *, fsdp: bool = False, port: int) -> list[str]:
    """The ``accelerate launch`` command line (as a user types it) that trains ``recipe_path`` on ``processes``."""
    config = ACCELERATE_CONFIGS["fsdp" if fsdp else "ddp"]
    try:
        config = config.relative_to(Path.cwd())
    except ValueError:
        pass
    return ["accelerate", "launch", "--config_file", str(config), "--num_processes", str(processes),
            "--main_process_port", str(port), "-m", "finetune.sft", str(recipe_path)]


def check_processes(recipe: Recipe, processes: int, fsdp: bool, on_gpu: bool, gpus: int) -> None:
    """Clear errors before anything starts: too few processes, more processes than GPUs, a batch that does not split."""
    if processes < 1:
        raise ConfigError(f"--processes {processes}: at least 1 is needed")
    if fsdp and processes < 2:
        raise ConfigError("--fsdp shards the model over several processes: give --processes 2 or more")
    if fsdp and not on_gpu:
        raise ConfigError("--fsdp needs GPUs: accelerate applies its FSDP plugin only to GPU (accelerator) process groups; CPU "
                          "processes (gloo) would silently train as plain DDP. On the CPU use --processes N without --fsdp")
    if on_gpu and processes > gpus:
        raise ConfigError(f"--processes {processes}: this machine has {gpus} GPU(s); use one process per GPU")
    if fsdp and recipe.model.load_in_4bit:
        raise ConfigError("--fsdp with model.load_in_4bit: shard a bf16 base instead (--set model.load_in_4bit=false), "
                          "or keep the 4-bit base with DDP (no --fsdp)")
    recipe.training.split(processes)  # ConfigError naming training.batch_size when it does not divide
    d = recipe.data
    splits = Path(d.splits_dir) if d.splits_dir else Path(d.dialogs).parent
    for split in filter(None, (d.train_split, d.valid_split)):  # what every process would stop on, said once
        if not split_file(splits, split).exists():
            raise DataError(f"split {split!r}: {split_file(splits, split)} not found (expected a JSON list of dialog ids)")


def launch(recipe: Recipe, processes: int, *, fsdp: bool = False, log=print) -> dict:
    """Train ``recipe`` on ``processes`` processes through ``accelerate launch``; returns rank 0's train_metrics.json."""
    import json

    import torch

    on_gpu = torch.cuda.is_available()
    check_processes(recipe, processes, fsdp, on_gpu, torch.cuda.device_count() if on_gpu else 0)
    out = recipe.out_dir()
    with out_lock(recipe):  # held here for every process it starts (they do not take it again)
        recipe_path = out / "recipe.yaml"  # finetune.sft rewrites the same resolved recipe there
        recipe_path.write_text(yaml.safe_dump(recipe.model_dump(), sort_keys=False))
        argv = launch_argv(recipe_path, processes, fsdp=fsdp, port=free_port())
        log(f"{'GPU' if on_gpu else 'CPU (gloo)'}, {processes} processes: {shlex.join(argv)}")
        # the venv's own accelerate, whatever PATH says
        proc = subprocess.run([sys.executable, "-m", "accelerate.commands.accelerate_cli", *argv[1:]],
                              env={**os.environ, OUT_LOCK_HELD_ENV: str(out.resolve())})
    if proc.returncode != 0:
        raise LaunchFailed(f"accelerate launch exited with status {proc.returncode} (the processes' messages are above); "
                           f"checkpoints in {out} are kept: the same command resumes")
    return json.loads((out / "train_metrics.json").read_text())


class LaunchFailed(MedstackError):
    """The launched training processes failed (after the recipe was checked)."""
