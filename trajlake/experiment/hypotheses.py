"""The preregistered hypotheses' entries: paired, task-clustered differences pooled over training seeds, Holm across
every entry, and a verdict by the configured decision rule (docs/experiment.md, "Verdicts").

The rule, the same for every entry, with d = candidate - baseline taken in the hypothesis' direction (d for
``greater``, -d for ``less``) and its (1 - alpha) interval [lo, hi]:

- ``supported``: lo > 0 and p_holm < alpha (never on an interval that includes 0);
- ``refuted``: hi < 0 (the opposite effect), or hi < min_effect (the data rule out the smallest effect the
  hypothesis claims); for H2, also a ``hackable`` verdict of ``reward-check`` on R2's process reward;
- ``inconclusive`` otherwise, stated with the minimum detectable difference at the observed n; always when the
  interval is degenerate (fewer than two tasks, or the same difference in every task: SE 0, e.g. both arms at 0%
  everywhere), which says nothing about the effect's size.

A hypothesis is supported when all its entries are, refuted when any is, inconclusive otherwise."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trajlake.experiment.config import DecisionRule, HypothesisSpec

VERDICTS = ("supported", "refuted", "inconclusive")


def rule_text(spec: HypothesisSpec, decision: DecisionRule, split: str) -> str:
    """The entry's rule as configured, in one line (``summary.json``'s ``rule``)."""
    sign = ">" if spec.direction == "greater" else "<"
    return (f"{spec.metric} on {split}: {spec.candidate} - {spec.baseline} {sign} 0 (matching: {spec.matching}); "
            f"paired by (task, env seed, attempt) and pooled over training seeds, clustered by task; supported if "
            f"the {1 - decision.alpha:.0%} interval excludes 0 in that direction and Holm-adjusted p < "
            f"{decision.alpha:g}; refuted if it lies wholly on the other side of 0 or below the minimum effect "
            f"{decision.min_effect:g}; else inconclusive with the MDD at power {decision.power:g}")


def decide(estimate: float, ci_low: float, ci_high: float, p_holm: float, *, direction: str, alpha: float,
           min_effect: float) -> str:
    """One entry's verdict from its difference (candidate - baseline) and interval (module docstring)."""
    if not all(math.isfinite(x) for x in (estimate, ci_low, ci_high)):
        return "inconclusive"
    sign = 1.0 if direction == "greater" else -1.0
    lo, hi = sorted((sign * ci_low, sign * ci_high))
    if lo > 0 and math.isfinite(p_holm) and p_holm < alpha:
        return "supported"
    if hi < 0 or hi < min_effect:
        return "refuted"
    return "inconclusive"


def hypothesis_verdict(verdicts: Sequence[str]) -> str:
    """A hypothesis from its entries: supported when all are, refuted when any is, else inconclusive."""
    if verdicts and all(v == "supported" for v in verdicts):
        return "supported"
    if any(v == "refuted" for v in verdicts):
        return "refuted"
    return "inconclusive"


def metric_values(ep: Mapping[str, np.ndarray], b_idx: np.ndarray, c_idx: np.ndarray, metric: str,
                  base_run_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(baseline values, candidate values, keep) of matched episodes for ``metric``; ``keep`` drops pairs whose
    value is unknown on either side (an ungraded episode's success, a missing cost) or, for
    ``recovery_held_out``, pairs where either side did not meet the fault. ``base_run_idx``: every episode of
    the baseline run (its mean steps / cost caps the ``success_at_*`` metrics)."""
    success = ep["success"]
    if metric in ("success", "steps", "cost_usd"):
        col = ep[metric]
        b, c = col[b_idx], col[c_idx]
    elif metric == "success_at_steps":
        cap = float(np.nanmean(ep["steps"][base_run_idx])) if base_run_idx.shape[0] else math.nan
        b = np.where(np.isnan(success[b_idx]), np.nan, (success[b_idx] == 1) & (ep["steps"][b_idx] <= cap))
        c = np.where(np.isnan(success[c_idx]), np.nan, (success[c_idx] == 1) & (ep["steps"][c_idx] <= cap))
    elif metric == "success_at_cost":
        cap = float(np.nanmean(ep["cost_usd"][base_run_idx])) if base_run_idx.shape[0] else math.nan
        cost = ep["cost_usd"]
        unknown_b = np.isnan(success[b_idx]) | np.isnan(cost[b_idx])
        unknown_c = np.isnan(success[c_idx]) | np.isnan(cost[c_idx])
        b = np.where(unknown_b, np.nan, (success[b_idx] == 1) & (cost[b_idx] <= cap))
        c = np.where(unknown_c, np.nan, (success[c_idx] == 1) & (cost[c_idx] <= cap))
    elif metric == "recovery_held_out":
        eligible = (ep["recovery_eligible"][b_idx] == 1) & (ep["recovery_eligible"][c_idx] == 1)
        b = np.where(eligible, ep["recovered"][b_idx], np.nan)
        c = np.where(eligible, ep["recovered"][c_idx], np.nan)
    else:
        raise ValueError(f"unknown metric {metric!r}")
    b, c = np.asarray(b, dtype=np.float64), np.asarray(c, dtype=np.float64)
    keep = ~(np.isnan(b) | np.isnan(c))
    return b, c, keep


def entry_statistics(b: np.ndarray, c: np.ndarray, clusters: np.ndarray, decision: DecisionRule
                     ) -> dict[str, Any]:
    """The paired, task-clustered difference of matched values (``evaluators.stats.paired_difference``) and the
    minimum detectable difference at the observed n."""
    from trajlake.evaluators.stats import minimum_detectable_difference, paired_difference

    n_tasks = int(np.unique(clusters).shape[0]) if clusters.shape[0] else 0
    out: dict[str, Any] = {"estimate": math.nan, "se": math.nan, "ci_low": math.nan, "ci_high": math.nan,
                           "p_value": math.nan, "mdd": math.nan, "n_pairs": int(b.shape[0]), "n_tasks": n_tasks,
                           "baseline_mean": float(b.mean()) if b.shape[0] else math.nan,
                           "candidate_mean": float(c.mean()) if c.shape[0] else math.nan}
    if b.shape[0] == 0:
        return out
    pc = paired_difference(b, c, clusters, confidence=1.0 - decision.alpha)
    out.update(estimate=pc.estimate, se=pc.se, ci_low=pc.ci_low, ci_high=pc.ci_high, p_value=pc.p_value)
    if math.isfinite(pc.se) and n_tasks >= 2:
        out["mdd"] = minimum_detectable_difference(pc.se, alpha=decision.alpha, power=decision.power)
    return out


def with_holm(entries: list[dict[str, Any]], decision: DecisionRule) -> list[dict[str, Any]]:
    """``p_holm`` (Holm across every entry with a p-value; nan for the others) and each entry's ``verdict``."""
    from trajlake.evaluators.stats import holm_bonferroni

    finite = [i for i, e in enumerate(entries) if math.isfinite(e["p_value"])]
    adjusted = holm_bonferroni(np.array([entries[i]["p_value"] for i in finite], dtype=np.float64)) if finite else []
    for e in entries:
        e["p_holm"] = math.nan
    for i, p in zip(finite, adjusted, strict=True):
        entries[i]["p_holm"] = float(p)
    for e in entries:
        verdict = decide(e["estimate"], e["ci_low"], e["ci_high"], e["p_holm"], direction=e["direction"],
                         alpha=decision.alpha, min_effect=decision.min_effect)
        if e["n_tasks"] < 2 or not e["se"] > 0:
            verdict = "inconclusive"
            e.setdefault("notes", []).append("degenerate interval (fewer than two tasks, or the same difference in "
                                             "every task): it bounds nothing")
            e["mdd"] = math.nan
        if e.get("refuted_by"):
            verdict = "refuted"
        e["verdict"] = verdict
    return entries


def summarise(entries: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """One verdict per hypothesis (H1..H4) from its entries."""
    by: dict[str, list[str]] = {}
    for e in entries:
        by.setdefault(str(e["hypothesis"]), []).append(str(e["verdict"]))
    return {h: hypothesis_verdict(v) for h, v in sorted(by.items())}


__all__ = ["VERDICTS", "decide", "entry_statistics", "hypothesis_verdict", "metric_values", "rule_text", "summarise",
           "with_holm"]
