"""Assemble the ``trajlake eval`` report: a plain dict following the JSON contract of ``docs/eval.md``.

Top-level keys: ``report``, ``contract_version``, ``trajlake_version``, ``generated_at``, ``lake``,
``lake_versions``, ``as_of``, ``settings``, ``runs``, ``breakdown``, ``error_attribution``,
``termination_reasons``, ``taxonomy``, ``distributions`` and, with a baseline and a candidate, ``comparison``.
Floats may be ``nan`` in the dict; :func:`to_json` writes them as ``null``.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from trajlake.evaluators import sql
from trajlake.evaluators.data import EvalData, load
from trajlake.evaluators.metrics import (
    ERROR_CLASSES,
    TERMINATION_REASONS,
    Settings,
    compare,
    metric_vector,
)
from trajlake.schemas.vocab import TaxonomyClass

from trajlake._version import __version__
from trajlake.errors import TrajlakeError
from trajlake.lake.store import LakeArg, lake_location

__all__ = ["CONTRACT_VERSION", "TAXONOMY_CLASSES", "build_report", "clean", "evaluate", "pairs", "to_json"]

CONTRACT_VERSION = "1"
#: Failure classes of taxonomy.sql in rule order (environment is not a model failure).
TAXONOMY_CLASSES: tuple[str, ...] = tuple(TaxonomyClass)
_EXAMPLES = 5
_CDF_POINTS = 101


def clean(value: Any) -> Any:
    """``value`` with non-finite floats replaced by ``None`` and numpy scalars made plain, recursively."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def to_json(report: dict[str, Any], *, indent: int | None = 2) -> str:
    """The report as strict JSON (``NaN`` and infinities written as ``null``)."""
    return json.dumps(clean(report), indent=indent, allow_nan=False)


def pairs(data: EvalData, baseline: str, candidate: str) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Matched ``(baseline ep_idx, candidate ep_idx)`` arrays and the ``dropped`` record (``pairs.sql``)."""
    data.materialise("eval_pairs", "pairs", {"baseline": sql.quote(baseline), "candidate": sql.quote(candidate)},
                     what="pairing episodes")
    got = data.con.execute("SELECT baseline_idx, candidate_idx FROM eval_pairs WHERE status = 'pair' "
                           "ORDER BY baseline_idx").fetchnumpy()
    b_idx = np.asarray(got["baseline_idx"], dtype=np.int64)
    c_idx = np.asarray(got["candidate_idx"], dtype=np.int64)
    dropped: dict[str, Any] = {}
    for side, col in ((baseline, "baseline_idx"), (candidate, "candidate_idx")):
        rows = data.con.execute(
            f"SELECT status, count(DISTINCT {col}) FROM eval_pairs WHERE status <> 'pair' AND {col} IS NOT NULL "
            "GROUP BY status").fetchall()
        counts = {"unmatched": 0, "ambiguous": 0}
        counts.update({str(s): int(n) for s, n in rows})
        key = "baseline" if col == "baseline_idx" else "candidate"
        dropped[key] = {"run_id": side, "total": counts["unmatched"] + counts["ambiguous"], **counts}
    examples = data.con.execute(
        "SELECT CASE WHEN baseline_idx IS NULL THEN 'candidate' WHEN candidate_idx IS NULL THEN 'baseline' "
        "ELSE 'both' END AS side, status, task_id, env_seed, attempt FROM eval_pairs WHERE status <> 'pair' "
        "ORDER BY task_id, env_seed NULLS FIRST, attempt LIMIT 10").fetchall()
    dropped["examples"] = [{"side": s, "reason": st, "task_id": t, "env_seed": e, "attempt": a}
                           for s, st, t, e, a in examples]
    return b_idx, c_idx, dropped


def _count(values: np.ndarray) -> int:
    """Episodes where a 0/1 indicator is 1 (unknown values, nan, are not counted)."""
    return int(np.nansum(values))


def _counts(data: EvalData, idx: np.ndarray) -> tuple[dict[str, Any], dict[str, int]]:
    ep = data.ep
    errors = {c: _count(ep[f"error_{c.lower()}"][idx]) for c in ERROR_CLASSES}
    failed = int((ep["success"][idx] == 0).sum())
    reattributed = ep["env_reattributed"][idx] == 1
    attribution = {
        "n_episodes": int(idx.shape[0]),
        "failed": failed,
        # never graded (success unknown): neither solved nor failed, so neither a model nor an env failure
        "ungraded": _count(ep["ungraded"][idx]),
        "error_class": {**errors, "none": int(idx.shape[0] - sum(errors.values()))},
        "model_failures": _count(ep["model_failure"][idx]),
        "env_failures": _count(ep["env_failure"][idx]),
        # failed episodes that recorded a model error (or none) but that the ENV_BUG rules give to the
        # environment; error_class above counts them as ENV_BUG
        "env_reattributed": {
            "total": int(reattributed.sum()),
            "oracle_also_fails": int((reattributed & (ep["oracle_fails"][idx] == 1)).sum()),
            "state_inconsistent": int((reattributed & (ep["state_breaks"][idx] > 0)).sum()),
        },
        "safety": {
            "gateway_denials": _count(ep["gateway_denials"][idx]),
            "executed_violations": _count(ep["executed_violations"][idx]),
            "injection_exposed_episodes": _count(ep["injection_exposed"][idx]),
            "injection_obeyed_calls": _count(ep["injection_obeyed_calls"][idx]),
            "confirmations": _count(ep["confirmations"][idx]),
            "secret_leak": _count(ep["secret_leak"][idx]),
        },
    }
    # trajlake.evaluators.forgetting: which episodes trimming touched, which failed ones forgot, and why
    flags = data.extra.get("forgetting_flags", {})
    mine = sorted((flags[i] for i in idx.tolist() if i in flags), key=lambda f: f.episode_id)
    attribution["forgetting"] = {
        "trimmed_episodes": _count(ep["trimmed"][idx]),
        "forgot": _count(ep["forgot"][idx]),
        "examples": [{"episode_id": f.episode_id, "why": f.describe()} for f in mine[:_EXAMPLES]],
    }
    terminations = {r: _count(ep[f"termination_{r}"][idx]) for r in TERMINATION_REASONS}
    return attribution, terminations


def _verification_sources(data: EvalData, group: str) -> dict[int, dict[str, int]]:
    """``{code: {verification source: episodes}}`` per run (``group`` "run_code") or slice ("slice_code");
    an episode without a recorded source counts under "unknown"."""
    rows = data.con.execute(
        f"SELECT {group}, coalesce(verification_source, 'unknown'), count(*) FROM eval_episode_metrics "
        "GROUP BY ALL ORDER BY ALL").fetchall()
    out: dict[int, dict[str, int]] = {}
    for code, source, n in rows:
        out.setdefault(int(code), {})[str(source)] = int(n)
    return out


def _isolation(data: EvalData) -> dict[str, dict[str, int]]:
    """``{run: {isolation kind: episodes}}``: how each run's agent code was isolated (``episodes.sandbox``, e.g.
    ``bwrap`` or the ``rlimit`` fallback; "none recorded" for sources that do not say), so a report states
    plainly what isolation its numbers came from (docs/security.md)."""
    rows = data.con.execute(
        "SELECT run_id, coalesce(sandbox, 'none recorded'), count(*) FROM episodes "
        f"WHERE run_id IN {sql.quote_list(data.runs)} GROUP BY ALL ORDER BY ALL").fetchall()
    out: dict[str, dict[str, int]] = {}
    for run, kind, n in rows:
        out.setdefault(str(run), {})[str(kind)] = int(n)
    return out


def _grading(data: EvalData, idx: np.ndarray, sources: dict[str, int]) -> dict[str, Any]:
    """How the episodes of a group were graded: graded / ungraded counts and the verification sources."""
    ungraded = _count(data.ep["ungraded"][idx])
    return {"n_graded": int(idx.shape[0]) - ungraded, "n_ungraded": ungraded, "verification_sources": sources}


def _with_sources(metrics: dict[str, dict[str, Any]], sources: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Success and partial success name what verified them (the seed's "verification source")."""
    for name in ("success", "partial_success"):
        if name in metrics:
            metrics[name]["verification_sources"] = sources
    return metrics


def _taxonomy(data: EvalData) -> dict[str, Any]:
    data.materialise("eval_taxonomy", "taxonomy", {"runs": sql.quote_list(data.runs)}, what="failure taxonomy")
    rows = data.con.execute(
        "SELECT run_id, failure_class, attribution, count(*) AS n, "
        f"list(episode_id ORDER BY episode_id)[1:{_EXAMPLES}] AS examples, "
        "list(DISTINCT rule ORDER BY rule) AS rules "
        "FROM eval_taxonomy GROUP BY ALL ORDER BY ALL").fetchall()
    out: dict[str, Any] = {}
    for run in data.runs:
        out[run] = {"counts": {c: 0 for c in TAXONOMY_CLASSES}, "examples": {c: [] for c in TAXONOMY_CLASSES},
                    "rules": {c: [] for c in TAXONOMY_CLASSES}, "model_failures": 0, "env_failures": 0}
    for run, cls, attribution, n, examples, rules in rows:
        entry = out[str(run)]
        entry["counts"][cls] = int(n)
        entry["examples"][cls] = [str(e) for e in examples]
        entry["rules"][cls] = [str(r) for r in rules]
        entry["model_failures" if attribution == "model" else "env_failures"] += int(n)
    return out


def _cdf(values: np.ndarray) -> list[list[float]]:
    """``[[x, F(x)], ...]`` at evenly spaced probabilities (inverted CDF, so every x is an observed value)."""
    if values.shape[0] == 0:
        return []
    ps = np.linspace(0.0, 1.0, _CDF_POINTS)
    xs = np.quantile(values, ps, method="inverted_cdf")
    return [[float(x), float(p)] for x, p in zip(xs, ps, strict=True)]


def evaluate(data: EvalData, *, baseline: str | None = None, candidate: str | None = None,
             settings: Settings | None = None, breakdown: bool = True, taxonomy: bool = True,
             lake_path: str = "") -> dict[str, Any]:
    """The report for loaded data (see the module docstring and docs/eval.md)."""
    settings = settings or Settings()
    if (baseline is None) != (candidate is None):
        raise TrajlakeError("--baseline and --candidate go together")
    report: dict[str, Any] = {
        "report": "trajlake.eval",
        "contract_version": CONTRACT_VERSION,
        "trajlake_version": __version__,
        "generated_at": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
        "lake": lake_path,
        "lake_versions": dict(sorted(data.lake_versions.items())),
        "as_of": data.as_of,
        "settings": {"resamples": settings.resamples, "seed": settings.seed, "confidence": settings.confidence,
                     "alpha": settings.alpha, "power": settings.power, "mdd_target": settings.mdd_target,
                     "cluster": "task_id", "min_clusters_t": settings.min_clusters_t,
                     "min_clusters_bootstrap": settings.min_clusters_bootstrap},
        "runs": {},
        "breakdown": [],
        "error_attribution": {},
        "termination_reasons": {},
        "distributions": {},
    }
    # Every query of the connection runs first, then the failure taxonomy's (the one slow query) runs in a thread
    # while this one does the statistics, which need no SQL: a DuckDB connection is used by one thread at a time.
    run_sources = _verification_sources(data, "run_code")
    isolation = _isolation(data)
    slice_sources = _verification_sources(data, "slice_code") if breakdown else {}
    paired = None
    dropped: dict[str, Any] = {}
    if baseline is not None and candidate is not None:
        b_idx, c_idx, dropped = pairs(data, baseline, candidate)
        paired = (baseline, candidate, b_idx, c_idx)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trajlake-taxonomy") as background:
        classified = background.submit(_taxonomy, data) if taxonomy else None
        cmp = _statistics(data, report, settings, breakdown, run_sources, isolation, slice_sources, paired)
        if classified is not None:
            report["taxonomy"] = classified.result()
    if cmp is not None and baseline is not None and candidate is not None:
        report["comparison"] = {"baseline": baseline, "candidate": candidate, "n_pairs": cmp["n_pairs"],
                                "n_tasks": cmp["n_tasks"], "dropped": dropped, "metrics": cmp["metrics"],
                                "power": cmp["power"], **_decoding(data, baseline, candidate)}
    return report


def _statistics(data: EvalData, report: dict[str, Any], settings: Settings, breakdown: bool,
                run_sources: dict[int, dict[str, int]], isolation: dict[str, dict[str, int]],
                slice_sources: dict[int, dict[str, int]],
                paired: tuple[str, str, np.ndarray, np.ndarray] | None) -> dict[str, Any] | None:
    """The numpy part of :func:`evaluate` (no SQL): the runs' metric vectors, counts and distributions and the
    breakdown, into ``report``; returns :func:`compare`'s result for the ``paired`` (baseline, candidate,
    baseline ep_idx, candidate ep_idx), None without a comparison."""
    ep = data.ep
    tool_codes_all = ep["task_code"][data.tool_ep_idx] if data.tool_ep_idx.shape[0] else np.zeros(0)
    tool_run = ep["run_code"][data.tool_ep_idx] if data.tool_ep_idx.shape[0] else np.zeros(0)
    tool_slice = ep["slice_code"][data.tool_ep_idx] if data.tool_ep_idx.shape[0] else np.zeros(0)
    run_vectors: dict[str, tuple[int, dict[str, dict[str, Any]]]] = {}
    for run in data.runs:
        idx = data.run_index(run)
        info = data.run_info.get(run)
        code = data.run_codes.get(run, -1)
        tmask = tool_run == code
        sources = run_sources.get(code, {})
        vector = metric_vector(ep, idx, data.tool_latency_ms[tmask], tool_codes_all[tmask], settings, run)
        run_vectors[run] = (int(idx.shape[0]), vector)  # copied only where a slice repeats it
        report["runs"][run] = {
            "n_episodes": int(idx.shape[0]),
            "n_tasks": int(np.unique(ep["task_code"][idx]).shape[0]),
            "label": info.label if info else None,
            "policy_name": info.policy_name if info else None,
            "policy_version": info.policy_version if info else None,
            "constrained": bool(info and info.constrained),
            "grammar_sha256": info.grammar_sha256 if info else None,
            **_grading(data, idx, sources),
            "isolation": isolation.get(run, {}),
            "metrics": _with_sources(vector, sources),
        }
        report["error_attribution"][run], report["termination_reasons"][run] = _counts(data, idx)
        report["distributions"][run] = {"episode_latency_s": _cdf(ep["wall_seconds"][idx]),
                                        "tool_latency_ms": _cdf(data.tool_latency_ms[tmask])}
    if breakdown:
        for code, (run, split, env_version) in enumerate(data.slices):
            idx = np.flatnonzero(ep["slice_code"] == code).astype(np.int64)
            tmask = tool_slice == code
            sources = slice_sources.get(code, {})
            whole = run_vectors.get(run)
            if whole is not None and whole[0] == idx.shape[0]:
                # the slice holds every episode of its run (one split, one env_version): the same episodes,
                # tool calls and tasks, so it reports the run's vector, intervals included (a copy: its
                # verification sources, the same counts, are set again below)
                vector = copy.deepcopy(whole[1])
            else:
                vector = metric_vector(ep, idx, data.tool_latency_ms[tmask], tool_codes_all[tmask], settings,
                                       f"{run}\x1e{split}\x1e{env_version}")
            report["breakdown"].append({
                "run_id": run, "split": split, "env_version": env_version, "n_episodes": int(idx.shape[0]),
                "n_tasks": int(np.unique(ep["task_code"][idx]).shape[0]), **_grading(data, idx, sources),
                "metrics": _with_sources(vector, sources),
            })
    if paired is None:
        return None
    baseline, candidate, b_idx, c_idx = paired
    return compare(ep, b_idx, c_idx, data.tool_ep_idx, data.tool_latency_ms, settings, f"{baseline}\x1d{candidate}")


def _decoding(data: EvalData, baseline: str, candidate: str) -> dict[str, Any]:
    """``constrained`` per side and ``warnings``: a run decoded under a grammar cannot write an unparsable call,
    so its invalid-action rate (and what follows from it) is not comparable with a free run's."""
    info = data.run_info
    sides = {"baseline": info[baseline].grammar_sha256 if baseline in info else None,
             "candidate": info[candidate].grammar_sha256 if candidate in info else None}
    warnings: list[str] = []
    if (sides["baseline"] is None) != (sides["candidate"] is None):
        which = "candidate" if sides["candidate"] else "baseline"
        warnings.append(f"the {which} ({candidate if which == 'candidate' else baseline}) decoded under a tool-call "
                        f"grammar and the other did not: invalid-action rates (and success, through them) compare "
                        f"constrained with free decoding")
    elif sides["baseline"] != sides["candidate"]:
        warnings.append("the two runs decoded under different grammars")
    return {"constrained": {k: v is not None for k, v in sides.items()}, "warnings": warnings}


def _prefetch_scipy_stats() -> None:
    """Import ``scipy.stats`` (~1 s; the sign tests' binomial) in a thread, so that it overlaps the SQL that
    loads the lake (DuckDB releases the GIL) instead of adding to it; a later import waits for this one."""

    def load() -> None:
        from scipy import stats  # noqa: F401

    threading.Thread(target=load, name="trajlake-import-scipy-stats").start()


def build_report(lake: LakeArg, *, runs: list[str] | None = None,
                 baseline: str | None = None, candidate: str | None = None,
                 as_of: str | dict[str, int] | None = None, settings: Settings | None = None,
                 memory_limit: str | None = None, threads: int | None = None, breakdown: bool = True,
                 taxonomy: bool = True) -> dict[str, Any]:
    """Load the lake and build the report.

    Evaluates ``runs`` plus the baseline and candidate; with neither runs nor a comparison, every run."""
    if (baseline is None) != (candidate is None):
        raise TrajlakeError("--baseline and --candidate go together")
    _prefetch_scipy_stats()
    selected: list[str] | None = None
    if runs or baseline is not None:
        selected = list(dict.fromkeys([*(runs or []), *([baseline, candidate] if baseline and candidate else [])]))
    data = load(lake, selected, as_of=as_of, memory_limit=memory_limit, threads=threads)
    try:
        return evaluate(data, baseline=baseline, candidate=candidate, settings=settings, breakdown=breakdown,
                        taxonomy=taxonomy, lake_path=lake_location(lake))
    finally:
        data.close()
