"""CRAFT-MD commands: `run craftmd`, `import craftmd`, `compare`, `meld`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import List, Optional

import typer

from experiments.config import config_dir, load_settings

DEFAULT_CONFIG = config_dir(__file__) / "paper.yaml"


def _print(text: str) -> None:
    """Markdown tables as they are (rich would wrap them at the terminal width)."""
    typer.echo(text.rstrip("\n"))


def _log(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(msg, highlight=False)


def run_craftmd(
    data: Optional[str] = typer.Option(None, "--data", help="Cases: CRAFT-MD CSV (usmle_and_derm_dataset.csv format) or AgentClinic OSCE .jsonl."),
    clinical_model: Optional[str] = typer.Option(None, "--clinical-model", help="Model under test (alias or ALIAS@URL)."),
    patient_model: Optional[str] = typer.Option(None, "--patient-model", help="Patient-AI model (alias or ALIAS@URL)."),
    grader_model: Optional[str] = typer.Option(None, "--grader-model", help="Grader-AI model (alias or ALIAS@URL); also summarizes unless --summarizer-model."),
    summarizer_model: Optional[str] = typer.Option(None, "--summarizer-model", help="Model that turns the patient's statements into a summary (default: the grader)."),
    formats: Optional[str] = typer.Option(None, "--formats", help="Comma list of vignette,multiturn,singleturn,summarized."),
    mcq: Optional[bool] = typer.Option(None, "--mcq/--no-mcq", help="Ask 4-choice MCQ (default from config: yes)."),
    frq: Optional[bool] = typer.Option(None, "--frq/--no-frq", help="Ask free-response questions graded by the grader-AI (default: yes)."),
    trials: Optional[int] = typer.Option(None, "--trials", help="Trials per case (paper: 5)."),
    specialty: Optional[str] = typer.Option(None, "--specialty", help="Only cases of this specialty (the CSV's category column)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="First N cases only."),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", help="Turn cap: doctor turns per conversation."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="(case, trial) units in flight, and the request limit."),
    name: Optional[str] = typer.Option(None, "--name", help="Run name shown by `compare` (default: the clinical model alias)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Base seed for sampled requests."),
    out: Optional[str] = typer.Option(None, "--out", help="Results directory (re-running with the same --out resumes)."),
    config: Path = typer.Option(DEFAULT_CONFIG, "--config", help="YAML settings (configs/paper.yaml, configs/embedded-small.yaml, ...)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Bypass the response cache."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow non-local endpoints."),
) -> None:
    """CRAFT-MD: simulated doctor–patient conversations, summaries, MCQ/FRQ in 4 formats, two-step grading, N trials.

    One record per (case, trial), id CASE/tK. Writes records.jsonl, metrics.json, summary.md in --out.
    """
    from experiments.craftmd.run import run
    from experiments.craftmd.settings import CraftSettings

    roles = {k: v for k, v in {"clinical": clinical_model, "patient": patient_model, "grader": grader_model, "summarizer": summarizer_model}.items() if v}
    if grader_model and not summarizer_model:
        roles["summarizer"] = grader_model
    overrides = {"data": data, "formats": formats, "mcq": mcq, "frq": frq, "trials": trials, "specialty": specialty, "limit": limit,
                 "max_turns": max_turns, "concurrency": concurrency, "name": name, "seed": seed, "out": out, "roles": roles or None,
                 "use_cache": False if no_cache else None, "allow_remote": True if allow_remote else None}
    settings = load_settings(CraftSettings, config, overrides)
    metrics = asyncio.run(run(settings, log=_log))
    _print((Path(settings.out) / "summary.md").read_text())
    _log(f"results in {settings.out} ({metrics['records']} records)")


def import_craftmd(
    src: Path = typer.Argument(..., help="Folder of the CRAFT-MD authors' per-case result JSON files."),
    name: str = typer.Option(..., "--name", help="Run name, e.g. gpt-4 (shown by `compare`)."),
    out: Path = typer.Option(..., "--out", help="Results directory to write."),
    cases: Optional[str] = typer.Option(None, "--cases", help="Case CSV to take MCQ choices and specialties from (by case_id) when the files lack them."),
) -> None:
    """Import published CRAFT-MD per-case results as a results directory (same record shape as a local run).

    MCQ free-text answers are mapped to choices by one rule for every model: letter, exact choice
    text, unique contained choice text, rapidfuzz token_set_ratio >= 85, else unparsed (= wrong).
    """
    from experiments.craftmd.importer import import_folder

    metrics = import_folder(src, name, out, cases)
    _print((Path(out) / "summary.md").read_text())
    _log(f"imported {metrics['records']} records into {out}")


def compare_cmd(
    results: List[Path] = typer.Argument(..., help="Results directories (local runs and/or imported ones)."),
    out: Path = typer.Option(Path("compare-out"), "--out", help="Where to write summary.md, compare.json, accuracy.png."),
) -> None:
    """Accuracy per format × MCQ/FRQ × run with 95% bootstrap CIs, paired bootstrap + Holm, McNemar, per specialty, bar chart."""
    from experiments.craftmd.compare import run_compare

    run_compare([str(p) for p in results], out)
    _print((out / "summary.md").read_text())
    _log(f"wrote {out}/summary.md, compare.json, accuracy.png")


def meld_cmd(
    model: str = typer.Option("embedded", "--model", help="Model to probe (alias or ALIAS@URL)."),
    data: str = typer.Option(..., "--data", help="Cases CSV (or OSCE .jsonl)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="First N cases only."),
    out: Path = typer.Option(Path("meld-out"), "--out", help="Results directory."),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="Similarity treated as memorized (default 0.95)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency"),
    config: Path = typer.Option(config_dir(__file__) / "meld.yaml", "--config", help="YAML settings."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow non-local endpoints."),
) -> None:
    """MELD contamination check: first half of each vignette -> model writes the second half; similarity = 1 − normalized Levenshtein."""
    from experiments.craftmd.meld import MeldSettings, run_meld

    s = load_settings(MeldSettings, config, {"data": data, "limit": limit, "out": str(out), "threshold": threshold, "concurrency": concurrency,
                                              "roles": {"default": model}, "allow_remote": True if allow_remote else None})
    asyncio.run(run_meld(s, log=_log))
    _print((out / "summary.md").read_text())


def register(app, run_app, score_app, import_app, data_app, finetune_app) -> None:
    run_app.command("craftmd")(run_craftmd)
    import_app.command("craftmd")(import_craftmd)
    app.command("compare")(compare_cmd)
    app.command("meld")(meld_cmd)
