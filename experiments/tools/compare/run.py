"""`medstack compare RUN... --out DIR`: runs side by side, for any study (docs/protocols.md, Runs;
experiments/tools/compare/README.md: what DIR holds). Each run is read by the one reader (``registry.open_run``).
"""

from __future__ import annotations

from pathlib import Path

from experiments.common.grade import grades
from experiments.common.markdown import md_table, num
from experiments.common.stats import mean_ci
from experiments.core.registry import open_run, results_of
from experiments.core.results import Run, make_results_dir, strict_json, write_private
from models.errors import MedstackError


def run_label(run: Run) -> str:
    cfg = run.config
    return str(cfg.get("name") or "/".join(run.path.parts[-2:]))


def score_rows(run: Run) -> list[dict]:
    """One row per score name (and named value) of the run's finished records: mean [95% CI], n, unscored."""
    values: dict[str, list[float]] = {}
    unscored: dict[str, int] = {}
    for r in run.finished:
        for name, g in grades(r).items():
            named = g.value.items() if isinstance(g.value, dict) else [(None, g.value)]
            for key, v in named:
                full = name + (f"[{key}]" if key is not None else "")
                values.setdefault(full, [])
                unscored.setdefault(full, 0)
                if g.skipped or v is None:
                    unscored[full] += 1
                else:
                    values[full].append(float(v))
    cis = {name: mean_ci(v) if v else None for name, v in values.items()}  # an empty score: no mean, never NaN
    return [{"score": name, "mean": ci and ci.mean, "ci_low": ci and ci.low, "ci_high": ci and ci.high, "n": len(values[name]),
             "unscored": unscored[name]} for name, ci in sorted(cis.items())]


def scores_markdown(table: list[dict]) -> str:
    lines = ["## Typed scores", "",
             "Per run and score: the mean of the scored values [95% percentile-bootstrap CI], n scored, and the grades left unscored "
             "(unreadable, skipped).", "", *md_table(["run", "experiment", "score", "mean [95% CI]", "n", "unscored"], [
                 [run["run"], run["experiment"] or "?", row["score"], num(row["mean"]) + (f" [{num(row['ci_low'])}, {num(row['ci_high'])}]" if row["mean"] is not None else ""),
                  row["n"], row["unscored"]]
                 for run in table for row in run["scores"] or [{"score": "(no typed scores)", "mean": None, "n": 0, "unscored": 0}]])]
    return "\n".join(lines) + "\n"


def run_compare(paths: list[str], out: str | Path) -> dict:
    """The study's comparison where all runs share one study that declares it, then the typed scores of every run;
    returns {"study": its result or None, "experiment", "scores": [...], "warnings"}."""
    if not paths:
        raise MedstackError("give at least one results directory")
    runs = [open_run(p) for p in paths]
    kinds = {(d.experiment if (d := results_of(r)) else r.experiment) for r in runs}
    declared = results_of(runs[0]) if len(kinds) == 1 else None
    out = make_results_dir(out)
    study = None
    head = ""
    if declared is not None and declared.compare is not None:
        study = declared.compare([str(p) for p in paths], out)
        head = (out / "summary.md").read_text(encoding="utf-8") if (out / "summary.md").exists() else ""
    table = [{"run": run_label(r), "path": str(r.path), "experiment": r.experiment, "scores": score_rows(r)} for r in runs]
    warnings = list((study or {}).get("warnings") or []) if isinstance(study, dict) else []
    if len(kinds) > 1:
        warnings.append(f"runs of different kinds ({', '.join(sorted(k or '?' for k in kinds))}): only their typed scores are compared")
    write_private(out / "scores.json", strict_json(table, indent=1))
    write_private(out / "summary.md", (head.rstrip("\n") + "\n\n" if head else "# Comparison\n\n") + scores_markdown(table))
    return {"study": study, "experiment": next(iter(kinds)) if len(kinds) == 1 else None, "scores": table, "warnings": warnings}
