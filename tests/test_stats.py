"""Tests of evaluators/stats.py against direct formulas, brute force and scipy references."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps
from trajlake.evaluators import stats as S
from trajlake.evaluators.stats import (
    StatsInputError,
    bootstrap_cluster_sums,
    bootstrap_mean,
    bootstrap_paired_mean_difference,
    bootstrap_paired_ratio_difference,
    bootstrap_quantiles,
    bootstrap_ratio,
    clustered_mean,
    holm_bonferroni,
    mcnemar_exact,
    minimum_detectable_difference,
    paired_difference,
    pass_at_k,
    pass_hat_k,
    sign_test,
    task_mean,
    tasks_needed,
)

from trajlake.errors import TrajlakeError

# ---------------------------------------------------------------------------------------------- helpers


def loop_clustered_se(x: list[float], clusters: list[int]) -> tuple[float, float, int]:
    """The clustered SE formula written out with plain loops (the reference)."""
    n = len(x)
    labels = sorted(set(clusters))
    n_clusters = len(labels)
    mean = sum(x) / n
    total = 0.0
    for lab in labels:
        s = 0.0
        for xi, ci in zip(x, clusters, strict=True):
            if ci == lab:
                s += xi - mean
        total += s * s
    return mean, math.sqrt(n_clusters / (n_clusters - 1) * total) / n, n_clusters


def mc_tolerance(se_boot: float, n_resamples: int, confidence: float = 0.95, k: float = 5.0) -> float:
    """k Monte Carlo SDs of the difference of two independent percentile-interval endpoints.

    The SD of an empirical p-quantile from B draws is sqrt(p(1-p)/B) / f(x_p); for a roughly normal bootstrap
    distribution with SD se_boot, f(x_p) = phi(z_p) / se_boot. Two independent runs: times sqrt(2).
    """
    p = (1.0 - confidence) / 2.0
    sd = math.sqrt(p * (1 - p) / n_resamples) / sps.norm.pdf(sps.norm.ppf(p)) * se_boot
    return k * math.sqrt(2.0) * sd


def mean_diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(y - x, axis=axis)


# ---------------------------------------------------------------------------------------------- clustered SE


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(-1e3, 1e3, allow_nan=False), st.integers(0, 7)),
        min_size=2,
        max_size=60,
    )
)
def test_clustered_se_matches_loop_formula(rows: list[tuple[float, int]]) -> None:
    x = [r[0] for r in rows]
    cl = [r[1] for r in rows]
    est = clustered_mean(x, cl)
    assert est.n == len(x)
    assert est.n_clusters == len(set(cl))
    if est.n_clusters < 2:
        assert math.isnan(est.se) and math.isnan(est.ci_low) and math.isnan(est.ci_high)
        return
    mean, se, n_clusters = loop_clustered_se(x, cl)
    scale = max(1.0, max(abs(v) for v in x))
    assert est.estimate == pytest.approx(mean, rel=1e-9, abs=1e-9 * scale)
    assert est.se == pytest.approx(se, rel=1e-7, abs=1e-9 * scale)
    tcrit = sps.t.ppf(0.975, n_clusters - 1)
    assert est.ci_low == pytest.approx(mean - tcrit * se, rel=1e-7, abs=1e-8 * scale)
    assert est.ci_high == pytest.approx(mean + tcrit * se, rel=1e-7, abs=1e-8 * scale)


def test_clustered_mean_string_labels_and_confidence() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=50)
    labels = np.array([f"task-{i % 7}" for i in range(50)])
    a = clustered_mean(x, labels, confidence=0.9)
    _, se, c = loop_clustered_se(list(x), [i % 7 for i in range(50)])
    assert a.se == pytest.approx(se, rel=1e-10)
    assert a.ci_high - a.estimate == pytest.approx(sps.t.ppf(0.95, c - 1) * se, rel=1e-10)


def test_clustered_singletons_equal_standard_error_of_mean() -> None:
    rng = np.random.default_rng(0)
    x = rng.exponential(size=40)
    est = clustered_mean(x, np.arange(40))
    assert est.se == pytest.approx(sps.sem(x), rel=1e-12)
    lo, hi = sps.t.interval(0.95, 39, loc=x.mean(), scale=sps.sem(x))
    assert (est.ci_low, est.ci_high) == pytest.approx((lo, hi), rel=1e-12)
    assert task_mean(x) == est


def test_clustered_degenerate_inputs_do_not_crash() -> None:
    empty = clustered_mean([], [])
    assert empty.n == 0 and empty.n_clusters == 0
    assert all(math.isnan(v) for v in (empty.estimate, empty.se, empty.ci_low, empty.ci_high))
    one = clustered_mean([1.0, 2.0, 4.0], ["t", "t", "t"])
    assert one.estimate == pytest.approx(7 / 3) and one.n_clusters == 1 and math.isnan(one.se)
    same = clustered_mean([2.0, 2.0, 2.0], [0, 1, 2])
    assert same.se == 0.0 and same.ci_low == same.ci_high == 2.0


def test_bad_input_raises_trajlake_error() -> None:
    with pytest.raises(StatsInputError):
        clustered_mean([1.0, float("nan")], [0, 1])
    with pytest.raises(ValueError):
        clustered_mean([1.0, 2.0], [0])
    with pytest.raises(TrajlakeError):
        paired_difference([1.0, 2.0], [1.0], [0, 1])
    with pytest.raises(StatsInputError):
        clustered_mean([1.0], [0], confidence=1.0)


# ---------------------------------------------------------------------------------------------- paired / tests


def test_paired_difference_with_singletons_is_ttest_rel() -> None:
    rng = np.random.default_rng(1)
    b = rng.normal(size=30)
    c = b + 0.3 + rng.normal(scale=0.8, size=30)
    res = paired_difference(b, c, np.arange(30))
    ref = sps.ttest_rel(c, b)
    assert res.estimate == pytest.approx(float(np.mean(c - b)), rel=1e-12)
    assert res.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert res.se == pytest.approx(sps.sem(c - b), rel=1e-12)


def test_paired_difference_clustered_uses_cluster_df() -> None:
    rng = np.random.default_rng(2)
    cl = np.repeat(np.arange(12), 4)
    b = rng.normal(size=48) + rng.normal(size=12)[cl]
    c = b + 0.2 + rng.normal(size=12)[cl] + rng.normal(scale=0.3, size=48)
    res = paired_difference(b, c, cl)
    mean, se, n_clusters = loop_clustered_se(list(c - b), list(cl))
    assert (res.estimate, res.se) == pytest.approx((mean, se), rel=1e-10)
    assert res.p_value == pytest.approx(2 * sps.t.sf(abs(mean / se), n_clusters - 1), rel=1e-10)


def test_paired_difference_zero_se() -> None:
    assert paired_difference([0, 1, 1], [0, 1, 1], [0, 1, 2]).p_value == 1.0
    # every task moved the same way: the exact sign test over 3 tasks, not a certain 0
    assert paired_difference([0, 0, 0], [1, 1, 1], [0, 1, 2]).p_value == pytest.approx(0.25)
    assert paired_difference([0] * 12, [2] * 12, list(range(12))).p_value == pytest.approx(2 * 0.5**12)
    assert math.isnan(paired_difference([0, 1], [1, 1], [5, 5]).p_value)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 40), st.integers(0, 40), st.integers(0, 20), st.integers(0, 20))
def test_mcnemar_matches_binomtest(n10: int, n01: int, n11: int, n00: int) -> None:
    base = [1] * n10 + [0] * n01 + [1] * n11 + [0] * n00
    cand = [0] * n10 + [1] * n01 + [1] * n11 + [0] * n00
    p = mcnemar_exact(np.array(base, dtype=bool), np.array(cand, dtype=bool))
    expected = 1.0 if n10 + n01 == 0 else sps.binomtest(n01, n10 + n01, 0.5).pvalue
    assert p == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_sign_test_drops_ties_and_matches_binomtest() -> None:
    rng = np.random.default_rng(4)
    b = rng.integers(0, 5, size=80).astype(float)
    c = b + rng.choice([-1.0, 0.0, 1.0, 2.0], size=80, p=[0.25, 0.3, 0.3, 0.15])
    n_pos, n_neg = int((c > b).sum()), int((c < b).sum())
    assert sign_test(b, c) == pytest.approx(sps.binomtest(n_pos, n_pos + n_neg).pvalue, rel=1e-9)
    assert sign_test([1.0, 2.0], [1.0, 2.0]) == 1.0


def test_mcnemar_rejects_non_binary() -> None:
    with pytest.raises(StatsInputError):
        mcnemar_exact([0, 2], [1, 1])


def test_holm_bonferroni_hand_example() -> None:
    # sorted: 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> running max 0.06
    adj = holm_bonferroni([0.01, float("nan"), 0.04, 0.03, 0.005])
    np.testing.assert_allclose(adj, [0.03, np.nan, 0.06, 0.06, 0.02], rtol=1e-12)
    np.testing.assert_allclose(holm_bonferroni([0.5, 0.6]), [1.0, 1.0])
    np.testing.assert_allclose(holm_bonferroni([0.2]), [0.2])
    assert np.isnan(holm_bonferroni([np.nan, np.nan])).all()
    assert holm_bonferroni([]).shape == (0,)
    with pytest.raises(StatsInputError):
        holm_bonferroni([1.5])


# ---------------------------------------------------------------------------------------------- bootstrap


def test_bootstrap_mean_singletons_matches_scipy_percentile() -> None:
    rng = np.random.default_rng(5)
    x = rng.exponential(scale=2.0, size=150)
    b = 20_000
    ours = bootstrap_mean(x, np.arange(x.size), n_resamples=b, seed=11)
    ref = sps.bootstrap((x,), np.mean, method="percentile", n_resamples=b, rng=12)
    tol = mc_tolerance(ref.standard_error, b)
    assert ours.estimate == pytest.approx(x.mean(), rel=1e-12)
    assert ours.ci_low == pytest.approx(ref.confidence_interval.low, abs=tol)
    assert ours.ci_high == pytest.approx(ref.confidence_interval.high, abs=tol)
    assert ours.se == pytest.approx(ref.standard_error, rel=0.03)


def test_bootstrap_mean_singletons_bca_matches_scipy_bca() -> None:
    rng = np.random.default_rng(6)
    x = rng.lognormal(sigma=1.0, size=120)
    b = 20_000
    ours = bootstrap_mean(x, np.arange(x.size), n_resamples=b, method="bca", seed=21)
    ref = sps.bootstrap((x,), np.mean, method="BCa", n_resamples=b, rng=22)
    tol = mc_tolerance(ref.standard_error, b)
    assert ours.ci_low == pytest.approx(ref.confidence_interval.low, abs=tol)
    assert ours.ci_high == pytest.approx(ref.confidence_interval.high, abs=tol)
    pct = bootstrap_mean(x, np.arange(x.size), n_resamples=b, seed=21)
    assert ours.ci_high - pct.ci_high > 0  # right-skewed data: BCa moves the interval up


def test_bca_of_nonlinear_statistic_of_sums_matches_scipy() -> None:
    # squared mean close to zero (0.6 SE): biased and skewed, so the bias correction z0 is far from 0
    x = np.random.default_rng(15).normal(size=100)
    x = x - x.mean() + 0.06
    b = 20_000
    sums = np.column_stack([x, np.ones_like(x)])
    ours = bootstrap_cluster_sums(
        sums, lambda t: (t[:, 0] / t[:, 1]) ** 2, n_resamples=b, method="bca", seed=61
    )
    ref = sps.bootstrap(
        (x,), lambda v, axis=-1: np.mean(v, axis=axis) ** 2, method="BCa", n_resamples=b, rng=62
    )
    tol = mc_tolerance(ref.standard_error, b, k=8.0)  # wider: the normal MC approximation is rough here
    assert ours.estimate == pytest.approx(x.mean() ** 2, rel=1e-12)
    assert ours.ci_low == pytest.approx(ref.confidence_interval.low, abs=tol)
    assert ours.ci_high == pytest.approx(ref.confidence_interval.high, abs=tol)


def _clustered_pairs(
    rng: np.random.Generator, n_tasks: int, per_task: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cl = np.repeat(np.arange(n_tasks), per_task)
    difficulty = rng.normal(size=n_tasks)[cl]
    base = difficulty + rng.normal(size=cl.size)
    cand = base + 0.2 + rng.gamma(1.0, 0.5, size=n_tasks)[cl] + rng.normal(size=cl.size)
    return base, cand, cl


def test_paired_cluster_bootstrap_matches_scipy_on_cluster_means() -> None:
    rng = np.random.default_rng(7)
    base, cand, cl = _clustered_pairs(rng, 80, 6)
    b = 20_000
    ours = bootstrap_paired_mean_difference(base, cand, cl, n_resamples=b, seed=31)
    # balanced clusters: resampling tasks == resampling per-task means as paired observations
    mb = base.reshape(80, 6).mean(axis=1)
    mc = cand.reshape(80, 6).mean(axis=1)
    ref = sps.bootstrap((mb, mc), mean_diff, paired=True, method="percentile", n_resamples=b, rng=32)
    tol = mc_tolerance(ref.standard_error, b)
    assert ours.estimate == pytest.approx(float(np.mean(cand - base)), rel=1e-12)
    assert ours.ci_low == pytest.approx(ref.confidence_interval.low, abs=tol)
    assert ours.ci_high == pytest.approx(ref.confidence_interval.high, abs=tol)
    # the naive row bootstrap ignores the task correlation and is much narrower
    assert ours.ci_high - ours.ci_low > 1.2 * (2 * 1.96 * sps.sem(cand - base))


def test_ratio_bootstraps_match_scipy_on_cluster_sums() -> None:
    rng = np.random.default_rng(8)
    sizes = rng.integers(1, 9, size=70)
    cl = np.repeat(np.arange(70), sizes)
    p = rng.beta(2, 2, size=70)[cl]
    succ_b = (rng.random(cl.size) < p).astype(float)
    succ_c = (rng.random(cl.size) < np.minimum(p + 0.1, 1)).astype(float)
    cost_b = rng.gamma(2.0, 1.0, size=cl.size) * (1 + p)
    cost_c = cost_b * 0.9 + rng.gamma(1.0, 0.2, size=cl.size)
    b = 20_000

    def sums(v: np.ndarray) -> np.ndarray:
        return np.bincount(cl, weights=v)

    ours = bootstrap_ratio(cost_b, succ_b, cl, n_resamples=b, seed=41)
    ref = sps.bootstrap(
        (sums(cost_b), sums(succ_b)),
        lambda a, d, axis=-1: a.sum(axis=axis) / d.sum(axis=axis),
        paired=True,
        method="percentile",
        n_resamples=b,
        rng=42,
    )
    tol = mc_tolerance(ref.standard_error, b)
    assert ours.estimate == pytest.approx(cost_b.sum() / succ_b.sum(), rel=1e-12)
    assert (ours.ci_low, ours.ci_high) == pytest.approx(tuple(ref.confidence_interval), abs=tol)

    diff = bootstrap_paired_ratio_difference(cost_b, succ_b, cost_c, succ_c, cl, n_resamples=b, seed=43)
    ref2 = sps.bootstrap(
        (sums(cost_b), sums(succ_b), sums(cost_c), sums(succ_c)),
        lambda bn, bd, cn, cd, axis=-1: (
            cn.sum(axis=axis) / cd.sum(axis=axis) - bn.sum(axis=axis) / bd.sum(axis=axis)
        ),
        paired=True,
        method="percentile",
        n_resamples=b,
        rng=44,
    )
    tol2 = mc_tolerance(ref2.standard_error, b)
    assert diff.estimate == pytest.approx(cost_c.sum() / succ_c.sum() - cost_b.sum() / succ_b.sum())
    assert (diff.ci_low, diff.ci_high) == pytest.approx(tuple(ref2.confidence_interval), abs=tol2)

    # unbalanced mean: pooled row mean of resampled tasks == sum/count of cluster sums
    mean_res = bootstrap_mean(cost_b, cl, n_resamples=b, seed=45)
    ref3 = sps.bootstrap(
        (sums(cost_b), sizes.astype(float)),
        lambda a, d, axis=-1: a.sum(axis=axis) / d.sum(axis=axis),
        paired=True,
        method="percentile",
        n_resamples=b,
        rng=46,
    )
    tol3 = mc_tolerance(ref3.standard_error, b)
    assert (mean_res.ci_low, mean_res.ci_high) == pytest.approx(tuple(ref3.confidence_interval), abs=tol3)


def test_bootstrap_engine_is_counts_matmul_cluster_sums() -> None:
    rng = np.random.default_rng(9)
    sums = rng.normal(size=(13, 3))
    sums[:, 2] = 4.0  # a constant column takes the shortcut
    res = bootstrap_cluster_sums(
        sums, lambda t: t[:, 0] + 10 * t[:, 1] + 100 * t[:, 2], n_resamples=600, seed=5
    )
    seen: list[np.ndarray] = []

    def record(idx: np.ndarray) -> np.ndarray:
        seen.append(idx.copy())
        return np.zeros((idx.shape[0], 1))

    S._run_resamples(13, 600, 1, record, 5, 1, max(1, S._CHUNK_ELEMS // 13))
    idx = np.concatenate(seen)
    counts = np.stack([np.bincount(row, minlength=13) for row in idx])
    assert (counts.sum(axis=1) == 13).all()
    np.testing.assert_allclose(res.replicates, counts @ sums @ np.array([1.0, 10.0, 100.0]), rtol=1e-12)


def _reference_totals(sums: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """The cluster-sums bootstrap by its definition, written plainly: per block of 256 resamples its own generator
    draws the whole ``(rows, C)`` index matrix in one ``integers`` call; totals are the rows' ``take(...).sum()``."""
    c = sums.shape[0]
    gens = S._block_generators(seed, -(-n_resamples // 256))
    out = []
    for b, g in enumerate(gens):
        idx = g.integers(0, c, size=(min(256, n_resamples - 256 * b), c), dtype=np.intp)
        out.append(np.column_stack([np.take(sums[:, j], idx).sum(axis=1) for j in range(sums.shape[1])]))
    return np.concatenate(out)


@pytest.mark.parametrize("draw_elems", [1, 5, 7, 13, 64, 1 << 16])
@pytest.mark.parametrize("workers", [1, 3])
def test_bootstrap_chunking_never_changes_a_replicate(
    monkeypatch: pytest.MonkeyPatch, draw_elems: int, workers: int
) -> None:
    # issue 28: resamples are drawn in cache-sized chunks, and a resample longer than a chunk in pieces (the long
    # path); every replicate must stay bit for bit the one of the plain definition, whatever the chunk size
    rng = np.random.default_rng(21)
    sums = np.column_stack([rng.normal(size=13) * 1e3, rng.normal(size=13), np.full(13, 2.0)])
    ref = _reference_totals(sums, 700, 8)
    monkeypatch.setattr(S, "_DRAW_ELEMS", draw_elems)
    res = bootstrap_cluster_sums(sums, lambda t: t[:, 0] / t[:, 1] + t[:, 2], n_resamples=700, seed=8,
                                 n_workers=workers)
    expected = ref[:, 0] / ref[:, 1] + 13 * 2.0
    assert res.replicates.tobytes() == expected.tobytes()


def test_bootstrap_long_resamples_match_the_definition() -> None:
    # 70,000 single-pair clusters: longer than a draw chunk, so each resample is drawn and gathered in pieces
    rng = np.random.default_rng(22)
    base, cand = rng.normal(size=70_000), rng.normal(size=70_000)
    res = bootstrap_paired_mean_difference(base, cand, np.arange(70_000), n_resamples=40, seed=5, n_workers=1)
    ref = _reference_totals(np.column_stack([cand - base, np.ones(70_000)]), 40, 5)
    assert res.replicates.tobytes() == (ref[:, 0] / ref[:, 1]).tobytes()


def test_bootstrap_deterministic_and_worker_independent() -> None:
    rng = np.random.default_rng(10)
    base, cand, cl = _clustered_pairs(rng, 50, 3)
    a = bootstrap_paired_mean_difference(base, cand, cl, n_resamples=2_000, seed=123, n_workers=1)
    b = bootstrap_paired_mean_difference(base, cand, cl, n_resamples=2_000, seed=123, n_workers=4)
    c = bootstrap_paired_mean_difference(base, cand, cl, n_resamples=2_000, seed=124, n_workers=1)
    np.testing.assert_array_equal(a.replicates, b.replicates)
    assert a == b
    assert not np.array_equal(a.replicates, c.replicates)
    g = bootstrap_paired_mean_difference(
        base, cand, cl, n_resamples=2_000, seed=np.random.default_rng(123), n_workers=2
    )
    h = bootstrap_paired_mean_difference(
        base, cand, cl, n_resamples=2_000, seed=np.random.default_rng(123), n_workers=1
    )
    np.testing.assert_array_equal(g.replicates, h.replicates)


def test_bootstrap_se_close_to_clustered_se() -> None:
    rng = np.random.default_rng(11)
    base, cand, cl = _clustered_pairs(rng, 400, 5)
    boot = bootstrap_paired_mean_difference(base, cand, cl, n_resamples=4_000, seed=1)
    analytic = paired_difference(base, cand, cl)
    # the bootstrap variance lacks the C/(C-1) factor
    assert boot.se == pytest.approx(analytic.se * math.sqrt(399 / 400), rel=0.05)


def test_bootstrap_degenerate_inputs() -> None:
    empty = bootstrap_mean([], [], n_resamples=50, seed=0)
    assert math.isnan(empty.estimate) and math.isnan(empty.ci_low) and empty.n_clusters == 0
    one = bootstrap_mean([1.0, 3.0], ["a", "a"], n_resamples=50, seed=0)
    assert one.estimate == 2.0 and math.isnan(one.ci_low) and math.isnan(one.se)
    # resamples that draw only failure tasks have no successes: cost per success is not finite there
    ratio = bootstrap_ratio([1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0, 1, 2], n_resamples=500, seed=0)
    assert ratio.estimate == 3.0 and 0 < ratio.n_invalid < 500
    assert np.isfinite(ratio.ci_low)
    assert bootstrap_quantiles([], [], n_resamples=10)[0].n_clusters == 0
    with pytest.raises(StatsInputError):
        bootstrap_mean([1.0], [0], method=cast(Any, "studentized"))


# ---------------------------------------------------------------------------------------------- quantiles


@pytest.mark.parametrize("n_clusters", [60, 400])
def test_weighted_quantile_kernel_matches_expanded_rows(n_clusters: int) -> None:
    rng = np.random.default_rng(12)
    n = 4_000
    codes = rng.integers(0, n_clusters, size=n)
    values = rng.lognormal(size=n) + 0.01 * codes
    qs = np.array([0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0])
    order = np.argsort(values, kind="stable")
    kernel = S._QuantileKernel(values[order], codes[order], n_clusters, qs)
    assert any(w is not None for w in kernel.windows)  # the fast path is exercised
    counts = rng.multinomial(n_clusters, np.full(n_clusters, 1 / n_clusters), size=60)
    counts[0] = 0
    counts[0, 3] = n_clusters  # one task drawn every time: far outside every window -> fallback
    fast = kernel(counts)
    full = kernel(counts, force_full=True)
    np.testing.assert_array_equal(fast, full)
    for row, got in zip(counts, fast, strict=True):
        expanded = np.repeat(values, row[codes])
        np.testing.assert_array_equal(got, np.quantile(expanded, qs, method="inverted_cdf"))


def test_bootstrap_quantiles_with_ties_match_expanded_rows_per_resample() -> None:
    # issue 28: the rows are sorted with the unstable argsort; with many ties (latencies on a coarse grid) every
    # replicate must still be exactly np.quantile(inverted_cdf) of the resample's rows, each drawn task repeated
    rng = np.random.default_rng(23)
    n, c = 3_000, 40
    codes = rng.integers(0, c, size=n)
    values = np.round(rng.lognormal(size=n) * 4) / 4  # ~30 distinct values
    qs = (0.1, 0.5, 0.99)
    res = bootstrap_quantiles(values, codes, qs, n_resamples=300, seed=6, n_workers=1)
    gens = S._block_generators(6, 2)
    idx = np.concatenate([gens[0].integers(0, c, size=(256, c)), gens[1].integers(0, c, size=(44, c))])
    for b, drawn in enumerate(idx):
        expanded = np.repeat(values, np.bincount(drawn, minlength=c)[codes])
        expected = np.quantile(expanded, qs, method="inverted_cdf")
        assert [r.replicates[b] for r in res] == expected.tolist(), b


@pytest.mark.parametrize("labels", [
    np.array([5, 3, 5, 9, 3, 3]),
    np.array([5.0, -3.0, 5.0, 9.0, -0.0, 0.0]),
    np.array([1e15, 1e15 + 2, 1e15 + 2]),
    np.array([0.5, 1.5, 0.5]),  # not whole numbers: np.unique
    np.array([0, 10**9, 7]),  # too sparse for a table: np.unique
    np.array([2**63 - 1, 2**63 - 3], dtype=np.uint64),
    np.array(["b", "a", "b"]),
    np.arange(5_000)[::-1] % 1_234,
])
def test_factorize_equals_np_unique(labels: np.ndarray) -> None:
    # issue 28: whole-number labels are factorised with a table instead of a sort; codes and count must be
    # np.unique's exactly
    uniq, inverse = np.unique(labels, return_inverse=True)
    codes, n = S._factorize(labels, labels.shape[0])
    assert n == uniq.shape[0] and codes.dtype == np.intp
    np.testing.assert_array_equal(codes, inverse.reshape(-1))


def test_t_kernels_equal_scipy_t() -> None:
    # issue 28: the clustered t interval and p-value call special.stdtrit / stdtr, the kernels of stats.t
    x = np.random.default_rng(24).normal(size=57)
    cl = np.arange(57) % 19
    e = clustered_mean(x, cl)
    assert e.ci_high - e.estimate == pytest.approx(float(sps.t.ppf(0.975, 18)) * e.se, rel=1e-15)
    p = paired_difference(np.zeros(57), x, cl)
    assert p.p_value == float(2.0 * sps.t.sf(abs(p.estimate / p.se), 18))


def test_weighted_quantile_kernel_target_reached_before_window() -> None:
    # singletons: half the draws on the smallest row, half on the largest; the weight before the median's
    # window already equals the target, so the answer is the minimum and must come from outside the window
    n = 1_000
    values = np.random.default_rng(16).normal(size=n)
    order = np.argsort(values)
    kernel = S._QuantileKernel(values[order], np.arange(n), n, np.array([0.5, 0.99]))
    assert kernel.windows[0] is not None and kernel.windows[0][0] > 0
    counts = np.zeros((2, n), dtype=np.int64)
    counts[:, 0] = counts[:, n - 1] = n // 2
    counts[1, 0] += 1
    counts[1, n - 1] -= 1
    np.testing.assert_array_equal(kernel(counts), kernel(counts, force_full=True))
    assert kernel(counts)[0, 0] == values.min() and kernel(counts)[0, 1] == values.max()


def test_bootstrap_quantiles_singletons_match_scipy() -> None:
    rng = np.random.default_rng(13)
    x = rng.lognormal(size=400)
    xs = np.sort(x)
    b = 10_000
    p50, p90 = bootstrap_quantiles(x, np.arange(x.size), (0.5, 0.9), n_resamples=b, seed=51)
    for res, q in ((p50, 0.5), (p90, 0.9)):
        ref = sps.bootstrap(
            (x,),
            lambda v, axis=-1, q=q: np.quantile(v, q, axis=axis, method="inverted_cdf"),
            method="percentile",
            n_resamples=b,
            rng=52,
        )
        assert res.estimate == np.quantile(x, q, method="inverted_cdf")
        for ours_end, ref_end in (
            (res.ci_low, ref.confidence_interval.low),
            (res.ci_high, ref.confidence_interval.high),
        ):
            # the bootstrap distribution of a quantile is discrete: allow MC error plus two order-statistic gaps
            i = int(np.searchsorted(xs, ref_end))
            gap = float(np.max(np.diff(xs[max(0, i - 3) : i + 4])))
            assert ours_end == pytest.approx(ref_end, abs=mc_tolerance(ref.standard_error, b) + 2 * gap)


def test_bootstrap_quantiles_clustered_wider_than_rows() -> None:
    rng = np.random.default_rng(14)
    cl = np.repeat(np.arange(100), 20)
    lat = rng.lognormal(size=cl.size) * rng.lognormal(0, 0.7, size=100)[cl]
    (clustered,) = bootstrap_quantiles(lat, cl, (0.5,), n_resamples=2_000, seed=1)
    (rows,) = bootstrap_quantiles(lat, np.arange(cl.size), (0.5,), n_resamples=2_000, seed=1)
    assert clustered.ci_high - clustered.ci_low > 1.5 * (rows.ci_high - rows.ci_low)


# ---------------------------------------------------------------------------------------------- pass@k


def test_pass_at_k_and_pass_hat_k_match_subset_enumeration() -> None:
    for k in range(1, 8):
        ns, cs, at_k, hat_k = [], [], [], []
        for n in range(k, 9):
            for c in range(n + 1):
                subsets = list(itertools.combinations(range(n), k))  # successes are items 0..c-1
                ns.append(n)
                cs.append(c)
                at_k.append(sum(any(i < c for i in s) for s in subsets) / len(subsets))
                hat_k.append(sum(all(i < c for i in s) for s in subsets) / len(subsets))
        np.testing.assert_allclose(pass_at_k(ns, cs, k), at_k, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(pass_hat_k(ns, cs, k), hat_k, rtol=1e-12, atol=1e-15)


def test_pass_at_k_is_stable_at_extremes() -> None:
    cases = [(10**6, 1, 1), (10**6, 3, 50), (400, 200, 150), (5000, 1, 4999)]
    got = pass_at_k([c[0] for c in cases], [c[1] for c in cases], 1)
    assert got[0] == pytest.approx(1e-6, rel=1e-12)
    for n, c, k in cases:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k([n], [c], k)[0] == pytest.approx(float(exact), rel=1e-10)
        exact_hat = Fraction(math.comb(c, k), math.comb(n, k))
        assert pass_hat_k([n], [c], k)[0] == pytest.approx(float(exact_hat), rel=1e-10, abs=1e-300)


def test_pass_at_k_shapes_and_validation() -> None:
    n = np.array([[10, 10], [5, 8]])
    c = np.array([[0, 10], [2, 1]])
    assert pass_at_k(n, c, 2).shape == (2, 2)
    assert pass_at_k(n, c, 2)[0, 0] == 0.0 and pass_at_k(n, c, 2)[0, 1] == 1.0
    with pytest.raises(StatsInputError):
        pass_at_k([3], [1], 4)
    with pytest.raises(StatsInputError):
        pass_at_k([3], [4], 1)
    with pytest.raises(StatsInputError):
        pass_hat_k([3], [1], 0)
    per_task = pass_at_k([10, 10, 10, 10], [0, 3, 5, 10], 3)
    est = task_mean(per_task)
    assert est.estimate == pytest.approx(per_task.mean()) and est.n_clusters == 4
    assert est.se == pytest.approx(sps.sem(per_task))


# ---------------------------------------------------------------------------------------------- power


def test_minimum_detectable_difference() -> None:
    assert minimum_detectable_difference(1.0) == pytest.approx(1.959964 + 0.841621, abs=1e-5)
    assert minimum_detectable_difference(0.02, alpha=0.01, power=0.9) == pytest.approx(
        0.02 * (sps.norm.ppf(0.995) + sps.norm.ppf(0.9)), rel=1e-12
    )
    mdds = [
        minimum_detectable_difference(0.01, n_clusters_observed=100, n_clusters=c) for c in (25, 100, 400)
    ]
    assert mdds[0] > mdds[1] > mdds[2]
    assert mdds[0] == pytest.approx(2 * mdds[1]) and mdds[2] == pytest.approx(mdds[1] / 2)
    with pytest.raises(StatsInputError):
        minimum_detectable_difference(0.01, n_clusters_observed=100)


def test_tasks_needed_monotone_and_consistent() -> None:
    se, c_obs = 0.015, 200
    needs = [tasks_needed(d, se, c_obs) for d in (0.01, 0.02, 0.04, 0.08)]
    assert needs == sorted(needs, reverse=True) and needs[0] > needs[-1]
    assert tasks_needed(0.02, 0.01, c_obs) < tasks_needed(0.02, 0.02, c_obs)
    for d in (0.005, 0.01, 0.03):
        c = tasks_needed(d, se, c_obs)
        assert minimum_detectable_difference(se, n_clusters_observed=c_obs, n_clusters=c) <= d + 1e-12
        if c > 2:
            assert minimum_detectable_difference(se, n_clusters_observed=c_obs, n_clusters=c - 1) > d
    # detecting the observed MDD needs exactly the observed number of tasks
    assert tasks_needed(minimum_detectable_difference(se), se, c_obs) == c_obs
    with pytest.raises(StatsInputError):
        tasks_needed(0.0, se, c_obs)
