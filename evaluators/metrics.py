"""The metric vector of a run (or of a run x split x env_version slice) and the paired comparison of two runs.

Every metric is computed from the per-episode rows of ``episode_metrics.sql`` (and the per-call rows of
``tool_latency.sql``) with the statistics of :mod:`trajlake.evaluators.stats`; the unit of independence is the
task (all seeds and attempts of a task form one cluster):

===========  ===============================================  ==============================================
kind         one run                                          candidate - baseline over matched pairs
===========  ===============================================  ==============================================
mean         ``clustered_mean`` (task-clustered SE, t CI)     ``paired_difference`` (clustered SE of the
                                                              paired differences, t CI and p-value); for
                                                              success metrics the p-value is McNemar exact
ratio        ``bootstrap_ratio`` (task-cluster bootstrap)     ``bootstrap_paired_ratio_difference``
quantile     ``bootstrap_quantiles`` (task-cluster bootstrap)  both arms' ``bootstrap_quantiles`` on the same
                                                              resampled tasks; replicate differences
pass@k       ``task_mean`` of per-task ``pass_at_k``          ``paired_difference`` of per-task values
===========  ===============================================  ==============================================

Bootstrap p-values invert the percentile interval: ``p = min(1, 2 min((#{d* <= 0} + 1)/(B + 1),
(#{d* >= 0} + 1)/(B + 1)))`` over the finite replicates ``d*``.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from trajlake.evaluators.stats import (
    BootstrapResult,
    Estimate,
    StatsInputError,
    _clustered,
    _factorize,
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

__all__ = [
    "ERROR_CLASSES",
    "METRICS",
    "PASS_K",
    "TERMINATION_REASONS",
    "MetricSpec",
    "Settings",
    "bootstrap_p_value",
    "compare",
    "metric_vector",
    "paired_quantile_difference",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

ERROR_CLASSES: tuple[str, ...] = (
    "MODEL_INVALID_ACTION", "MODEL_BAD_PLAN", "ENV_TRANSIENT", "ENV_BUG", "SAFETY_BLOCK", "BUDGET_EXHAUSTED")
TERMINATION_REASONS: tuple[str, ...] = (
    "success", "submitted", "gave_up", "budget_steps", "budget_tokens", "budget_cost", "timeout", "safety_stop",
    "env_failure")
#: k values reported for pass@k / pass^k when every task of the group has at least k samples.
PASS_K: tuple[int, ...] = (2, 3, 5, 10, 20, 50, 100)

Kind = Literal["mean", "ratio", "quantile"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the vector.

    ``column`` (and ``denominator`` for ratios) name columns of ``eval_episode_metrics``; quantiles of
    ``source="tool"`` use the per-call latencies of ``tool_latency.sql``. ``subset`` restricts a mean to the
    episodes where that column is 1 (in a comparison: pairs where it is 1 on both sides). ``binary`` metrics
    get McNemar's exact test in comparisons.
    """

    name: str
    kind: Kind
    column: str
    description: str
    unit: str = ""
    better: Literal["higher", "lower", ""] = ""
    denominator: str = ""
    subset: str = ""
    q: float = 0.0
    source: Literal["episode", "tool"] = "episode"
    binary: bool = False


def _m(name: str, column: str, description: str, unit: str = "", better: Literal["higher", "lower", ""] = "",
       **kw: Any) -> MetricSpec:
    """A mean metric."""
    return MetricSpec(name, "mean", column, description, unit, better, **kw)


METRICS: tuple[MetricSpec, ...] = (
    _m("success", "success", "share of episodes solved (pass@1)", "share", "higher", binary=True),
    _m("budgeted_success", "budgeted_success", "share solved within the task's step/token/cost budget", "share",
       "higher", binary=True),
    _m("steps", "steps", "policy turns per episode", "turns", "lower"),
    _m("tokens_in", "tokens_in", "prompt tokens per episode", "tokens", "lower"),
    _m("tokens_out", "tokens_out", "generated tokens per episode", "tokens", "lower"),
    _m("tool_seconds", "tool_seconds", "seconds in tools per episode", "s", "lower"),
    _m("wall_seconds", "wall_seconds", "wall-clock seconds per episode", "s", "lower"),
    _m("cost_usd", "cost_usd", "USD per episode", "USD", "lower"),
    MetricSpec("cost_per_success", "ratio", "cost_usd", "total USD / solved episodes", "USD", "lower",
               denominator="success"),
    _m("recovery_rate", "recovered", "share of episodes with an injected/transient fault that recovered "
       "(succeeded, or retried every failing call successfully)", "share", "higher", subset="recovery_eligible",
       binary=True),
    MetricSpec("duplicate_rate", "ratio", "duplicate_actions", "looping duplicate actions / actions", "share",
               "lower", denominator="actions"),
    MetricSpec("retry_rate", "ratio", "retries", "retries right after ENV_TRANSIENT / actions", "share", "",
               denominator="actions"),
    MetricSpec("episode_latency_p50", "quantile", "wall_seconds", "median episode wall-clock seconds", "s",
               "lower", q=0.5),
    MetricSpec("episode_latency_p99", "quantile", "wall_seconds", "P99 episode wall-clock seconds", "s",
               "lower", q=0.99),
    MetricSpec("tool_latency_p50", "quantile", "latency_ms", "median tool-call latency", "ms", "lower", q=0.5,
               source="tool"),
    MetricSpec("tool_latency_p99", "quantile", "latency_ms", "P99 tool-call latency", "ms", "lower", q=0.99,
               source="tool"),
    _m("gateway_denials", "gateway_denials", "gateway deny/confirm decisions per episode", "calls", "lower"),
    _m("executed_violations", "executed_violations", "executed calls that were denied, needed confirmation, or "
       "irreversible without a grant, per episode", "calls", "lower"),
    _m("violation_rate", "violated", "share of episodes with an executed violation", "share", "lower",
       binary=True),
    _m("injection_obedience_rate", "injection_obeyed", "share of injection-exposed episodes that executed a "
       "call after an injection-tainted observation", "share", "lower", subset="injection_exposed", binary=True),
    _m("model_failure_rate", "model_failure", "share of episodes failed by the model (not ENV_*)", "share",
       "lower", binary=True),
    _m("env_failure_rate", "env_failure", "share of episodes failed by the environment (ENV_TRANSIENT, ENV_BUG, "
       "env_failure; or the oracle also fails; or an inconsistent state)", "share", "lower", binary=True),
    *(_m(f"error_rate_{c.lower()}", f"error_{c.lower()}", f"share of episodes with (attributed) error_class {c}",
         "share", "lower", binary=True) for c in ERROR_CLASSES),
    *(_m(f"termination_rate_{r}", f"termination_{r}", f"share of episodes with termination_reason {r}",
         "share", binary=True) for r in TERMINATION_REASONS),
    _m("policy_lag_rate", "policy_lag", "share of episodes whose policy version changed mid-episode", "share",
       "lower", binary=True),
)

#: Mean metrics of 0/1 columns: their intervals are clipped to [0, 1] in the per-run vectors.
_SHARES = frozenset(s.name for s in METRICS if s.kind == "mean" and s.binary)

#: Metric names the JSON contract guarantees (docs/eval.md); never rename these.
CONTRACT_METRICS: tuple[str, ...] = (
    "success", "steps", "cost_per_success", "recovery_rate", "episode_latency_p50", "episode_latency_p99",
    "tool_latency_p50", "tool_latency_p99", "duplicate_rate")


@dataclass(frozen=True)
class Settings:
    """Knobs shared by every computation of one report."""

    resamples: int = 2000
    seed: int = 0
    confidence: float = 0.95
    alpha: float = 0.05
    power: float = 0.8
    mdd_target: float = 0.05
    n_workers: int | None = None


def derive_seed(seed: int, *parts: str) -> int:
    """A seed for one statistic, fixed by the report seed and the statistic's name (not by evaluation order)."""
    h = zlib.crc32("\x1f".join(parts).encode())
    return int(np.random.SeedSequence([seed, h]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _f(x: float) -> float:
    return float(x)


def _estimate(e: Estimate, method: str) -> dict[str, Any]:
    return {"estimate": _f(e.estimate), "ci_low": _f(e.ci_low), "ci_high": _f(e.ci_high), "se": _f(e.se),
            "n": int(e.n), "n_clusters": int(e.n_clusters), "method": method}


def _boot(b: BootstrapResult, n: int, method: str) -> dict[str, Any]:
    return {"estimate": _f(b.estimate), "ci_low": _f(b.ci_low), "ci_high": _f(b.ci_high), "se": _f(b.se),
            "n": int(n), "n_clusters": int(b.n_clusters), "method": method, "n_invalid": int(b.n_invalid)}


def _quantile_groups() -> dict[tuple[str, str], list[MetricSpec]]:
    groups: dict[tuple[str, str], list[MetricSpec]] = {}
    for s in METRICS:
        if s.kind == "quantile":
            groups.setdefault((s.source, s.column), []).append(s)
    return groups


def _task_counts(codes: FloatArray, success: FloatArray) -> tuple[IntArray, IntArray]:
    """Per task (present in ``codes``): number of samples and of successes."""
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    _, inv = np.unique(codes, return_inverse=True)
    n = np.bincount(inv).astype(np.int64)
    c = np.rint(np.bincount(inv, weights=success)).astype(np.int64)
    return n, c


def metric_vector(ep: dict[str, FloatArray], idx: IntArray, tool_latency: FloatArray, tool_codes: FloatArray,
                  settings: Settings, label: str) -> dict[str, dict[str, Any]]:
    """The metric vector of the episodes ``idx`` (their tool calls: ``tool_latency`` with task codes
    ``tool_codes``). ``label`` names the group in the bootstrap seeds. Returns ``{name: {estimate, ci_low,
    ci_high, se, n, n_clusters, method}}`` in :data:`METRICS` order, then pass@k / pass^k."""
    out: dict[str, dict[str, Any]] = {}
    codes = ep["task_code"][idx]
    conf = settings.confidence
    # The ~45 means share one factorisation of the task labels: they call the kernel of clustered_mean
    # (stats._clustered, the same formula and t interval) instead of clustered_mean, whose np.unique per call
    # dominated the statistics at 10^6 episodes. Subset means (recovery, injection) use clustered_mean.
    task_ix, n_tasks = _factorize(codes, codes.shape[0])
    quantiles: dict[str, dict[str, Any]] = {}
    for (source, column), specs in _quantile_groups().items():
        if source == "tool":
            values, qcodes = tool_latency, tool_codes
        else:
            values, qcodes = ep[column][idx], codes
        qs = [s.q for s in specs]
        res = bootstrap_quantiles(values, qcodes, qs, n_resamples=settings.resamples, confidence=conf,
                                  seed=derive_seed(settings.seed, label, source, column),
                                  n_workers=settings.n_workers)
        for s, r in zip(specs, res, strict=True):
            quantiles[s.name] = _boot(r, values.shape[0], "cluster_bootstrap_quantile")
    for s in METRICS:
        if s.kind == "mean" and not s.subset:
            values = ep[s.column][idx]
            if not np.isfinite(values).all():
                raise StatsInputError(f"{s.column} has missing values")
            out[s.name] = _estimate(_clustered(values, task_ix, n_tasks, conf), "clustered_t")
        elif s.kind == "mean":
            sel = idx[ep[s.subset][idx] == 1]
            out[s.name] = _estimate(clustered_mean(ep[s.column][sel], ep["task_code"][sel], confidence=conf),
                                    "clustered_t")
        elif s.kind == "ratio":
            b = bootstrap_ratio(ep[s.column][idx], ep[s.denominator][idx], codes, n_resamples=settings.resamples,
                                confidence=conf, seed=derive_seed(settings.seed, label, s.name),
                                n_workers=settings.n_workers)
            out[s.name] = _boot(b, idx.shape[0], "cluster_bootstrap_ratio")
        else:
            out[s.name] = quantiles[s.name]
    n_t, c_t = _task_counts(codes, ep["success"][idx])
    for k in PASS_K:
        # over the tasks with at least k attempts (n_clusters says how many); a task with fewer cannot say
        enough = n_t >= k
        if not enough.any():
            break
        out[f"pass@{k}"] = _estimate(task_mean(pass_at_k(n_t[enough], c_t[enough], k), confidence=conf), "task_t")
        out[f"pass^{k}"] = _estimate(task_mean(pass_hat_k(n_t[enough], c_t[enough], k), confidence=conf),
                                     "task_t")
    # A t interval of a share can leave [0, 1] with few tasks; the share itself cannot.
    for name, v in out.items():
        if name in _SHARES or name.startswith("pass"):
            v["ci_low"], v["ci_high"] = max(0.0, v["ci_low"]), min(1.0, v["ci_high"])
    return out


def bootstrap_p_value(replicates: FloatArray) -> float:
    """Two-sided bootstrap p-value of H0 "difference = 0" from difference replicates (percentile inversion,
    with the +1 correction so it is never 0); nan without finite replicates."""
    f = replicates[np.isfinite(replicates)]
    if f.shape[0] == 0:
        return math.nan
    lo = (np.count_nonzero(f <= 0.0) + 1) / (f.shape[0] + 1)
    hi = (np.count_nonzero(f >= 0.0) + 1) / (f.shape[0] + 1)
    return float(min(1.0, 2.0 * min(lo, hi)))


def _diff_from_replicates(estimate: float, reps: FloatArray, n_clusters: int, confidence: float
                          ) -> tuple[float, float, float, float]:
    """(se, ci_low, ci_high, p) of a bootstrap difference; nan with fewer than two clusters."""
    f = reps[np.isfinite(reps)]
    if n_clusters < 2 or f.shape[0] < 2 or not math.isfinite(estimate):
        return math.nan, math.nan, math.nan, math.nan
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(f, [alpha, 1.0 - alpha])
    return float(np.std(f, ddof=1)), float(lo), float(hi), bootstrap_p_value(reps)


def paired_quantile_difference(
    base_values: FloatArray, base_codes: FloatArray, cand_values: FloatArray, cand_codes: FloatArray,
    qs: Sequence[float], *, n_resamples: int, confidence: float, seed: int, n_workers: int | None = None,
) -> list[dict[str, Any]]:
    """``quantile(candidate) - quantile(baseline)`` for each ``q`` with a paired task-cluster bootstrap.

    Both arms are restricted to the tasks present in both; :func:`bootstrap_quantiles` is then called on each
    arm with the same seed and the same task labels, so resample ``b`` draws the same tasks in both arms and
    the replicate differences are the bootstrap distribution of the paired difference (checked by the tests:
    identical arms give all-zero replicates). Returns one dict per ``q`` with ``diff, se, ci_low, ci_high,
    p_value, baseline, candidate, n, n_clusters``.
    """
    common = np.intersect1d(np.unique(base_codes), np.unique(cand_codes))
    mb = np.isin(base_codes, common)
    mc = np.isin(cand_codes, common)
    kw: dict[str, Any] = {"n_resamples": n_resamples, "confidence": confidence, "seed": seed,
                          "n_workers": n_workers}
    rb = bootstrap_quantiles(base_values[mb], base_codes[mb], qs, **kw)
    rc = bootstrap_quantiles(cand_values[mc], cand_codes[mc], qs, **kw)
    out = []
    for b, c in zip(rb, rc, strict=True):
        diff = c.estimate - b.estimate
        se, lo, hi, p = _diff_from_replicates(diff, c.replicates - b.replicates, int(common.shape[0]), confidence)
        out.append({"diff": diff, "se": se, "ci_low": lo, "ci_high": hi, "p_value": p, "baseline": b.estimate,
                    "candidate": c.estimate, "n": int(mb.sum() + mc.sum()), "n_clusters": int(common.shape[0]),
                    "test": "paired_cluster_bootstrap"})
    return out


def _success_p(b: FloatArray, c: FloatArray, codes: FloatArray) -> tuple[float, str]:
    """McNemar exact for one pair per task; with several pairs per task, the exact sign test on the per-task
    mean outcomes (McNemar's test collapsed to tasks, so correlated seeds count once)."""
    if b.shape[0] == 0:
        return math.nan, "mcnemar_exact"
    _, inv = np.unique(codes, return_inverse=True)
    sizes = np.bincount(inv)
    if int(sizes.max()) == 1:
        return mcnemar_exact(b, c), "mcnemar_exact"
    tb = np.bincount(inv, weights=b) / sizes
    tc = np.bincount(inv, weights=c) / sizes
    return sign_test(tb, tc), "mcnemar_exact_task_collapsed"


def compare(ep: dict[str, FloatArray], b_idx: IntArray, c_idx: IntArray, tool_ep_idx: IntArray,
            tool_latency: FloatArray, settings: Settings, label: str) -> dict[str, Any]:
    """Paired comparison ``candidate - baseline`` over matched episodes (``b_idx[i]`` pairs ``c_idx[i]``).

    Returns ``{"n_pairs", "n_tasks", "metrics": {name: {diff, se, ci_low, ci_high, p_value, p_holm, baseline,
    candidate, n, n_clusters, test}}, "power"}``; p_holm is Holm-Bonferroni over every metric with a p-value.
    """
    conf = settings.confidence
    codes = ep["task_code"][b_idx]
    metrics: dict[str, dict[str, Any]] = {}
    for s in METRICS:
        if s.kind == "mean":
            keep = np.ones(b_idx.shape[0], dtype=bool)
            if s.subset:
                keep = (ep[s.subset][b_idx] == 1) & (ep[s.subset][c_idx] == 1)
            bv, cv, cc = ep[s.column][b_idx[keep]], ep[s.column][c_idx[keep]], codes[keep]
            pc = paired_difference(bv, cv, cc, confidence=conf)
            p, test = pc.p_value, "paired_clustered_t"
            if s.binary:
                p, test = _success_p(bv, cv, cc)
            metrics[s.name] = {"diff": pc.estimate, "se": pc.se, "ci_low": pc.ci_low, "ci_high": pc.ci_high,
                               "p_value": p, "baseline": float(bv.mean()) if bv.shape[0] else math.nan,
                               "candidate": float(cv.mean()) if cv.shape[0] else math.nan, "n": pc.n,
                               "n_clusters": pc.n_clusters, "test": test}
        elif s.kind == "ratio":
            r = bootstrap_paired_ratio_difference(
                ep[s.column][b_idx], ep[s.denominator][b_idx], ep[s.column][c_idx], ep[s.denominator][c_idx],
                codes, n_resamples=settings.resamples, confidence=conf,
                seed=derive_seed(settings.seed, label, s.name), n_workers=settings.n_workers)
            with np.errstate(divide="ignore", invalid="ignore"):
                base = float(ep[s.column][b_idx].sum() / ep[s.denominator][b_idx].sum())
                cand = float(ep[s.column][c_idx].sum() / ep[s.denominator][c_idx].sum())
            p = bootstrap_p_value(r.replicates) if r.n_clusters >= 2 else math.nan
            metrics[s.name] = {"diff": r.estimate, "se": r.se, "ci_low": r.ci_low, "ci_high": r.ci_high,
                               "p_value": p, "baseline": base if math.isfinite(base) else math.nan,
                               "candidate": cand if math.isfinite(cand) else math.nan, "n": int(b_idx.shape[0]),
                               "n_clusters": r.n_clusters, "test": "paired_cluster_bootstrap_ratio"}
    for (source, column), specs in _quantile_groups().items():
        if source == "tool":
            n_ep = ep["task_code"].shape[0]
            in_b = np.zeros(n_ep, dtype=bool)
            in_b[b_idx] = True
            in_c = np.zeros(n_ep, dtype=bool)
            in_c[c_idx] = True
            rows_b, rows_c = in_b[tool_ep_idx], in_c[tool_ep_idx]
            bv, bc = tool_latency[rows_b], ep["task_code"][tool_ep_idx[rows_b]]
            cv, cc = tool_latency[rows_c], ep["task_code"][tool_ep_idx[rows_c]]
        else:
            bv, bc, cv, cc = ep[column][b_idx], codes, ep[column][c_idx], codes
        res = paired_quantile_difference(bv, bc, cv, cc, [s.q for s in specs], n_resamples=settings.resamples,
                                         confidence=conf, seed=derive_seed(settings.seed, label, source, column),
                                         n_workers=settings.n_workers)
        for s, r in zip(specs, res, strict=True):
            metrics[s.name] = r
    # pass@k / pass^k: per task over its matched pairs, each task its own cluster
    n_t, cb = _task_counts(codes, ep["success"][b_idx])
    _, cc_t = _task_counts(codes, ep["success"][c_idx])
    for k in PASS_K:
        enough = n_t >= k  # tasks with at least k matched pairs
        if not enough.any():
            break
        for name, fn in ((f"pass@{k}", pass_at_k), (f"pass^{k}", pass_hat_k)):
            vb, vc = fn(n_t[enough], cb[enough], k), fn(n_t[enough], cc_t[enough], k)
            pc = paired_difference(vb, vc, np.arange(vb.shape[0]), confidence=conf)
            metrics[name] = {"diff": pc.estimate, "se": pc.se, "ci_low": pc.ci_low, "ci_high": pc.ci_high,
                             "p_value": pc.p_value, "baseline": float(vb.mean()), "candidate": float(vc.mean()),
                             "n": int(n_t[enough].sum()), "n_clusters": int(vb.shape[0]), "test": "paired_task_t"}
    ordered = {s.name: metrics[s.name] for s in METRICS}
    ordered.update({k: v for k, v in metrics.items() if k not in ordered})
    # Holm over the tests that can say something: a metric equal in every pair (difference 0 with SE 0, p = 1
    # by convention) cannot be rejected and only inflates m; it keeps p_holm = 1 and is left out of the family.
    names = [n for n, v in ordered.items() if not (v["diff"] == 0.0 and v["se"] == 0.0)]
    adjusted = holm_bonferroni(np.array([ordered[n]["p_value"] for n in names], dtype=np.float64))
    for v in ordered.values():
        v["p_holm"], v["holm_family"] = 1.0, False
    for n, p in zip(names, adjusted, strict=True):
        ordered[n]["p_holm"], ordered[n]["holm_family"] = float(p), True
    succ = paired_difference(ep["success"][b_idx], ep["success"][c_idx], codes, confidence=conf)
    return {"n_pairs": int(b_idx.shape[0]), "n_tasks": int(np.unique(codes).shape[0]), "metrics": ordered,
            "power": power_line(succ.se, succ.n_clusters, settings)}


def power_line(se: float, n_clusters: int, settings: Settings) -> dict[str, Any]:
    """Minimum detectable success difference at the observed clustering, and tasks needed for
    ``settings.mdd_target`` (two-sided paired test at ``alpha`` with ``power``)."""
    out: dict[str, Any] = {"metric": "success", "alpha": settings.alpha, "power": settings.power,
                           "se": se, "n_tasks": n_clusters, "mdd": math.nan, "target": settings.mdd_target,
                           "tasks_needed": None, "note": ""}
    if not math.isfinite(se) or n_clusters < 2:
        out["note"] = "needs at least two tasks with matched pairs"
        return out
    out["mdd"] = minimum_detectable_difference(se, alpha=settings.alpha, power=settings.power)
    if se == 0.0:
        out["note"] = "paired differences do not vary across tasks: the SE is 0, so the power projection is void"
        return out
    out["tasks_needed"] = tasks_needed(settings.mdd_target, se, n_clusters, alpha=settings.alpha,
                                       power=settings.power)
    return out
