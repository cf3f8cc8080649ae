"""`medstack compare RUN... --out DIR`: runs side by side, for any study (docs/protocols.md, Runs;
experiments/tools/compare/README.md: what DIR holds). Each run is read by the one reader (``registry.open_run``).
"""

from __future__ import annotations

from pathlib import Path

from experiments.core.registry import open_run, study_of
from experiments.core.results import Run, claim_dir, strict_json, write_private
from experiments.core.scorers import figures, scores_markdown
from models.errors import MedstackError


def run_label(run: Run) -> str:
    cfg = run.config
    return str(cfg.get("name") or "/".join(run.path.parts[-2:]))


def run_figures(run: Run, study=None) -> list[dict]:
    """Every score's figures of a run, through its study's scorers: the same numbers its summary.md shows."""
    return [f.json() for f in figures(run.finished, study.scorers if study is not None else ())]


def run_compare(paths: list[str], out: str | Path) -> dict:
    """The study's comparison where all runs share one study that declares it, then the typed scores of every run;
    returns {"study": its result or None, "experiment", "scores": [...], "warnings"}."""
    if not paths:
        raise MedstackError("give at least one results directory")
    runs = [open_run(p) for p in paths]
    studies = [study_of(r) for r in runs]
    kinds = {(st.name if st else r.experiment) for st, r in zip(studies, runs)}
    study = studies[0] if len(kinds) == 1 else None
    out = claim_dir(out, "compare", {"runs": [str(p) for p in paths]})
    own = None
    head = ""
    if study is not None:
        own = study.compare([str(p) for p in paths], out)
        head = (out / "summary.md").read_text(encoding="utf-8") if own is not None and (out / "summary.md").exists() else ""
    table = [{"run": run_label(r), "path": str(r.path), "experiment": r.experiment, "scores": run_figures(r, st)} for r, st in zip(runs, studies)]
    warnings = list((own or {}).get("warnings") or []) if isinstance(own, dict) else []
    if len(kinds) > 1:
        warnings.append(f"runs of different kinds ({', '.join(sorted(k or '?' for k in kinds))}): only their typed scores are compared")
    scorers = tuple(s for st in {type(x): x for x in studies if x is not None}.values() for s in st.scorers)
    write_private(out / "scores.json", strict_json(table, indent=1))
    write_private(out / "summary.md", (head.rstrip("\n") + "\n\n" if head else "# Comparison\n\n")
                  + scores_markdown([], scorers, [(t["run"], t["scores"]) for t in table]))
    return {"study": own, "experiment": next(iter(kinds)) if len(kinds) == 1 else None, "scores": table, "warnings": warnings}
