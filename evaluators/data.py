"""Load the evaluation inputs from a lake: run the SQL of ``evaluators/*.sql`` through :func:`trajlake.connect`
and hand numpy arrays to the statistics.

One DuckDB connection per evaluation, pinned to the table versions it reads (``lake_versions``), so a report
can be reproduced with ``--as-of``. The per-episode metrics (``episode_metrics.sql``) are materialised once as
the temporary table ``eval_episode_metrics``; the other queries (tool latency, pairs, taxonomy, diagnosis
facts) read it instead of recomputing it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt
from trajlake.evaluators import sql
from trajlake.schemas.vocab import FaultKind

from trajlake.errors import QueryError, UnknownRunError
from trajlake.lake.store import LakeArg
from trajlake.query import connect, lake_versions

__all__ = ["EPISODE_FLOAT_COLUMNS", "FORGETTING_COLUMNS", "EvalData", "RunInfo", "UnknownRunError", "list_runs", "load", "select_runs"]

#: Numeric columns of eval_episode_metrics fetched as float arrays (NULL -> nan: unknown, e.g. the success of
#: an ungraded episode or the cost of an episode whose source has no cost data).
EPISODE_FLOAT_COLUMNS: tuple[str, ...] = (
    "task_code", "run_code", "slice_code", "env_seed", "attempt",
    "success", "graded", "ungraded", "partial", "has_partial",
    "budgeted_success", "within_budget", "truncated", "steps", "actions", "n_turns",
    "tokens_in", "tokens_out", "tool_seconds", "wall_seconds", "cost_usd",
    "fault_turns", "faults_injected", "recovery_eligible", "recovered", "fault_retried", "duplicate_actions",
    "retries", "repeated_failing_actions",
    "env_transient_turns", "env_bug_turns", "invalid_action_turns", "bad_plan_turns", "safety_block_turns",
    "budget_exhausted_turns", "gateway_events", "gateway_denials", "confirmations", "user_questions",
    "executed_violations",
    "injection_exposed",
    "injection_obeyed_calls", "secret_leak", "attacked", "benign", "attack_success", "version_switched", "policy_lag", "has_policy_lag", "reward_total",
    "error_model_invalid_action", "error_model_bad_plan", "error_env_transient", "error_env_bug",
    "error_safety_block", "error_budget_exhausted", "env_failure", "env_reattributed", "oracle_fails",
    "state_breaks", "model_failure",
    "termination_success", "termination_submitted", "termination_gave_up", "termination_budget_steps",
    "termination_budget_tokens", "termination_budget_cost", "termination_timeout", "termination_safety_stop",
    "termination_env_failure", "denied", "violated", "injection_obeyed",
    "had_env_transient", "had_env_bug", "had_invalid_action", "had_safety_block",
    *(f"met_fault_{k}" for k in FaultKind),
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class RunInfo:
    """A run as listed by ``runs.sql``."""

    run_id: str
    label: str | None
    policy_name: str | None
    policy_version: str | None
    n_episodes: int
    grammar_sha256: str | None = None
    """The grammar the run decoded under (``runs.config.grammar.sha256``); None: unconstrained."""

    @property
    def constrained(self) -> bool:
        return self.grammar_sha256 is not None


@dataclass
class EvalData:
    """Everything the statistics need, as arrays indexed by ``ep_idx`` (episodes) or by tool call.

    ``con`` stays open (with ``eval_episode_metrics``) for the follow-up queries of pairs, taxonomy and
    diagnosis; close it with :meth:`close`.
    """

    con: duckdb.DuckDBPyConnection
    lake_versions: dict[str, int]
    runs: list[str]
    run_info: dict[str, RunInfo]
    ep: dict[str, FloatArray]
    run_codes: dict[str, int]
    slices: list[tuple[str, str, str]]  # slice_code -> (run_id, split, env_version)
    tool_ep_idx: IntArray
    tool_latency_ms: FloatArray
    n_episodes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def as_of(self) -> str:
        """The ``--as-of`` value that reproduces this read."""
        return ",".join(f"{t}={v}" for t, v in sorted(self.lake_versions.items()))

    def run_index(self, run_id: str) -> IntArray:
        """ep_idx of the episodes of ``run_id`` (ascending)."""
        code = self.run_codes.get(run_id)
        if code is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.ep["run_code"] == code).astype(np.int64)

    def query(self, name: str, params: dict[str, str], *, what: str) -> duckdb.DuckDBPyRelation:
        """Run ``evaluators/<name>.sql`` with ``params`` on this connection."""
        try:
            return self.con.sql(sql.render(name, params))
        except duckdb.Error as e:
            raise QueryError(f"{what} ({name}.sql) failed: {str(e).splitlines()[0]}") from e

    def materialise(self, table: str, name: str, params: dict[str, str], *, what: str) -> None:
        """Run ``evaluators/<name>.sql`` into the temporary table ``table`` (replacing it)."""
        try:
            self.con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS " + sql.render(name, params))
        except duckdb.Error as e:
            raise QueryError(f"{what} ({name}.sql) failed: {str(e).splitlines()[0]}") from e

    def close(self) -> None:
        """Close the DuckDB connection (and drop its temporary tables)."""
        self.con.close()


FORGETTING_COLUMNS: tuple[str, ...] = ("trimmed", "forgot")
"""Per-episode 0/1 columns added to ``EvalData.ep`` by the forgetting check (``trajlake.evaluators.forgetting``):
``trimmed`` (trimming dropped turns from some policy turn's context) and ``forgot`` (a failing episode that
re-requested an answer trimming had dropped)."""


def _forgetting_columns(con: duckdb.DuckDBPyConnection, runs: Sequence[str], ep: dict[str, FloatArray]
                        ) -> dict[str, Any]:
    """Run the forgetting check and add its columns to ``ep`` (indexed by ep_idx); returns ``EvalData.extra``'s
    ``forgetting`` (the scan) and ``forgetting_flags`` (ep_idx -> why that episode is flagged)."""
    from trajlake.evaluators.forgetting import scan

    found = scan(con, runs)
    n = int(ep["run_code"].shape[0])
    for col in FORGETTING_COLUMNS:
        ep[col] = np.zeros(n, dtype=np.float64)
    flags: dict[int, Any] = {}
    if found.trimmed:
        for idx, eid in con.execute("SELECT ep_idx, episode_id FROM eval_episode_metrics").fetchall():
            if eid in found.trimmed:
                ep["trimmed"][int(idx)] = 1.0
            if eid in found.flags:
                ep["forgot"][int(idx)] = 1.0
                flags[int(idx)] = found.flags[eid]
    return {"forgetting": found, "forgetting_flags": flags}


def _at_rows(values: FloatArray, rows: npt.NDArray[np.int64]) -> FloatArray:
    """``values`` placed at their rows: ``out[rows[i]] = values[i]`` (``rows`` a permutation of 0..n-1)."""
    out = np.empty_like(values)
    out[rows] = values
    return out


def _float(arr: Any) -> FloatArray:
    if isinstance(arr, np.ma.MaskedArray):
        return np.ma.filled(arr.astype(np.float64), np.nan)
    return np.asarray(arr, dtype=np.float64)


def default_memory_limit() -> str:
    """Half of the physical memory, as a DuckDB memory_limit value."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "4GB"
    return f"{max(256, total // 2 // 2**20)}MB"


def select_runs(info: Mapping[str, Any], runs: Sequence[str] | None) -> list[str]:
    """The runs to read: every run of the lake (``info``, from ``list_runs``) when ``runs`` is None, else
    ``runs`` without repeats. Raises :class:`UnknownRunError` naming the ones the lake does not hold."""
    if runs is None:
        return sorted(info)
    selected = list(dict.fromkeys(runs))
    unknown = [r for r in selected if r not in info]
    if unknown:
        known = sorted(info)
        shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
        raise UnknownRunError(f"unknown run id(s): {', '.join(unknown)}; the lake has "
                              + (f"runs {shown}" if known else "no runs"))
    return selected


def list_runs(con: duckdb.DuckDBPyConnection) -> dict[str, RunInfo]:
    """Every run of the lake (``runs.sql``)."""
    rows = con.sql(sql.render("runs", {})).fetchall()
    return {str(r[0]): RunInfo(str(r[0]), r[1], r[2], r[3], int(r[4]), r[5]) for r in rows}


def load(lake: LakeArg, runs: list[str] | None = None, *,
         as_of: str | dict[str, int] | None = None, memory_limit: str | None = None,
         threads: int | None = None) -> EvalData:
    """Open the lake (pinned with ``as_of``), check the run ids and load the per-episode metrics and tool-call
    latencies of ``runs`` (every run of the lake when ``None``).

    DuckDB's memory limit defaults to half of the machine's memory (DuckDB's own default is 80%): the
    per-episode arrays of the statistics (~0.7 GB per million episodes) live beside it in this process.

    Raises :class:`UnknownRunError` naming the run ids the lake does not hold."""
    con = connect(lake, as_of, memory_limit=memory_limit or default_memory_limit(), threads=threads)
    try:
        versions = lake_versions(con)
        info = list_runs(con)
        selected = select_runs(info, runs)
        runs_sql = sql.quote_list(selected)
        try:
            con.execute("CREATE TEMP TABLE eval_episode_metrics AS "
                        + sql.render("episode_metrics", {"runs": runs_sql}))
            cols = ", ".join(EPISODE_FLOAT_COLUMNS)
            # fetched in the table's order and placed at ep_idx: cheaper than DuckDB sorting 80-odd columns
            raw = con.execute(f"SELECT ep_idx, {cols} FROM eval_episode_metrics").fetchnumpy()
            at = np.asarray(raw["ep_idx"], dtype=np.int64)
            ep = {c: _at_rows(_float(raw[c]), at) for c in EPISODE_FLOAT_COLUMNS}
            codes = con.execute("SELECT DISTINCT run_code, run_id FROM eval_episode_metrics").fetchall()
            run_codes = {str(r): int(c) for c, r in codes}
            slice_rows = con.execute("SELECT DISTINCT slice_code, run_id, split, env_version "
                                     "FROM eval_episode_metrics ORDER BY slice_code").fetchall()
            slices = [(str(r), str(s), str(v)) for _, r, s, v in slice_rows]
            tool = con.sql(sql.render("tool_latency", {"runs": runs_sql})).fetchnumpy()
            forgetting = _forgetting_columns(con, selected, ep)
        except duckdb.Error as e:
            raise QueryError(f"evaluation query failed: {str(e).splitlines()[0]}") from e
        # sorted by latency in the query: every subset (a run, a slice, a comparison arm) stays sorted, so the
        # sort inside each quantile bootstrap is nearly free (2-3x faster at 10^7 calls)
        tool_idx = np.asarray(tool["ep_idx"], dtype=np.int64)
        tool_lat = _float(tool["latency_ms"])
        n = int(ep["run_code"].shape[0])
        return EvalData(con=con, lake_versions=versions, runs=selected, run_info=info, ep=ep,
                        run_codes=run_codes, slices=slices, tool_ep_idx=tool_idx, tool_latency_ms=tool_lat,
                        n_episodes=n, extra=forgetting)
    except BaseException:
        con.close()
        raise
