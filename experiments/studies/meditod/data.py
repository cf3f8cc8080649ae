"""MediTOD data: load and validate ``dialogs.json`` and the split id files (experiments/studies/meditod/README.md, Data and
Python interface: a stable interface the LoRA fine-tuning code builds on).

Any problem raises :class:`models.errors.DataError` naming the file and the dialogue / utterance id (or the JSON line
and column). Every utterance has ``speaker`` (doctor | patient), ``uttr_id`` and ``text``; patient turns carry ``nlu``
(list of ``{intent, slots}``) and ``dialog_state`` (dict); doctor turns carry ``actions``.
"""

from __future__ import annotations

import json
from pathlib import Path

from models.errors import DataError

SPEAKERS = ("doctor", "patient")


def _read_json(path: Path):
    if not path.exists():
        raise DataError(f"{path}: file does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e})") from None


def _check_utterance(path: Path, did: str, idx: int, u) -> None:
    where = f"{path}: dialogue {did!r}, utterance #{idx}"
    if not isinstance(u, dict):
        raise DataError(f"{where}: expected an object, got {type(u).__name__}")
    uid = u.get("uttr_id")
    if isinstance(uid, bool) or not isinstance(uid, int):
        raise DataError(f"{where}: missing or non-integer 'uttr_id'")
    where = f"{path}: dialogue {did!r}, utterance {uid}"
    speaker = u.get("speaker")
    if speaker not in SPEAKERS:
        raise DataError(f"{where}: unknown speaker {speaker!r} (expected doctor or patient)")
    if not isinstance(u.get("text"), str):
        raise DataError(f"{where}: missing or non-string 'text'")
    if speaker == "patient":
        nlu = u.get("nlu", [])
        if not isinstance(nlu, list) or not all(isinstance(e, dict) and isinstance(e.get("intent"), str) for e in nlu):
            raise DataError(f"{where}: 'nlu' must be a list of objects with an 'intent'")
        for e in nlu:
            if not isinstance(e.get("slots", {}), dict):
                raise DataError(f"{where}: 'slots' of intent {e['intent']!r} must be an object")
        if not isinstance(u.get("dialog_state", {}), dict):
            raise DataError(f"{where}: 'dialog_state' must be an object")
    else:
        acts = u.get("actions", [])
        if not isinstance(acts, list) or not all(isinstance(a, dict) and isinstance(a.get("action"), str) for a in acts):
            raise DataError(f"{where}: 'actions' must be a list of objects with an 'action'")


def load_dialogs(path: str | Path) -> dict:
    """Load and validate ``dialogs.json``; raise DataError naming file and dialogue/utterance id."""
    path = Path(path)
    data = _read_json(path)
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected an object mapping dialogue ids to dialogues, got {type(data).__name__}")
    for did, dlg in data.items():
        if not isinstance(dlg, dict):
            raise DataError(f"{path}: dialogue {did!r}: expected an object, got {type(dlg).__name__}")
        utts = dlg.get("utterances")
        if not isinstance(utts, list):
            raise DataError(f"{path}: dialogue {did!r}: missing 'utterances' list")
        seen: set[int] = set()
        for idx, u in enumerate(utts):
            _check_utterance(path, did, idx, u)
            if u["uttr_id"] in seen:
                raise DataError(f"{path}: dialogue {did!r}, utterance {u['uttr_id']}: duplicate uttr_id")
            seen.add(u["uttr_id"])
    return data


def split_path(splits_dir: str | Path, split: str) -> Path:
    return Path(splits_dir) / f"{split}_ids.json"


def load_split_ids(splits_dir: str | Path, split: str, *, dialogs: dict | None = None) -> list[str]:
    """Dialogue ids of ``split`` from ``<splits_dir>/<split>_ids.json`` (as strings)."""
    path = split_path(splits_dir, split)
    ids = _read_json(path)
    if not isinstance(ids, list) or not all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in ids):
        raise DataError(f"{path}: expected a JSON list of dialogue ids")
    ids = [str(x) for x in ids]
    if dialogs is not None:
        missing = [x for x in ids if x not in dialogs]
        if missing:
            raise DataError(f"{path}: dialogue id {missing[0]!r} is not in the data" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return ids

