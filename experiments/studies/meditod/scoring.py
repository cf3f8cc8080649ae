"""Aligning predictions made elsewhere with the gold labels of ``dialogs.json`` (for `medstack score`)."""

from __future__ import annotations

from pathlib import Path

from experiments.studies.meditod.data import load_dialogs
from experiments.studies.meditod.tasks import gold_turns
from experiments.common.parsing import extract_json
from experiments.core.results import read_jsonl
from models.errors import DataError


def _as_structured(value):
    """A prediction for NLU/POL: a list as is; an object wrapped; a string parsed as model output; else None."""
    if isinstance(value, str):
        value = extract_json(value)
    if isinstance(value, dict):
        value = [value]
    return value if isinstance(value, list) else None


def align_predictions(task: str, data: str | Path, pred: str | Path) -> tuple[list, list, list[str]]:
    """(golds, predictions, dialog ids) in dialogue / turn order, for the turns that have a prediction.

    Each line of ``pred``: ``{"dialog_id": "115", "uttr_id": 3, "prediction": ...}``. Unknown turns,
    duplicates and missing keys raise DataError naming the file and line.
    """
    dialogs = load_dialogs(data)
    pred = Path(pred)
    if not pred.exists():
        raise DataError(f"{pred}: file does not exist")
    samples = gold_turns(dialogs, list(dialogs), task)
    order = {(s["dialog_id"], s["uttr_id"]): i for i, s in enumerate(samples)}
    found: dict[int, object] = {}
    for lineno, row in enumerate(read_jsonl(pred), 1):
        if not isinstance(row, dict) or "dialog_id" not in row or "uttr_id" not in row or "prediction" not in row:
            raise DataError(f"{pred}:{lineno}: expected an object with dialog_id, uttr_id and prediction")
        key = (str(row["dialog_id"]), row["uttr_id"])
        if key not in order:
            raise DataError(f"{pred}:{lineno}: dialogue {key[0]!r} utterance {key[1]!r} is not a {task.upper()} turn of {data}")
        i = order[key]
        if i in found:
            raise DataError(f"{pred}:{lineno}: second prediction for dialogue {key[0]!r} utterance {key[1]!r}")
        p = row["prediction"]
        if task == "nlg":
            found[i] = p if isinstance(p, str) else ""
        else:
            found[i] = _as_structured(p)
    if not found:
        raise DataError(f"{pred}: no predictions")
    idx = sorted(found)
    return [samples[i]["target"] for i in idx], [found[i] for i in idx], [samples[i]["dialog_id"] for i in idx]
