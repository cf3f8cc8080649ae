"""`medstack run|score|data` commands for MediTOD (user docs: experiments/meditod/README.md).

- ``medstack run meditod-nlu|meditod-pol|meditod-nlg --data dialogs.json [...]``
- ``medstack score meditod-nlu|meditod-pol|meditod-nlg --data dialogs.json --pred PRED.jsonl [--json]``
- ``medstack data meditod --data dialogs.json [--splits-dir DIR] [--png FILE]``
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Optional

import typer

from experiments.config import config_dir, load_settings
from models.errors import MedstackError

CONFIGS = config_dir(__file__)


def _run_command(task: str):
    def command(
        data: Path = typer.Option(..., "--data", help="MediTOD dialogs.json."),
        splits_dir: Optional[Path] = typer.Option(None, "--splits-dir", help="Folder with <split>_ids.json (default: the folder of --data)."),
        split: Optional[str] = typer.Option(None, "--split", help="Split to evaluate: test (default), valid, or any <name>_ids.json, e.g. an out-of-domain set."),
        mode: Optional[str] = typer.Option(None, "--mode", help="icl (retrieved in-context exemplars) or supervised (short prompt, optionally a LoRA adapter)."),
        k: Optional[int] = typer.Option(None, "--k", help="In-context exemplars per test sample (paper: 5)."),
        encoder: Optional[str] = typer.Option(None, "--encoder", help="Local sentence-transformers dir for retrieval and BERTScore (default: all-MiniLM-L6-v2)."),
        model: Optional[str] = typer.Option(None, "--model", "-m", help="Model alias, or ALIAS@URL for a running server."),
        lora: Optional[Path] = typer.Option(None, "--lora", help="Supervised mode: LoRA adapter dir, served under --lora-name."),
        lora_name: Optional[str] = typer.Option(None, "--lora-name", help="Served name of the adapter (default meditod-lora)."),
        limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N samples of the split."),
        max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Generation cap per sample (config default)."),
        adjudicate_model: Optional[str] = typer.Option(None, "--adjudicate-model", help="Also score with LLM adjudication of non-canonical values by this model (alias or ALIAS@URL)."),
        compare: Optional[Path] = typer.Option(None, "--compare", help="Results dir of the other mode to put side by side in summary.md."),
        out: Optional[Path] = typer.Option(None, "--out", help=f"Results dir (default runs/meditod/{task}-<mode>); re-running resumes."),
        config: Optional[Path] = typer.Option(None, "--config", help=f"YAML settings (default configs/{task}_<mode>.yaml)."),
        concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Parallel requests."),
        no_bertscore: bool = typer.Option(False, "--no-bertscore", help="NLG: skip BERTScore."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Bypass the response cache."),
        allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-local endpoint."),
    ) -> None:
        from experiments.meditod.run import MeditodSettings, run

        m = mode or "icl"
        if m not in ("icl", "supervised"):
            raise MedstackError(f"--mode must be icl or supervised, got {m!r}")
        cfg = config or CONFIGS / f"{task}_{m}.yaml"
        overrides = {
            "task": task, "data": str(data), "splits_dir": str(splits_dir) if splits_dir else None, "split": split, "mode": mode,
            "k": k, "encoder": encoder, "lora": str(lora) if lora else None, "lora_name": lora_name, "limit": limit,
            "max_tokens": max_tokens, "adjudicate_model": adjudicate_model, "compare": str(compare) if compare else None,
            "concurrency": concurrency, "roles": {"default": model} if model else None,
            "bertscore": False if no_bertscore else None, "use_cache": False if no_cache else None,
            "allow_remote": True if allow_remote else None,
        }
        s = load_settings(MeditodSettings, cfg, overrides)
        s.out = str(out) if out else (s.out or f"runs/meditod/{task}-{s.mode}")
        result = asyncio.run(run(s, log=lambda msg: typer.echo(msg, err=True)))
        typer.echo((Path(s.out) / "summary.md").read_text())
        typer.echo(f"results: {s.out}  (format errors {result.get('format_errors', 0)}, request errors {result.get('request_errors', 0)})")

    command.__doc__ = {
        "nlu": "MediTOD NLU: history + last exchange -> the patient turn's intents/slots (JSON); P/R/F1, joint accuracy.",
        "pol": "MediTOD POL: history + dialogue state -> the doctor's next actions (JSON); P/R/F1, Precision@K.",
        "nlg": "MediTOD NLG: history + doctor actions -> the doctor's utterance; BLEU-2/4, ROUGE-1/L, BERTScore.",
    }[task]
    return command


def _score_command(task: str):
    def command(
        data: Path = typer.Option(..., "--data", help="MediTOD dialogs.json holding the gold labels."),
        pred: Path = typer.Option(..., "--pred", help='JSONL, one {"dialog_id": "115", "uttr_id": 3, "prediction": ...} per line.'),
        as_json: bool = typer.Option(False, "--json", help="Print the metrics as one JSON object."),
        encoder: Optional[str] = typer.Option(None, "--encoder", help="NLG: local encoder for BERTScore."),
        no_bertscore: bool = typer.Option(False, "--no-bertscore", help="NLG: skip BERTScore."),
    ) -> None:
        from experiments.meditod.metrics import score
        from experiments.meditod.run import ROWS, metrics_table
        from experiments.meditod.scoring import align_predictions

        golds, preds, dids = align_predictions(task, data, pred)
        m = score(task, golds, preds, dialog_ids=dids, encoder=encoder, bertscore=not no_bertscore)
        if as_json:
            typer.echo(json.dumps(m))
            return
        typer.echo(metrics_table(task, [(pred.name, m)]))
        extra = {k: v for k, v in m.items() if k not in dict(ROWS[task])}
        typer.echo(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items()))

    command.__doc__ = f"Score {task.upper()} predictions made elsewhere with the MediTOD scorer (same numbers as our runs)."
    return command


def data_command(
    data: Path = typer.Option(..., "--data", help="MediTOD dialogs.json."),
    splits_dir: Optional[Path] = typer.Option(None, "--splits-dir", help="Folder with <split>_ids.json (default: the folder of --data)."),
    png: Optional[Path] = typer.Option(None, "--png", help="Also write the slot/intent/action distributions as a PNG chart."),
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON."),
) -> None:
    """MediTOD data set view: split sizes, utterances, intent / slot / action distributions."""
    from experiments.meditod.view import dataset_stats, print_stats, write_png

    stats = dataset_stats(data, splits_dir)
    if png:
        write_png(stats, png)
        typer.echo(f"chart: {png}", err=True)
    if as_json:
        typer.echo(json.dumps(stats, indent=2))
    else:
        print_stats(stats)


def register(app, run_app, score_app, import_app, data_app, finetune_app) -> None:  # noqa: ARG001
    for task in ("nlu", "pol", "nlg"):
        run_app.command(f"meditod-{task}")(_run_command(task))
        score_app.command(f"meditod-{task}")(_score_command(task))
    data_app.command("meditod")(data_command)

