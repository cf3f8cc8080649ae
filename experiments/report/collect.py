"""Finding and reading results directories for the report, whatever study wrote them.

A results directory is a folder holding ``records.jsonl``, ``metrics.json``,
``bench.json`` or ``train_metrics.json`` (a fine-tuning run). Unreadable files become warnings shown in the report (naming file and
line), so one broken run does not hide the others.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml

from models.errors import DataError, MedstackError
from experiments.core.results import CALL_LOG, iter_jsonl_at, slim, value_at

MARKERS = ("records.jsonl", "metrics.json", "bench.json", "train_metrics.json")


def is_run_dir(p: Path) -> bool:
    return p.is_dir() and any((p / m).exists() for m in MARKERS)


def find_runs(paths: list[str]) -> list[Path]:
    """Run folders given directly or found below the given folders (not below a run folder)."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise MedstackError(f"{p}: no such file or directory")
        if not p.is_dir():
            raise MedstackError(f"{p}: expected a results directory (a folder with records.jsonl / metrics.json / bench.json / train_metrics.json)")
        stack = [p]
        before = len(found)
        while stack:
            d = stack.pop()
            if is_run_dir(d):
                found.append(d)
                continue
            stack.extend(sorted((c for c in d.iterdir() if c.is_dir() and not c.name.startswith(".")), reverse=True))
        if len(found) == before:
            raise MedstackError(f"{p}: no results directories in it (none holds records.jsonl, metrics.json, bench.json or train_metrics.json)")
    unique = []
    for f in found:
        if f.resolve() not in {u.resolve() for u in unique}:
            unique.append(f)
    return unique


def _read_json(path: Path, warnings: list[str]):
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        warnings.append(f"{path}:{getattr(e, 'lineno', '?')}: not valid JSON ({getattr(e, 'msg', e)})")
        return None


def _finetune(p: Path, warnings: list[str]) -> dict | None:
    """A fine-tuning run (finetune/): train_metrics.json, recipe.yaml and the adapter's hash."""
    metrics = _read_json(p / "train_metrics.json", warnings)
    if metrics is None:
        return None
    adapter = p / "adapter"
    served_hash = None
    if any(adapter.glob("adapter_model.*")):
        from serving.session import adapter_hash  # the hash a served adapter carries in identity.json

        served_hash = adapter_hash(str(adapter))
    recipe = (p / "recipe.yaml").read_text(encoding="utf-8", errors="replace") if (p / "recipe.yaml").exists() else ""
    return {"metrics": metrics if isinstance(metrics, dict) else {}, "recipe": recipe, "adapter_hash": served_hash,
            "adapter": str(adapter) if adapter.exists() else None}


def _records(path: Path, warnings: list[str]) -> tuple[list[dict], list[int]]:
    """The last record per id (a case that failed and was run again has two lines) without its call log, and
    the byte offset of each one's line; one pass, so the call logs of a paper-scale run are never held together."""
    if not path.exists():
        return [], []
    latest: dict[str, tuple[int, dict]] = {}
    memo: dict = {}
    try:
        for i, (_, at, r) in enumerate(iter_jsonl_at(path, objects=False)):
            r = slim(r, CALL_LOG, memo) if isinstance(r, dict) else {"value": r}
            latest[str(r.get("id", i))] = (at, r)
    except DataError as e:
        warnings.append(str(e))
        return [], []
    return [r for _, r in latest.values()], [at for at, _ in latest.values()]


def full_record(run: dict, index: int) -> dict:
    """Record ``index`` of a run from :func:`load_run_dir` read again whole, call log included (for the cases the
    report renders); the record as loaded when its line has changed since."""
    rec = run["records"][index]
    whole = value_at(Path(run["path"]) / "records.jsonl", run["record_offsets"][index])
    if not isinstance(whole, dict) or whole.get("id") != rec.get("id"):
        return rec
    return whole


def load_run_dir(p: Path) -> dict:
    """Everything the report shows about one run; missing parts are None / empty."""
    warnings: list[str] = []
    records, offsets = _records(p / "records.jsonl", warnings)
    config_text = (p / "config.yaml").read_text(encoding="utf-8", errors="replace") if (p / "config.yaml").exists() else ""
    try:
        config = yaml.safe_load(config_text) or {} if config_text else {}
    except yaml.YAMLError as e:
        warnings.append(f"{p / 'config.yaml'}: not valid YAML ({e})")
        config = {}
    bench = _read_json(p / "bench.json", warnings)
    charts = []
    for png in sorted(p.glob("*.png")):
        charts.append({"name": png.name, "data": base64.b64encode(png.read_bytes()).decode("ascii")})
    summary = (p / "summary.md").read_text(encoding="utf-8", errors="replace") if (p / "summary.md").exists() else ""
    if not summary and (p / "bench.md").exists():
        summary = (p / "bench.md").read_text(encoding="utf-8", errors="replace")
    return {
        "path": str(p),
        "finetune": _finetune(p, warnings),
        "records": records,  # without call logs; full_record() reads one whole
        "record_offsets": offsets,
        "config": config if isinstance(config, dict) else {"value": config},
        "config_text": config_text,
        "metrics": _read_json(p / "metrics.json", warnings),
        "identity": _read_json(p / "identity.json", warnings),
        "bench": bench,
        "summary": summary,
        "charts": charts,
        "review_calibrations": [c for f in sorted((p / "reviews").glob("calibration-*.json")) if isinstance(c := _read_json(f, warnings), dict)],
        "warnings": warnings,
    }
