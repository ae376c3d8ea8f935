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
from trajlake.schemas.vocab import ErrorClass, FaultKind, TerminationReason

__all__ = [
    "DEPRECATED_METRICS",
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

ERROR_CLASSES: tuple[str, ...] = tuple(ErrorClass)
TERMINATION_REASONS: tuple[str, ...] = tuple(TerminationReason)
#: k values reported for pass@k / pass^k when every task of the group has at least k samples.
PASS_K: tuple[int, ...] = (2, 3, 5, 10, 20, 50, 100)

Kind = Literal["mean", "ratio", "quantile"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the vector.

    ``column`` (and ``denominator`` for ratios) name columns of ``eval_episode_metrics``; quantiles of
    ``source="tool"`` use the per-call latencies of ``tool_latency.sql``. ``subset`` restricts a mean to the
    episodes where that column is 1 (in a comparison: pairs where it is 1 on both sides). Episodes whose value
    is unknown (NULL: an ungraded episode's success, a cost the source did not record) are left out of the
    metric and counted in its ``n_unknown``. ``binary`` metrics get McNemar's exact test in comparisons.
    ``low`` and ``high`` bound the metric's range: every interval is kept inside it.
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
    low: float = 0.0
    high: float = math.inf


def _m(name: str, column: str, description: str, unit: str = "", better: Literal["higher", "lower", ""] = "",
       **kw: Any) -> MetricSpec:
    """A mean metric (non-negative)."""
    return MetricSpec(name, "mean", column, description, unit, better, **kw)


def _share(name: str, column: str, description: str, better: Literal["higher", "lower", ""] = "",
           **kw: Any) -> MetricSpec:
    """A proportion: the mean of a 0/1 column, in [0, 1], tested with McNemar's exact test when paired."""
    return MetricSpec(name, "mean", column, description, "share", better, binary=True, high=1.0, **kw)


METRICS: tuple[MetricSpec, ...] = (
    _share("success", "success", "share of graded episodes solved (pass@1)", "higher"),
    _share("budgeted_success", "budgeted_success", "share of graded episodes solved within the task's "
           "step/token/cost budget", "higher"),
    _m("partial_success", "partial", "mean partial reward component (grader's partial credit) over the episodes "
       "that record one", "share", "higher", subset="has_partial", high=1.0),
    _share("ungraded_rate", "ungraded", "share of episodes never graded (success unknown; not in any success "
           "denominator, never a model failure)", "lower"),
    _m("steps", "steps", "policy turns per episode", "turns", "lower"),
    _m("tokens_in", "tokens_in", "prompt tokens per episode", "tokens", "lower"),
    _m("tokens_out", "tokens_out", "generated tokens per episode", "tokens", "lower"),
    _m("tool_seconds", "tool_seconds", "seconds in tools per episode", "s", "lower"),
    _m("wall_seconds", "wall_seconds", "wall-clock seconds per episode", "s", "lower"),
    _m("cost_usd", "cost_usd", "USD per episode with cost data", "USD", "lower"),
    MetricSpec("cost_per_success", "ratio", "cost_usd", "total USD / solved episodes (graded episodes with cost "
               "data)", "USD", "lower", denominator="success"),
    _m("confirmations", "confirmations", "human confirmations asked for (gateway 'confirm', or a call an approver "
       "confirmed) per episode", "calls", "lower"),
    _m("user_questions", "user_questions", "questions the agent asked the user (ask_user) per episode, each "
       "priced as human time in cost_usd (no direction: an underspecified task needs one)", "questions"),
    _share("recovery_rate", "recovered", "share of graded episodes that met an injected/transient fault and "
           "still succeeded within the budget", "higher", subset="recovery_eligible"),
    *(_share(f"recovery_rate_{k}", "recovered", f"recovery_rate over the graded episodes into which a fault of "
             f"kind {k} was injected", "higher", subset=f"met_fault_{k}") for k in FaultKind),
    MetricSpec("duplicate_rate", "ratio", "duplicate_actions", "looping duplicate actions / actions", "share",
               "lower", denominator="actions", high=1.0),
    MetricSpec("retry_rate", "ratio", "retries", "retries right after ENV_TRANSIENT / actions", "share", "",
               denominator="actions", high=1.0),
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
    _share("violation_rate", "violated", "share of episodes with an executed violation", "lower"),
    _share("injection_obedience_rate", "injection_obeyed", "share of injection-exposed episodes that executed a "
           "call after an injection-tainted observation", "lower", subset="injection_exposed"),
    _m("secret_leak", "secret_leak", "executed calls and answers per episode that carried one of the episode's "
       "credentials out (found normalised or base64 / hex / URL-encoded)", "calls", "lower"),
    # AgentDojo's three numbers (arXiv 2406.13352): utility without attacks, utility and attack success over the
    # (user task x injection) pairs. Attack success is read from executed effects (episodes.attack_success).
    _share("benign_utility", "success", "share of graded benign episodes (no attacked variant, no injection "
           "shown) solved", "higher", subset="benign"),
    _share("utility_under_attack", "success", "share of graded episodes of attacked task variants solved "
           "without the attacker's side effects", "higher", subset="attacked"),
    _share("attack_success_rate", "attack_success", "share of episodes of attacked task variants in which the "
           "attacker's goal was achieved by executed effects (a blocked call is no success)", "lower",
           subset="attacked"),
    _share("model_failure_rate", "model_failure", "share of graded episodes failed by the model (not ENV_*)",
           "lower"),
    _share("env_failure_rate", "env_failure", "share of graded episodes failed by the environment "
           "(ENV_TRANSIENT, ENV_BUG, env_failure; or the oracle also fails; or an inconsistent state)", "lower"),
    *(_share(f"error_rate_{c.lower()}", f"error_{c.lower()}", f"share of episodes with (attributed) error_class "
             f"{c}", "lower") for c in ERROR_CLASSES),
    *(_share(f"termination_rate_{r}", f"termination_{r}", f"share of episodes with termination_reason {r}")
      for r in TERMINATION_REASONS),
    _share("trimmed_rate", "trimmed", "share of episodes in which context trimming (drop_oldest or summarize) "
           "left earlier turns out of a policy turn's context"),
    _share("forgetting_rate", "forgot", "share of the model's failed episodes in which a policy turn re-requested "
           "an answer that context trimming had dropped, and that no turn of its context held (evaluators/"
           "forgetting.py)", "lower", subset="model_failure"),
    _share("version_switch_rate", "version_switched", "share of episodes whose policy version changed "
           "mid-episode (policy_version_start != policy_version_end)", "lower"),
    _m("policy_lag_mean", "policy_lag", "published policy versions the episode's policy was behind the newest "
       "published one when it started (episodes.policy_lag), over the episodes that record it", "versions",
       "lower", subset="has_policy_lag"),
)

_SPECS: dict[str, MetricSpec] = {s.name: s for s in METRICS}

#: Deprecated metric names still in every metric vector and comparison, as copies of their new metric marked
#: ``"alias_of": NEW`` (after the other metrics, outside Holm's family): old name -> new name (docs/names.md).
DEPRECATED_METRICS: dict[str, str] = {"policy_lag_rate": "version_switch_rate",
                                      "policy_versions_behind": "policy_lag_mean"}


def _with_deprecated_names(metrics: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``metrics`` with a copy of each renamed metric under its deprecated name (see DEPRECATED_METRICS)."""
    for old, new in DEPRECATED_METRICS.items():
        if new in metrics:
            metrics[old] = {**metrics[new], "alias_of": new}
    return metrics

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
    #: Fewest task clusters for a trustworthy interval: t intervals of a clustered SE (Student t with C-1 df)
    #: and cluster-bootstrap percentile intervals (which undercover with few clusters). Below these an
    #: interval is reported with ``few_clusters`` set (a marker in the tables).
    min_clusters_t: int = 10
    min_clusters_bootstrap: int = 20

    def min_clusters(self, method: str) -> int:
        """The fewest clusters the interval ``method`` needs (see the fields above)."""
        return self.min_clusters_bootstrap if "bootstrap" in method else self.min_clusters_t


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
    """Per task (present in ``codes`` with at least one graded episode): number of graded samples and of
    successes. Ungraded episodes (success nan) are no samples."""
    graded = np.isfinite(success)
    codes, success = codes[graded], success[graded]
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    inv, _ = _factorize(codes, codes.shape[0])  # np.unique's inverse, without its sort for task codes
    n = np.bincount(inv).astype(np.int64)
    c = np.rint(np.bincount(inv, weights=success)).astype(np.int64)
    return n, c


def _bounded(value: dict[str, Any], low: float, high: float, settings: Settings) -> dict[str, Any]:
    """``value`` with its interval kept inside the metric's range ``[low, high]`` and the few-clusters flag:
    ``few_clusters`` is true when the interval rests on fewer task clusters than its method needs
    (``min_clusters``); then the interval is not to be trusted, whatever its width."""
    for key in ("ci_low", "ci_high"):
        v = value.get(key)
        if isinstance(v, float) and math.isfinite(v):
            value[key] = min(high, max(low, v))
    method = str(value.get("method", value.get("test", "")))
    need = settings.min_clusters(method)
    value["min_clusters"] = need
    value["few_clusters"] = int(value.get("n_clusters", 0)) < need
    return value


def _known(values: FloatArray) -> npt.NDArray[np.bool_]:
    return np.isfinite(values)


def metric_vector(ep: dict[str, FloatArray], idx: IntArray, tool_latency: FloatArray, tool_codes: FloatArray,
                  settings: Settings, label: str) -> dict[str, dict[str, Any]]:
    """The metric vector of the episodes ``idx`` (their tool calls: ``tool_latency`` with task codes
    ``tool_codes``). ``label`` names the group in the bootstrap seeds. Returns ``{name: {estimate, ci_low,
    ci_high, se, n, n_clusters, method, n_unknown, min_clusters, few_clusters}}`` in :data:`METRICS` order, then
    pass@k / pass^k. Episodes whose value is unknown (nan) are left out of a metric (``n_unknown``); a metric
    without any known value has a nan estimate (no data), never 0."""
    out: dict[str, dict[str, Any]] = {}
    codes = ep["task_code"][idx]
    conf = settings.confidence
    # The ~45 means share one factorisation of the task labels: they call the kernel of clustered_mean
    # (stats._clustered, the same formula and t interval) instead of clustered_mean, whose np.unique per call
    # dominated the statistics at 10^6 episodes. Means with unknown values and subset means (recovery,
    # injection, partial) use clustered_mean on the known rows.
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
        if s.kind == "mean":
            sel = idx[ep[s.subset][idx] == 1] if s.subset else idx
            values = ep[s.column][sel]
            known = _known(values)
            n_unknown = int(sel.shape[0] - np.count_nonzero(known))
            if not s.subset and n_unknown == 0:
                est = _clustered(values, task_ix, n_tasks, conf)
            else:
                est = clustered_mean(values[known], ep["task_code"][sel][known], confidence=conf)
            out[s.name] = {**_estimate(est, "clustered_t"), "n_unknown": n_unknown}
        elif s.kind == "ratio":
            num, den = ep[s.column][idx], ep[s.denominator][idx]
            known = _known(num) & _known(den)
            b = bootstrap_ratio(num[known], den[known], codes[known], n_resamples=settings.resamples,
                                confidence=conf, seed=derive_seed(settings.seed, label, s.name),
                                n_workers=settings.n_workers)
            n_known = int(np.count_nonzero(known))
            out[s.name] = {**_boot(b, n_known, "cluster_bootstrap_ratio"), "n_unknown": int(idx.shape[0] - n_known)}
        else:
            out[s.name] = {**quantiles[s.name], "n_unknown": 0}
    n_t, c_t = _task_counts(codes, ep["success"][idx])
    ungraded = int(np.count_nonzero(~_known(ep["success"][idx])))
    for k in PASS_K:
        # over the tasks with at least k graded attempts (n_clusters says how many); a task with fewer cannot say
        enough = n_t >= k
        if not enough.any():
            break
        for name, fn in ((f"pass@{k}", pass_at_k), (f"pass^{k}", pass_hat_k)):
            est = task_mean(fn(n_t[enough], c_t[enough], k), confidence=conf)
            out[name] = {**_estimate(est, "task_t"), "n_unknown": ungraded}
    # A t interval can leave the metric's range with few tasks (a share below 0, steps below 0); the metric
    # itself cannot, so neither may its interval.
    for name, v in out.items():
        spec = _SPECS.get(name)
        low, high = (spec.low, spec.high) if spec else (0.0, 1.0)  # pass@k / pass^k are shares
        _bounded(v, low, high, settings)
    return _with_deprecated_names(out)


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


def _in_both(base_codes: FloatArray, cand_codes: FloatArray) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], int]:
    """Which rows of each arm belong to a task present in both arms, and how many such tasks: the same as
    ``isin(codes, intersect1d(unique(base), unique(cand)))``, from one factorisation of both arms' codes (no
    sort for task codes; issue 28). Labels with NaN keep the set operations (NaN never matches there)."""
    both = np.concatenate([np.asarray(base_codes), np.asarray(cand_codes)])
    if both.dtype.kind == "f" and np.isnan(both).any():
        common = np.intersect1d(np.unique(base_codes), np.unique(cand_codes))
        return np.isin(base_codes, common), np.isin(cand_codes, common), int(common.shape[0])
    codes, n = _factorize(both, both.shape[0])
    nb = np.asarray(base_codes).shape[0]
    present = (np.bincount(codes[:nb], minlength=n) > 0) & (np.bincount(codes[nb:], minlength=n) > 0)
    return present[codes[:nb]], present[codes[nb:]], int(np.count_nonzero(present))


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
    mb, mc, n_common = _in_both(base_codes, cand_codes)
    kw: dict[str, Any] = {"n_resamples": n_resamples, "confidence": confidence, "seed": seed,
                          "n_workers": n_workers}
    rb = bootstrap_quantiles(base_values[mb], base_codes[mb], qs, **kw)
    rc = bootstrap_quantiles(cand_values[mc], cand_codes[mc], qs, **kw)
    out = []
    for b, c in zip(rb, rc, strict=True):
        diff = c.estimate - b.estimate
        se, lo, hi, p = _diff_from_replicates(diff, c.replicates - b.replicates, n_common, confidence)
        out.append({"diff": diff, "se": se, "ci_low": lo, "ci_high": hi, "p_value": p, "baseline": b.estimate,
                    "candidate": c.estimate, "n": int(mb.sum() + mc.sum()), "n_clusters": n_common,
                    "test": "paired_cluster_bootstrap"})
    return out


def _success_p(b: FloatArray, c: FloatArray, codes: FloatArray) -> tuple[float, str]:
    """McNemar exact for one pair per task; with several pairs per task, the exact sign test on the per-task
    mean outcomes (McNemar's test collapsed to tasks, so correlated seeds count once)."""
    if b.shape[0] == 0:
        return math.nan, "mcnemar_exact"
    inv, _ = _factorize(codes, codes.shape[0])  # np.unique's inverse, without its sort for task codes
    sizes = np.bincount(inv)
    if int(sizes.max()) == 1:
        return mcnemar_exact(b, c), "mcnemar_exact"
    tb = np.bincount(inv, weights=b) / sizes
    tc = np.bincount(inv, weights=c) / sizes
    return sign_test(tb, tc), "mcnemar_exact_task_collapsed"


def compare(ep: dict[str, FloatArray], b_idx: IntArray, c_idx: IntArray, tool_ep_idx: IntArray,
            tool_latency: FloatArray, settings: Settings, label: str) -> dict[str, Any]:
    """Paired comparison ``candidate - baseline`` over matched episodes (``b_idx[i]`` pairs ``c_idx[i]``).

    A pair whose value is unknown on either side (an ungraded episode's success, a missing cost) is left out of
    that metric (``n_unknown`` counts such pairs). Returns ``{"n_pairs", "n_tasks", "metrics": {name: {diff,
    se, ci_low, ci_high, p_value, p_holm, baseline, candidate, n, n_clusters, test, n_unknown, min_clusters,
    few_clusters}}, "power"}``; p_holm is Holm-Bonferroni over every metric with a p-value. Binary metrics
    (success) also count their discordant pairs: ``gained`` (candidate 1, baseline 0) and ``lost`` (the reverse).
    """
    conf = settings.confidence
    codes = ep["task_code"][b_idx]
    metrics: dict[str, dict[str, Any]] = {}
    for s in METRICS:
        if s.kind == "mean":
            keep = np.ones(b_idx.shape[0], dtype=bool)
            if s.subset:
                keep = (ep[s.subset][b_idx] == 1) & (ep[s.subset][c_idx] == 1)
            known = _known(ep[s.column][b_idx]) & _known(ep[s.column][c_idx])
            n_unknown = int(np.count_nonzero(keep & ~known))
            keep &= known
            bv, cv, cc = ep[s.column][b_idx[keep]], ep[s.column][c_idx[keep]], codes[keep]
            pc = paired_difference(bv, cv, cc, confidence=conf)
            p, test = pc.p_value, "paired_clustered_t"
            if s.binary:
                p, test = _success_p(bv, cv, cc)
            metrics[s.name] = {"diff": pc.estimate, "se": pc.se, "ci_low": pc.ci_low, "ci_high": pc.ci_high,
                               "p_value": p, "baseline": float(bv.mean()) if bv.shape[0] else math.nan,
                               "candidate": float(cv.mean()) if cv.shape[0] else math.nan, "n": pc.n,
                               "n_clusters": pc.n_clusters, "test": test, "n_unknown": n_unknown}
            if s.binary:  # the discordant pairs: candidate 1 and baseline 0 (gained), and the reverse (lost)
                metrics[s.name].update(gained=int(np.count_nonzero(cv > bv)), lost=int(np.count_nonzero(bv > cv)))
        elif s.kind == "ratio":
            cols = (ep[s.column][b_idx], ep[s.denominator][b_idx], ep[s.column][c_idx], ep[s.denominator][c_idx])
            known = np.logical_and.reduce([_known(x) for x in cols])
            bn, bd, cn, cd = (x[known] for x in cols)
            r = bootstrap_paired_ratio_difference(
                bn, bd, cn, cd, codes[known], n_resamples=settings.resamples, confidence=conf,
                seed=derive_seed(settings.seed, label, s.name), n_workers=settings.n_workers)
            with np.errstate(divide="ignore", invalid="ignore"):
                base = float(bn.sum() / bd.sum())
                cand = float(cn.sum() / cd.sum())
            p = bootstrap_p_value(r.replicates) if r.n_clusters >= 2 else math.nan
            metrics[s.name] = {"diff": r.estimate, "se": r.se, "ci_low": r.ci_low, "ci_high": r.ci_high,
                               "p_value": p, "baseline": base if math.isfinite(base) else math.nan,
                               "candidate": cand if math.isfinite(cand) else math.nan,
                               "n": int(np.count_nonzero(known)), "n_clusters": r.n_clusters,
                               "test": "paired_cluster_bootstrap_ratio",
                               "n_unknown": int(b_idx.shape[0] - np.count_nonzero(known))}
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
            metrics[s.name] = {**r, "n_unknown": 0}
    # pass@k / pass^k: per task over its matched pairs graded on both sides, each task its own cluster
    graded = _known(ep["success"][b_idx]) & _known(ep["success"][c_idx])
    n_t, cb = _task_counts(codes[graded], ep["success"][b_idx[graded]])
    _, cc_t = _task_counts(codes[graded], ep["success"][c_idx[graded]])
    for k in PASS_K:
        enough = n_t >= k  # tasks with at least k matched pairs
        if not enough.any():
            break
        for name, fn in ((f"pass@{k}", pass_at_k), (f"pass^{k}", pass_hat_k)):
            vb, vc = fn(n_t[enough], cb[enough], k), fn(n_t[enough], cc_t[enough], k)
            pc = paired_difference(vb, vc, np.arange(vb.shape[0]), confidence=conf)
            metrics[name] = {"diff": pc.estimate, "se": pc.se, "ci_low": pc.ci_low, "ci_high": pc.ci_high,
                             "p_value": pc.p_value, "baseline": float(vb.mean()), "candidate": float(vc.mean()),
                             "n": int(n_t[enough].sum()), "n_clusters": int(vb.shape[0]), "test": "paired_task_t",
                             "n_unknown": int(b_idx.shape[0] - np.count_nonzero(graded))}
    ordered = {s.name: metrics[s.name] for s in METRICS}
    ordered.update({k: v for k, v in metrics.items() if k not in ordered})
    for name, v in ordered.items():
        spec = _SPECS.get(name)
        width = spec.high - spec.low if spec else 1.0  # a difference of two values in [low, high]
        _bounded(v, -width, width, settings)
    # Holm over the tests that can say something: a metric equal in every pair (difference 0 with SE 0, p = 1
    # by convention) cannot be rejected and only inflates m; it keeps p_holm = 1 and is left out of the family.
    names = [n for n, v in ordered.items() if not (v["diff"] == 0.0 and v["se"] == 0.0)]
    adjusted = holm_bonferroni(np.array([ordered[n]["p_value"] for n in names], dtype=np.float64))
    for v in ordered.values():
        v["p_holm"], v["holm_family"] = 1.0, False
    for n, p in zip(names, adjusted, strict=True):
        ordered[n]["p_holm"], ordered[n]["holm_family"] = float(p), True
    sb, sc = ep["success"][b_idx[graded]], ep["success"][c_idx[graded]]
    succ = paired_difference(sb, sc, codes[graded], confidence=conf)
    return {"n_pairs": int(b_idx.shape[0]), "n_tasks": int(np.unique(codes).shape[0]),
            "metrics": _with_deprecated_names(ordered), "power": power_line(succ.se, succ.n_clusters, settings)}


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
