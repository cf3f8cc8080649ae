"""`medstack run|score|data` commands for MediTOD (user docs: experiments/meditod/README.md).

- ``medstack run meditod-nlu|meditod-pol|meditod-nlg --data dialogs.json [...]``
- ``medstack score meditod-nlu|meditod-pol|meditod-nlg --data dialogs.json --pred PRED.jsonl [--json]``
- ``medstack data meditod --data dialogs.json [--splits-dir DIR] [--png FILE]``
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from experiments.core.commands import resolve_data, study_command

RUN_HELP = {
    "nlu": "MediTOD NLU: dialog history + last turn -> the patient turn's intents/slots (JSON); P/R/F1, joint accuracy.",
    "pol": "MediTOD POL: dialog state + last turn -> the doctor's next actions (JSON); P/R/F1, Precision@K.",
    "nlg": "MediTOD NLG: doctor actions + last turn -> the doctor's utterance; BLEU-2/4, ROUGE-1/L, BERTScore.",
}

BERTSCORE_ENCODER_HELP = "NLG: local encoder dir for BERTScore (default: all-MiniLM-L6-v2; the MediTOD authors: roberta-large)."
BERTSCORE_LAYER_HELP = "NLG: encoder layer for BERTScore (default: bert_score's table for a known encoder, e.g. roberta-large 17; else the last)."

MEDITOD_OPTIONS = {
    "split": (Optional[str], typer.Option(None, "--split", help="Split to evaluate: test (default), valid, or any <name>_ids.json, e.g. an out-of-domain set.")),
    "splits_dir": (Optional[str], typer.Option(None, "--splits-dir", help="Folder with <split>_ids.json (default: the folder of --data).")),
    "mode": (Optional[str], typer.Option(None, "--mode", help="icl (chat messages: ontology, retrieved exemplars, test input) or supervised (the fine-tuning rendering + [answer]; --lora NAME=PATH serves an adapter).")),
    "k": (Optional[int], typer.Option(None, "--k", help="In-context exemplars per test turn (paper: 5; >= 0).")),
    "encoder": (Optional[str], typer.Option(None, "--encoder", help="Local sentence-transformers dir for in-context exemplar retrieval by last-turn text (default: all-MiniLM-L6-v2; the authors: bge-large-en-v1.5).")),
    "max_tokens": (Optional[int], typer.Option(None, "--max-tokens", help="Generation cap per turn (config default; >= 1).")),
    "adjudicate_model": (Optional[str], typer.Option(None, "--adjudicate-model", help="Also score with LLM adjudication of non-canonical values by this model (the grader role: ALIAS or ALIAS@URL).")),
    "compare": (Optional[str], typer.Option(None, "--compare", help="Results dir of the other mode to put side by side in summary.md.")),
    "no_bertscore": (bool, typer.Option(False, "--no-bertscore", help="NLG: skip BERTScore.")),
    "bertscore_encoder": (Optional[str], typer.Option(None, "--bertscore-encoder", help=BERTSCORE_ENCODER_HELP)),
    "bertscore_layer": (Optional[int], typer.Option(None, "--bertscore-layer", help=BERTSCORE_LAYER_HELP)),
}


def _meditod_overrides(task: str):
    def to_overrides(v: dict) -> dict:
        out = {k: val for k, val in v.items() if val is not None and k != "no_bertscore"}
        out["task"] = task
        if v.get("no_bertscore"):
            out["bertscore"] = False
        return out

    return to_overrides


def _study(task: str):
    def make():
        from experiments.meditod.run import MeditodStudy

        return MeditodStudy(task)

    return make


def _run_command(task: str):
    return study_command(_study(task), options=MEDITOD_OPTIONS, to_overrides=_meditod_overrides(task), help=RUN_HELP[task] + """

    One case per test turn (id DIALOG/UTTR). Default config: configs/<task>_<mode>.yaml; default --out runs/meditod/<task>-<mode>.
    Writes records.jsonl, metrics.json, summary.md; re-running resumes.
    Exit 0 done, 2 bad input, 3 some turns failed (run the same command again to retry them).
    """)


def _score_command(task: str):
    def command(
        data: str = typer.Option(..., "--data", help="MediTOD dialogs.json holding the gold labels, or a registered data set name (meditod-sample)."),
        pred: Path = typer.Option(..., "--pred", help='JSONL, one {"dialog_id": "115", "uttr_id": 3, "prediction": ...} per line.'),
        as_json: bool = typer.Option(False, "--json", help="Print the metrics as one JSON object."),
        encoder: Optional[str] = typer.Option(None, "--bertscore-encoder", help=BERTSCORE_ENCODER_HELP),
        layer: Optional[int] = typer.Option(None, "--bertscore-layer", min=1, help=BERTSCORE_LAYER_HELP),
        no_bertscore: bool = typer.Option(False, "--no-bertscore", help="NLG: skip BERTScore."),
    ) -> None:
        from experiments.meditod.metrics import score
        from experiments.meditod.run import ROWS, metrics_table
        from experiments.meditod.scoring import align_predictions

        golds, preds, dids = align_predictions(task, Path(resolve_data(data)), pred)
        m = score(task, golds, preds, dialog_ids=dids, bertscore_encoder=encoder, bertscore_layer=layer, bertscore=not no_bertscore)
        if as_json:
            typer.echo(json.dumps(m))
            return
        typer.echo(metrics_table(task, [(pred.name, m)]))
        extra = {k: v for k, v in m.items() if k not in dict(ROWS[task])}
        typer.echo(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items()))

    command.__doc__ = f"Score {task.upper()} predictions made elsewhere with the MediTOD scorer (same numbers as our runs)."
    return command


def data_command(
    data: str = typer.Option(..., "--data", help="MediTOD dialogs.json, or a registered data set name (meditod-sample)."),
    splits_dir: Optional[Path] = typer.Option(None, "--splits-dir", help="Folder with <split>_ids.json (default: the folder of --data)."),
    png: Optional[Path] = typer.Option(None, "--png", help="Also write the slot/intent/action distributions as a PNG chart."),
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON."),
) -> None:
    """MediTOD data set view: split sizes, utterances, intent / slot / action distributions."""
    from experiments.meditod.view import dataset_stats, print_stats, write_png

    stats = dataset_stats(Path(resolve_data(data)), splits_dir)
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

