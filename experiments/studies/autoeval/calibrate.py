"""Rubric-judge rank agreement (docs/protocols.md, Auto-evaluation): ``medstack calibrate autoeval``: judge ratings
(a CSV, or an autoeval results directory) against reference ratings (CSV) on the same items (the measures:
experiments/studies/autoeval/README.md).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from experiments.common.grade import Grade, grades, score_name, split_name, to_disk
from experiments.common.markdown import md_table, num
from experiments.common.stats import kendall, spearman, weighted_kappa
from experiments.core.registry import open_run
from experiments.core.record import is_typed, record
from experiments.core.results import RunDir
from experiments.core.runlock import RunLock
from experiments.core.study import Study
from experiments.studies.autoeval.scorers import RATINGS_ONLY
from experiments.tables.plots import confusion_png
from models.errors import DataError, read_utf8


def _read_ratings_csv(path: Path) -> dict[tuple[str, str], int]:
    """CSV with columns id (or dialogue_id), [criterion], rating -> {(id, criterion): rating}."""
    with io.StringIO(read_utf8(path), newline="") as f:  # not UTF-8: one line naming the file, line and byte
        reader = csv.DictReader(f)
        cols = [c.strip().lower() for c in reader.fieldnames or []]
        idc = next((c for c in ("id", "dialogue_id", "item", "case_id") if c in cols), None)
        if idc is None or "rating" not in cols:
            raise DataError(f"{path}:1: expected columns id (or dialogue_id) and rating, optionally criterion; got {', '.join(cols)}")
        out = {}
        for row in reader:
            row = {k.strip().lower(): (v or "").strip() for k, v in row.items() if k}
            if not row.get("rating"):
                continue
            try:
                v = int(float(row["rating"]))
            except ValueError:
                raise DataError(f"{path}:{reader.line_num}: rating {row['rating']!r} is not a number") from None
            out[(row[idc], row.get("criterion", "").lower())] = v
    return out


def _read_autoeval_dir(path: Path) -> dict[tuple[str, str], int]:
    """An autoeval results folder's ratings: its records' typed scores ``rubric/<criterion>`` (read by the one reader),
    each keyed by the rated dialogue's id."""
    out = {}
    for r in open_run(path).finished:
        for name, g in grades(r).items():
            step, criterion, by = split_name(name)
            if step == "rubric" and by is None and g.scored:
                out[(str((r.get("inputs") or {}).get("source_id")), (criterion or "").strip().lower())] = int(g.value)
    return out


def read_ratings(path: str | Path) -> dict[tuple[str, str], int]:
    p = Path(path)
    if p.is_dir():
        if not (p / "records.jsonl").exists():
            raise DataError(f"{p}: not an autoeval results directory (no records.jsonl)")
        return _read_autoeval_dir(p)
    if not p.exists():
        raise DataError(f"{p}: no such file")
    return _read_ratings_csv(p)


def item_record(item: str, criterion: str, reference, judge, ratings: str | None) -> dict:
    """One (dialogue, criterion) item as a typed record: the judge's rating its grade, the reference rating its target."""
    return record(f"{item}|{criterion}", item, inputs={"criterion": criterion or None, "source_id": item}, target=reference,
                  scores=to_disk({score_name(RATINGS_ONLY.name, criterion or None): Grade(value=judge, answer=item, source=ratings)}))


def calibrate_autoeval(ratings: str, reference: str, out: str | Path, *, lo: int = 1, hi: int = 5) -> dict:
    judge, ref = read_ratings(ratings), read_ratings(reference)
    # a reference without a criterion column applies to every criterion of the item
    keys = []
    for k in judge:
        if k in ref:
            keys.append((k, k))
        elif (k[0], "") in ref:
            keys.append((k, (k[0], "")))
    if not keys:
        raise DataError(f"{ratings} and {reference} share no (id, criterion) item")
    for k, rk in keys:
        for v, src in ((judge[k], ratings), (ref[rk], reference)):
            if not lo <= v <= hi:
                raise DataError(f"{src}: item {k[0]} rating {v} outside {lo}-{hi}")
    a = [ref[rk] for _, rk in keys]
    b = [judge[k] for k, _ in keys]
    cats = list(range(lo, hi + 1))
    cm = [[sum(1 for x, y in zip(a, b) if x == i and y == j) for j in cats] for i in cats]
    diff = [abs(x - y) for x, y in zip(a, b)]
    overall = {"n": len(keys), "spearman": spearman(a, b), "kendall": kendall(a, b), "exact_agreement": sum(d == 0 for d in diff) / len(diff),
               "mean_abs_diff": sum(diff) / len(diff), "weighted_kappa_linear": weighted_kappa(a, b, categories=cats), "confusion": cm}
    per = {}
    for crit in sorted({k[1] for k, _ in keys}):
        sel = [(ref[rk], judge[k]) for k, rk in keys if k[1] == crit]
        xa, xb = [x for x, _ in sel], [y for _, y in sel]
        per[crit or "(all)"] = {"n": len(sel), "spearman": spearman(xa, xb), "kendall": kendall(xa, xb),
                                "exact_agreement": sum(x == y for x, y in sel) / len(sel), "weighted_kappa_linear": weighted_kappa(xa, xb, categories=cats)}
    from experiments.core.registry import named

    config = {"experiment": named(Calibration).name, "ratings": str(ratings), "reference": str(reference), "scale": [lo, hi], "kappa_weights": "linear"}
    lock = RunLock(out, config["experiment"]).acquire()  # computed whole: the old result stays until commit()
    try:
        return _write_whole(RunDir(out, config, whole=True), keys, judge, ref, ratings, reference, overall, per, cm, cats)
    finally:
        lock.release()


def _write_whole(rundir: RunDir, keys, judge, ref, ratings, reference, overall, per, cm, cats) -> dict:
    for (k, rk) in keys:
        rundir.append(item_record(k[0], k[1], ref[rk], judge[k], str(ratings)))
    metrics = {"items_judge": len(judge), "items_reference": len(ref), "items_matched": len(keys), "overall": overall, "per_criterion": per, "kappa_weights": "linear"}
    confusion_png(cm, rundir.path / "confusion_autoeval.png", f"rubric judge vs reference, n={len(keys)}", "judge rating", "reference rating", labels=cats)
    rundir.write_metrics(metrics)
    L = ["# Rubric judge calibration against reference ratings (docs/protocols.md, Auto-evaluation)", "", f"judge ratings: {ratings}; reference: {reference}; "
         f"{len(keys)} matched items ({len(judge)} judge, {len(ref)} reference)", "",
         *md_table(["criterion", "n", "Spearman rho", "Kendall tau-b", "exact agreement", "weighted kappa (linear)"],
                   [[crit, m["n"], *map(num, (m["spearman"]["rho"], m["kendall"]["tau_b"], m["exact_agreement"], m["weighted_kappa_linear"]))]
                    for crit, m in [("all", overall)] + list(per.items())])]
    L += ["", f"mean absolute difference: {num(overall['mean_abs_diff'])}; confusion matrix: confusion_autoeval.png (rows: reference)"]
    rundir.write_summary("\n".join(L) + "\n")
    rundir.commit()
    return metrics


def report_tables(run: dict) -> list[dict]:
    """A `calibrate autoeval` run in `medstack report` (``Study.report_run``): the judge against the reference."""
    x = (run.get("metrics") or {}).get("overall") if isinstance(run.get("metrics"), dict) else None
    if not x:
        return []
    return [{"heading": "Judge calibration", "title": "Rubric judge vs reference ratings (1-5; kappa linear-weighted)",
             "columns": ["rater", "n", "exact agreement", "mean |diff|", "weighted kappa", "Spearman rho", "Kendall tau-b"],
             "rows": [["rubric judge", x["n"], *map(num, (x["exact_agreement"], x["mean_abs_diff"], x["weighted_kappa_linear"],
                                                          (x.get("spearman") or {}).get("rho"), (x.get("kendall") or {}).get("tau_b")))]]}]


class Calibration(Study):
    """The kind ``calibrate-autoeval`` (`medstack calibrate autoeval`): the judge's ratings (its records' grades
    ``rubric/<criterion>``, read from a CSV or an autoeval run, never asked again) against the reference's (their target)."""

    scorers = (RATINGS_ONLY,)

    def upgrade(self, r: dict, s) -> dict:
        """A record written before typed records: ``item``, ``criterion``, ``reference``, ``judge``."""
        return r if is_typed(r) else item_record(str(r["item"]), str(r.get("criterion") or ""), r.get("reference"), r.get("judge"),
                                                 getattr(s, "ratings", None))

    def report_run(self, run: dict) -> list[dict]:
        return report_tables(run)
