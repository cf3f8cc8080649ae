"""Finding and reading results directories for the report, whatever study wrote them (experiments/tools/report/README.md).
Unreadable files become warnings shown in the report (naming file and line), so one broken run does not hide the others.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from experiments.core.registry import open_run
from models.errors import MedstackError

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


def full_record(run: dict, index: int) -> dict:
    """Record ``index`` of a run from :func:`load_run_dir` read again whole, call log included (for the cases the
    report renders): the one reader's :meth:`Run.full_record`, with the record as upgraded to today's shape on top."""
    return {**run["run"].full_record(index), **run["records"][index]}


def load_run_dir(p: Path) -> dict:
    """Everything the report shows about one run; missing parts are None / empty. The records, config, metrics and
    identity come from the one reader (``registry.open_run``, lenient: what cannot be read becomes a warning)."""
    run = open_run(p, lenient=True)
    warnings = list(run.warnings)
    bench = _read_json(p / "bench.json", warnings)
    charts = []
    for png in sorted(p.glob("*.png")):
        charts.append({"name": png.name, "data": base64.b64encode(png.read_bytes()).decode("ascii")})
    summary = (p / "summary.md").read_text(encoding="utf-8", errors="replace") if (p / "summary.md").exists() else ""
    if not summary and (p / "bench.md").exists():
        summary = (p / "bench.md").read_text(encoding="utf-8", errors="replace")
    return {
        "path": str(p),
        "run": run,
        "experiment": run.experiment,
        "finetune": _finetune(p, warnings),
        "records": run.records,  # without call logs; full_record() reads one whole
        "record_offsets": run.offsets,
        "config": run.config,
        "config_text": run.config_text,
        "metrics": run.metrics,
        "identity": run.identity,
        "bench": bench,
        "summary": summary,
        "charts": charts,
        "review_calibrations": [c for f in sorted((p / "reviews").glob("calibration-*.json")) if isinstance(c := _read_json(f, warnings), dict)],
        "warnings": warnings,
    }
