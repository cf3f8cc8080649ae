"""Pure functions over autoeval records: mean rating per criterion with CIs, and judge-vs-reference agreement.

The ratings are the records' typed scores ``rubric/<criterion>`` (:func:`rating_of`). Unscored ratings (unparseable
replies, failed requests) are counted and left out of means; they are never treated as 0.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from collections import Counter, defaultdict
from pathlib import Path

from experiments.common.grade import Grade, aggregate, grades
from experiments.common.markdown import md_table, num
from models.errors import DataError, read_utf8

from experiments.studies.autoeval.judge import RATINGS, Criterion


def _num(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 4)


def criterion_of(record: dict) -> str | None:
    return (record.get("inputs") or {}).get("criterion")


def rating_of(record: dict) -> Grade:
    """A record's typed score ``rubric/<criterion>`` (value None when it has none)."""
    return grades(record).get(f"rubric/{criterion_of(record)}") or Grade(value=None)


def criterion_stats(records: list[dict], key: str) -> dict:
    """The mean rating of ``rubric/<key>`` with its 95% CI (the one aggregation, dialogues resampled), plus n, unscored
    and the rating histogram."""
    scored = [v for r in records if (v := rating_of(r).value) is not None]
    f = aggregate(records, f"rubric/{key}")
    return {
        "mean": _num(f.value), "low": _num(f.low), "high": _num(f.high), "n": f.n,
        "unscored": len(records) - len(scored),
        "parse_errors": sum(1 for r in records if rating_of(r).metadata.get("parse_error")),
        "request_errors": sum(1 for r in records if r.get("error")),
        "distribution": {str(k): Counter(scored).get(k, 0) for k in RATINGS},
    }


def rating_metrics(records: list[dict], criteria: list[Criterion]) -> dict:
    """Per criterion (and per rated model, when the results mix models) rating statistics."""
    by_crit: dict[str, list[dict]] = defaultdict(list)
    by_model: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        by_crit[criterion_of(r)].append(r)
        by_model[str((r.get("metadata") or {}).get("model"))][criterion_of(r)].append(r)
    out = {c.key: {"name": c.name, **criterion_stats(by_crit.get(c.key, []), c.key)} for c in criteria}
    total = len(records)
    unscored = sum(v["unscored"] for v in out.values())
    parse_errors = sum(v["parse_errors"] for v in out.values())
    return {
        "criteria": out,
        "ratings": total,
        "unscored": unscored,
        "unscored_rate": round(unscored / total, 4) if total else None,
        "parse_errors": parse_errors,
        "parse_error_rate": round(parse_errors / total, 4) if total else None,
        "by_model": {
            m: {c.key: criterion_stats(per.get(c.key, []), c.key) for c in criteria}
            for m, per in sorted(by_model.items())
        } if len(by_model) > 1 else {},
    }


# ------------------------------------------------------------------ reference agreement

def load_reference(path: str | Path, criteria: list[Criterion]) -> list[dict]:
    """Rows {id, criterion (key), rating} from a CSV with columns id, criterion, rating.

    ``criterion`` may be the key (``empathy``) or the full name (``Showing Empathy``). Rows for
    criteria not being rated are dropped. Bad rows raise naming file and line.
    """
    p = Path(path)
    if not p.exists():
        raise DataError(f"reference file {p} does not exist")
    lookup = {}
    for c in criteria:
        lookup[c.key.lower()] = c.key
        lookup[c.name.lower()] = c.key
    rows = []
    with io.StringIO(read_utf8(p), newline="") as f:  # not UTF-8: one line naming the file, line and byte
        reader = csv.DictReader(f)
        cols = [c.strip().lower() for c in (reader.fieldnames or [])]
        missing = [c for c in ("id", "criterion", "rating") if c not in cols]
        if missing:
            raise DataError(f"{p}: missing column(s) {', '.join(missing)}; expected a header with id, criterion, rating")
        for lineno, raw in enumerate(reader, 2):
            row = {(k or "").strip().lower(): (v or "").strip() for k, v in raw.items()}
            try:
                rating = float(row["rating"])
            except ValueError:
                raise DataError(f"{p}:{lineno}: rating {row['rating']!r} is not a number") from None
            key = lookup.get(row["criterion"].lower())
            if key is None:
                continue
            rows.append({"id": row["id"], "criterion": key, "rating": rating})
    return rows


def rank_agreement(judge: list[float], reference: list[float]) -> dict:
    """Kendall tau-b and Spearman rho (scipy) of paired ratings, with p-values and n. None where undefined."""
    from scipy.stats import kendalltau, spearmanr

    n = len(judge)
    out = {"n": n, "kendall_tau": None, "kendall_p": None, "spearman_rho": None, "spearman_p": None}
    if n < 2 or len(set(judge)) < 2 or len(set(reference)) < 2:
        return out  # a constant side has no ranking to agree with
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kt = kendalltau(judge, reference)
        sp = spearmanr(judge, reference)
    out.update(kendall_tau=_num(kt.statistic), kendall_p=_num(kt.pvalue), spearman_rho=_num(sp.statistic), spearman_p=_num(sp.pvalue))
    return out


def agreement_metrics(records: list[dict], reference: list[dict], criteria: list[Criterion]) -> dict:
    """Judge vs reference per criterion and pooled over criteria, on (dialogue id, criterion) pairs both rated."""
    judged = {(str(r.get("case_id")), criterion_of(r)): r for r in records}
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    unmatched = Counter()
    judge_unscored = Counter()
    for row in reference:
        rec = judged.get((row["id"], row["criterion"]))
        if rec is None:
            unmatched[row["criterion"]] += 1
        elif rating_of(rec).value is None:
            judge_unscored[row["criterion"]] += 1
        else:
            pairs[row["criterion"]].append((float(rating_of(rec).value), row["rating"]))
    out = {}
    for c in criteria:
        p = pairs.get(c.key, [])
        out[c.key] = {**rank_agreement([a for a, _ in p], [b for _, b in p]),
                      "reference_unmatched": unmatched[c.key], "judge_unscored": judge_unscored[c.key]}
    pooled = [x for c in criteria for x in pairs.get(c.key, [])]
    out["all"] = {**rank_agreement([a for a, _ in pooled], [b for _, b in pooled]),
                  "reference_unmatched": sum(unmatched.values()), "judge_unscored": sum(judge_unscored.values())}
    return out


# ------------------------------------------------------------------ summary

def summary_markdown(metrics: dict, title: str) -> str:
    lines = [f"# {title}", "", f"Judge: `{metrics.get('judge')}`; dialogues rated: {metrics['dialogues']['rated']} "
             f"(skipped without transcript: {metrics['dialogues']['skipped_no_transcript']}).", "",
             *md_table(["criterion", "n", "unscored", "mean rating", "95% CI", *map(str, RATINGS)],
                       [[v["name"], v["n"], v["unscored"], num(v["mean"], 2), f"[{num(v['low'], 2)}, {num(v['high'], 2)}]",
                         *(v["distribution"][str(k)] for k in RATINGS)] for v in metrics["criteria"].values()])]
    if metrics.get("by_model"):
        lines += ["", "## Mean rating per rated model", "", *md_table(
            ["model", "criterion", "n", "unscored", "mean", "95% CI"],
            [[m, metrics["criteria"][key]["name"], v["n"], v["unscored"], num(v["mean"], 2), f"[{num(v['low'], 2)}, {num(v['high'], 2)}]"]
             for m, per in metrics["by_model"].items() for key, v in per.items()])]
    if metrics.get("agreement"):
        lines += ["", "## Agreement with reference ratings", "", *md_table(
            ["criterion", "n pairs", "Kendall tau", "p", "Spearman rho", "p", "ref. unmatched", "judge unscored"],
            [["all criteria" if key == "all" else metrics["criteria"][key]["name"], v["n"], num(v["kendall_tau"]), num(v["kendall_p"]),
              num(v["spearman_rho"]), num(v["spearman_p"]), v["reference_unmatched"], v["judge_unscored"]]
             for key, v in metrics["agreement"].items()])]
    run = metrics.get("run") or {}
    if run:
        lines += ["", f"Run: {run.get('cases_run')} ratings in {run.get('rating_wall_seconds')} s "
                  f"(+ {(metrics.get('examples') or {}).get('wall_seconds')} s explaining examples), "
                  f"{run.get('completion_tokens')} output tokens ({run.get('output_tokens_per_s')} tok/s), "
                  f"{run.get('cache_hits')} cache hits, {run.get('cases_resumed')} resumed."]
    return "\n".join(lines) + "\n"
