"""`medstack score meditod-<task>` and `medstack data meditod` for MediTOD, declared in __init__.py (user docs:
experiments/studies/meditod/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from experiments.core.commands import resolve_data
from experiments.studies.meditod.settings import BERTSCORE_ENCODER_HELP, BERTSCORE_LAYER_HELP


def _score_command(task: str):
    def command(
        data: str = typer.Option(..., "--data", help="MediTOD dialogs.json holding the gold labels, or a registered data set name (meditod-sample)."),
        pred: Path = typer.Option(..., "--pred", help='JSONL, one {"dialog_id": "115", "uttr_id": 3, "prediction": ...} per line.'),
        as_json: bool = typer.Option(False, "--json", help="Print the metrics as one JSON object."),
        encoder: Optional[str] = typer.Option(None, "--bertscore-encoder", help=BERTSCORE_ENCODER_HELP),
        layer: Optional[int] = typer.Option(None, "--bertscore-layer", min=1, help=BERTSCORE_LAYER_HELP),
        no_bertscore: bool = typer.Option(False, "--no-bertscore", help="NLG: skip BERTScore."),
    ) -> None:
        from experiments.studies.meditod.metrics import score
        from experiments.studies.meditod.study import ROWS, metrics_table
        from experiments.studies.meditod.scoring import align_predictions

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
    from experiments.studies.meditod.view import dataset_stats, print_stats, write_png

    stats = dataset_stats(Path(resolve_data(data)), splits_dir)
    if png:
        write_png(stats, png)
        typer.echo(f"chart: {png}", err=True)
    if as_json:
        typer.echo(json.dumps(stats, indent=2))
    else:
        print_stats(stats)


score_nlu, score_pol, score_nlg = (_score_command(task) for task in ("nlu", "pol", "nlg"))
