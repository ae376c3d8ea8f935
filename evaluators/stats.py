"""Pure statistics for ``trajlake eval``: clustered estimates, paired tests, cluster bootstrap, pass@k, power.

Everything here is numpy + scipy on in-memory arrays: no I/O, no DuckDB. The unit of independence is the
*task*: all seeds and attempts of one task form a cluster, because they share the task's difficulty and are
therefore correlated. Treating them as independent rows understates uncertainty, so every interval in this
module is task-clustered.

Conventions
-----------
* ``clusters`` is a 1-D array of task labels (any sortable dtype), one per observation or per matched pair.
* Intervals are two-sided with coverage ``confidence`` (default 0.95).
* Bad input (shape mismatch, NaN values, impossible counts) raises :class:`StatsInputError`, which is both a
  :class:`trajlake.errors.TrajlakeError` and a :class:`ValueError`. Degenerate but valid input (no rows, a
  single cluster) never raises: the affected fields are ``nan``.
* Bootstraps are deterministic given ``seed`` (an ``int``, ``SeedSequence`` or ``Generator``), whatever
  ``n_workers`` is: resamples are drawn in fixed blocks of 256, each with its own child seed.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import special

from trajlake.errors import StatsInputError

__all__ = [
    "BootstrapResult",
    "Estimate",
    "PairedComparison",
    "StatsInputError",
    "bootstrap_cluster_sums",
    "bootstrap_mean",
    "bootstrap_paired_mean_difference",
    "bootstrap_paired_ratio_difference",
    "bootstrap_quantiles",
    "bootstrap_ratio",
    "clustered_mean",
    "holm_bonferroni",
    "mcnemar_exact",
    "minimum_detectable_difference",
    "paired_difference",
    "pass_at_k",
    "pass_hat_k",
    "sign_test",
    "task_mean",
    "tasks_needed",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]
SeedLike = int | np.random.SeedSequence | np.random.Generator | None
BootstrapMethod = Literal["percentile", "bca"]

_BLOCK = 256  # resamples per independently seeded block (the unit of work for threads)
_CHUNK_ELEMS = 1 << 19  # weights accumulated per slice of the full quantile method: bounds its memory
# Random indices drawn per chunk of resamples. Small enough that the index array and its gathered values (512 KiB
# each) stay in the core's cache and come from malloc's free lists instead of fresh page-faulted mappings: at
# 2**19 the draws of a 2,000-task bootstrap ran ~2.7x slower in CPU time (issue 28). The chunking never changes
# a result: a block's indices are one sequential stream and every replicate is its own row.
_DRAW_ELEMS = 1 << 16
_NAN = float("nan")


# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class Estimate:
    """A point estimate with its (task-clustered) standard error and confidence interval.

    ``se``, ``ci_low`` and ``ci_high`` are ``nan`` when they are undefined (fewer than two clusters);
    ``estimate`` is ``nan`` when there are no observations.
    """

    estimate: float
    se: float
    ci_low: float
    ci_high: float
    n: int
    n_clusters: int


@dataclass(frozen=True, slots=True)
class PairedComparison:
    """``candidate - baseline`` over matched pairs, with clustered SE, CI and two-sided p-value (H0: 0)."""

    estimate: float
    se: float
    ci_low: float
    ci_high: float
    p_value: float
    n: int
    n_clusters: int


@dataclass(frozen=True, slots=True)
class BootstrapResult:
    """A cluster-bootstrap interval.

    ``estimate`` is the statistic on the original data, ``se`` the standard deviation of the finite
    replicates, ``n_invalid`` the number of replicates that were not finite (e.g. a ratio whose resampled
    denominator is 0); those are excluded from ``se`` and the interval. ``replicates`` holds all
    ``n_resamples`` bootstrap values (not part of equality or repr).
    """

    estimate: float
    ci_low: float
    ci_high: float
    se: float
    n_resamples: int
    n_clusters: int
    n_invalid: int
    method: str
    confidence: float
    replicates: FloatArray = field(repr=False, compare=False)


# --------------------------------------------------------------------------------------------- input helpers


def _float_1d(name: str, values: npt.ArrayLike) -> FloatArray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise StatsInputError(f"{name} must be numeric: {exc}") from exc
    if arr.ndim != 1:
        raise StatsInputError(f"{name} must be 1-D, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise StatsInputError(f"{name} contains NaN or infinite values")
    return arr


def _factorize(clusters: npt.ArrayLike, n: int) -> tuple[IntArray, int]:
    """Map cluster labels to codes ``0..C-1`` (sorted label order); return ``(codes, C)``."""
    arr = np.asarray(clusters)
    if arr.ndim != 1:
        raise StatsInputError(f"clusters must be 1-D, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise StatsInputError(f"clusters has {arr.shape[0]} labels for {n} observations")
    if n == 0:
        return np.zeros(0, dtype=np.intp), 0
    dense = _dense_int_codes(arr)
    if dense is not None:
        return dense
    try:
        uniq, codes = np.unique(arr, return_inverse=True)
    except TypeError as exc:
        raise StatsInputError(f"cluster labels must be mutually comparable: {exc}") from exc
    return codes.astype(np.intp, copy=False).reshape(-1), int(uniq.shape[0])


def _dense_int_codes(arr: npt.NDArray[np.generic]) -> tuple[IntArray, int] | None:
    """``np.unique(arr, return_inverse=True)``'s codes and count without sorting, for labels that are whole
    numbers in a range no wider than a few times their count (task codes such as the evaluator's, as ints or
    floats): present labels are marked in a table, their running count is the code. The codes are the same
    ranks in sorted label order as ``np.unique``'s; ``None`` when the labels do not qualify (issue 28: the sort
    of ``np.unique`` was most of the ~300 factorisations of an eval report)."""
    if arr.dtype.kind not in "iuf" or arr.dtype.itemsize > 8:
        return None
    lo, hi = arr.min(), arr.max()
    if not (np.isfinite(lo) and np.isfinite(hi)) or float(hi) - float(lo) > 4 * arr.shape[0] + 1024:
        return None
    shifted = arr - lo  # exact: whole numbers of at most ~2**40 apart
    ints = shifted.astype(np.intp)
    if arr.dtype.kind == "f" and not np.array_equal(ints, shifted):
        return None  # not all whole numbers
    present = np.zeros(int(ints.max()) + 1, dtype=np.intp)
    present[ints] = 1
    rank = np.cumsum(present) - 1
    return rank[ints], int(rank[-1]) + 1


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise StatsInputError(f"confidence must be in (0, 1), got {confidence}")


def _same_length(**arrays: FloatArray) -> int:
    lengths = {name: a.shape[0] for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise StatsInputError(f"arrays differ in length: {lengths}")
    return next(iter(lengths.values()))


# --------------------------------------------------------------------------------------------- clustered SE


def _clustered(x: FloatArray, codes: IntArray, n_clusters: int, confidence: float) -> Estimate:
    n = x.shape[0]
    if n == 0:
        return Estimate(_NAN, _NAN, _NAN, _NAN, 0, 0)
    mean = float(x.mean())
    if n_clusters < 2:
        return Estimate(mean, _NAN, _NAN, _NAN, n, n_clusters)
    resid = np.bincount(codes, weights=x - mean, minlength=n_clusters)
    se = math.sqrt(n_clusters / (n_clusters - 1) * float(resid @ resid)) / n
    # scipy.stats.t.ppf is special.stdtrit (times scale 1, plus loc 0) behind ~1 ms of argument handling per call
    tcrit = float(special.stdtrit(n_clusters - 1, 0.5 + confidence / 2.0))
    return Estimate(mean, se, mean - tcrit * se, mean + tcrit * se, n, n_clusters)


def clustered_mean(values: npt.ArrayLike, clusters: npt.ArrayLike, *, confidence: float = 0.95) -> Estimate:
    """Mean (or proportion, for 0/1 values) with a task-clustered standard error.

    With ``n`` observations in ``C`` clusters and mean ``m``::

        SE = sqrt( C/(C-1) * sum_c ( sum_{i in c} (x_ic - m) )^2 ) / n

    the cluster-robust (CR1 / "sandwich") variance of a mean: residuals are summed within a task before
    squaring, so correlated seeds of one task count once. ``C/(C-1)`` is the usual small-sample correction.
    The interval is ``m ± t_{C-1, 1-(1-confidence)/2} * SE``: with clustered errors the effective number of
    independent units is the number of clusters, so the reference distribution is Student t with ``C-1``
    degrees of freedom (as Stata's ``vce(cluster)``), which is conservative when there are few tasks.

    With every observation in its own cluster this reduces to ``sd(x, ddof=1) / sqrt(n)`` and the one-sample
    t interval. ``C == 1`` gives ``nan`` SE/CI; ``n == 0`` gives ``nan`` everywhere. O(n) after factorising
    the labels (``np.unique``) and one ``np.bincount``.
    """
    _check_confidence(confidence)
    x = _float_1d("values", values)
    codes, n_clusters = _factorize(clusters, x.shape[0])
    return _clustered(x, codes, n_clusters, confidence)


def task_mean(per_task_values: npt.ArrayLike, *, confidence: float = 0.95) -> Estimate:
    """Average of one value per task (e.g. per-task pass@k) with a task-level t interval.

    Each task is its own cluster, so ``SE = sd(v, ddof=1) / sqrt(T)`` and the CI uses t with ``T-1`` df.
    """
    v = _float_1d("per_task_values", per_task_values)
    return clustered_mean(v, np.arange(v.shape[0]), confidence=confidence)


def paired_difference(
    baseline: npt.ArrayLike,
    candidate: npt.ArrayLike,
    clusters: npt.ArrayLike,
    *,
    confidence: float = 0.95,
) -> PairedComparison:
    """Mean paired difference ``candidate - baseline`` with clustered SE, t CI and two-sided p-value.

    ``baseline[i]`` and ``candidate[i]`` are matched (same task, seed, attempt). With ``d = candidate -
    baseline`` this is :func:`clustered_mean` of ``d``; the test statistic ``t = mean(d) / SE`` is referred
    to Student t with ``C-1`` df, ``p = 2 * P(T_{C-1} > |t|)``. Pairing removes the task-difficulty component
    shared by both arms, which is why it is far more powerful than comparing two clustered means.
    If ``SE == 0`` (the same difference in every task) the t statistic is undefined: ``p`` is 1 when the
    difference is 0, else the exact sign test over the clusters, ``min(1, 2 * 0.5**C)`` (all C tasks moved the
    same way; never 0, so a handful of tasks cannot look certain). With fewer than two clusters ``p`` is
    ``nan``. With one pair per task this equals ``scipy.stats.ttest_rel``.
    """
    _check_confidence(confidence)
    b = _float_1d("baseline", baseline)
    c = _float_1d("candidate", candidate)
    _same_length(baseline=b, candidate=c)
    codes, n_clusters = _factorize(clusters, b.shape[0])
    est = _clustered(c - b, codes, n_clusters, confidence)
    if not math.isfinite(est.se):
        p = _NAN
    elif est.se == 0.0:
        p = 1.0 if est.estimate == 0.0 else min(1.0, 2.0 * 0.5 ** n_clusters)
    else:
        p = float(2.0 * special.stdtr(n_clusters - 1, -abs(est.estimate / est.se)))  # stats.t.sf's kernel
    return PairedComparison(est.estimate, est.se, est.ci_low, est.ci_high, p, est.n, est.n_clusters)


# --------------------------------------------------------------------------------------------- exact tests


def _binomial_two_sided(k_min: int, n: int) -> float:
    """Exact two-sided binomial p-value for ``p = 1/2``: ``min(1, 2 * P(X <= k_min))``, X ~ Bin(n, 1/2)."""
    if n == 0:
        return 1.0
    # imported here: scipy.stats takes ~1 s to import and nothing else of this module needs it (a report starts
    # the import in the background while its SQL runs: trajlake.evaluators.report._prefetch_scipy_stats)
    from scipy import stats

    return float(min(1.0, 2.0 * stats.binom.cdf(k_min, n, 0.5)))


def sign_test(baseline: npt.ArrayLike, candidate: npt.ArrayLike) -> float:
    """Exact two-sided sign test on matched pairs; returns the p-value.

    Counts ``n+ = #(candidate > baseline)`` and ``n- = #(candidate < baseline)``; ties are dropped. Under H0
    (median difference 0) ``n+ ~ Bin(n+ + n-, 1/2)``; ``p = min(1, 2 * P(X <= min(n+, n-)))``, the same
    value as ``scipy.stats.binomtest(n+, n+ + n-).pvalue``. Pairs are assumed independent (one per task, or
    aggregate per task first); p is 1 when every pair ties.
    """
    b = _float_1d("baseline", baseline)
    c = _float_1d("candidate", candidate)
    _same_length(baseline=b, candidate=c)
    n_pos = int(np.count_nonzero(c > b))
    n_neg = int(np.count_nonzero(c < b))
    return _binomial_two_sided(min(n_pos, n_neg), n_pos + n_neg)


def mcnemar_exact(baseline_success: npt.ArrayLike, candidate_success: npt.ArrayLike) -> float:
    """Exact McNemar test for paired binary outcomes; returns the two-sided p-value.

    Only discordant pairs carry information: ``b = #(baseline 1, candidate 0)``, ``c = #(baseline 0,
    candidate 1)``. Under H0 (equal success rates) ``c ~ Bin(b + c, 1/2)`` and ``p = min(1, 2 * P(X <=
    min(b, c)))``; p is 1 without discordant pairs. This is the sign test restricted to 0/1 data. It assumes
    independent pairs: with several seeds per task, use :func:`paired_difference` (clustered) or the cluster
    bootstrap instead, or collapse each task to one pair.
    """
    b = _float_1d("baseline_success", baseline_success)
    c = _float_1d("candidate_success", candidate_success)
    _same_length(baseline_success=b, candidate_success=c)
    for name, a in (("baseline_success", b), ("candidate_success", c)):
        if not np.isin(a, (0.0, 1.0)).all():
            raise StatsInputError(f"{name} must contain only 0/1 (or booleans)")
    return sign_test(b, c)


def holm_bonferroni(p_values: npt.ArrayLike) -> FloatArray:
    """Holm–Bonferroni step-down adjusted p-values (reject where ``adjusted <= alpha``).

    With the ``m`` non-NaN p-values sorted ascending ``p_(1) <= ... <= p_(m)``::

        adj_(i) = min(1, max_{j <= i} (m - j + 1) * p_(j))

    which controls the family-wise error rate at ``alpha`` under any dependence. NaN entries (tests that
    could not be run) stay NaN and do not count towards ``m``. Output order matches the input.
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1:
        raise StatsInputError(f"p_values must be 1-D, got shape {p.shape}")
    ok = ~np.isnan(p)
    valid = p[ok]
    if ((valid < 0.0) | (valid > 1.0)).any():
        raise StatsInputError("p-values must lie in [0, 1]")
    out = np.full(p.shape, _NAN)
    m = valid.shape[0]
    if m == 0:
        return out
    order = np.argsort(valid, kind="stable")
    scaled = (m - np.arange(m)) * valid[order]
    adjusted = np.minimum(1.0, np.maximum.accumulate(scaled))
    res = np.empty(m)
    res[order] = adjusted
    out[ok] = res
    return out


# --------------------------------------------------------------------------------------------- bootstrap engine


def _default_workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8))


def _block_generators(seed: SeedLike, n_blocks: int) -> list[np.random.Generator]:
    """One child generator per block of resamples, derived deterministically from ``seed``."""
    root = np.random.default_rng(seed)
    entropy = [int(v) for v in root.integers(0, 2**63 - 1, size=4)]
    return [np.random.Generator(np.random.PCG64(s)) for s in np.random.SeedSequence(entropy).spawn(n_blocks)]


def _for_each_block(
    n_resamples: int, seed: SeedLike, n_workers: int | None, fill: Callable[[np.random.Generator, int, int], None]
) -> None:
    """Call ``fill(rng, start, stop)`` for every block of ``_BLOCK`` resamples with that block's own generator.

    Blocks are spread over a thread pool (numpy releases the GIL in the random fill, ``take`` and reductions);
    each block draws only from its own generator, so the result does not depend on ``n_workers``.
    """
    n_blocks = -(-n_resamples // _BLOCK)
    gens = _block_generators(seed, n_blocks)

    def work(block: int) -> None:
        fill(gens[block], block * _BLOCK, min(n_resamples, (block + 1) * _BLOCK))

    workers = min(n_workers if n_workers is not None else _default_workers(), n_blocks)
    if workers <= 1:
        for b in range(n_blocks):
            work(b)
    else:
        list(_pool(workers).map(work, range(n_blocks)))


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """A thread pool of ``workers`` threads kept for the process: an eval report runs ~50 bootstraps, and a
    fresh pool each time started ~100 threads (issue 28). Which thread runs a block never changes a result."""
    with _POOLS_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            pool = _POOLS[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trajlake-boot")
        return pool


def _run_resamples(
    n_clusters: int,
    n_resamples: int,
    n_out: int,
    consume: Callable[[IntArray], FloatArray],
    seed: SeedLike,
    n_workers: int | None,
    rows_per_chunk: int,
) -> FloatArray:
    """Draw ``n_resamples`` cluster resamples and reduce each with ``consume``.

    A resample is ``C`` cluster indices drawn uniformly with replacement (``Generator.integers(0, C,
    dtype=intp)``, one sequential stream per block of ``_BLOCK`` resamples, row after row). Chunks of ``r``
    resamples arrive at ``consume`` as an ``(r, C)`` intp index array and must come back as ``(r, n_out)``.
    """
    out = np.empty((n_resamples, n_out))
    rows = max(1, min(rows_per_chunk, _BLOCK))

    def fill(rng: np.random.Generator, first: int, stop: int) -> None:
        for start in range(first, stop, rows):
            end = min(stop, start + rows)
            idx = rng.integers(0, n_clusters, size=(end - start, n_clusters), dtype=np.intp)
            out[start:end] = consume(idx)

    _for_each_block(n_resamples, seed, n_workers, fill)
    return out


def _check_bootstrap_args(n_resamples: int, confidence: float, method: str) -> None:
    _check_confidence(confidence)
    if n_resamples < 1:
        raise StatsInputError(f"n_resamples must be >= 1, got {n_resamples}")
    if method not in ("percentile", "bca"):
        raise StatsInputError(f"method must be 'percentile' or 'bca', got {method!r}")


def _interval(
    replicates: FloatArray,
    theta_hat: float,
    confidence: float,
    method: str,
    jackknife: FloatArray | None,
) -> tuple[float, float]:
    """Percentile or BCa interval from finite replicates (linear interpolation, as scipy)."""
    alpha = (1.0 - confidence) / 2.0
    if replicates.shape[0] == 0 or not math.isfinite(theta_hat):
        return _NAN, _NAN
    if method == "percentile" or float(np.ptp(replicates)) == 0.0:
        lo, hi = np.quantile(replicates, [alpha, 1.0 - alpha])
        return float(lo), float(hi)
    assert jackknife is not None
    b = replicates.shape[0]
    # bias correction: normal quantile of the (mid-rank) share of replicates below the estimate
    share = (np.count_nonzero(replicates < theta_hat) + 0.5 * np.count_nonzero(replicates == theta_hat)) / b
    z0 = float(special.ndtri(share))
    jk = jackknife[np.isfinite(jackknife)]
    dev = jk.mean() - jk if jk.shape[0] else jk
    denom = 6.0 * float(np.sum(dev**2)) ** 1.5
    accel = float(np.sum(dev**3)) / denom if denom > 0.0 else 0.0
    z = special.ndtri(np.array([alpha, 1.0 - alpha]))
    levels = special.ndtr(z0 + (z0 + z) / (1.0 - accel * (z0 + z)))
    if not np.isfinite(levels).all():
        return _NAN, _NAN
    lo, hi = np.quantile(replicates, levels)
    return float(lo), float(hi)


def _finish(
    replicates: FloatArray,
    theta_hat: float,
    n_clusters: int,
    confidence: float,
    method: str,
    jackknife: FloatArray | None,
) -> BootstrapResult:
    finite = replicates[np.isfinite(replicates)]
    n_invalid = int(replicates.shape[0] - finite.shape[0])
    if n_clusters < 2:
        lo = hi = se = _NAN
    else:
        lo, hi = _interval(finite, theta_hat, confidence, method, jackknife)
        se = float(np.std(finite, ddof=1)) if finite.shape[0] > 1 else _NAN
    return BootstrapResult(
        estimate=theta_hat,
        ci_low=lo,
        ci_high=hi,
        se=se,
        n_resamples=int(replicates.shape[0]),
        n_clusters=n_clusters,
        n_invalid=n_invalid,
        method=method,
        confidence=confidence,
        replicates=replicates,
    )


def bootstrap_cluster_sums(
    cluster_sums: npt.ArrayLike,
    statistic: Callable[[FloatArray], FloatArray],
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    method: BootstrapMethod = "percentile",
    seed: SeedLike = None,
    n_workers: int | None = None,
) -> BootstrapResult:
    """Task-cluster bootstrap of any statistic of column totals, computed from per-cluster sums only.

    ``cluster_sums`` is ``(C, k)``: row ``c`` holds cluster ``c``'s sufficient statistics (e.g. sum of
    values, number of rows). A resample draws ``C`` clusters with replacement; with ``N`` the ``(B, C)``
    matrix of draw counts (``N_b ~ Multinomial(C, 1/C)``), the resampled totals are ``T = N @ cluster_sums``
    and the replicates ``statistic(T)``. ``statistic`` maps ``(m, k)`` totals to ``(m,)`` values and must not
    depend on the number of clusters (ratios of totals do not), because BCa's jackknife evaluates it on the
    leave-one-cluster-out totals ``T - cluster_sums[c]``.

    ``N @ S`` is evaluated without materialising ``N``: row ``b`` of ``N @ S`` is ``sum_j S[idx_bj]`` for the
    ``C`` drawn indices, so each chunk of resamples is one ``np.take`` and one row sum per non-constant
    column (a column equal in every cluster, like the row count of a balanced design, costs nothing). The
    work is O(B * C * k) independent of the number of rows, threaded over blocks of resamples.

    ``method="percentile"`` takes the ``(1±confidence)/2`` quantiles of the replicates; ``"bca"`` shifts
    those levels by the bias correction ``z0 = Φ^-1(share of replicates < estimate)`` and the jackknife
    acceleration ``a = Σd³ / (6 (Σd²)^1.5)`` (Efron 1987), which is cheap here because the jackknife comes
    from sums too. Non-finite replicates are counted in ``n_invalid`` and left out.
    """
    _check_bootstrap_args(n_resamples, confidence, method)
    s = np.asarray(cluster_sums, dtype=np.float64)
    if s.ndim == 1:
        s = s[:, None]
    if s.ndim != 2:
        raise StatsInputError(f"cluster_sums must be (C, k), got shape {s.shape}")
    if not np.isfinite(s).all():
        raise StatsInputError("cluster_sums contains NaN or infinite values")
    n_clusters, k = s.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        theta_hat = float(np.asarray(statistic(s.sum(axis=0)[None, :]), dtype=np.float64).reshape(-1)[0])
    if n_clusters < 2:
        return _finish(np.full(n_resamples, theta_hat), theta_hat, n_clusters, confidence, method, None)

    cols: list[FloatArray | float] = []
    for j in range(k):
        col = np.ascontiguousarray(s[:, j])
        cols.append(float(col[0]) * n_clusters if (col == col[0]).all() else col)

    def consume(idx: IntArray) -> FloatArray:
        totals = np.empty((idx.shape[0], k))
        for j, col in enumerate(cols):
            if isinstance(col, float):
                totals[:, j] = col
            else:
                totals[:, j] = np.take(col, idx).sum(axis=1)
        return totals

    if n_clusters <= _DRAW_ELEMS:
        totals = _run_resamples(
            n_clusters, n_resamples, k, consume, seed, n_workers, max(1, _DRAW_ELEMS // n_clusters)
        )
    else:
        totals = _long_resample_totals(cols, n_clusters, n_resamples, seed, n_workers)
    jackknife = None
    with np.errstate(divide="ignore", invalid="ignore"):
        replicates = np.asarray(statistic(totals), dtype=np.float64).reshape(-1)
        if method == "bca":
            jackknife = np.asarray(statistic(s.sum(axis=0)[None, :] - s), dtype=np.float64).reshape(-1)
    if replicates.shape[0] != n_resamples:
        raise StatsInputError("statistic must return one value per row of totals")
    return _finish(replicates, theta_hat, n_clusters, confidence, method, jackknife)


def _long_resample_totals(
    cols: Sequence[FloatArray | float], n_clusters: int, n_resamples: int, seed: SeedLike, n_workers: int | None
) -> FloatArray:
    """The resampled column totals of :func:`bootstrap_cluster_sums` when one resample has more than
    ``_DRAW_ELEMS`` clusters (e.g. 100,000 single-pair clusters).

    The same indices as ``_run_resamples`` (one resample is ``integers(0, C, size=C)``; drawing it in pieces
    continues the same stream) and the same sums: each piece's values are gathered into a full-length row buffer
    and the row is summed with one ``sum`` of all ``C`` values, so numpy's pairwise summation sees the same
    operands in the same order and every replicate is bit for bit the one of a whole-row ``take(...).sum()``.
    Only the pieces' index arrays (512 KiB) are new per piece and stay in cache (issue 28: ~1.3x faster at
    100,000 clusters than whole rows on one thread).
    """
    k = len(cols)
    totals = np.empty((n_resamples, k))
    varying = [(j, col) for j, col in enumerate(cols) if not isinstance(col, float)]
    for j, col in enumerate(cols):
        if isinstance(col, float):
            totals[:, j] = col

    def fill(rng: np.random.Generator, first: int, stop: int) -> None:
        rows = [np.empty(n_clusters) for _ in varying]
        for r in range(first, stop):
            for a in range(0, n_clusters, _DRAW_ELEMS):
                b = min(n_clusters, a + _DRAW_ELEMS)
                idx = rng.integers(0, n_clusters, size=b - a, dtype=np.intp)
                for row, (_, col) in zip(rows, varying, strict=True):
                    # indices are in range: mode="clip" only spares take the buffered copy of mode="raise"
                    np.take(col, idx, out=row[a:b], mode="clip")
            for row, (j, _) in zip(rows, varying, strict=True):
                totals[r, j] = row.sum()

    _for_each_block(n_resamples, seed, n_workers, fill)
    return totals


def _ratio(t: FloatArray) -> FloatArray:
    return t[:, 0] / t[:, 1]


def _ratio_difference(t: FloatArray) -> FloatArray:
    return t[:, 0] / t[:, 1] - t[:, 2] / t[:, 3]


def _sums(codes: IntArray, n_clusters: int, *columns: FloatArray) -> FloatArray:
    return np.column_stack([np.bincount(codes, weights=col, minlength=n_clusters) for col in columns])


def bootstrap_mean(
    values: npt.ArrayLike,
    clusters: npt.ArrayLike,
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    method: BootstrapMethod = "percentile",
    seed: SeedLike = None,
    n_workers: int | None = None,
) -> BootstrapResult:
    """Cluster bootstrap of the overall mean (or proportion) ``sum(x) / n``.

    Sufficient statistics per cluster: ``(sum x, n_c)``; replicate ``b`` is ``Σ_c N_bc Σx_c / Σ_c N_bc n_c``,
    the pooled row mean of the resampled tasks. See :func:`bootstrap_cluster_sums` for the intervals.
    """
    x = _float_1d("values", values)
    codes, n_clusters = _factorize(clusters, x.shape[0])
    sums = _sums(codes, n_clusters, x, np.ones_like(x))
    return bootstrap_cluster_sums(
        sums,
        _ratio,
        n_resamples=n_resamples,
        confidence=confidence,
        method=method,
        seed=seed,
        n_workers=n_workers,
    )


def bootstrap_ratio(
    numerator: npt.ArrayLike,
    denominator: npt.ArrayLike,
    clusters: npt.ArrayLike,
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    method: BootstrapMethod = "percentile",
    seed: SeedLike = None,
    n_workers: int | None = None,
) -> BootstrapResult:
    """Cluster bootstrap of a ratio of sums, e.g. cost per success ``Σ cost / Σ success``.

    Per cluster ``(Σ numerator, Σ denominator)``; replicate ``b`` is ``(N_b @ num_c) / (N_b @ den_c)``.
    A resample whose denominator total is 0 gives a non-finite replicate, reported in ``n_invalid``.
    """
    num = _float_1d("numerator", numerator)
    den = _float_1d("denominator", denominator)
    _same_length(numerator=num, denominator=den)
    codes, n_clusters = _factorize(clusters, num.shape[0])
    sums = _sums(codes, n_clusters, num, den)
    return bootstrap_cluster_sums(
        sums,
        _ratio,
        n_resamples=n_resamples,
        confidence=confidence,
        method=method,
        seed=seed,
        n_workers=n_workers,
    )


def bootstrap_paired_mean_difference(
    baseline: npt.ArrayLike,
    candidate: npt.ArrayLike,
    clusters: npt.ArrayLike,
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    method: BootstrapMethod = "percentile",
    seed: SeedLike = None,
    n_workers: int | None = None,
) -> BootstrapResult:
    """Cluster bootstrap of the mean paired difference ``mean(candidate - baseline)``.

    Tasks are resampled with all their pairs, so both arms move together. Per cluster ``(Σ d, n_c)`` with
    ``d = candidate - baseline``; replicate ``b`` is ``N_b @ Σd_c / N_b @ n_c``.
    """
    b = _float_1d("baseline", baseline)
    c = _float_1d("candidate", candidate)
    _same_length(baseline=b, candidate=c)
    codes, n_clusters = _factorize(clusters, b.shape[0])
    sums = _sums(codes, n_clusters, c - b, np.ones_like(b))
    return bootstrap_cluster_sums(
        sums,
        _ratio,
        n_resamples=n_resamples,
        confidence=confidence,
        method=method,
        seed=seed,
        n_workers=n_workers,
    )


def bootstrap_paired_ratio_difference(
    baseline_numerator: npt.ArrayLike,
    baseline_denominator: npt.ArrayLike,
    candidate_numerator: npt.ArrayLike,
    candidate_denominator: npt.ArrayLike,
    clusters: npt.ArrayLike,
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    method: BootstrapMethod = "percentile",
    seed: SeedLike = None,
    n_workers: int | None = None,
) -> BootstrapResult:
    """Cluster bootstrap of ``Σ cand_num / Σ cand_den - Σ base_num / Σ base_den`` over matched rows.

    E.g. the change in cost per success between two policies run on the same tasks. Four sufficient
    statistics per cluster; both ratios are recomputed on the same resampled tasks in every replicate.
    """
    bn = _float_1d("baseline_numerator", baseline_numerator)
    bd = _float_1d("baseline_denominator", baseline_denominator)
    cn = _float_1d("candidate_numerator", candidate_numerator)
    cd = _float_1d("candidate_denominator", candidate_denominator)
    _same_length(
        baseline_numerator=bn, baseline_denominator=bd, candidate_numerator=cn, candidate_denominator=cd
    )
    codes, n_clusters = _factorize(clusters, bn.shape[0])
    sums = _sums(codes, n_clusters, cn, cd, bn, bd)
    return bootstrap_cluster_sums(
        sums,
        _ratio_difference,
        n_resamples=n_resamples,
        confidence=confidence,
        method=method,
        seed=seed,
        n_workers=n_workers,
    )


# --------------------------------------------------------------------------------------------- quantiles


def _quantile_targets(total_weight: npt.NDArray[np.int64], qs: FloatArray) -> npt.NDArray[np.int64]:
    """Integer cumulative-weight targets ``max(ceil(q W), 1)`` of the inverted-CDF quantile, ``(r, nq)``."""
    return np.maximum(np.ceil(np.multiply.outer(total_weight, qs)), 1).astype(np.int64)


def _weighted_quantiles_sorted(
    sorted_values: FloatArray,
    sorted_codes: IntArray,
    counts: npt.NDArray[np.int64],
    qs: FloatArray,
) -> FloatArray:
    """Inverted-CDF quantiles of rows weighted by their cluster's draw count, one row per resample.

    ``counts`` is ``(r, C)``. Row weights ``w = counts[:, code]`` (in value order) are accumulated and the
    ``q``-quantile is the first value whose cumulative weight reaches ``max(ceil(q W), 1)`` — exactly
    ``np.quantile(expanded_rows, q, method="inverted_cdf")`` of the resample with each row repeated. Rows
    are processed in slices of about ``_CHUNK_ELEMS`` weights to bound memory.
    """
    r, n = counts.shape[0], sorted_values.shape[0]
    out = np.empty((r, qs.shape[0]))
    step = max(1, _CHUNK_ELEMS // max(n, 1))
    for s in range(0, r, step):
        cum = np.take(counts[s : s + step], sorted_codes, axis=1)
        np.cumsum(cum, axis=1, out=cum)
        targets = _quantile_targets(cum[:, -1], qs)
        for i in range(cum.shape[0]):
            out[s + i] = sorted_values[np.searchsorted(cum[i], targets[i], side="left")]
    return out


class _QuantileKernel:
    """Weighted quantiles of cluster resamples, exact, with a windowed fast path.

    The full computation accumulates a weight for each of the ``n`` rows per resample. But a resampled
    quantile lands close to the original one, so per quantile we keep a window ``[lo, hi)`` of sorted
    positions around it and precompute ``below[c]`` = rows of cluster ``c`` before ``lo``. For a resample
    with draw counts ``N`` the weight before the window is ``N @ below`` and the total is ``N @ sizes`` (one
    small matrix product for all quantiles), so only the ``hi - lo`` window rows need cumulative weights.
    Whenever the target falls outside the window the resample is recomputed with the full method, so the
    result is identical; the window half-width is 8 bootstrap SDs (in rows) of the weight below the
    original quantile plus 64, so fallbacks are rare.
    """

    def __init__(
        self, sorted_values: FloatArray, sorted_codes: IntArray, n_clusters: int, qs: FloatArray
    ) -> None:
        self.values = sorted_values
        self.codes = sorted_codes
        self.qs = qs
        n = sorted_values.shape[0]
        sizes = np.bincount(sorted_codes, minlength=n_clusters)
        self.windows: list[tuple[int, int, IntArray] | None] = []
        mats: list[npt.NDArray[np.int64]] = [sizes]
        for q in qs:
            pos = int(_quantile_targets(np.array([n], dtype=np.int64), np.array([q]))[0, 0]) - 1
            upto = np.bincount(sorted_codes[: pos + 1], minlength=n_clusters)
            # bootstrap variance of the resampled weight up to `pos` minus its target: C * Var_c(upto - q n_c)
            dev = upto - q * sizes
            half = math.ceil(8.0 * math.sqrt(n_clusters * float(np.var(dev)))) + 64
            lo, hi = max(0, pos - half), min(n, pos + half + 1)
            if hi - lo >= n // 2:
                self.windows.append(None)
                continue
            self.windows.append((lo, hi, np.ascontiguousarray(sorted_codes[lo:hi])))
            mats.append(np.bincount(sorted_codes[:lo], minlength=n_clusters))
        # integer sums of at most C * n stay exact in float64 for any realistic size
        self.proj = np.column_stack(mats).astype(np.float64)

    def __call__(self, counts: npt.NDArray[np.int64], *, force_full: bool = False) -> FloatArray:
        r = counts.shape[0]
        if force_full or all(w is None for w in self.windows):
            return _weighted_quantiles_sorted(self.values, self.codes, counts, self.qs)
        proj = np.rint(counts.astype(np.float64) @ self.proj).astype(np.int64)
        targets = _quantile_targets(proj[:, 0], self.qs)
        out = np.empty((r, self.qs.shape[0]))
        full = np.zeros(r, dtype=bool)
        col = 1
        for j, window in enumerate(self.windows):
            if window is None:
                full[:] = True
                continue
            lo, _hi, wcodes = window
            below = proj[:, col]
            col += 1
            cum = np.take(counts, wcodes, axis=1)
            np.cumsum(cum, axis=1, out=cum)
            cum += below[:, None]
            t = targets[:, j]
            inside = (below < t) & (cum[:, -1] >= t)
            pos = lo + np.count_nonzero(cum < t[:, None], axis=1)
            out[inside, j] = self.values[pos[inside]]
            full |= ~inside
        if full.any():
            out[full] = _weighted_quantiles_sorted(self.values, self.codes, counts[full], self.qs)
        return out


def bootstrap_quantiles(
    values: npt.ArrayLike,
    clusters: npt.ArrayLike,
    quantiles: Sequence[float] = (0.5, 0.99),
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: SeedLike = None,
    n_workers: int | None = None,
) -> tuple[BootstrapResult, ...]:
    """Cluster-bootstrap percentile intervals for quantiles (e.g. P50 / P99 latency), one result per ``q``.

    Quantiles do not decompose into per-cluster sums, so each resample is a weighted quantile over rows with
    row weight = the number of times its task was drawn. The rows are sorted once; per chunk of resamples the
    draw counts ``(r, C)`` come from one ``np.bincount``, are gathered to rows in value order, accumulated
    with ``cumsum`` and searched with ``searchsorted`` for the first cumulative weight ``>= max(ceil(q W),
    1)``. Only a window of rows around each quantile is accumulated (the weight before the window is one
    matrix product of the draw counts with per-cluster row counts); resamples whose quantile falls outside
    the window are recomputed over all rows, so the answer is exact. Cost about O(B * (C + window));
    memory bounded by chunks of about 2**19 elements.

    The quantile definition is the inverted CDF (Hyndman–Fan type 1, ``np.quantile(...,
    method="inverted_cdf")``): always an observed value, well defined for integer weights. ``estimate`` uses
    the same definition on the original rows. Percentile intervals only (BCa's jackknife would need C full
    re-evaluations).
    """
    _check_bootstrap_args(n_resamples, confidence, "percentile")
    x = _float_1d("values", values)
    qs = np.asarray(quantiles, dtype=np.float64).reshape(-1)
    if qs.shape[0] == 0 or not ((qs >= 0.0) & (qs <= 1.0)).all():
        raise StatsInputError(f"quantiles must be a non-empty sequence in [0, 1], got {quantiles!r}")
    codes, n_clusters = _factorize(clusters, x.shape[0])
    n = x.shape[0]
    if n == 0:
        reps = np.full(n_resamples, _NAN)
        return tuple(_finish(reps, _NAN, 0, confidence, "percentile", None) for _ in qs)
    # Any order of tied values gives the same quantiles (a tie group's cumulative weight before and after it does
    # not depend on its order, and every row in it has the same value), so the unstable argsort (~2x faster
    # than a stable one) changes no result.
    order = np.argsort(x)
    sorted_values = x[order]
    sorted_codes = codes[order]
    theta = sorted_values[_quantile_targets(np.array([n], dtype=np.int64), qs)[0] - 1]
    if n_clusters < 2:
        return tuple(
            _finish(np.full(n_resamples, t), float(t), n_clusters, confidence, "percentile", None)
            for t in theta
        )
    c = n_clusters
    kernel = _QuantileKernel(sorted_values, sorted_codes, c, qs)
    widest = max([c] + [w[1] - w[0] for w in kernel.windows if w is not None])

    def consume(idx: IntArray) -> FloatArray:
        r = idx.shape[0]
        flat = (idx + (np.arange(r, dtype=np.int64) * c)[:, None]).reshape(-1)
        counts = np.bincount(flat, minlength=r * c).reshape(r, c).astype(np.int64, copy=False)
        return kernel(counts)

    reps = _run_resamples(
        c, n_resamples, qs.shape[0], consume, seed, n_workers, max(1, _CHUNK_ELEMS // widest)
    )
    return tuple(
        _finish(np.ascontiguousarray(reps[:, j]), float(theta[j]), c, confidence, "percentile", None)
        for j in range(qs.shape[0])
    )


# --------------------------------------------------------------------------------------------- pass@k


def _pass_counts(
    n_samples: npt.ArrayLike, n_success: npt.ArrayLike, k: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    n = np.asarray(n_samples)
    c = np.asarray(n_success)
    if n.shape != c.shape:
        raise StatsInputError(f"n_samples {n.shape} and n_success {c.shape} differ in shape")
    if (n.size and not np.all(n == np.round(n))) or (c.size and not np.all(c == np.round(c))):
        raise StatsInputError("n_samples and n_success must be whole numbers")
    n = n.astype(np.int64)
    c = c.astype(np.int64)
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise StatsInputError(f"k must be a positive integer, got {k!r}")
    if ((c < 0) | (c > n)).any():
        raise StatsInputError("need 0 <= n_success <= n_samples for every task")
    if (n < k).any():
        raise StatsInputError(f"every task needs at least k={k} samples for the unbiased estimator")
    return n, c


def pass_at_k(n_samples: npt.ArrayLike, n_success: npt.ArrayLike, k: int) -> FloatArray:
    """Unbiased pass@k per task: ``1 - C(n-c, k) / C(n, k)`` (Chen et al., 2021).

    The probability that at least one of ``k`` samples drawn without replacement from the task's ``n``
    attempts (``c`` successes) succeeds. Computed in product form, never with binomials::

        C(n-c, k) / C(n, k) = prod_{i=0}^{k-1} (1 - c / (n - i))

    as ``-expm1(Σ log1p(-c / (n - i)))``, accurate for tiny and near-1 values; 1 when ``n - c < k``.
    Vectorised over tasks (arrays of any matching shape); requires ``n >= k`` for every task.
    """
    n, c = _pass_counts(n_samples, n_success, k)
    out = np.ones(n.shape, dtype=np.float64)
    ok = (n - c) >= k
    nv = n[ok].astype(np.float64)
    cv = c[ok].astype(np.float64)
    log_ratio = np.zeros(nv.shape)
    for i in range(int(k)):
        log_ratio += np.log1p(-cv / (nv - i))
    out[ok] = -np.expm1(log_ratio)
    return out


def pass_hat_k(n_samples: npt.ArrayLike, n_success: npt.ArrayLike, k: int) -> FloatArray:
    """Unbiased pass^k per task (all ``k`` succeed): ``C(c, k) / C(n, k) = prod_{i<k} (c - i) / (n - i)``.

    The probability that ``k`` attempts drawn without replacement are all successes (a reliability metric,
    tau-bench's pass^k); 0 when ``c < k``. Product form, vectorised over tasks; requires ``n >= k``.
    """
    n, c = _pass_counts(n_samples, n_success, k)
    out = np.ones(n.shape, dtype=np.float64)
    nf = n.astype(np.float64)
    cf = c.astype(np.float64)
    for i in range(int(k)):
        out *= np.maximum(cf - i, 0.0) / (nf - i)
    return out


# --------------------------------------------------------------------------------------------- power


def _z_sum(alpha: float, power: float) -> float:
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise StatsInputError(f"alpha and power must be in (0, 1), got {alpha}, {power}")
    return float(special.ndtri(1.0 - alpha / 2.0) + special.ndtri(power))


def minimum_detectable_difference(
    se: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    n_clusters_observed: int | None = None,
    n_clusters: int | None = None,
) -> float:
    """Minimum detectable difference of a two-sided paired test: ``MDD = (z_{1-α/2} + z_power) * SE``.

    ``se`` is the observed clustered SE of the paired difference (:func:`paired_difference`). To project to
    a different number of tasks pass ``n_clusters_observed`` and ``n_clusters``: the clustered SE scales as
    ``1/sqrt(C)`` at fixed seeds per task, so ``SE_C = SE * sqrt(C_obs / C)``. Normal quantiles (a planning
    approximation; at alpha=0.05, power=0.8 the multiplier is 2.80).
    """
    if se < 0 or not math.isfinite(se):
        raise StatsInputError(f"se must be finite and >= 0, got {se}")
    scale = 1.0
    if (n_clusters_observed is None) != (n_clusters is None):
        raise StatsInputError("pass both n_clusters_observed and n_clusters, or neither")
    if n_clusters_observed is not None and n_clusters is not None:
        if n_clusters_observed < 1 or n_clusters < 1:
            raise StatsInputError("cluster counts must be >= 1")
        scale = math.sqrt(n_clusters_observed / n_clusters)
    return _z_sum(alpha, power) * se * scale


def tasks_needed(
    difference: float,
    se: float,
    n_clusters_observed: int,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
) -> int:
    """Number of tasks needed to detect ``difference`` with the given power (two-sided test at ``alpha``).

    Solving ``(z_{1-α/2} + z_power) * SE * sqrt(C_obs / C) <= |difference|`` for ``C``::

        C = ceil( C_obs * ((z_{1-α/2} + z_power) * SE / difference)^2 )

    assuming the per-task variance and seeds per task of the observed run; at least 2.
    """
    if not math.isfinite(difference) or difference == 0.0:
        raise StatsInputError(f"difference must be finite and non-zero, got {difference}")
    if se < 0 or not math.isfinite(se):
        raise StatsInputError(f"se must be finite and >= 0, got {se}")
    if n_clusters_observed < 1:
        raise StatsInputError("n_clusters_observed must be >= 1")
    needed = n_clusters_observed * (_z_sum(alpha, power) * se / difference) ** 2
    return max(2, math.ceil(needed * (1.0 - 1e-12)))
