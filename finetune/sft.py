"""LoRA supervised fine-tuning of the MediTOD NLU / POL / NLG baselines.

Single process:   python -m finetune.sft finetune/configs/embedded-cpu.yaml data.dialogs=D.json training.max_steps=30
Several GPUs:     accelerate launch --config_file finetune/accelerate_ddp.yaml -m finetune.sft finetune/configs/llama3-8b-nlu.yaml data.dialogs=D.json
(or `medstack finetune meditod-nlu ...`, which calls :func:`train`).

Sections: seed -> logging -> last checkpoint -> data -> tokenizer -> model -> trainer with
peft config -> train -> save -> evaluate. The recipe (finetune/recipe.py) carries every key.

The paper recipe (the MediTOD authors' configs): 10 epochs, valid loss every epoch, early stopping
with patience 5, the adapter with the best valid loss kept (``load_best_model_at_end``), gradient
checkpointing, sequences of at most 1024 tokens, and on GPU a 4-bit NF4 base (bitsandbytes,
:func:`bnb_4bit_kwargs`). On the CPU the base stays float32 and ``--max-steps`` makes smoke runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import transformers
import yaml
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, EarlyStoppingCallback, Trainer, TrainingArguments, set_seed
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import get_last_checkpoint

from experiments.core.config import parse_set
from finetune.callbacks import LossProgressCallback, ThroughputCallback
from finetune.data import build_dataset, collator, completion_loss, dataset_stats, load_pairs
from finetune.recipe import Recipe, is_rank_zero, load_recipe, out_lock, require_4bit_support, world_size
from finetune.report import plot_losses, summarize, write_metrics
from models.registry import resolve_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def bnb_4bit_kwargs(compute_dtype: torch.dtype, double_quant: bool = False) -> dict:
    """The QLoRA base: 4-bit NormalFloat weights, compute in ``compute_dtype`` (bf16 on GPU); double quantization
    as the recipe says (the MediTOD authors: off)."""
    return {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": compute_dtype,
            "bnb_4bit_use_double_quant": double_quant}


def from_pretrained_kwargs(recipe: Recipe, on_gpu: bool, dtype: torch.dtype) -> dict:
    """Keyword arguments of ``AutoModelForCausalLM.from_pretrained`` for the base (4-bit checks first)."""
    require_4bit_support(recipe, on_gpu)
    kwargs = {"dtype": dtype}
    if recipe.model.attn_implementation:
        kwargs["attn_implementation"] = recipe.model.attn_implementation
    if recipe.model.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(**bnb_4bit_kwargs(dtype, recipe.model.double_quant))
        from accelerate import PartialState

        # the whole 4-bit model on this process's GPU: under DDP each rank loads onto its own (local rank)
        kwargs["device_map"] = {"": PartialState().local_process_index}
    return kwargs


def load_base(weights: Path, recipe: Recipe, on_gpu: bool, dtype: torch.dtype):
    kwargs = from_pretrained_kwargs(recipe, on_gpu, dtype)
    model = AutoModelForCausalLM.from_pretrained(str(weights), **kwargs)
    model.config.use_cache = False  # incompatible with gradient checkpointing, useless in training
    if recipe.model.load_in_4bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=recipe.model.gradient_checkpointing)
    return model


def merge_adapter(weights: Path, adapter_dir: Path, out_dir: Path, dtype: torch.dtype, tokenizer) -> Path:
    """Base (reloaded unquantized) + adapter -> one plain checkpoint vLLM/transformers load without peft."""
    base = AutoModelForCausalLM.from_pretrained(str(weights), dtype=dtype)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def train(recipe: Recipe, log=print, *, weights: Path | None = None) -> dict:
    """Fine-tune per ``recipe``; ``weights`` replaces the base alias's resolved weights dir (tests use a tiny model).

    One process per ``out`` folder: a second training on it is refused before anything loads (``out_lock``)."""
    with out_lock(recipe):
        return _train(recipe, log, weights=weights)


def _train(recipe: Recipe, log=print, *, weights: Path | None = None) -> dict:
    t_start = time.perf_counter()
    if not is_rank_zero():  # under `accelerate launch` only rank 0 reports (every rank trains)
        log = lambda *_: None  # noqa: E731
    out = recipe.out_dir()
    out.mkdir(parents=True, exist_ok=True)
    on_gpu = torch.cuda.is_available()
    require_4bit_support(recipe, on_gpu)  # before any loading: a clear error where a GPU or bitsandbytes is missing

    # ---- seed
    set_seed(recipe.training.seed)

    # ---- logging
    transformers.utils.logging.set_verbosity_warning()
    (out / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(), sort_keys=False))
    log(f"fine-tuning {recipe.model.base} on MediTOD {recipe.data.task} -> {out}")

    # ---- last checkpoint (a re-run with the same --out resumes)
    last_checkpoint = get_last_checkpoint(str(out))
    if last_checkpoint:
        log(f"resuming from {last_checkpoint}")

    # ---- data
    d = recipe.data
    train_pairs = load_pairs(d.dialogs, d.splits_dir, d.train_split, d.task, history_size=d.history_size)[: d.limit]
    valid_pairs = load_pairs(d.dialogs, d.splits_dir, d.valid_split, d.task, history_size=d.history_size) if d.valid_split else []

    # ---- tokenizer
    if weights is None:
        _, weights = resolve_weights(recipe.model.base)
    tokenizer = AutoTokenizer.from_pretrained(str(weights))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    train_ds = build_dataset(train_pairs, tokenizer, d.max_length, d.prompt_format)
    valid_ds = build_dataset(valid_pairs, tokenizer, d.max_length, d.prompt_format) if valid_pairs else None
    data_stats = {"train": dataset_stats(train_ds), "valid": dataset_stats(valid_ds) if valid_ds else None}
    log(f"data: {json.dumps(data_stats)}")

    # ---- model
    dtype = DTYPES.get(recipe.model.dtype) or (torch.bfloat16 if on_gpu else torch.float32)
    model = load_base(weights, recipe, on_gpu, dtype)

    # ---- trainer with peft config
    lora = recipe.lora
    peft_config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             target_modules=lora.target_modules, task_type="CAUSAL_LM")
    model = get_peft_model(model, peft_config)
    t = recipe.training
    per_device, accumulation = t.split(world_size())  # batch_size is the global batch on any number of processes
    has_valid = valid_ds is not None
    eval_steps = t.eval_steps or (t.max_steps if t.max_steps > 0 else None)
    strategy = ("steps" if eval_steps else "epoch") if has_valid else "no"
    args = TrainingArguments(
        output_dir=str(out), seed=t.seed, use_cpu=not on_gpu,
        # transformers >= 5 (requirements.txt) reads a float warmup_steps < 1 as a fraction of the steps (warmup_ratio is gone)
        learning_rate=t.learning_rate, lr_scheduler_type=t.lr_scheduler_type, warmup_steps=t.warmup_ratio,
        per_device_train_batch_size=per_device, per_device_eval_batch_size=t.per_device_eval_batch_size,
        gradient_accumulation_steps=accumulation,
        num_train_epochs=t.epochs, max_steps=t.max_steps, weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm,
        optim=t.optim, dataloader_drop_last=t.dataloader_drop_last,
        train_sampling_strategy="group_by_length" if t.group_by_length else "random",
        bf16=on_gpu and dtype == torch.bfloat16, fp16=on_gpu and dtype == torch.float16,
        gradient_checkpointing=recipe.model.gradient_checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False},
        logging_steps=t.logging_steps, logging_first_step=True, include_num_input_tokens_seen="non_padding",
        eval_strategy=strategy, eval_steps=eval_steps if strategy == "steps" else None,
        save_strategy=strategy if has_valid else "steps", save_steps=(t.save_steps or eval_steps or 500),
        save_total_limit=t.save_total_limit, load_best_model_at_end=has_valid,
        metric_for_best_model="eval_loss" if has_valid else None, greater_is_better=False if has_valid else None,
        remove_unused_columns=False, report_to="none", ddp_find_unused_parameters=False if world_size() > 1 else None,
    )
    throughput = ThroughputCallback()
    callbacks = [throughput] + ([EarlyStoppingCallback(early_stopping_patience=t.early_stopping_patience)]
                                if t.early_stopping_patience else [])
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=valid_ds,
                      data_collator=collator(tokenizer), compute_loss_func=completion_loss, callbacks=callbacks)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(LossProgressCallback())
    if trainer.is_world_process_zero():
        model.print_trainable_parameters()
    state = trainer.accelerator.state
    distributed = {"type": str(state.distributed_type).rsplit(".", 1)[-1], "backend": state.backend, "processes": state.num_processes,
                   "per_device_batch": per_device, "accumulation": accumulation, "global_batch": per_device * accumulation * state.num_processes}
    if state.num_processes > 1:
        log(f"distributed: {json.dumps(distributed)}")
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and distributed["type"] != "FSDP":
        log(f"warning: the accelerate config asks for FSDP, but these processes train as {distributed['type']} (plain data "
            "parallel, the model replicated): accelerate applies FSDP only to GPU (accelerator) process groups")

    # ---- train
    result = trainer.train(resume_from_checkpoint=last_checkpoint)

    # ---- save
    adapter_dir = out / "adapter"
    if trainer.is_world_process_zero():
        trainer.model.save_pretrained(str(adapter_dir))
        log(f"adapter saved to {adapter_dir} (serve: medstack serve --model {recipe.model.base} --lora {d.task}={adapter_dir})")
    trainer.accelerator.wait_for_everyone()
    merged_dir = None
    if recipe.merge and trainer.is_world_process_zero():
        merged_dir = merge_adapter(weights, adapter_dir, out / "merged", dtype, tokenizer)
        log(f"merged checkpoint written to {merged_dir}")

    # ---- evaluate
    # (with load_best_model_at_end the loaded adapter's valid loss is state.best_metric: no second pass)
    best = trainer.state.best_metric
    eval_metrics = ({"eval_loss": best} if best is not None else trainer.evaluate()) if has_valid else {}
    planned = trainer.state.max_steps
    stopped_early = bool(t.early_stopping_patience) and trainer.state.global_step < planned
    best_ckpt = trainer.state.best_model_checkpoint
    if stopped_early:
        log(f"early stopping after {trainer.state.global_step} of {planned} steps: no lower valid loss in "
            f"{t.early_stopping_patience} evaluations; best valid loss {best} at {best_ckpt}")
    metrics = summarize(trainer.state.log_history, throughput.train_tokens, throughput.train_seconds, time.perf_counter() - t_start)
    metrics.update({
        "task": d.task, "base": recipe.model.base, "weights": str(weights), "device": "cuda" if on_gpu else "cpu",
        "dtype": str(dtype).removeprefix("torch."), "world_size": world_size(), "distributed": distributed, "data": data_stats,
        "global_step": trainer.state.global_step, "train_runtime_s": result.metrics.get("train_runtime"),
        "final_valid_loss": eval_metrics.get("eval_loss"), "adapter": str(adapter_dir),
        "planned_steps": planned, "early_stopping_patience": t.early_stopping_patience, "stopped_early": stopped_early,
        "best_checkpoint": best_ckpt, "best_step": int(best_ckpt.rsplit("-", 1)[1]) if best_ckpt else None,
        "load_in_4bit": recipe.model.load_in_4bit, "gradient_checkpointing": recipe.model.gradient_checkpointing,
        "max_length": d.max_length, "history_size": d.history_size, "prompt_format": d.prompt_format,
        "merged": str(merged_dir) if merged_dir else None, "resumed_from": last_checkpoint,
        "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 3) if on_gpu else None,
    })
    if trainer.is_world_process_zero():
        write_metrics(out, metrics)
        plot_losses(out, metrics, f"{recipe.model.base} LoRA r={lora.r}, MediTOD {d.task}")
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="recipe YAML (finetune/configs/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="SECTION.KEY=VALUE, e.g. data.dialogs=dialogs.json training.max_steps=30")
    ns = parser.parse_args(argv)
    from models.errors import MedstackError
    from models.paths import set_offline

    set_offline()
    try:
        recipe = load_recipe(ns.config, parse_set(ns.overrides))
        if not recipe.data.dialogs:
            raise MedstackError("data.dialogs is required (data.dialogs=PATH/dialogs.json)")
        metrics = train(recipe)
    except MedstackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if is_rank_zero():
        print(json.dumps({k: metrics[k] for k in ("first_loss", "last_loss", "best_valid_loss", "train_tokens_per_s", "train_seconds", "adapter")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
