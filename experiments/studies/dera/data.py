"""Input data: encounters (our JSONL or MediTOD ``dialogs.json``) and MedQA open-ended JSONL (the formats and case ids:
experiments/studies/dera/README.md, Inputs).
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.core.results import iter_jsonl
from models.errors import DataError

ENCOUNTER_FIELDS = ("id", "age", "sex", "chief_complaint", "chat")
NOT_STATED = "not stated"


def _check_chat(chat, where: str) -> list[dict]:
    if not isinstance(chat, list) or not chat:
        raise DataError(f"{where}: 'chat' must be a non-empty list of {{speaker, text}} turns")
    out = []
    for i, turn in enumerate(chat):
        if not isinstance(turn, dict) or not str(turn.get("text", "")).strip() or not turn.get("speaker"):
            raise DataError(f"{where}: chat turn {i} needs a non-empty 'speaker' and 'text'")
        out.append({"speaker": str(turn["speaker"]), "text": str(turn["text"]).strip()})
    return out


def load_encounters(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file")
    if p.suffix == ".json":
        return _load_meditod(p)
    rows = []
    for lineno, row in iter_jsonl(p):
        where = f"{p}:{lineno}"
        missing = [k for k in ENCOUNTER_FIELDS if k not in row or row[k] in (None, "")]
        if missing:
            raise DataError(f"{where}: encounter {row.get('id', '?')!r} lacks {', '.join(missing)}")
        rows.append({**row, "id": str(row["id"]), "chat": _check_chat(row["chat"], f"{where} (id {row['id']})")})
    _check_unique(rows, p)
    return rows


def _load_meditod(p: Path) -> list[dict]:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise DataError(f"{p}: expected MediTOD dialogs.json (an object of dialogue id -> {{utterances}})")
    rows = []
    for did, dialog in data.items():
        utts = dialog.get("utterances") if isinstance(dialog, dict) else None
        chat = _check_chat(utts, f"{p} (dialogue {did})")
        rows.append({"id": str(did), "age": NOT_STATED, "sex": NOT_STATED, "chief_complaint": NOT_STATED, "chat": chat, "source": "meditod"})
    return rows


def _check_unique(rows: list[dict], p: Path) -> None:
    seen = set()
    for r in rows:
        if r["id"] in seen:
            raise DataError(f"{p}: duplicate id {r['id']!r}")
        seen.add(r["id"])


def format_chat(chat: list[dict]) -> str:
    return "\n".join(f"{t['speaker'].capitalize()}: {t['text']}" for t in chat)


def resolve_qa_path(path: str | Path, split: str | None) -> Path:
    """``--data`` may be a file or a folder holding ``<split>.jsonl``."""
    p = Path(path)
    if p.is_dir():
        f = p / f"{split or 'test'}.jsonl"
        if not f.exists():
            raise DataError(f"{p}: no {f.name} in this folder")
        return f
    if not p.exists():
        raise DataError(f"{p}: no such file")
    return p


def load_medqa(path: str | Path, *, mcq: bool) -> list[dict]:
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file")
    rows = []
    for lineno, row in iter_jsonl(p):
        where = f"{p}:{lineno}"
        need = ["question_open", "answer"] + (["options", "answer_idx"] if mcq else [])
        missing = [k for k in need if not row.get(k)]
        if missing:
            raise DataError(f"{where}: question lacks {', '.join(missing)}")
        if mcq and (not isinstance(row["options"], dict) or row["answer_idx"] not in row["options"]):
            raise DataError(f"{where}: 'options' must map letters to text and contain answer_idx {row.get('answer_idx')!r}")
        rows.append({**row, "id": str(row.get("id") or f"{p.stem}-{lineno:05d}")})
    _check_unique(rows, p)
    return rows


def format_options(options: dict | None) -> str:
    return "  ".join(f"{k}) {v}" for k, v in (options or {}).items())
