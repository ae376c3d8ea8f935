"""Benchmark: paired task-cluster bootstrap (evaluators/stats.py) against scipy.stats.bootstrap.

Two designs over the same 100,000 matched (baseline, candidate) pairs:

* ``2000x50``: 2,000 tasks x 50 seeds, tasks are the clusters (the realistic eval layout);
* ``100000x1``: the same pairs, every pair its own cluster (where cluster and row bootstrap coincide).

For each design the script times ``bootstrap_paired_mean_difference`` (percentile; with ``--workers`` threads,
default the CPUs, and on one thread) with 10,000 resamples, and ``scipy.stats.bootstrap(paired=True,
method="percentile")`` on the same data:

* ``100000x1`` against scipy on the 100,000 pair rows (exactly the same bootstrap as ours);
* ``2000x50`` against scipy on the 2,000 per-task mean pairs (with 50 seeds in every task, resampling tasks ==
  resampling task means: the same bootstrap).

All arms run in ``--rounds`` rounds, the order reversed every other round, so the load of a shared machine weighs
on both sides; each round gives one ratio and the median is reported (issue 28). The two sides use different
random streams, so endpoints agree up to Monte Carlo error; the difference is printed in units of its MC SD
(sqrt(2) * sqrt(p(1-p)/B) / phi(z_p) * bootstrap SE). "Drawing the indices alone" times just the
``Generator.integers`` draws ours makes (the same stream): the floor under any implementation that keeps the
results for a given seed.

scipy is given ``batch=--scipy-batch`` (default 250): with ``batch=None`` it materialises all 10,000 x
100,000 resample indices and data at once (over 24 GB). Usage::

    OMP_NUM_THREADS=1 python bench/bench_bootstrap.py [--n-resamples 10000] [--workers N] [--rounds 2]
                                                      [--skip-bca] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy
from scipy import stats as sps
from trajlake.evaluators.stats import (
    BootstrapResult,
    _block_generators,
    bootstrap_paired_mean_difference,
    paired_difference,
)


def make_pairs(
    n_tasks: int, seeds: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Success-like scores with a task difficulty shared by both arms and a task-dependent effect."""
    tasks = np.repeat(np.arange(n_tasks), seeds)
    difficulty = rng.normal(0.0, 1.0, n_tasks)[tasks]
    baseline = difficulty + rng.normal(0.0, 1.0, tasks.size)
    candidate = baseline + 0.05 + rng.normal(0.0, 0.3, n_tasks)[tasks] + rng.normal(0.0, 1.0, tasks.size)
    return baseline, candidate, tasks


def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[Any, float]:
    """Run ``fn`` ``repeat`` times; return its (last) result and the fastest wall time."""
    best = math.inf
    out = None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return out, best


def mean_diff(b: np.ndarray, c: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(c - b, axis=axis)


def scipy_boot(
    b: np.ndarray, c: np.ndarray, method: str, n_resamples: int, seed: int, batch: int | None, repeat: int
) -> tuple[Any, float]:
    def run() -> Any:
        return sps.bootstrap(
            (b, c),
            mean_diff,
            paired=True,
            vectorized=True,
            method=method,
            n_resamples=n_resamples,
            batch=batch,
            rng=seed,
        )

    return timed(run, repeat)


def mc_sd(se_boot: float, n_resamples: int, confidence: float = 0.95) -> float:
    p = (1 - confidence) / 2
    return math.sqrt(2 * p * (1 - p) / n_resamples) / sps.norm.pdf(sps.norm.ppf(p)) * se_boot


def fmt_ci(lo: float, hi: float) -> str:
    return f"[{lo:+.5f}, {hi:+.5f}]"


def compare(label: str, ours: BootstrapResult, ref: Any, n_resamples: int) -> tuple[str, float]:
    """One line comparing two percentile-type intervals; also the larger endpoint gap in MC SDs."""
    lo, hi = ref.confidence_interval
    sd = mc_sd(float(ref.standard_error), n_resamples)
    z_lo, z_hi = (ours.ci_low - lo) / sd, (ours.ci_high - hi) / sd
    line = (
        f"    {label:<36} ours {fmt_ci(ours.ci_low, ours.ci_high)}  scipy {fmt_ci(lo, hi)}  "
        f"gap/MC-SD ({z_lo:+.2f}, {z_hi:+.2f})"
    )
    return line, max(abs(z_lo), abs(z_hi))


def draws_only(n_clusters: int, n_resamples: int, seed: int) -> float:
    """Seconds to draw just the resamples' cluster indices, the same stream as ours (``Generator.integers`` per
    block of 256 resamples, in cache-sized pieces): the floor under any bootstrap with these resamples."""
    gens = _block_generators(seed, -(-n_resamples // 256))
    piece = 1 << 16
    start = time.perf_counter()
    for b, g in enumerate(gens):
        for _ in range(min(256, n_resamples - 256 * b)):
            for a in range(0, n_clusters, piece):
                g.integers(0, n_clusters, size=min(piece, n_clusters - a), dtype=np.intp)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-resamples", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None, help="threads for ours (default: CPUs, at most 8)")
    ap.add_argument("--skip-bca", action="store_true", help="skip the BCa runs (ours and scipy)")
    ap.add_argument(
        "--scipy-batch", type=int, default=250, help="scipy batch size; 0 means None (all at once)"
    )
    ap.add_argument("--rounds", type=int, default=2,
                    help="alternating rounds (scipy then ours, ours then scipy, ...); one ratio per round")
    args = ap.parse_args()
    n_res = args.n_resamples
    batch = args.scipy_batch or None

    rng = np.random.default_rng(args.seed)
    base, cand, tasks = make_pairs(2_000, 50, rng)
    singles = np.arange(base.size)
    mb = base.reshape(2_000, 50).mean(axis=1)
    mc = cand.reshape(2_000, 50).mean(axis=1)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}, "
        f"{cpus} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at start"
    )
    print(f"{base.size:,} pairs, {n_res:,} resamples, scipy batch={batch}, {args.rounds} alternating round(s)\n")

    def ours(clusters: np.ndarray, workers: int | None, method: str = "percentile") -> Callable[[], Any]:
        return lambda: bootstrap_paired_mean_difference(
            base, cand, clusters, n_resamples=n_res, method=method, seed=args.seed, n_workers=workers
        )

    # every arm: (label, function); each round runs them all, the order reversed every other round, so load
    # that rises or falls during the run weighs on scipy and on ours alike
    arms: list[tuple[str, Callable[[], Any]]] = [
        ("scipy rows", lambda: scipy_boot(base, cand, "percentile", n_res, args.seed + 1, batch, 1)[0]),
        ("ours 100000x1", ours(singles, args.workers)),
        ("ours 100000x1, 1 thread", ours(singles, 1)),
        ("scipy task means", lambda: scipy_boot(mb, mc, "percentile", n_res, args.seed + 2, batch, 1)[0]),
        ("ours 2000x50", ours(tasks, args.workers)),
        ("ours 2000x50, 1 thread", ours(tasks, 1)),
    ]
    secs: dict[str, list[float]] = {label: [] for label, _ in arms}
    results: dict[str, Any] = {}
    for r in range(args.rounds):
        order = arms if r % 2 == 0 else arms[::-1]
        line = []
        for label, fn in order:
            res, t = timed(fn)
            results[label] = res
            secs[label].append(t)
            line.append(f"{label} {t:.3f} s")
        print(f"round {r + 1} (load {os.getloadavg()[0]:.1f}): " + ", ".join(line), flush=True)
    floor_single = draws_only(base.size, n_res, args.seed)
    floor_tasks = draws_only(2_000, n_res, args.seed)
    print()

    def ratios(num: str, den: str) -> str:
        per = [a / b for a, b in zip(secs[num], secs[den], strict=True)]
        return f"{statistics.median(per):.1f}x (per round " + ", ".join(f"{x:.1f}" for x in per) + ")"

    summary: list[str] = []
    ref_rows = results["scipy rows"]
    print("2000x50: 2,000 task clusters of 50 pairs")
    ana = paired_difference(base, cand, tasks)
    print(f"    clustered t interval (C-1 df)  {fmt_ci(ana.ci_low, ana.ci_high)}   se {ana.se:.5f}")
    for label in ("ours 2000x50", "ours 2000x50, 1 thread"):
        res = results[label]
        print(f"    {label:<28} {min(secs[label]):7.3f} s   {fmt_ci(res.ci_low, res.ci_high)}   "
              f"vs scipy on task means {ratios('scipy task means', label)}")
    print(f"    scipy percentile, 2,000 task means {min(secs['scipy task means']):7.3f} s (same bootstrap)")
    print(f"    drawing the indices alone          {floor_tasks:7.3f} s (ours 1 thread / draws "
          f"{min(secs['ours 2000x50, 1 thread']) / floor_tasks:.2f}x)")
    line, gap = compare("percentile vs scipy on task means", results["ours 2000x50"],
                        results["scipy task means"], n_res)
    print(line)
    summary.append(
        f"2000x50 : {ratios('scipy task means', 'ours 2000x50')} faster than scipy on task means "
        f"({ratios('scipy task means', 'ours 2000x50, 1 thread')} on 1 thread), "
        f"{ratios('scipy rows', 'ours 2000x50')} than scipy on the rows; intervals within {gap:.1f} MC SD"
    )
    if not args.skip_bca:
        ours_bca = ours(tasks, args.workers, "bca")()
        ref_bca, t_bca = scipy_boot(mb, mc, "BCa", n_res, args.seed + 3, batch, 1)
        print(f"    scipy BCa, 2,000 task means        {t_bca:7.3f} s")
        line, gap = compare("BCa vs scipy BCa on task means", ours_bca, ref_bca, n_res)
        print(line)
    rlo, rhi = ref_rows.confidence_interval
    print(f"    scipy on rows ignores the tasks:   {fmt_ci(rlo, rhi)}  (too narrow)\n")

    print("100000x1: 100,000 clusters of 1")
    ana = paired_difference(base, cand, singles)
    print(f"    clustered t interval (C-1 df)  {fmt_ci(ana.ci_low, ana.ci_high)}   se {ana.se:.5f}")
    for label in ("ours 100000x1", "ours 100000x1, 1 thread"):
        res = results[label]
        print(f"    {label:<28} {min(secs[label]):7.3f} s   {fmt_ci(res.ci_low, res.ci_high)}   "
              f"vs scipy on rows {ratios('scipy rows', label)}")
    print(f"    scipy percentile on the rows       {min(secs['scipy rows']):7.3f} s (same bootstrap)")
    print(f"    drawing the indices alone          {floor_single:7.3f} s (ours 1 thread / draws "
          f"{min(secs['ours 100000x1, 1 thread']) / floor_single:.2f}x; scipy / draws "
          f"{min(secs['scipy rows']) / floor_single:.1f}x)")
    line, gap = compare("percentile vs scipy on rows", results["ours 100000x1"], ref_rows, n_res)
    print(line)
    summary.append(
        f"100000x1: {ratios('scipy rows', 'ours 100000x1')} faster than scipy "
        f"({ratios('scipy rows', 'ours 100000x1, 1 thread')} on 1 thread); intervals within {gap:.1f} MC SD"
    )
    if not args.skip_bca:
        print("    scipy BCa on 100,000 rows: not run (its jackknife is 100,000 x 99,999 values)")
    print()
    print("summary")
    for line in summary:
        print("    " + line)


if __name__ == "__main__":
    main()
