"""CRAFT-MD commands: `run craftmd`, `import craftmd`, `compare`, `meld`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from experiments.core.commands import study_command


def _print(text: str) -> None:
    """Markdown tables as they are (rich would wrap them at the terminal width)."""
    typer.echo(text.rstrip("\n"))


def _log(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(msg, highlight=False)


def _craftmd_overrides(v: dict) -> dict:
    """Study options -> settings keys; the per-role flags are aliases of --role ROLE=REF."""
    roles = {k: v.pop(f"{k}_model") for k in ("clinical", "patient", "grader", "summarizer") if v.get(f"{k}_model")}
    if "grader" in roles and "summarizer" not in roles:
        roles["summarizer"] = roles["grader"]  # the grader summarizes unless --summarizer-model says otherwise
    out = {k: val for k, val in v.items() if val is not None and not k.endswith("_model")}
    if roles:
        out["roles"] = roles
    return out


CRAFTMD_OPTIONS = {
    "clinical_model": (Optional[str], typer.Option(None, "--clinical-model", help="Model under test (alias of --role clinical=REF).")),
    "patient_model": (Optional[str], typer.Option(None, "--patient-model", help="Patient-AI model (alias of --role patient=REF).")),
    "grader_model": (Optional[str], typer.Option(None, "--grader-model", help="Grader-AI model; also summarizes unless --summarizer-model.")),
    "summarizer_model": (Optional[str], typer.Option(None, "--summarizer-model", help="Model that turns the patient's statements into a summary (default: the grader).")),
    "formats": (Optional[str], typer.Option(None, "--formats", help="Comma list of vignette,multiturn,singleturn,summarized.")),
    "mcq": (Optional[bool], typer.Option(None, "--mcq/--no-mcq", help="Ask 4-choice MCQ (default from config: yes).")),
    "frq": (Optional[bool], typer.Option(None, "--frq/--no-frq", help="Ask free-response questions graded by the grader-AI (default: yes).")),
    "trials": (Optional[int], typer.Option(None, "--trials", help="Trials per case (paper: 5; >= 1).")),
    "specialty": (Optional[str], typer.Option(None, "--specialty", help="Only cases of this specialty (the CSV's category column).")),
    "max_turns": (Optional[int], typer.Option(None, "--max-turns", help="Turn cap: doctor turns per conversation (>= 1).")),
    "name": (Optional[str], typer.Option(None, "--name", help="Run name shown by `compare` (default: the clinical model alias).")),
}


def _craftmd_study():
    from experiments.craftmd.run import CraftmdStudy

    return CraftmdStudy()


def _meld_study():
    from experiments.craftmd.meld import MeldStudy

    return MeldStudy()


run_craftmd = study_command(_craftmd_study, options=CRAFTMD_OPTIONS, to_overrides=_craftmd_overrides, help="""CRAFT-MD: simulated doctor–patient conversations, summaries, MCQ/FRQ in 4 formats, two-step grading, N trials.

    One record per (case, trial), id CASE/tK. Writes records.jsonl, metrics.json, summary.md in --out.
    Exit 0 done, 2 bad input, 3 some cases failed (run the same command again to retry them).
    """)


def import_craftmd(
    src: str = typer.Argument(..., help="Folder of the CRAFT-MD authors' per-case result JSON files, or a registered name (craftmd-published-gpt3_1106, ...)."),
    name: str = typer.Option(..., "--name", help="Run name, e.g. gpt-4 (shown by `compare`)."),
    out: Path = typer.Option(..., "--out", help="Results directory to write."),
    cases: Optional[str] = typer.Option(None, "--cases", help="Case CSV (or craftmd-cases) to take MCQ choices and specialties from (by case_id) when the files lack them."),
) -> None:
    """Import published CRAFT-MD per-case results as a results directory (same record shape as a local run).

    MCQ free-text answers are mapped to choices by one rule for every model: exact choice text,
    letter, stated ("the diagnosis is X"), unique contained choice text, first-mentioned choice
    (unless hedged with "or"), the one choice equal up to spelling slips, else unparsed (= wrong, listed).
    FRQ uses the published grades (-1 = wrong); the run records grades: published, concurrent rule: any.
    """
    from experiments.core.commands import resolve_data
    from experiments.craftmd.importer import import_folder

    metrics = import_folder(Path(resolve_data(src)), name, out, resolve_data(cases))
    _print((Path(out) / "summary.md").read_text())
    _log(f"imported {metrics['records']} records into {out}")


def compare_cmd(
    results: List[Path] = typer.Argument(..., help="Results directories (local runs and/or imported ones)."),
    out: Path = typer.Option(Path("compare-out"), "--out", help="Where to write summary.md, compare.json, accuracy.png."),
) -> None:
    """Accuracy per format × MCQ/FRQ × run with 95% bootstrap CIs, paired bootstrap + Holm, McNemar, per specialty, bar chart."""
    from experiments.craftmd.compare import run_compare

    result = run_compare([str(p) for p in results], out)
    _print((out / "summary.md").read_text())
    for w in result.get("warnings") or []:
        _log(f"[yellow]warning:[/yellow] {w}")
    _log(f"wrote {out}/summary.md, compare.json, accuracy.png")


meld_cmd = study_command(_meld_study, options={
    "threshold": (Optional[float], typer.Option(None, "--threshold", help="Similarity treated as memorized (default 0.95).")),
}, help="MELD contamination check: first half of each vignette -> model writes the second half; similarity = 1 − normalized Levenshtein.")


def register(app, run_app, score_app, import_app, data_app, finetune_app) -> None:
    run_app.command("craftmd")(run_craftmd)
    import_app.command("craftmd")(import_craftmd)
    app.command("compare")(compare_cmd)
    app.command("meld")(meld_cmd)
