"""Benchmark: paired task-cluster bootstrap (evaluators/stats.py) against scipy.stats.bootstrap.

Two designs over the same 100,000 matched (baseline, candidate) pairs:

* ``2000x50``: 2,000 tasks x 50 seeds, tasks are the clusters (the realistic eval layout);
* ``100000x1``: the same pairs, every pair its own cluster (where cluster and row bootstrap coincide).

For each design the script times ``bootstrap_paired_mean_difference`` (percentile, and BCa unless
``--skip-bca``) with 10,000 resamples, and compares with ``scipy.stats.bootstrap(paired=True,
method="percentile")``:

* speed: scipy on the 100,000 pair rows, the call the issue timed (~12 s there); for ``100000x1`` it computes
  exactly the same bootstrap as ours. It is run once; both designs are compared with it.
* intervals: for ``2000x50`` scipy on the 2,000 per-task mean pairs (with 50 seeds in every task, resampling
  tasks == resampling task means), for ``100000x1`` the row run above. The two runs use different random
  streams, so endpoints agree up to Monte Carlo error; the difference is printed in units of its MC SD
  (sqrt(2) * sqrt(p(1-p)/B) / phi(z_p) * bootstrap SE).

scipy is given ``batch=--scipy-batch`` (default 1000): with ``batch=None`` it materialises all 10,000 x
100,000 resample indices and data at once (over 24 GB). Usage::

    python bench/bench_bootstrap.py [--n-resamples 10000] [--workers N] [--skip-bca] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy
from scipy import stats as sps
from trajlake.evaluators.stats import BootstrapResult, bootstrap_paired_mean_difference, paired_difference


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-resamples", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None, help="threads for ours (default: CPUs, at most 8)")
    ap.add_argument("--skip-bca", action="store_true", help="skip the BCa runs (ours and scipy)")
    ap.add_argument(
        "--scipy-batch", type=int, default=250, help="scipy batch size; 0 means None (all at once)"
    )
    ap.add_argument("--repeat", type=int, default=1, help="time every run this many times, keep the fastest")
    args = ap.parse_args()
    n_res, rep = args.n_resamples, args.repeat
    batch = args.scipy_batch or None

    rng = np.random.default_rng(args.seed)
    base, cand, tasks = make_pairs(2_000, 50, rng)
    singles = np.arange(base.size)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}, "
        f"{cpus} CPUs, load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at start"
    )
    print(f"{base.size:,} pairs, {n_res:,} resamples, scipy batch={batch}, fastest of {rep} run(s)\n")

    print("scipy.stats.bootstrap(paired=True, method='percentile') on the 100,000 pair rows", flush=True)
    ref_rows, t_scipy = scipy_boot(base, cand, "percentile", n_res, args.seed + 1, batch, rep)
    print(f"    {t_scipy:.2f} s\n")

    summary: list[str] = []
    designs = [
        ("2000x50: 2,000 task clusters of 50 pairs", tasks),
        ("100000x1: 100,000 clusters of 1", singles),
    ]
    for name, clusters in designs:
        print(name)
        ana = paired_difference(base, cand, clusters)
        print(f"    clustered t interval (C-1 df)  {fmt_ci(ana.ci_low, ana.ci_high)}   se {ana.se:.5f}")
        runs: list[tuple[str, str, int | None]] = [("percentile", "percentile", args.workers)]
        runs.append(("percentile, 1 thread", "percentile", 1))
        if not args.skip_bca:
            runs.append(("bca", "bca", args.workers))
        results: dict[str, BootstrapResult] = {}
        times: dict[str, float] = {}
        for label, method, workers in runs:

            def run(
                method: str = method, workers: int | None = workers, clusters: np.ndarray = clusters
            ) -> Any:
                return bootstrap_paired_mean_difference(
                    base, cand, clusters, n_resamples=n_res, method=method, seed=args.seed, n_workers=workers
                )

            res, secs = timed(run, rep)
            results[label], times[label] = res, secs
            print(
                f"    ours {label:<22} {secs:7.3f} s   {fmt_ci(res.ci_low, res.ci_high)}   "
                f"speed-up vs scipy on rows {t_scipy / secs:6.1f}x"
            )
        if clusters is tasks:
            mb = base.reshape(2_000, 50).mean(axis=1)
            mc = cand.reshape(2_000, 50).mean(axis=1)
            ref_pct, t_ref = scipy_boot(mb, mc, "percentile", n_res, args.seed + 2, batch, rep)
            print(
                f"    scipy percentile, 2,000 task means {t_ref:7.3f} s   "
                f"(same bootstrap; ours is {t_ref / times['percentile']:.1f}x faster)"
            )
            line, gap = compare("percentile vs scipy on task means", results["percentile"], ref_pct, n_res)
            print(line)
            summary.append(
                f"2000x50 : {t_scipy / times['percentile']:.0f}x faster than scipy on the rows, "
                f"{t_ref / times['percentile']:.1f}x than scipy on task means; intervals within {gap:.1f} MC SD"
            )
            if not args.skip_bca:
                ref_bca, t_bca = scipy_boot(mb, mc, "BCa", n_res, args.seed + 3, batch, rep)
                print(f"    scipy BCa, 2,000 task means        {t_bca:7.3f} s")
                line, gap = compare("BCa vs scipy BCa on task means", results["bca"], ref_bca, n_res)
                print(line)
            rlo, rhi = ref_rows.confidence_interval
            print(f"    scipy on rows ignores the tasks:   {fmt_ci(rlo, rhi)}  (too narrow)")
        else:
            line, gap = compare("percentile vs scipy on rows", results["percentile"], ref_rows, n_res)
            print(line)
            summary.append(
                f"100000x1: {t_scipy / times['percentile']:.1f}x faster than scipy "
                f"({t_scipy / times['percentile, 1 thread']:.1f}x on 1 thread); intervals within {gap:.1f} MC SD"
            )
            if not args.skip_bca:
                print("    scipy BCa on 100,000 rows: not run (its jackknife is 100,000 x 99,999 values)")
        print()
    print("summary")
    for line in summary:
        print("    " + line)


if __name__ == "__main__":
    main()
