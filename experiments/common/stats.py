"""Statistics shared by every experiment that compares arms: CIs, paired tests, Holm, McNemar, F1, rater agreement."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_B = 10_000
DEFAULT_SEED = 0
BLOCK_CELLS = 2_000_000  # resampled values drawn at a time (~32 MB of indices and values)


def prf(pred_hits: float, n_pred: float, gold_hits: float, n_gold: float, *, both_empty: float = 0.0) -> tuple[float, float, float]:
    """(precision = pred_hits / n_pred, recall = gold_hits / n_gold, F1); an empty denominator gives 0, both lists
    empty give ``both_empty`` (GPT-F1: 1, MediTOD: 0). One-to-one matching: pred_hits = gold_hits = TP."""
    if n_pred == 0 and n_gold == 0:
        return both_empty, both_empty, both_empty
    p = pred_hits / n_pred if n_pred > 0 else 0.0
    r = gold_hits / n_gold if n_gold > 0 else 0.0
    f = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return p, r, f


def _boot_means(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """The means of ``n_boot`` resamples of ``x``, drawn block by block: the same numbers as one
    ``rng.integers(0, n, size=(n_boot, n))`` (blocks of an even number of draws keep numpy's stream), without
    its n_boot x n matrix (10,000 x 2,000 cases: 320 MB at once)."""
    rows = max(2, BLOCK_CELLS // x.size // 2 * 2)
    out = np.empty(n_boot)
    for start in range(0, n_boot, rows):
        k = min(rows, n_boot - start)
        out[start:start + k] = x[rng.integers(0, x.size, size=(k, x.size))].mean(axis=1)
    return out


@dataclass
class MeanCI:
    mean: float
    low: float
    high: float
    n: int

    def to_dict(self) -> dict:
        return asdict(self)


def mean_ci(values, *, n_boot: int = DEFAULT_B, seed: int = DEFAULT_SEED, level: float = 0.95) -> MeanCI:
    """Mean with a percentile bootstrap CI (fixed seed)."""
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        return MeanCI(float("nan"), float("nan"), float("nan"), 0)
    boots = _boot_means(x, n_boot, np.random.default_rng(seed))
    a = (1 - level) / 2
    return MeanCI(float(x.mean()), float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a)), int(x.size))


def ratio_ci(numerators, denominators, *, n_boot: int = DEFAULT_B, seed: int = DEFAULT_SEED, level: float = 0.95) -> MeanCI:
    """sum(numerators) / sum(denominators) over units (a case's flagged patient turns / its patient turns; a case's
    accuracy with a bias / without, paired by case: the ratio of two runs' accuracies), with a
    percentile bootstrap CI that redraws whole units (fixed seed); ``n`` is the number of units. NaN where the
    denominators sum to 0."""
    num = np.asarray(list(numerators), dtype=float)
    den = np.asarray(list(denominators), dtype=float)
    if num.shape != den.shape:
        raise ValueError(f"numerators and denominators differ in length: {num.size} vs {den.size}")
    if num.size == 0 or den.sum() == 0:
        return MeanCI(float("nan"), float("nan"), float("nan"), int(num.size))
    rng = np.random.default_rng(seed)
    rows = max(2, BLOCK_CELLS // num.size // 2 * 2)
    boots = np.empty(n_boot)
    for start in range(0, n_boot, rows):
        k = min(rows, n_boot - start)
        idx = rng.integers(0, num.size, size=(k, num.size))
        d = den[idx].sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            boots[start:start + k] = np.where(d > 0, num[idx].sum(axis=1) / np.where(d > 0, d, 1), np.nan)
    boots = boots[~np.isnan(boots)]
    a = (1 - level) / 2
    return MeanCI(float(num.sum() / den.sum()), float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a)), int(num.size))


@dataclass
class PairedTest:
    mean_diff: float  # mean(a - b)
    low: float
    high: float
    p_value: float
    n: int
    n_boot: int

    def to_dict(self) -> dict:
        return asdict(self)


def paired_bootstrap(a, b, *, n_boot: int = DEFAULT_B, seed: int = DEFAULT_SEED, level: float = 0.95) -> PairedTest:
    """Two-sided paired bootstrap test of mean(a) == mean(b) over cases paired by position: resamples of the paired
    differences, centred under the null, p = (extreme + 1) / (B + 1); plus a CI of the mean difference."""
    a = np.asarray(list(a), dtype=float)
    b = np.asarray(list(b), dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired samples differ in length: {a.size} vs {b.size}")
    d = a - b
    if d.size == 0:
        return PairedTest(float("nan"), float("nan"), float("nan"), float("nan"), 0, n_boot)
    observed = d.mean()
    boots = _boot_means(d, n_boot, np.random.default_rng(seed))
    extreme = int(np.sum(np.abs(boots - observed) >= abs(observed) - 1e-12))
    alpha = (1 - level) / 2
    return PairedTest(
        float(observed), float(np.quantile(boots, alpha)), float(np.quantile(boots, 1 - alpha)),
        (extreme + 1) / (n_boot + 1), int(d.size), n_boot,
    )


MIN_SHARED_CASES = 10  # below this many shared cases a paired difference gets its interval but no p-value


def paired_over_shared(sa: dict, sb: dict, *, min_shared: int = MIN_SHARED_CASES, n_boot: int = DEFAULT_B,
                       seed: int = DEFAULT_SEED) -> dict:
    """Two runs' per-unit values (unit id -> value: a case's mean grade) compared over the units both hold, paired by
    id: {"n_shared", "only_a", "only_b", "mean_diff" (mean a - b), "diff_ci", "p"}; ``p`` is None (and ``too_few``
    True) below ``min_shared`` shared units, where a bootstrap p-value of a handful of cases means nothing."""
    common = sorted(set(sa) & set(sb))
    out = {"n_shared": len(common), "only_a": len(set(sa) - set(sb)), "only_b": len(set(sb) - set(sa)),
           "too_few": len(common) < min_shared}
    if not common:
        return {**out, "mean_diff": None, "diff_ci": None, "p": None}
    t = paired_bootstrap([sa[c] for c in common], [sb[c] for c in common], n_boot=n_boot, seed=seed)
    return {**out, "mean_diff": t.mean_diff, "diff_ci": [t.low, t.high], "p": None if out["too_few"] else t.p_value}


def holm(p_values) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the input order."""
    from statsmodels.stats.multitest import multipletests

    p = list(p_values)
    if not p:
        return []
    return [float(x) for x in multipletests(p, method="holm")[1]]


def mcnemar_test(a, b, *, exact: bool | None = None) -> dict:
    """McNemar's test for paired 0/1 outcomes. Returns the 2x2 table, statistic and p.

    ``exact``: True = the exact binomial test on the discordant pairs; False = chi-square with continuity
    correction; None = exact when fewer than 25 pairs are discordant."""
    from statsmodels.stats.contingency_tables import mcnemar

    a = np.asarray(list(a), dtype=int)
    b = np.asarray(list(b), dtype=int)
    table = [[int(np.sum((a == 1) & (b == 1))), int(np.sum((a == 1) & (b == 0)))],
             [int(np.sum((a == 0) & (b == 1))), int(np.sum((a == 0) & (b == 0)))]]
    discordant = table[0][1] + table[1][0]
    exact = discordant < 25 if exact is None else exact
    res = mcnemar(table, exact=exact, correction=True)
    return {"table": table, "statistic": float(res.statistic), "p_value": float(res.pvalue), "exact": exact}


# -- agreement between raters (judge calibration, docs/protocols.md, Judge calibration and Auto-evaluation) ---------------------------------

def weighted_kappa(a, b, categories=None, weights: str = "linear", item_weights=None) -> float:
    """Cohen's kappa with linear (|i-j|/(k-1)) or quadratic weights over ordered ``categories``
    (default: the sorted union of both raters' values). 1 = perfect agreement, 0 = chance; NaN when
    both raters use one category only (no variance to agree on). With two categories both weightings
    give the unweighted kappa. ``item_weights``: each item counts this much in the joint table (a
    stratified sample's inverse sampling fractions, to estimate the population's kappa)."""
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"rating lists differ in length: {len(a)} vs {len(b)}")
    cats = list(categories) if categories is not None else sorted(set(a) | set(b))
    k = len(cats)
    if not a or k < 2:
        return float("nan")
    pos = {c: i for i, c in enumerate(cats)}
    obs = np.zeros((k, k))
    for n, (x, y) in enumerate(zip(a, b)):
        obs[pos[x], pos[y]] += 1 if item_weights is None else item_weights[n]
    obs /= obs.sum()
    exp = np.outer(obs.sum(axis=1), obs.sum(axis=0))
    i, j = np.indices((k, k))
    if weights == "linear":
        w = np.abs(i - j) / (k - 1)
    elif weights == "quadratic":
        w = ((i - j) / (k - 1)) ** 2
    else:
        raise ValueError("weights must be 'linear' or 'quadratic'")
    denom = (w * exp).sum()
    return float("nan") if denom == 0 else float(1 - (w * obs).sum() / denom)


def _rank_correlation(test, key: str, a, b) -> dict:
    a, b = np.asarray(list(a), dtype=float), np.asarray(list(b), dtype=float)
    if a.size < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return {key: float("nan"), "p_value": float("nan"), "n": int(a.size)}
    r = test(a, b)
    return {key: float(r.statistic if hasattr(r, "statistic") else r[0]), "p_value": float(r.pvalue), "n": int(a.size)}


def spearman(a, b) -> dict:
    """Spearman rank correlation (ties get average ranks) with its two-sided p (scipy)."""
    from scipy.stats import spearmanr

    return _rank_correlation(spearmanr, "rho", a, b)


def kendall(a, b) -> dict:
    """Kendall's tau-b (tie-corrected) with its two-sided p (scipy)."""
    from scipy.stats import kendalltau

    return _rank_correlation(kendalltau, "tau_b", a, b)


def count_agreement(a, b, max_count: int, weights=None, rank: bool = True) -> dict:
    """Agreement of two raters' per-item counts out of ``max_count`` (e.g. correct trials of 5):
    exact agreement share, mean absolute difference, the trial-level agreement bound
    mean((max - |a - b|) / max), linear-weighted kappa over 0..max, Spearman rho and the
    (max+1)x(max+1) confusion matrix (rows: a, columns: b). ``weights``: see :func:`rater_agreement`."""
    m = rater_agreement(a, b, range(max_count + 1), weights=weights, rank=rank)
    m["trial_agreement_bound"] = _wmean([(max_count - abs(int(x) - int(y))) / max_count for x, y in zip(a, b)], weights)
    return {k: m[k] for k in ("n", "exact_agreement", "mean_abs_diff", "trial_agreement_bound", "weighted_kappa_linear", "spearman", "confusion")}


def _wmean(values: list[float], weights=None) -> float:
    """Plain mean (sum / n) without weights; else sum(w x) / sum(w). NaN when empty."""
    if not values:
        return float("nan")
    if weights is None:
        return sum(values) / len(values)
    return float(sum(w * v for w, v in zip(weights, values)) / sum(weights))


def rater_agreement(a, b, categories, weights=None, rank: bool = True) -> dict:
    """Two raters on the same items, on an ordered scale ``categories`` (0/1 verdicts, counts, 1-5 ratings):
    exact agreement share, mean absolute difference, Cohen's kappa with linear weights (unweighted
    for two categories), Spearman rho and the confusion matrix (rows: a, columns: b; weighted counts
    when weighted). ``weights``: per item, e.g. N_h / n_h of a stratified sample, so that the shares,
    the mean difference, kappa and the matrix estimate the whole population (Spearman stays unweighted;
    ``rank=False`` leaves it out, e.g. inside a bootstrap)."""
    cats = list(categories)
    a, b = [int(x) for x in a], [int(x) for x in b]
    if len(a) != len(b):
        raise ValueError(f"rating lists differ in length: {len(a)} vs {len(b)}")
    if weights is not None and len(weights) != len(a):
        raise ValueError(f"weights differ in length from the ratings: {len(weights)} vs {len(a)}")
    diff = [abs(x - y) for x, y in zip(a, b)]
    pos = {c: i for i, c in enumerate(cats)}
    cm = [[0] * len(cats) for _ in cats]
    for n, (x, y) in enumerate(zip(a, b)):
        cm[pos[x]][pos[y]] += 1 if weights is None else weights[n]
    return {
        "n": len(a),
        "exact_agreement": _wmean([float(d == 0) for d in diff], weights),
        "mean_abs_diff": _wmean(diff, weights),
        "weighted_kappa_linear": weighted_kappa(a, b, categories=cats, weights="linear", item_weights=weights),
        "spearman": spearman(a, b) if rank else None,
        "confusion": cm,
    }


def fleiss_kappa(ratings, categories=None) -> float:
    """Fleiss' kappa of several raters over the same items (statsmodels): ``ratings`` holds one list per item, each
    with every rater's category (the same number of raters per item); ``categories``: the categories the scale has
    (default: those used). 1 = full agreement, 0 = chance; NaN with no item, fewer than two raters, or one category
    used throughout (no variance to agree on)."""
    from statsmodels.stats.inter_rater import fleiss_kappa as fleiss

    rows = [list(r) for r in ratings]
    if not rows or len(rows[0]) < 2:
        return float("nan")
    if any(len(r) != len(rows[0]) for r in rows):
        raise ValueError("every item needs the same number of ratings for Fleiss' kappa")
    cats = list(categories) if categories is not None else sorted({x for r in rows for x in r})
    pos = {c: i for i, c in enumerate(cats)}
    table = np.zeros((len(rows), len(cats)))
    for i, r in enumerate(rows):
        for x in r:
            table[i, pos[x]] += 1
    p = table.sum(axis=0) / table.sum()
    if np.isclose((p ** 2).sum(), 1.0):  # one category throughout: chance agreement is 1
        return float("nan")
    return float(fleiss(table, method="fleiss"))


def _groups(labels) -> list[np.ndarray]:
    groups: dict = {}
    for i, g in enumerate(labels):
        groups.setdefault(g, []).append(i)
    return [np.asarray(g) for g in groups.values()]


def _percentile_cis(stat, draw, *, n_boot: int, seed: int, level: float) -> dict:
    """{name: (low, high)} over ``n_boot`` resamples ``draw(rng)`` (item indices); NaN values dropped per figure."""
    rng = np.random.default_rng(seed)
    vals: dict[str, list[float]] = {}
    for _ in range(n_boot):
        for k, v in stat(draw(rng).tolist()).items():
            if v == v:
                vals.setdefault(k, []).append(v)
    a = (1 - level) / 2
    return {k: (float(np.quantile(v, a)), float(np.quantile(v, 1 - a))) for k, v in vals.items()}


def stratified_bootstrap(stat, strata, *, n_boot: int = 2000, seed: int = DEFAULT_SEED, level: float = 0.95) -> dict:
    """Percentile CIs of the figures ``stat(indices)`` returns (a dict of numbers) over resamples that redraw
    each stratum's items with replacement, keeping its size (the design of a stratified sample): {name: (low, high)}.
    NaN values of a resample are dropped for that figure."""
    members = _groups(strata)

    def draw(rng):
        return np.concatenate([g[rng.integers(0, g.size, size=g.size)] for g in members]) if members else np.asarray([], dtype=int)
    return _percentile_cis(stat, draw, n_boot=n_boot, seed=seed, level=level)


def cluster_bootstrap(stat, clusters, *, n_boot: int = 2000, seed: int = DEFAULT_SEED, level: float = 0.95) -> dict:
    """Percentile CIs of the figures ``stat(indices)`` returns over resamples that redraw whole clusters with
    replacement (items of one cluster, e.g. one case's conversations with several models, are not independent):
    {name: (low, high)}. With every item its own cluster it draws exactly as :func:`stratified_bootstrap` with one
    stratum. NaN values of a resample are dropped for that figure."""
    members = _groups(clusters)

    def draw(rng):
        if not members:
            return np.asarray([], dtype=int)
        return np.concatenate([members[j] for j in rng.integers(0, len(members), size=len(members))])
    return _percentile_cis(stat, draw, n_boot=n_boot, seed=seed, level=level)


def weighted_precision_recall(flagged, positive, weights) -> dict:
    """A check's precision and recall on a labelled sample whose items weigh what they stand for (a stratified sample:
    each item weighs its stratum's size over the items drawn from it): precision = weight of flagged positives over
    weight flagged, recall = weight of flagged positives over weight positive; NaN where a denominator is 0."""
    f = np.asarray(list(flagged), dtype=bool)
    p = np.asarray(list(positive), dtype=bool)
    w = np.asarray(list(weights), dtype=float)
    tp, n_flag, n_pos = w[f & p].sum(), w[f].sum(), w[p].sum()
    return {"precision": float(tp / n_flag) if n_flag else float("nan"), "recall": float(tp / n_pos) if n_pos else float("nan")}
