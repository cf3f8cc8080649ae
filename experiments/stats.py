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
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))
    boots = x[idx].mean(axis=1)
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
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(n_boot, d.size))
    boots = d[idx].mean(axis=1)
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
