"""`medstack compare RUN... --out DIR`: runs side by side, for any study (docs/protocols.md, Runs;
experiments/tools/compare/README.md: what DIR holds). Each run is read by the one reader (``registry.open_run``).
"""

from __future__ import annotations

from pathlib import Path

import itertools

from experiments.common.grade import unit_values
from experiments.common.markdown import md_table, num
from experiments.common.stats import MIN_SHARED_CASES, holm, paired_over_shared
from experiments.core.conditions import EFFECT_COLUMNS, EFFECT_NOTE, effect_rows, relative_effects, settings_columns
from experiments.core.registry import open_run, study_of
from experiments.core.results import Run, claim_dir, strict_json, write_private
from experiments.core.scorers import figures, find, readable, scores_markdown
from models.errors import MedstackError


def run_label(run: Run) -> str:
    cfg = run.config
    return str(cfg.get("name") or "/".join(run.path.parts[-2:]))


def unique_labels(runs: list[Run]) -> list[str]:
    """Each run's label; runs that share one get their folder's name added."""
    labels = [run_label(r) for r in runs]
    return [lbl if labels.count(lbl) == 1 else f"{lbl} ({r.path.name})" for lbl, r in zip(labels, runs)]


def paired_tests(runs: list[tuple[str, list[dict]]], scorers, names: list[str]) -> list[dict]:
    """Every pair of runs on every score both carry (each a scorer's mean figure; a ratio metric is left out), tested
    only over the cases both hold, paired by case (the unit its scorer declares): ``stats.paired_over_shared``, no
    p-value below ``MIN_SHARED_CASES`` shared cases; Holm over the p-values of the table."""
    tests = []
    for name in names:
        sc = find(scorers, name)
        if sc is not None and not any(m.numerator is None for m in sc.metrics):
            continue
        scale, unit = (sc.scale, sc.unit) if sc else (None, "case_id")
        values = [(label, unit_values(records, name, scale, unit)) for label, records in runs]
        for (la, va), (lb, vb) in itertools.combinations([(lbl, v) for lbl, v in values if v], 2):
            tests.append({"score": name, "label": readable(name, scorers), "a": la, "b": lb, **paired_over_shared(va, vb)})
    idx = [i for i, t in enumerate(tests) if t["p"] is not None]
    for t in tests:
        t["p_holm"] = None
    for i, p in zip(idx, holm([tests[i]["p"] for i in idx])):
        tests[i]["p_holm"] = p
    return tests


PAIRED_NOTE = (f"Each difference over the cases both runs hold, paired by case (a case's mean grade); [95% CI] from 10,000 "
               f"resamples of the shared cases (fixed seed); p: paired bootstrap, two-sided, Holm over this table. No p-value "
               f"below {MIN_SHARED_CASES} shared cases; runs over different cases are not compared beyond those they share.")


def paired_markdown(tests: list[dict]) -> list[str]:
    if not tests:
        return []
    rows = [[t["label"], t["a"], t["b"], f"{t['n_shared']} (only in a: {t['only_a']}; only in b: {t['only_b']})",
             "–" if t["mean_diff"] is None else f"{num(t['mean_diff'])} [{num(t['diff_ci'][0])}, {num(t['diff_ci'][1])}]",
             f"– (fewer than {MIN_SHARED_CASES} shared cases)" if t["too_few"] else num(t["p"], 4),
             "–" if t["p_holm"] is None else num(t["p_holm"], 4)] for t in tests]
    return ["## Paired differences (shared cases only)", "", PAIRED_NOTE, "",
            *md_table(["score", "a", "b", "shared cases", "a − b [95% CI]", "p", "p (Holm)"], rows), ""]


def run_figures(run: Run, study=None) -> list[dict]:
    """Every score's figures of a run, through its study's scorers: the same numbers its summary.md shows."""
    return [f.json() for f in figures(run.finished, study.scorers if study is not None else ())]


def run_compare(paths: list[str], out: str | Path) -> dict:
    """The study's comparison where all runs share one study that declares it, then the runs and the settings that
    tell them apart, the study's effects relative to a baseline run, the typed scores of every run and the paired
    differences over shared cases (experiments/tools/compare/README.md); returns {"study": its result or None,
    "experiment", "scores": [...], "effects", "paired", "warnings"}."""
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
    labels = unique_labels(runs)
    settings_cls = study.settings_cls if study is not None else None
    keys, values = settings_columns([r.config for r in runs], settings_cls)
    table = [{"run": lbl, "path": str(r.path), "experiment": r.experiment, "cases": len({str(x["case_id"] if x.get("case_id") is not None else x.get("id")) for x in r.finished}),
              "settings": dict(zip(keys, v)), "scores": run_figures(r, st)} for lbl, r, st, v in zip(labels, runs, studies, values)]
    warnings = list((own or {}).get("warnings") or []) if isinstance(own, dict) else []
    if len(kinds) > 1:
        warnings.append(f"runs of different kinds ({', '.join(sorted(k or '?' for k in kinds))}): only their typed scores are compared")
    scorers = tuple(s for st in {type(x): x for x in studies if x is not None}.values() for s in st.scorers)
    effects = relative_effects([(lbl, r.config, r.finished) for lbl, r in zip(labels, runs)], settings_cls, study.effects, scorers) \
        if study is not None and study.effects else []
    names = list(dict.fromkeys(f["score"] for t in table for f in t["scores"]))
    # the study's own comparison tests its own differences: not tested twice
    tests = paired_tests([(lbl, r.finished) for lbl, r in zip(labels, runs)], scorers, names) if len(runs) > 1 and own is None else []
    write_private(out / "scores.json", strict_json(table, indent=1))
    write_private(out / "paired.json", strict_json({"effects": effects, "paired": tests}, indent=1))
    runs_md = ["## Runs", "", *md_table(["run", "cases", *keys, "path"], [[t["run"], t["cases"], *v, t["path"]] for t, v in zip(table, values)]), ""]
    effects_md = ["## Relative to the baseline run", "", EFFECT_NOTE, "", *md_table(EFFECT_COLUMNS, effect_rows(effects)), ""] if effects else []
    write_private(out / "summary.md", (head.rstrip("\n") + "\n\n" if head else "# Comparison\n\n") + "\n".join(runs_md + effects_md)
                  + "\n" + scores_markdown([], scorers, [(t["run"], t["scores"]) for t in table]) + "\n" + "\n".join(paired_markdown(tests)))
    return {"study": own, "experiment": next(iter(kinds)) if len(kinds) == 1 else None, "scores": table, "effects": effects,
            "paired": tests, "warnings": warnings}
