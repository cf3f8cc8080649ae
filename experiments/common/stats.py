"""Statistics shared by every experiment that compares arms (CRAFT-MD, DERA, MediTOD).

- ``mean_ci``: mean with a percentile bootstrap 95% CI (fixed seed).
- ``paired_bootstrap``: two-sided paired bootstrap test on per-case outcomes
  (B resamples of the paired differences, centred under the null;
  p = (extreme + 1) / (B + 1)), plus a CI of the mean difference.
- ``holm``: Holm–Bonferroni adjusted p-values (statsmodels).
- ``mcnemar_test``: McNemar's test on paired binary outcomes (statsmodels; exact
  binomial when the discordant count is small).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_B = 10_000
DEFAULT_SEED = 0
BLOCK_CELLS = 2_000_000  # resampled values drawn at a time (~32 MB of indices and values)


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
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        return MeanCI(float("nan"), float("nan"), float("nan"), 0)
    boots = _boot_means(x, n_boot, np.random.default_rng(seed))
    a = (1 - level) / 2
    return MeanCI(float(x.mean()), float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a)), int(x.size))


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
    """Two-sided paired bootstrap test of mean(a) == mean(b) over cases paired by position."""
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


def holm(p_values) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the input order."""
    from statsmodels.stats.multitest import multipletests

    p = list(p_values)
    if not p:
        return []
    return [float(x) for x in multipletests(p, method="holm")[1]]


def mcnemar_test(a, b) -> dict:
    """McNemar's test for paired 0/1 outcomes. Returns the 2x2 table, statistic and p."""
    from statsmodels.stats.contingency_tables import mcnemar

    a = np.asarray(list(a), dtype=int)
    b = np.asarray(list(b), dtype=int)
    table = [[int(np.sum((a == 1) & (b == 1))), int(np.sum((a == 1) & (b == 0)))],
             [int(np.sum((a == 0) & (b == 1))), int(np.sum((a == 0) & (b == 0)))]]
    discordant = table[0][1] + table[1][0]
    exact = discordant < 25
    res = mcnemar(table, exact=exact, correction=True)
    return {"table": table, "statistic": float(res.statistic), "p_value": float(res.pvalue), "exact": exact}


# -- agreement between raters (judge calibration, SPEC 3.1 / 3.2) ---------------------------------

def weighted_kappa(a, b, categories=None, weights: str = "linear") -> float:
    """Cohen's kappa with linear (|i-j|/(k-1)) or quadratic weights over ordered ``categories``
    (default: the sorted union of both raters' values). 1 = perfect agreement, 0 = chance; NaN when
    both raters use one category only (no variance to agree on)."""
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"rating lists differ in length: {len(a)} vs {len(b)}")
    cats = list(categories) if categories is not None else sorted(set(a) | set(b))
    k = len(cats)
    if not a or k < 2:
        return float("nan")
    pos = {c: i for i, c in enumerate(cats)}
    obs = np.zeros((k, k))
    for x, y in zip(a, b):
        obs[pos[x], pos[y]] += 1
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
    r = kendalltau(a, b)
    return {"tau_b": float(r.statistic if hasattr(r, "statistic") else r[0]), "p_value": float(r.pvalue), "n": int(a.size)}


def count_agreement(a, b, max_count: int) -> dict:
    """Agreement of two raters' per-item counts out of ``max_count`` (e.g. correct trials of 5):
    exact agreement share, mean absolute difference, the trial-level agreement bound
    mean((max - |a - b|) / max), linear-weighted kappa over 0..max, Spearman rho and the
    (max+1)x(max+1) confusion matrix (rows: a, columns: b)."""
    a, b = [int(x) for x in a], [int(x) for x in b]
    if len(a) != len(b):
        raise ValueError(f"count lists differ in length: {len(a)} vs {len(b)}")
    n = len(a)
    diff = [abs(x - y) for x, y in zip(a, b)]
    cm = [[0] * (max_count + 1) for _ in range(max_count + 1)]
    for x, y in zip(a, b):
        cm[x][y] += 1
    return {
        "n": n,
        "exact_agreement": sum(d == 0 for d in diff) / n if n else float("nan"),
        "mean_abs_diff": sum(diff) / n if n else float("nan"),
        "trial_agreement_bound": sum((max_count - d) / max_count for d in diff) / n if n else float("nan"),
        "weighted_kappa_linear": weighted_kappa(a, b, categories=range(max_count + 1), weights="linear"),
        "spearman": spearman(a, b),
        "confusion": cm,
    }
