"""`medstack calibrate RUN_DIR --labels RUN_DIR/reviews`: a judge against clinicians' review labels (docs/protocols.md, Judge calibration).

The labels come from ``medstack review``; the judge's decisions are read again from the run
(:mod:`experiments.tools.review.judges`), the sample design from ``reviews/sample-<judge>.json``. The measures, the
undone stratification weights, the consensus and the tiebreak are described in experiments/tools/review/README.md
(`medstack calibrate`). Why consensus items keep their sampling weight N_h / n_h: the items set aside are the
disputed ones, not like the rest of their stratum, so their weight is not spread over it (nor are the
tiebreaker's items in the tiebreaker's own row: they are the disputed ones too).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from experiments.common.markdown import md_table, num
from experiments.common.stats import count_agreement, rater_agreement, spearman, stratified_bootstrap
from experiments.core.results import strict_json, write_private
from experiments.tools.review.judges import load_judge
from experiments.tools.review.labels import check_label, read_labels, read_sample, reviews_dir, sample_path
from models.errors import DataError

N_BOOT = 2000
CI_KEYS = ("exact_agreement", "mean_abs_diff", "trial_agreement_bound", "weighted_kappa_linear")


def _agreement(a, b, scale: dict, weights, rank: bool = True):
    if scale["kind"] == "count":
        return count_agreement(a, b, scale["max"], weights=weights, rank=rank)
    if scale["kind"] == "unit":
        diff = [abs(x - y) for x, y in zip(a, b)]
        mae = sum(diff) / len(diff) if weights is None else sum(w * d for w, d in zip(weights, diff)) / sum(weights)
        return {"n": len(a), "mean_abs_diff": mae, "spearman": spearman(a, b) if rank else None}
    return rater_agreement(a, b, sorted(scale["values"]), weights=weights, rank=rank)


def compare(a: list, b: list, strata: list[str], population: dict[str, int], scale: dict, *, n_boot: int = N_BOOT) -> dict:
    """Rater ``a`` (rows) against rater ``b`` on paired items, with the design weights N_h / m_h and stratified bootstrap CIs."""
    m = Counter(strata)
    w_h = {h: population[h] / m[h] for h in m}
    uniform = len(set(round(v, 12) for v in w_h.values())) <= 1
    weights = None if uniform else [w_h[h] for h in strata]
    out = _agreement(a, b, scale, weights)
    out["weighted"] = not uniform

    def stat(idx):
        mh = Counter(strata[i] for i in idx)  # the resample's own m_h: its weights are N_h / m_h again
        ww = None if uniform else [population[strata[i]] / mh[strata[i]] for i in idx]
        r = _agreement([a[i] for i in idx], [b[i] for i in idx], scale, ww, rank=False)
        return {k: r[k] for k in CI_KEYS if k in r}

    out["ci95"] = {k: list(v) for k, v in stratified_bootstrap(stat, strata, n_boot=n_boot).items()}
    return out


def _consensus(labels: list, scale: dict):
    if scale["kind"] == "unit":
        return sum(labels) / len(labels)
    value, count = Counter(labels).most_common(1)[0]
    return value if count * 2 > len(labels) else None


def calibrate_reviews(run_dir: str | Path, labels_src: str | Path, judge: str | None = None, *, n_boot: int = N_BOOT,
                      tiebreak: str | None = None) -> dict:
    run_dir = Path(run_dir)
    by_reviewer = read_labels(labels_src, run_dir)
    steps = sorted({j for rows in by_reviewer.values() for (j, _) in rows})
    if judge is None:
        if len(steps) != 1:
            raise DataError(f"{labels_src}: labels for judges {', '.join(steps)}: choose one with --judge")
        judge = steps[0]
    sp = sample_path(run_dir, judge)
    if not sp.exists():
        raise DataError(f"{sp}: no review sample of judge {judge} in this run (make it with `medstack review {run_dir} --judge {judge} --sample N`)")
    sample = read_sample(sp)
    j = load_judge(run_dir, judge)
    scale = j["scale"]
    verdict = {it["id"]: it["verdict"] for it in j["items"]}
    stratum = {s["id"]: s["stratum"] for s in sample["items"]}
    population = {h: v["N"] for h, v in sample["strata"].items()}
    missing = [i for i in stratum if i not in verdict]
    if missing:
        raise DataError(f"{sp}: item(s) {', '.join(missing[:5])} are no longer in the run's {judge} decisions")

    # reviewer -> item -> label (skips and labels of items outside the sample left out, counted)
    per: dict[str, dict[str, object]] = {}
    counts = {}
    for who, rows in sorted(by_reviewer.items()):
        mine = {item: row["label"] for (step, item), row in rows.items() if step == judge and not row.get("skipped") and row.get("label") is not None}
        outside = sorted(i for i in mine if i not in stratum)
        if outside:
            raise DataError(f"labels of {who}: item(s) {', '.join(outside[:5])} are not in {sp}")
        per[who] = {i: check_label(v, scale, f"labels of {who}, item {i}") for i, v in mine.items()}
        counts[who] = {"labelled": len(per[who]), "skipped": sum(1 for (step, item), row in rows.items() if step == judge and row.get("skipped"))}
    per = {w: v for w, v in per.items() if v}
    if not per:
        raise DataError(f"{labels_src}: no label for judge {judge}")
    if tiebreak is not None:
        if tiebreak not in per:
            raise DataError(f"--tiebreak {tiebreak}: no label of judge {judge} by {tiebreak} (reviewers: {', '.join(sorted(per))})")
        if len(per) < 3:
            raise DataError(f"--tiebreak {tiebreak}: needs two other reviewers whose disagreements {tiebreak} decides")
        if scale["kind"] == "unit":
            raise DataError(f"--tiebreak {tiebreak}: the 0-1 scale has no ties to break (its consensus is the mean)")

    order = [it["id"] for it in j["items"] if it["id"] in stratum]  # the run's order: the same sums as today's calibrate

    def vs_judge(labels: dict, sampled_weights: bool = False) -> dict:
        ids = [i for i in order if i in labels]
        h = [stratum[i] for i in ids]
        pop = population
        if sampled_weights:  # each item keeps its weight N_h / n_h: what was set aside is not spread over the rest of its stratum
            m = Counter(h)
            pop = {k: population[k] * m[k] / sample["strata"][k]["n"] for k in m}
        return compare([labels[i] for i in ids], [verdict[i] for i in ids], h, pop, scale, n_boot=n_boot)

    result = {"judge": judge, "experiment": j["experiment"], "scale": scale, "run": str(run_dir), "labels": str(labels_src),
              "sample": {"size": len(sample["items"]), "population": sample["population"], "seed": sample["seed"], "strata": sample["strata"]},
              "reviewers": {w: {**counts[w], "strata_without_label": sorted(set(stratum.values()) - {stratum[i] for i in per[w]}),
                                "vs_judge": vs_judge(per[w], sampled_weights=w == tiebreak)} for w in per}, "n_boot": n_boot}
    if tiebreak is not None:
        result["reviewers"][tiebreak]["tiebreaker"] = True
    names = sorted(w for w in per if w != tiebreak)
    if len(names) >= 2:
        result["inter_rater"] = []
        for x in range(len(names)):
            for y in range(x + 1, len(names)):
                a, b = per[names[x]], per[names[y]]
                ids = [i for i in order if i in a and i in b]
                if ids:
                    result["inter_rater"].append({"a": names[x], "b": names[y], **compare([a[i] for i in ids], [b[i] for i in ids],
                                                                                          [stratum[i] for i in ids], population, scale, n_boot=n_boot)})
        both = [i for i in order if all(i in per[w] for w in names)]
        cons, agreed, broken, set_aside = {}, 0, 0, 0
        for i in both:
            c = _consensus([per[w][i] for w in names], scale)
            if c is not None:
                cons[i], agreed = c, agreed + 1
            elif tiebreak is not None and i in per[tiebreak]:
                cons[i], broken = per[tiebreak][i], broken + 1
            else:
                set_aside += 1
        result["consensus"] = {"reviewers": names, "tiebreak": tiebreak, "items_all_labelled": len(both), "majority": agreed,
                               "tie_broken": broken, "set_aside": set_aside, "vs_judge": vs_judge(cons, sampled_weights=True) if cons else None}
    write(run_dir, result)
    return result


def _cell(m: dict, k: str) -> str:
    if k not in m:
        return "–"
    ci = m.get("ci95", {}).get(k)
    return num(m[k]) + (f" [{num(ci[0])}, {num(ci[1])}]" if ci else "")


COLUMNS = ["rater", "n", "exact agreement", "MAE", "trial agreement bound", "kappa", "Spearman rho"]


def table_rows(r: dict) -> list[list[str]]:
    """The calibration table (also the report's): each reviewer, the consensus, and reviewer pairs."""
    rows = []

    def row(name, m):
        rows.append([name, str(m["n"]), *(_cell(m, k) for k in CI_KEYS[:2]), _cell(m, "trial_agreement_bound"), _cell(m, "weighted_kappa_linear"),
                     num((m.get("spearman") or {}).get("rho"))])

    for w, v in r["reviewers"].items():
        row(f"judge vs {w}" + (" (tiebreaker)" if v.get("tiebreaker") else ""), v["vs_judge"])
    for p in r.get("inter_rater") or []:
        row(f"{p['a']} vs {p['b']} (inter-rater)", p)
    c = r.get("consensus")
    if c and c.get("vs_judge"):
        row(f"judge vs consensus of {', '.join(c['reviewers'])} ({consensus_note(c)})", c["vs_judge"])
    return rows


def consensus_note(c: dict) -> str:
    """How the consensus row was made: the items it stands on and those it set aside."""
    aside = c.get("set_aside", c.get("no_majority", 0))  # a calibration file written before the tiebreak named it so
    parts = [f"{c.get('majority', c['items_all_labelled'] - aside)} of {c['items_all_labelled']} items by majority"]
    if c.get("tiebreak"):
        parts.append(f"{c['tie_broken']} decided by {c['tiebreak']}")
    parts.append(f"{aside} set aside for disagreement" if aside else "none set aside")
    return "; ".join(parts)


def summary(r: dict) -> str:
    s = r["sample"]
    kind = r["scale"]["kind"]
    kappa = {"binary": "unweighted (two categories)", "unit": "not defined for a 0-1 score"}.get(kind, "linear weights")
    L = [f"# Judge `{r['judge']}` of {r['run']} against clinicians' review labels (docs/protocols.md, Judge calibration)", "",
         f"scale: {kind} {r['scale'].get('values') or '0-1'}; kappa: {kappa}; sample {s['size']} of {s['population']} items, "
         f"{len(s['strata'])} strata, seed {s['seed']}; labels: {r['labels']}",
         "weights: " + ("N_h / m_h per stratum (the sample's oversampling undone)" if any(v["vs_judge"].get("weighted") for v in r["reviewers"].values())
                        else "none needed (every stratum sampled at the same rate)") + f"; CIs: stratified percentile bootstrap, {r['n_boot']} resamples", "",
         *md_table(COLUMNS, table_rows(r))]
    for w, v in r["reviewers"].items():
        gap = v.get("strata_without_label") or []
        L.append(f"\n{w}: {v['labelled']} labelled, {v['skipped']} skipped"
                 + (f"; {len(gap)} stratum/strata without a label yet, left out of the estimates: {', '.join(gap)}" if gap else ""))
    if r.get("consensus"):
        c = r["consensus"]
        L.append(f"\nconsensus of {', '.join(c['reviewers'])}: {c['items_all_labelled']} items labelled by all; {consensus_note(c)}"
                 + (" -- the judge vs consensus row leaves out the items the reviewers disagree on, which flatters the judge; "
                    "read the rows per reviewer first (a third reviewer can decide them: --tiebreak NAME)" if c.get("set_aside") else ""))
    return "\n".join(L) + "\n"


def write(run_dir: Path, r: dict) -> None:
    """reviews/calibration-<judge>.json (the report reads it) and .md, private."""
    d = reviews_dir(run_dir)
    for name, text in ((f"calibration-{r['judge']}.json", strict_json(r, indent=1)), (f"calibration-{r['judge']}.md", summary(r))):
        write_private(d / name, text)
