"""`medstack finetune meditod-TASK ... --executor slurm --gpus N`: the training as one Slurm job.

    OUT/slurm-recipe.yaml   the resolved recipe the job trains (the command's options applied)
    OUT/slurm-job.sbatch    the job script (plain sbatch: read it, `sbatch` it again by hand)
    OUT/slurm-job.log       the job's log, appended across requeues
    OUT/slurm-job.json      the job's own state: submitted -> running -> done | failed | interrupted

The job runs ``medstack finetune slurm-job OUT``, which calls what the local command calls: :func:`finetune.sft.train`
on one process, or :func:`finetune.launch.launch` (``accelerate launch``, DDP or ``--fsdp``) on N. It asks for N
GPUs (``--gres=gpu:N``; none with ``--gpus 0``: one CPU process, or ``--processes`` CPU processes). A preempted or
requeued job resumes from the last checkpoint in OUT, as a re-run of the local command does.
``medstack finetune status OUT`` shows the job's state and the last checkpoint's step.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import yaml

from experiments.core.config import ConfigError
from finetune.recipe import Recipe, load_recipe
from models.paths import private_dir, private_file
from models.registry import get_spec
from serving.slurm import (SlurmOptions, header, job_identity, log_tail, queue_states, read_state, sbatch_script, shown_state,
                           submit, write_script, write_state)

RECIPE, SCRIPT, LOG, STATE = "slurm-recipe.yaml", "slurm-job.sbatch", "slurm-job.log", "slurm-job.json"


def submit_training(recipe: Recipe, task: str, gpus: int, processes: int, fsdp: bool, opts: SlurmOptions, log=print) -> str:
    out = private_dir(recipe.out_dir())
    st = read_state(out / STATE)
    if st.get("job_id") and st["job_id"] in queue_states([st["job_id"]]):
        raise ConfigError(f"{out}: its training is already queued as job {st['job_id']} (`medstack finetune status {out}`); "
                          f"wait for it or cancel it (scancel {st['job_id']})")
    nproc = processes if processes > 1 else max(1, gpus)
    if fsdp and nproc < 2:
        raise ConfigError("--fsdp shards the model over several processes: give --gpus 2 or more")
    recipe.training.split(nproc)  # a batch that does not split: said here, not in the job
    (out / RECIPE).write_text(yaml.safe_dump(recipe.model_dump(), sort_keys=False), encoding="utf-8")
    private_file(out / RECIPE)
    python = opts.python_argv(sys.executable)
    body = [f"exec >>{shlex.quote(str(out / LOG))} 2>&1  # the job's log, beside its checkpoints",
            'echo "== $(date -Is) job $SLURM_JOB_ID on $(hostname), restart ${SLURM_RESTART_COUNT:-0}"',
            "exec " + shlex.join([*python, "-m", "scripts.cli", "finetune", "slurm-job", str(out)])]
    hdr = header(f"medstack-finetune-{task}", opts, gpus=gpus, mem_gb=get_spec(recipe.model.base).memory_gb,
                 output=out / "slurm-job.out")
    script = write_script(out / SCRIPT, sbatch_script(hdr, body, chdir=Path.cwd(), opts=opts,
                                                      comment=f"medstack finetune meditod-{task} of {recipe.model.base} into {out}"))
    job = submit(script, cwd=Path.cwd())
    write_state(out / STATE, state="submitted", job_id=job, submitted=time.time(), processes=nproc, fsdp=fsdp, gpus=gpus,
                max_steps=recipe.training.max_steps, script=str(script))
    log(f"finetune: submitted as Slurm job {job} ({script}); log {out / LOG}; `medstack finetune status {out}` shows its progress")
    return job


def run_job(out: Path, log=print) -> dict:
    """Inside the job: train the recipe OUT/slurm-recipe.yaml on the processes asked for (resuming from a checkpoint)."""
    out = Path(out)
    st = read_state(out / STATE)
    recipe = load_recipe(out / RECIPE, {"out": str(out)})
    write_state(out / STATE, state="running", started=time.time(), **{**job_identity(), "job_id": job_identity()["slurm_job_id"]})
    try:
        if st.get("processes", 1) > 1:
            from finetune.launch import launch

            metrics = launch(recipe, st["processes"], fsdp=bool(st.get("fsdp")), log=log)
        else:
            from finetune.sft import train

            metrics = train(recipe, log=log)
    except (Exception, KeyboardInterrupt) as e:
        interrupted = isinstance(e, KeyboardInterrupt)
        sys.stdout.flush()
        sys.stderr.flush()
        write_state(out / STATE, state="interrupted" if interrupted else "failed", ended=time.time(),
                    message="" if interrupted else f"{type(e).__name__}: {e}", log_tail="" if interrupted else log_tail(out / LOG))
        raise
    write_state(out / STATE, state="done", ended=time.time(), global_step=metrics.get("global_step"), adapter=metrics.get("adapter"))
    return metrics


def last_step(out: Path) -> int:
    steps = [int(p.name.rsplit("-", 1)[1]) for p in Path(out).glob("checkpoint-*") if p.name.rsplit("-", 1)[1].isdigit()]
    return max(steps, default=0)


def status_lines(out: Path) -> list[str]:
    out = Path(out)
    st = read_state(out / STATE)
    if not st:
        raise ConfigError(f"{out}: no Slurm fine-tune here ({out / STATE} not found); submit one with "
                          f"`medstack finetune meditod-TASK ... --executor slurm --out {out}`")
    job = st.get("job_id", "")
    state = shown_state(queue_states([job]).get(job), st)
    step = last_step(out)
    metrics = out / "train_metrics.json"
    if metrics.exists() and state == "done":
        step = json.loads(metrics.read_text()).get("global_step", step)
    total = st.get("max_steps")
    lines = [f"finetune {out}: job {job} {state}; step {step}" + (f"/{total}" if total else "") + " (last checkpoint)"
             + f"; restarts {st.get('restarts', 0)}; log {out / LOG}"]
    if state == "done" and st.get("adapter"):
        lines.append(f"adapter: {st['adapter']}")
    if state == "failed":
        lines += [f"failed: {st.get('message') or 'the job left the queue without finishing'}"]
        lines += ["    " + x for x in (st.get("log_tail") or log_tail(out / LOG)).splitlines()]
    return lines
