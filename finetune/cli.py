"""`medstack finetune meditod-nlu|meditod-pol|meditod-nlg`: LoRA fine-tuning from the command line.

The command resolves a recipe (``--config``, else the base's default config in
``finetune/configs/``), applies the options on top, and calls :func:`finetune.sft.train`.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from pathlib import Path
from typing import List, Literal, Optional

import typer


HELP = {
    "nlu": "dialogue history + last exchange -> the patient turn's NLU (intents, slots) as JSON",
    "pol": "dialogue history + dialogue state -> the doctor's next actions as JSON",
    "nlg": "dialogue history + the doctor's actions -> the doctor's utterance",
}


def _command(task: str):
    def finetune(
        data: str = typer.Option(..., "--data", help="MediTOD dialogs.json, or a registered data set name (meditod-sample)."),
        base: str = typer.Option(..., "--base", help="Registry alias of the base model (e.g. embedded, llama3-8b-instruct, openbiollm-8b)."),
        splits_dir: Optional[Path] = typer.Option(None, "--splits-dir", help="Folder with train_ids.json / valid_ids.json (default: beside --data)."),
        config: Optional[Path] = typer.Option(None, "--config", help="Recipe YAML (default: finetune/configs/<base default>.yaml)."),
        out: Optional[Path] = typer.Option(None, "--out", help="Output dir: checkpoints, adapter/, train_metrics.json, loss.png (re-run resumes) \\[default: runs/finetune/meditod-<task>-<base>]"),
        merge: bool = typer.Option(False, "--merge", help="Also write a merged base+adapter checkpoint to OUT/merged."),
        limit: Optional[int] = typer.Option(None, "--limit", help="Use at most N training samples (smoke runs)."),
        set_: List[str] = typer.Option([], "--set", help="Any recipe key, SECTION.KEY=VALUE (repeatable), e.g. --set lora.r=16 --set training.learning_rate=2e-4."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Train nothing: write OUT/samples.jsonl, one line per training (--limit applies) "
                                     "and validation sample (split, id, messages; the rendered text when the base's tokenizer is on this machine)."),
        processes: int = typer.Option(1, "--processes", min=1, help="Train on N processes with `accelerate launch` (DDP; one per GPU, or N CPU "
                                      "processes with gloo); training.batch_size stays the global batch. The command line is printed."),
        fsdp: bool = typer.Option(False, "--fsdp", help="With --processes N: fully sharded data parallel (finetune/accelerate_fsdp.yaml) instead of DDP."),
        executor: Literal["local", "slurm"] = typer.Option("local", "--executor", help="local: train here; slurm: submit the training as one Slurm job "
                                     "(resumes from its last checkpoint when requeued; `medstack finetune status OUT`)."),
        gpus: int = typer.Option(1, "--gpus", min=0, help="With --executor slurm: GPUs of the job, one process each (0: no GPU, "
                                 "one CPU process or --processes N)."),
        slurm_partition: Optional[str] = typer.Option(None, "--slurm-partition", help="With --executor slurm: the partition."),
        slurm_account: Optional[str] = typer.Option(None, "--slurm-account", help="With --executor slurm: the account charged."),
        slurm_time: Optional[str] = typer.Option(None, "--slurm-time", help="With --executor slurm: the time limit (MINUTES, HH:MM:SS, D-HH:MM:SS)."),
        slurm_cpus: Optional[int] = typer.Option(None, "--slurm-cpus", min=1, help="With --executor slurm: CPUs of the job (default 8 per GPU, 2 without)."),
        slurm_extra: List[str] = typer.Option([], "--slurm-extra", help="With --executor slurm: KEY=VALUE, one more #SBATCH --KEY=VALUE line (repeatable)."),
        slurm_setup: List[str] = typer.Option([], "--slurm-setup", help="With --executor slurm: a shell line the job runs first (repeatable)."),
        slurm_python: Optional[str] = typer.Option(None, "--slurm-python", help="With --executor slurm: the command that runs Python in the job."),
        recipe_flags: dict | None = None,  # the recipe's own flags (--max-steps, --epochs, ...: recipe_flags()), as overrides
    ) -> None:
        from experiments.core.commands import resolve_data
        from experiments.core.config import ConfigError, check_keys, parse_set
        from finetune.recipe import Recipe
        from finetune.recipe import load_recipe, merge_overrides, strip_none
        from models.prompt_format import default_recipe

        data = Path(resolve_data(data))
        overrides = {
            "out": str(out) if out else None,
            "merge": True if merge else None,
            "model": {"base": base},
            "data": {"task": task, "dialogs": str(data), "splits_dir": str(splits_dir) if splits_dir else None, "limit": limit},
        }
        for item in set_ or []:  # a key the recipe has no place for, named as typed
            check_keys(Recipe, parse_set([item]), given=f"--set {item}")
        overrides = merge_overrides(merge_overrides(strip_none(overrides), recipe_flags or {}), parse_set(set_))
        recipe = load_recipe(config or default_recipe(base), overrides)
        if dry_run:
            _dry_run(recipe)
            return

        if executor not in ("local", "slurm"):
            raise ConfigError(f"--executor {executor!r}: local or slurm")
        if executor == "slurm":
            from finetune.slurm import submit_training
            from serving.slurm import SlurmOptions, parse_extra, require_slurm

            require_slurm()
            opts = SlurmOptions(partition=slurm_partition, account=slurm_account, time=slurm_time, cpus=slurm_cpus,
                                extra=parse_extra(slurm_extra), setup=list(slurm_setup), python=slurm_python)
            submit_training(recipe, task, gpus, processes, fsdp, opts, log=lambda m: typer.echo(m, err=True))
            return
        if processes > 1 or fsdp:
            from finetune.launch import LaunchFailed, launch

            try:
                metrics = launch(recipe, processes, fsdp=fsdp, log=lambda m: typer.echo(m, err=True))
            except LaunchFailed as e:  # the processes ran and failed: checkpoints are kept, a re-run resumes
                typer.echo(f"error: {e}", err=True)
                raise typer.Exit(3)
        else:
            from finetune.sft import train

            metrics = train(recipe, log=lambda m: typer.echo(m, err=True))
        typer.echo(
            f"train loss {metrics['first_loss']:.4f} -> {metrics['last_loss']:.4f} over {metrics['global_step']} steps; "
            f"valid loss {metrics['final_valid_loss'] if metrics['final_valid_loss'] is not None else '-'}; "
            f"{metrics['train_tokens_per_s']} training tokens/s; {metrics['train_seconds']} s\n"
            f"adapter: {metrics['adapter']}\nmetrics: {recipe.out_dir() / 'train_metrics.json'}"
        )

    flags = recipe_flags()

    def command(**values) -> None:
        from experiments.core.commands import flag_overrides

        given = flag_overrides(flags, {p.key: values.pop(p.key) for p in flags})
        finetune(**values, recipe_flags=given)

    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in inspect.signature(finetune, eval_str=True).parameters.values()
           if p.name != "recipe_flags"]
    at = next(i for i, p in enumerate(own) if p.name == "out") + 1  # the recipe's flags after --out, as before
    command.__signature__ = inspect.Signature([*own[:at], *_flag_parameters(flags), *own[at:]])
    command.__doc__ = (
        f"LoRA supervised fine-tuning for MediTOD {task.upper()} ({HELP[task]}); loss on the completion only, "
        "valid loss on the valid split, checkpoints (a re-run with the same --out resumes), a peft adapter in OUT/adapter "
        f"that vLLM serves (`medstack serve --model BASE --lora {task}=OUT/adapter`)."
    )
    return command


@lru_cache(maxsize=1)
def recipe_flags() -> list:
    """The recipe fields marked as flags (finetune/recipe.py: ``json_schema_extra=cli("--max-steps")``), generated as a
    study's flags are from its settings model (experiments/core/commands.py)."""
    from experiments.core.commands import nested_flags
    from finetune.recipe import Recipe

    return nested_flags(Recipe)


def _flag_parameters(flags: list) -> list:
    """Typer parameters of the recipe's flags; each help names the recipe key it overrides, and its value where every
    shipped recipe agrees."""
    import yaml

    from experiments.core.commands import flag_parameters
    from finetune.recipe import CONFIG_DIR

    shipped = [yaml.safe_load(p.read_text(encoding="utf-8")) or {} for p in sorted(CONFIG_DIR.glob("*.yaml"))]

    def help_of(p) -> str:
        key = p.flag.targets[0]
        values = {str(_lookup(r, key)) for r in shipped}
        every = f": {values.pop()} in every shipped recipe" if len(values) == 1 and "None" not in values else ""
        return p.flag.help + f" \\[default: the recipe's {key}{every}]"

    return flag_parameters(flags, help_of)


def _lookup(tree: dict, dotted: str):
    for key in dotted.split("."):
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def _dry_run(recipe) -> None:
    """The samples training would see, without weights (messages only) or with the base's local tokenizer."""
    from experiments.studies.meditod.prompts import load_tokenizer
    from finetune.data import write_samples

    tok = load_tokenizer(recipe.model.base)
    counts = write_samples(recipe, recipe.out_dir(), tok)
    how = "messages and rendered text" if tok is not None or recipe.data.prompt_format == "completion" else \
        f"messages only (no local tokenizer for {recipe.model.base}: the {recipe.data.prompt_format} rendering needs it)"
    typer.echo(f"dry run: {', '.join(f'{n} {k}' for k, n in counts.items())} samples ({how}) written to "
               f"{recipe.out_dir() / 'samples.jsonl'}; nothing trained")


def status(out: Path = typer.Argument(..., help="The fine-tune's --out folder.")) -> None:
    """Where a fine-tune submitted with --executor slurm is: its job's state, the last checkpoint's step, the adapter."""
    from finetune.slurm import status_lines

    typer.echo("\n".join(status_lines(out)))


def slurm_job(out: Path = typer.Argument(...)) -> None:
    """Inside a Slurm job: train OUT/slurm-recipe.yaml (what `--executor slurm` submitted)."""
    from finetune.launch import LaunchFailed
    from finetune.slurm import run_job

    try:
        metrics = run_job(out, log=lambda m: typer.echo(m, err=True))
    except LaunchFailed as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(3)
    typer.echo(f"adapter: {metrics['adapter']}")


def register(app=None, run_app=None, score_app=None, import_app=None, data_app=None, finetune_app=None, **_) -> None:
    for task in ("nlu", "pol", "nlg"):
        finetune_app.command(f"meditod-{task}")(_command(task))
    finetune_app.command("status")(status)
    finetune_app.command("slurm-job", hidden=True)(slurm_job)
