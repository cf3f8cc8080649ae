"""Pure functions over autoeval records: what is not a score (the rating histogram, unscored and parse-error counts),
the mean rating per rated model, judge-vs-reference agreement, and summary.md's tables.

The ratings are the records' typed scores ``rubric/<criterion>`` (experiments/studies/autoeval/scorers.py, ``rating``);
every mean and interval is the runner's one aggregation of them (metrics.json ``scores``, resampled by case). Unscored
ratings (unparseable replies) are counted and left out of means; they are never treated as 0.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from collections import Counter, defaultdict
from pathlib import Path

from experiments.common.grade import Figure
from experiments.common.markdown import md_table, num
from experiments.core.scorers import figures
from models.errors import DataError, read_utf8

from experiments.studies.autoeval.judge import RATINGS, Criterion
from experiments.studies.autoeval.scorers import rating


def _num(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 4)


def criterion_of(record: dict) -> str | None:
    return (record.get("inputs") or {}).get("criterion")


def criterion_counts(records: list[dict]) -> dict:
    """One criterion's unscored ratings, parse errors and histogram of ratings 1..5."""
    scored = [g.value for r in records if (g := rating(r)).scored]
    return {"unscored": len(records) - len(scored),
            "parse_errors": sum(1 for r in records if rating(r).metadata.get("parse_error")),
            "distribution": {str(k): Counter(scored).get(k, 0) for k in RATINGS}}


def rating_metrics(records: list[dict], criteria: list[Criterion], scorers) -> dict:
    """Per criterion its counts; the mean rating per rated model (the one aggregation over that model's records) when the
    results mix models."""
    by_crit: dict[str, list[dict]] = defaultdict(list)
    by_model: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_crit[criterion_of(r)].append(r)
        by_model[str((r.get("metadata") or {}).get("model"))].append(r)
    out = {c.key: {"name": c.name, **criterion_counts(by_crit.get(c.key, []))} for c in criteria}
    total = len(records)
    unscored = sum(v["unscored"] for v in out.values())
    parse_errors = sum(v["parse_errors"] for v in out.values())
    names = [f"rubric/{c.key}" for c in criteria]
    return {
        "criteria": out,
        "ratings": total,
        "unscored": unscored,
        "unscored_rate": round(unscored / total, 4) if total else None,
        "parse_errors": parse_errors,
        "parse_error_rate": round(parse_errors / total, 4) if total else None,
        "by_model": {m: [f.json() for f in figures(per, scorers, names)] for m, per in sorted(by_model.items())} if len(by_model) > 1 else {},
    }


# ------------------------------------------------------------------ reference agreement

def load_reference(path: str | Path, criteria: list[Criterion]) -> dict[tuple[str, str], float]:
    """{(id, criterion key): rating} from a CSV with columns id, criterion, rating.

    ``criterion`` may be the key (``empathy``) or the full name (``Showing Empathy``). Rows for criteria not being
    rated are dropped. Bad rows (a rating that is no number, an item given twice) raise naming file and line.
    """
    p = Path(path)
    if not p.exists():
        raise DataError(f"reference file {p} does not exist")
    lookup = {}
    for c in criteria:
        lookup[c.key.lower()] = c.key
        lookup[c.name.lower()] = c.key
    rows: dict[tuple[str, str], float] = {}
    with io.StringIO(read_utf8(p), newline="") as f:  # not UTF-8: one line naming the file, line and byte
        reader = csv.DictReader(f)
        cols = [c.strip().lower() for c in (reader.fieldnames or [])]
        missing = [c for c in ("id", "criterion", "rating") if c not in cols]
        if missing:
            raise DataError(f"{p}: missing column(s) {', '.join(missing)}; expected a header with id, criterion, rating")
        for lineno, raw in enumerate(reader, 2):
            row = {(k or "").strip().lower(): (v or "").strip() for k, v in raw.items()}
            try:
                value = float(row["rating"])
            except ValueError:
                raise DataError(f"{p}:{lineno}: rating {row['rating']!r} is not a number") from None
            key = lookup.get(row["criterion"].lower())
            if key is None:
                continue
            if (row["id"], key) in rows:
                raise DataError(f"{p}:{lineno}: a second rating of {row['id']!r} on {key}; one per item")
            rows[(row["id"], key)] = value
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


def agreement_metrics(records: list[dict], reference: dict[tuple[str, str], float], criteria: list[Criterion]) -> dict:
    """Judge vs reference per criterion and pooled over criteria, on the (dialogue, criterion) pairs both rated: each
    record's rating against its target (the reference rating); reference rows without a rated record are counted."""
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    judge_unscored = Counter()
    judged = set()
    for r in records:
        key = criterion_of(r)
        judged.add(((r.get("inputs") or {}).get("source_id"), key))
        if r.get("target") is None:
            continue
        if rating(r).scored:
            pairs[key].append((float(rating(r).value), float(r["target"])))
        else:
            judge_unscored[key] += 1
    unmatched = Counter(key for item, key in reference if (item, key) not in judged)
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

def _mean(figs: list[dict], name: str) -> Figure:
    """The runner's figure of score ``name`` (metrics.json ``scores``): the mean rating over cases."""
    f = next((f for f in figs if f["score"] == name and f["metric"] == "mean"), None)
    return Figure(**f) if f else Figure(name, "mean", None, None, None, 0, 0, 0, 0)


def summary_markdown(metrics: dict, title: str) -> str:
    """The study's tables; every mean and interval is the runner's figure (the Scores section shows the same)."""
    crit, scores = metrics["criteria"], metrics.get("scores") or []
    lines = [f"# {title}", "", f"Judge: `{metrics.get('judge')}`; dialogues rated: {metrics['dialogues']['rated']} "
             f"(skipped without transcript: {metrics['dialogues']['skipped_no_transcript']}). Mean rating [95 % CI]: over "
             "the dialogues' cases, resampled by case (the Scores section below).", "",
             *md_table(["criterion", "cases", "unscored", "mean rating [95 % CI]", *map(str, RATINGS)],
                       [[v["name"], (f := _mean(scores, f"rubric/{key}")).n, v["unscored"], f.text(),
                         *(v["distribution"][str(k)] for k in RATINGS)] for key, v in crit.items()])]
    if metrics.get("by_model"):
        lines += ["", "## Mean rating per rated model", "", *md_table(
            ["model", "criterion", "cases", "unscored", "mean rating [95 % CI]"],
            [[m, crit[key]["name"], (f := _mean(figs, f"rubric/{key}")).n, f.unscored, f.text()]
             for m, figs in metrics["by_model"].items() for key in crit])]
    if metrics.get("agreement"):
        lines += ["", "## Agreement with reference ratings", "", *md_table(
            ["criterion", "n pairs", "Kendall tau", "p", "Spearman rho", "p", "ref. unmatched", "judge unscored"],
            [["all criteria" if key == "all" else crit[key]["name"], v["n"], num(v["kendall_tau"]), num(v["kendall_p"]),
              num(v["spearman_rho"]), num(v["spearman_p"]), v["reference_unmatched"], v["judge_unscored"]]
             for key, v in metrics["agreement"].items()])]
    return "\n".join(lines) + "\n"
