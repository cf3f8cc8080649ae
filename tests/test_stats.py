"""The statistics module against hand-computed values."""

import math

import numpy as np
import pytest

from experiments.common.stats import (MIN_SHARED_CASES, cluster_bootstrap, holm, mcnemar_test, mean_ci, paired_bootstrap, paired_over_shared,
                                      ratio_ci, stratified_bootstrap)


def test_holm_known_list():
    # sorted p: 0.01, 0.02, 0.03, 0.04 with m=4 -> 0.04, 0.06, 0.06 (monotone), 0.06
    assert holm([0.04, 0.01, 0.03, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm([0.5]) == [0.5] and holm([]) == []


def test_mcnemar_known_table():
    # a correct, b wrong on 1 case; a wrong, b correct on 6: exact binomial two-sided
    a = [1] * 5 + [1] + [0] * 6 + [0] * 3
    b = [1] * 5 + [0] + [1] * 6 + [0] * 3
    res = mcnemar_test(a, b)
    assert res["table"] == [[5, 1], [6, 3]]
    # P(X<=1 | n=7, p=.5) * 2 = 2 * (1 + 7) / 128 = 0.125
    assert res["p_value"] == pytest.approx(0.125)


def test_paired_bootstrap_identical_arms_and_p_formula():
    t = paired_bootstrap([1, 0, 1, 1], [1, 0, 1, 1], n_boot=999, seed=1)
    assert t.mean_diff == 0 and t.p_value == 1.0  # every resample is as extreme as 0: (999+1)/(999+1)


def test_paired_bootstrap_known_small_sample():
    # all differences equal 1: every centred resample is exactly 0 -> no extreme -> p = 1/(B+1)
    t = paired_bootstrap([1, 1, 1, 1], [0, 0, 0, 0], n_boot=99, seed=0)
    assert t.mean_diff == 1 and t.p_value == pytest.approx(1 / 100) and t.low == t.high == 1
    # hand-checkable with a fixed seed: replicate the resampling here
    a, b = np.array([1, 1, 0, 1, 0, 1]), np.array([0, 1, 0, 0, 0, 1])
    d = a - b
    rng = np.random.default_rng(7)
    boots = d[rng.integers(0, 6, size=(500, 6))].mean(axis=1)
    extreme = np.sum(np.abs(boots - d.mean()) >= abs(d.mean()) - 1e-12)
    t = paired_bootstrap(a, b, n_boot=500, seed=7)
    assert t.p_value == pytest.approx((extreme + 1) / 501)
    assert t.mean_diff == pytest.approx(2 / 6)


def test_mean_ci_brackets_mean_and_is_deterministic():
    x = [0, 1, 1, 0, 1, 1, 1, 0, 1, 1]
    c1, c2 = mean_ci(x, seed=3), mean_ci(x, seed=3)
    assert c1 == c2 and c1.low <= 0.7 <= c1.high and c1.n == 10
    assert math.isnan(mean_ci([]).mean)


def test_bootstrap_in_blocks_draws_the_same_resamples(monkeypatch):
    """Blocks of resamples (bounded memory) give exactly the numbers of the one-matrix draw they replaced."""
    import numpy as np

    from experiments.common import stats

    for n in (1, 7, 2001):
        x = np.random.default_rng(n).random(n)
        whole = x[np.random.default_rng(0).integers(0, n, size=(999, n))].mean(axis=1)
        monkeypatch.setattr(stats, "BLOCK_CELLS", 3000)  # many blocks, an odd-sized last one
        assert np.array_equal(stats._boot_means(x, 999, np.random.default_rng(0)), whole)
        ci = stats.mean_ci(x, n_boot=999)
        a = (1 - 0.95) / 2
        assert (ci.low, ci.high) == (float(np.quantile(whole, a)), float(np.quantile(whole, 1 - a)))


def test_cluster_bootstrap_widens_the_ci_of_items_that_move_together():
    # 4 cases x 2 models, both models alike within a case: yes, yes | yes, yes | no, no | no, no (mean 0.5).
    # Items drawn alone: the mean is k/8 with k ~ Binomial(8, 1/2): P(k = 0) = 1/256 < 2.5 % < P(k <= 1) = 9/256, so the
    # 95 % interval is [1/8, 7/8]. Cases drawn whole: the mean is j/4 with j ~ Binomial(4, 1/2): P(j = 0) = 1/16 > 2.5 %,
    # so the interval is [0, 1].
    y = [1, 1, 1, 1, 0, 0, 0, 0]
    cases = ["a", "a", "b", "b", "c", "c", "d", "d"]
    mean = lambda idx: {"mean": sum(y[i] for i in idx) / len(idx)}
    alone = stratified_bootstrap(mean, ["all"] * 8, n_boot=4000)["mean"]
    clustered = cluster_bootstrap(mean, cases, n_boot=4000)["mean"]
    assert alone == pytest.approx((0.125, 0.875)) and clustered == pytest.approx((0.0, 1.0))


def test_cluster_bootstrap_of_singletons_is_the_plain_bootstrap():
    y = [0.1, 0.9, 0.4, 0.3, 0.7]
    mean = lambda idx: {"mean": sum(y[i] for i in idx) / len(idx)}
    assert cluster_bootstrap(mean, range(5), n_boot=500) == stratified_bootstrap(mean, ["all"] * 5, n_boot=500)


def test_ratio_ci_of_two_runs_accuracies_by_hand():
    # cases c1, c2: with a bias 1, 0; without 1, 1 -> ratio (1 + 0) / (1 + 1) = 0.5. A resample of two cases draws
    # (c1, c1): 2/2 = 1 (p 1/4), one of each: 1/2 (p 1/2), (c2, c2): 0/2 = 0 (p 1/4): the 2.5 % and 97.5 % points 0 and 1
    r = ratio_ci([1, 0], [1, 1], n_boot=4000, seed=3)
    assert (r.mean, r.low, r.high, r.n) == (0.5, 0.0, 1.0, 2)
    # a single pair: its own ratio, every resample alike
    assert ratio_ci([1], [2]).to_dict() == {"mean": 0.5, "low": 0.5, "high": 0.5, "n": 1}
    # no accuracy without the bias: no ratio
    assert math.isnan(ratio_ci([1, 0], [0, 0]).mean)


def test_paired_over_shared_pairs_by_id_and_withholds_p_below_the_minimum():
    # only the shared ids c1, c2 are paired: a - b = (1 - 0, 0 - 0) -> mean 0.5; c3 and c9 held by one run only
    t = paired_over_shared({"c1": 1.0, "c2": 0.0, "c3": 1.0}, {"c2": 0.0, "c1": 0.0, "c9": 1.0})
    assert (t["n_shared"], t["only_a"], t["only_b"], t["mean_diff"], t["p"], t["too_few"]) == (2, 1, 1, 0.5, None, True)
    assert MIN_SHARED_CASES == 10
    # 10 shared cases, a right on all, b on none: the difference 1 in every resample; p = (0 + 1) / (B + 1)
    big = paired_over_shared({f"c{i}": 1.0 for i in range(10)}, {f"c{i}": 0.0 for i in range(10)}, n_boot=999)
    assert (big["n_shared"], big["mean_diff"], big["diff_ci"], big["too_few"]) == (10, 1.0, [1.0, 1.0], False)
    assert big["p"] == pytest.approx(1 / 1000)
    assert paired_over_shared({"a": 1.0}, {"b": 1.0})["mean_diff"] is None


def test_weighted_precision_recall_by_hand():
    from experiments.common.stats import weighted_precision_recall
    # 4 items: flagged positive (weight 1), flagged negative (weight 3), unflagged positive (weight 2), unflagged negative (weight 10)
    got = weighted_precision_recall([1, 1, 0, 0], [1, 0, 1, 0], [1, 3, 2, 10])
    assert got["precision"] == 1 / 4 and got["recall"] == 1 / 3
    # equal weights: the plain sample figures
    assert weighted_precision_recall([1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]) == {"precision": 0.5, "recall": 0.5}
    # nothing flagged: precision is undefined (NaN), recall 0
    nothing = weighted_precision_recall([0, 0], [1, 0], [1, 1])
    assert nothing["precision"] != nothing["precision"] and nothing["recall"] == 0.0
