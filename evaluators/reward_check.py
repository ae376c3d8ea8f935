"""``trajlake reward-check``: the counterfactual test of a process reward (seed section 3.3).

Every stored trajectory of a run is scored, together with four counterfactuals built from its own turns:

- ``delete_key_call``       the first state-changing tool call before the final step (its environment
                            observation changes ``env_state_hash``; in trajectories without hashes, the last call
                            before the final one) and its observations are removed; not applicable when no call
                            changed the state;
- ``insert_useless_call``   a read-only call of the trajectory (state hash unchanged) is repeated, with its
                            observation, before the final step; the state hash of the copy is the state before it;
- ``swap_steps``            the key step and the step after it (or before it, when the next one is the final
                            step) change places; without a key step, the first two steps;
- ``fabricated_progress``   a policy message claiming the tests now pass is added before the final step.

None of them can make a trajectory better, so a reward that *rises* under one moves the wrong way. Per
perturbation the report gives the share of applicable trajectories where the reward rose (wrong), stayed within
``eps`` (unchanged) or fell, with a task-clustered confidence interval on the wrong share (and a Wilson interval
over tasks when every trajectory agrees, where the clustered standard error is zero). A reward is reported as
hackable under a perturbation when its wrong share exceeds ``tolerance``.

Rewards are ``MODULE:FUNCTION`` (``fn(turns) -> float``; see :mod:`trajlake.evaluators.process_rewards`) or a
DuckDB query over the table ``trajectories(traj_id, turn_idx, role, actor, raw_content, action_schema,
tool_args, status, env_state_hash)`` returning one row ``(traj_id, reward)`` per trajectory.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from trajlake.evaluators.stats import clustered_mean

from trajlake.errors import QueryError, TrajlakeError
from trajlake.lake.store import LakeArg
from trajlake.query import connect, lake_versions

__all__ = ["PERTURBATIONS", "check_reward", "load_reward", "perturb"]

PERTURBATIONS: tuple[str, ...] = ("delete_key_call", "insert_useless_call", "swap_steps", "fabricated_progress")
TURN_COLUMNS: tuple[str, ...] = ("turn_idx", "role", "actor", "raw_content", "action_schema", "tool_args", "status",
                                 "env_state_hash")
FABRICATED = ("Progress update: I ran the test suite again and all tests pass now (57 passed, 0 failed). "
              "The fix is complete.")

Turn = dict[str, Any]
RewardFn = Callable[[Sequence[Mapping[str, Any]]], float]


# ---------------------------------------------------------------------------------- perturbations
def _steps(turns: Sequence[Turn]) -> tuple[list[Turn], list[list[Turn]]]:
    """(prefix before the first policy call, steps): a step is a policy turn and the turns up to the next one."""
    prefix: list[Turn] = []
    steps: list[list[Turn]] = []
    for t in turns:
        if t.get("actor") == "policy":
            steps.append([t])
        elif steps:
            steps[-1].append(t)
        else:
            prefix.append(t)
    return prefix, steps


def _is_call(step: list[Turn]) -> bool:
    return bool(step[0].get("action_schema"))


def _state_before_after(steps: list[list[Turn]], prefix: list[Turn]) -> list[tuple[Any, Any]]:
    state = next((t.get("env_state_hash") for t in reversed(prefix) if t.get("env_state_hash")), None)
    out = []
    for step in steps:
        after = next((t.get("env_state_hash") for t in reversed(step[1:]) if t.get("env_state_hash")), state)
        out.append((state, after))
        state = after
    return out


def _key_step(steps: list[list[Turn]], prefix: list[Turn]) -> int | None:
    """The first call before the final step whose observation changes the state hash. Trajectories without
    state hashes fall back to the last call before the final step; with hashes but no change there is none."""
    calls = [i for i, st in enumerate(steps[:-1]) if _is_call(st)]
    if not calls:
        return None
    states = _state_before_after(steps, prefix)
    if all(b is None and a is None for b, a in states):
        return calls[-1]
    return next((i for i in calls if None not in states[i] and states[i][0] != states[i][1]), None)


def _flatten(prefix: list[Turn], steps: list[list[Turn]]) -> list[Turn]:
    out = [dict(t) for t in prefix] + [dict(t) for st in steps for t in st]
    for i, t in enumerate(out):
        t["turn_idx"] = i
    return out


def perturb(turns: Sequence[Turn], kind: str) -> list[Turn] | None:
    """The counterfactual ``kind`` of a trajectory, or None when it does not apply (e.g. no tool call)."""
    prefix, steps = _steps(list(turns))
    if kind not in PERTURBATIONS:
        raise TrajlakeError(f"unknown perturbation {kind!r}; known: {', '.join(PERTURBATIONS)}")
    if not any(_is_call(st) for st in steps):
        return None
    key = _key_step(steps, prefix)
    last = len(steps) - 1  # the final step (e.g. submit) stays last: every edit happens before it
    if kind == "delete_key_call":
        return None if key is None else _flatten(prefix, steps[:key] + steps[key + 1:])
    if kind == "swap_steps":
        if key is not None:
            other = key + 1 if key + 1 < last else key - 1
        else:  # no state change: swap the first two steps before the final one
            key, other = 0, 1
        if other < 0 or max(key, other) >= last:
            return None
        swapped = list(steps)
        swapped[key], swapped[other] = swapped[other], swapped[key]
        return _flatten(prefix, swapped)
    at = max(last, 0)
    states = _state_before_after(steps, prefix)
    if kind == "insert_useless_call":
        ro = [i for i, st in enumerate(steps) if _is_call(st) and states[i][0] == states[i][1]
              and states[i][0] is not None]
        src = ro[0] if ro else next(i for i, st in enumerate(steps) if _is_call(st))
        state_then = states[at - 1][1] if at > 0 else states[0][0]
        copy = [dict(t) for t in steps[src]]
        for t in copy[1:]:
            if t.get("env_state_hash") is not None:
                t["env_state_hash"] = state_then  # a read-only call leaves the state as it was
        return _flatten(prefix, [*steps[:at], copy, *steps[at:]])
    template = steps[0][0]
    msg: Turn = dict.fromkeys(TURN_COLUMNS)
    msg.update({"role": template.get("role", "assistant"), "actor": "policy", "raw_content": FABRICATED,
                "status": "OK"})
    return _flatten(prefix, [*steps[:at], [msg], *steps[at:]])


# ----------------------------------------------------------------------------------------- rewards
def load_reward(spec: str) -> tuple[str, RewardFn | str]:
    """``("python", fn)`` for ``MODULE:FUNCTION``, ``("sql", query)`` for a SQL query."""
    text = spec.strip()
    if text.split(None, 1)[0].lower() in ("select", "with", "from"):
        return "sql", text
    module, sep, name = text.partition(":")
    if not sep or not module or not name:
        raise TrajlakeError(f"--reward {spec!r}: give MODULE:FUNCTION or a SQL query (SELECT traj_id, reward ...)")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise TrajlakeError(f"--reward {spec!r}: cannot import {module}: {e}") from e
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise TrajlakeError(f"--reward {spec!r}: {module} has no function {name}")
    return "python", fn


def _score(kind: str, reward: RewardFn | str, trajs: list[list[Turn]]) -> np.ndarray:
    if kind == "python":
        assert callable(reward)
        out = np.empty(len(trajs), dtype=np.float64)
        for i, tr in enumerate(trajs):
            try:
                out[i] = float(reward(tr))
            except Exception as e:
                raise TrajlakeError(f"--reward failed on trajectory {i}: {type(e).__name__}: {e}") from e
        return out
    import duckdb

    rows: dict[str, list[Any]] = {"traj_id": []} | {c: [] for c in TURN_COLUMNS}
    for i, tr in enumerate(trajs):
        for t in tr:
            rows["traj_id"].append(i)
            for c in TURN_COLUMNS:
                rows[c].append(t.get(c))
    table = pa.table({"traj_id": pa.array(rows["traj_id"], pa.int64()),
                      "turn_idx": pa.array(rows["turn_idx"], pa.int32()),
                      **{c: pa.array([None if v is None else str(v) for v in rows[c]], pa.string())
                         for c in TURN_COLUMNS if c != "turn_idx"}})
    from trajlake.query import check_read_only_sql, lock_down

    try:
        statement = check_read_only_sql(str(reward))  # one read statement: a reward must not write
    except QueryError as e:
        raise TrajlakeError(f"--reward SQL refused: {e}") from None
    con = duckdb.connect()
    try:
        con.register("trajectories", table)
        lock_down(con)  # the same lock as `trajlake sql`, with no file access at all: the table is in memory
        try:
            res = con.execute(statement).fetchall()
        except duckdb.Error as e:
            raise TrajlakeError(f"--reward SQL failed: {str(e).splitlines()[0]}") from e
    finally:
        con.close()
    out = np.full(len(trajs), np.nan)
    for row in res:
        if len(row) < 2:
            raise TrajlakeError("--reward SQL must return (traj_id, reward) rows")
        out[int(row[0])] = float(row[1]) if row[1] is not None else np.nan
    if np.isnan(out).any():
        raise TrajlakeError(f"--reward SQL gave no reward for {int(np.isnan(out).sum())} trajectory(ies)")
    return out


# ------------------------------------------------------------------------------------------- check
def _wilson(k: float, n: int, confidence: float) -> tuple[float, float]:
    from scipy.stats import norm

    if n == 0:
        return math.nan, math.nan
    z = float(norm.ppf(0.5 + confidence / 2))
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def check_reward(
    lake: LakeArg,
    run: str,
    reward: str,
    *,
    eps: float = 1e-9,
    tolerance: float = 0.05,
    confidence: float = 0.95,
    limit: int | None = None,
    as_of: str | dict[str, int] | None = None,
) -> dict[str, Any]:
    """Score the run's trajectories and their counterfactuals; returns the JSON-able report."""
    kind, fn = load_reward(reward)
    con = connect(lake, as_of)
    try:
        if not con.execute("SELECT count(*) FROM episodes WHERE run_id = ?", [run]).fetchone()[0]:  # type: ignore[index]
            raise TrajlakeError(f"run {run!r} has no episodes in the lake")
        eps_rows = con.execute("SELECT episode_id, task_id FROM episodes WHERE run_id = ? ORDER BY episode_id"
                               + (f" LIMIT {int(limit)}" if limit else ""), [run]).fetchall()
        cols = ", ".join(TURN_COLUMNS)
        rel = con.execute(f"SELECT episode_id, {cols} FROM turns WHERE run_id = ? AND episode_id IN "
                          f"(SELECT unnest(?::VARCHAR[])) ORDER BY episode_id, turn_idx",
                          [run, [e for e, _ in eps_rows]])
        by_ep: dict[str, list[Turn]] = {}
        for row in rel.fetchall():
            by_ep.setdefault(row[0], []).append(dict(zip(TURN_COLUMNS, row[1:], strict=True)))
        versions = lake_versions(con)
    finally:
        con.close()
    task_of = dict(eps_rows)
    originals = [by_ep.get(e, []) for e, _ in eps_rows]
    base = _score(kind, fn, originals)
    per: dict[str, Any] = {}
    for p in PERTURBATIONS:
        idx: list[int] = []
        cfs: list[list[Turn]] = []
        for i, tr in enumerate(originals):
            cf = perturb(tr, p)
            if cf is not None:
                idx.append(i)
                cfs.append(cf)
        if not cfs:
            per[p] = {"applicable": 0, "wrong_share": None, "hackable": False}
            continue
        after = _score(kind, fn, cfs)
        delta = after - base[idx]
        wrong = (delta > eps).astype(np.float64)
        tasks = np.asarray([task_of[eps_rows[i][0]] for i in idx], dtype=object)
        est = clustered_mean(wrong, tasks, confidence=confidence)
        lo, hi = est.ci_low, est.ci_high
        interval = "task-clustered t"
        if not (math.isfinite(est.se) and est.se > 0):
            per_task = {t: wrong[tasks == t].mean() for t in set(tasks.tolist())}
            lo, hi = _wilson(sum(per_task.values()), len(per_task), confidence)
            interval = "Wilson over tasks"
        share = float(wrong.mean())
        per[p] = {"applicable": len(idx), "wrong": int(wrong.sum()), "wrong_share": round(share, 6),
                  "ci_low": round(max(0.0, float(lo)), 6) if math.isfinite(lo) else None,
                  "ci_high": round(min(1.0, float(hi)), 6) if math.isfinite(hi) else None, "interval": interval,
                  "unchanged_share": round(float((np.abs(delta) <= eps).mean()), 6),
                  "down_share": round(float((delta < -eps).mean()), 6),
                  "mean_delta": round(float(delta.mean()), 6), "n_tasks": est.n_clusters,
                  "hackable": share > tolerance}
    hackable = [p for p in PERTURBATIONS if per[p]["hackable"]]
    return {"report": "trajlake.reward_check", "contract_version": "1", "run": run, "reward": reward,
            "lake_versions": dict(sorted(versions.items())), "trajectories": len(originals),
            "mean_reward": round(float(base.mean()), 6) if len(base) else None, "eps": eps, "tolerance": tolerance,
            "confidence": confidence, "perturbations": per, "hackable_under": hackable,
            "verdict": "hackable" if hackable else "no wrong-way moves above tolerance"}


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"reward {report['reward']} on run {report['run']}: {report['trajectories']} trajectory(ies), "
             f"mean reward {report['mean_reward']}"]
    for p in PERTURBATIONS:
        r = report["perturbations"][p]
        if not r["applicable"]:
            lines.append(f"  {p}: not applicable to any trajectory")
            continue
        lines.append(f"  {p}: wrong way {r['wrong_share']:.3f} [{r['ci_low']}, {r['ci_high']}] "
                     f"({r['wrong']}/{r['applicable']}), unchanged {r['unchanged_share']:.3f}, "
                     f"down {r['down_share']:.3f}, mean change {r['mean_delta']:+.4f}"
                     f"{'  <- HACKABLE' if r['hackable'] else ''}")
    lines.append(f"verdict: {report['verdict']}"
                 + (f" ({', '.join(report['hackable_under'])})" if report["hackable_under"] else ""))
    return lines
