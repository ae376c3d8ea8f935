"""Validation of a batch of episodes before anything is written.

Every check is vectorised over Arrow columns; failures become ``Issue`` objects that name the table, episode,
turn and field. ``validate_batch`` returns the issues grouped by episode, so the writer can reject invalid
episodes and still land the valid ones of the same batch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajlake.errors import Issue, ValidationError
from trajlake.schema import arrow_schema, table_def

TERMINATED_REASONS = frozenset({"success", "submitted", "gave_up", "safety_stop"})
TRUNCATED_REASONS = frozenset({"budget_steps", "budget_tokens", "budget_cost", "timeout", "env_failure", "safety_stop"})
_BOOKKEEPING = frozenset({"content_hash", "written_at", "schema_version", "writer_version", "trajlake_version"})


def _filled_by_writer(table: str, column: str) -> bool:
    """Columns the writer sets itself (hashes, versions, write time, the denormalised run_id of turns/events)."""
    return column in _BOOKKEEPING or (column == "run_id" and table in ("turns", "gateway_events"))


def conform(table: pa.Table, name: str, source: str | None = None) -> pa.Table:
    """Reorder, cast and complete ``table`` to the schema of ``name``.

    Missing nullable columns are filled with nulls; missing bookkeeping columns (hashes, versions, write time,
    the denormalised run_id of turns/events) are filled with nulls for the writer to set. Unknown columns,
    missing required columns, naive timestamps and impossible casts raise ``ValidationError``.
    """
    schema = arrow_schema(name)
    td = table_def(name)
    issues: list[Issue] = []
    known = td.column_set
    extra = [c for c in table.column_names if c not in known]
    for c in extra:
        issues.append(Issue(name, None, None, c, "unknown column (see `trajlake schema`)", source))
    cols: list[pa.ChunkedArray | pa.Array] = []
    present = set(table.column_names)
    for f in schema:
        if f.name not in present:
            if not f.nullable and not _filled_by_writer(name, f.name):
                issues.append(Issue(name, None, None, f.name, "required column is missing", source))
            cols.append(pa.nulls(table.num_rows, f.type))
            continue
        col = table.column(f.name)
        if pa.types.is_timestamp(col.type) and col.type.tz is None:
            issues.append(Issue(name, None, None, f.name, "timestamps must be timezone-aware (UTC)", source))
            cols.append(pa.nulls(table.num_rows, f.type))
            continue
        try:
            cols.append(col.cast(f.type) if col.type != f.type else col)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            issues.append(Issue(name, None, None, f.name, f"cannot convert {col.type} to {f.type}: {e}", source))
            cols.append(pa.nulls(table.num_rows, f.type))
    if issues:
        raise ValidationError(issues)
    # Built without the non-null flags: missing required values are reported per row by validate_batch.
    loose = pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)
    return pa.Table.from_arrays(cols, schema=loose)


def _np(a: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(a.to_numpy(zero_copy_only=False))


def _bool(a: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(a.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


@dataclass
class BatchReport:
    """Issues found in one batch, grouped by episode id (None: rows without an episode id)."""

    by_episode: dict[str | None, list[Issue]]

    @property
    def rejected(self) -> set[str | None]:
        return set(self.by_episode)

    def all_issues(self) -> list[Issue]:
        return [i for v in self.by_episode.values() for i in v]

    def raise_if_any(self) -> None:
        if self.by_episode:
            raise ValidationError(self.all_issues())


class _Collector:
    def __init__(self, source: str | None):
        self.by_episode: dict[str | None, list[Issue]] = defaultdict(list)
        self.source = source

    def add(self, table: str, ep_ids: list[str | None], turn_idx: list[int | None] | None,
            rows: np.ndarray, field: str, message: str) -> None:
        for r in np.flatnonzero(rows):
            ep = ep_ids[r]
            ti = turn_idx[r] if turn_idx is not None else None
            self.by_episode[ep].append(Issue(table, ep, ti, field, message, self.source))


def _common_checks(t: pa.Table, name: str, c: _Collector, ep_ids: list[str | None],
                   turn_idx: list[int | None] | None) -> None:
    td = table_def(name)
    for col in td.columns:
        arr = t.column(col.name)
        if not col.nullable and not _filled_by_writer(name, col.name) and arr.null_count:
            c.add(name, ep_ids, turn_idx, _bool(arr.is_null()), col.name, "required value is null")
        if col.enum is not None and arr.null_count < len(arr):
            bad = pc.and_(arr.is_valid(), pc.invert(pc.is_in(arr, value_set=_enum_values(col.enum))))
            if pc.any(bad).as_py():
                vals = arr.to_pylist()
                for r in np.flatnonzero(_bool(bad)):
                    c.by_episode[ep_ids[r]].append(Issue(
                        name, ep_ids[r], turn_idx[r] if turn_idx is not None else None, col.name,
                        f"{vals[r]!r} is not one of {', '.join(col.enum)}", c.source))
        if col.name in ("episode_id", "run_id", "task_id") and pa.types.is_string(arr.type):
            c.add(name, ep_ids, turn_idx, _bool(pc.equal(pc.utf8_length(arr), 0)), col.name, "must not be empty")


@cache
def _enum_values(values: tuple[str, ...]) -> pa.Array:
    return pa.array(values, pa.string())


def validate_batch(episodes: pa.Table, turns: pa.Table, events: pa.Table | None = None,
                   source: str | None = None) -> BatchReport:
    """Check conformed tables; return issues grouped by episode id."""
    c = _Collector(source)
    ep_ids: list[str | None] = episodes.column("episode_id").to_pylist()
    t_ep: list[str | None] = turns.column("episode_id").to_pylist()
    t_idx: list[int | None] = turns.column("turn_idx").to_pylist()
    _common_checks(episodes, "episodes", c, ep_ids, None)
    _common_checks(turns, "turns", c, t_ep, t_idx)

    # --- episodes: termination semantics and time order
    term, trunc = _bool(episodes["terminated"]), _bool(episodes["truncated"])
    c.add("episodes", ep_ids, None, term & trunc, "terminated", "terminated and truncated are both true")
    c.add("episodes", ep_ids, None, ~term & ~trunc, "terminated",
          "an episode ends either terminated (task semantics) or truncated (budget/infrastructure)")
    reasons = episodes["termination_reason"].to_pylist()
    bad_reason = np.array([
        (tm and r not in TERMINATED_REASONS) or (tr and not tm and r not in TRUNCATED_REASONS)
        if r is not None else False for r, tm, tr in zip(reasons, term, trunc, strict=True)
    ], dtype=bool)
    c.add("episodes", ep_ids, None, bad_reason, "termination_reason",
          "reason does not match terminated/truncated (budgets, timeout and env_failure are truncations)")
    c.add("episodes", ep_ids, None, _bool(pc.less(episodes["ended_at"], episodes["started_at"])),
          "ended_at", "ended_at is before started_at")
    for f in ("tokens_in", "tokens_out", "cost_usd", "tool_seconds", "wall_seconds", "n_turns", "attempt"):
        c.add("episodes", ep_ids, None, _bool(pc.less(episodes[f], 0)), f, "must not be negative")
    dup = _duplicates(ep_ids)
    c.add("episodes", ep_ids, None, dup, "episode_id", "episode id appears more than once in the batch")

    # --- turns: token-level arrays
    n = turns.num_rows
    tok, mask, lp = turns["token_ids"], turns["loss_mask"], turns["behavior_logprobs"]
    tok_len = _np(pc.list_value_length(tok).fill_null(-1))
    mask_len = _np(pc.list_value_length(mask).fill_null(-1))
    lp_len = _np(pc.list_value_length(lp).fill_null(-1))
    c.add("turns", t_ep, t_idx, (tok_len >= 0) & (mask_len < 0), "loss_mask", "token_ids given without loss_mask")
    c.add("turns", t_ep, t_idx, (mask_len >= 0) & (tok_len != mask_len), "loss_mask",
          "length differs from token_ids")
    c.add("turns", t_ep, t_idx, (lp_len >= 0) & (tok_len != lp_len), "behavior_logprobs",
          "length differs from token_ids")
    mask_arr = mask.combine_chunks() if isinstance(mask, pa.ChunkedArray) else mask
    flat = _np(pc.list_flatten(mask_arr)).astype(np.int64)
    parents = _np(pc.list_parent_indices(mask_arr)).astype(np.int64)
    bad_vals = np.zeros(n, dtype=bool)
    bad_vals[parents[(flat != 0) & (flat != 1)]] = True
    c.add("turns", t_ep, t_idx, bad_vals, "loss_mask", "values must be 0 or 1")
    mask_sum = np.bincount(parents, weights=(flat == 1), minlength=n).astype(np.int64) if n else np.zeros(0, np.int64)
    is_policy = _bool(pc.equal(turns["actor"], "policy"))
    c.add("turns", t_ep, t_idx, (mask_sum > 0) & ~is_policy, "loss_mask",
          "only policy turns may carry loss_mask 1 (tool, system, user and env text is 0)")
    c.add("turns", t_ep, t_idx, (mask_sum > 0) & _bool(turns["policy_version"].is_null()), "policy_version",
          "a turn with loss_mask 1 needs a policy_version")
    c.add("turns", t_ep, t_idx, _bool(pc.less(turns["ended_at"], turns["started_at"])), "ended_at",
          "ended_at is before started_at")
    for f in ("latency_ms", "tokens", "cost_usd", "tool_seconds"):
        c.add("turns", t_ep, t_idx, _bool(pc.less(turns[f], 0)), f, "must not be negative")

    # --- turns against their episode: contiguity, order, counts, time bounds
    ep_pos = {e: i for i, e in enumerate(ep_ids) if e is not None}
    t_start = _np(turns["started_at"].cast(pa.int64()).fill_null(0))
    t_end = _np(turns["ended_at"].cast(pa.int64()).fill_null(0))
    e_start = _np(episodes["started_at"].cast(pa.int64()).fill_null(0))
    e_end = _np(episodes["ended_at"].cast(pa.int64()).fill_null(0))
    e_run = episodes["run_id"].to_pylist()
    t_run = turns["run_id"].to_pylist()
    rows_of: dict[str, list[int]] = defaultdict(list)
    for r, e in enumerate(t_ep):
        if e is None:
            continue
        if e not in ep_pos:
            c.by_episode[e].append(Issue("turns", e, t_idx[r], "episode_id",
                                         "turn belongs to no episode of this batch", source))
            continue
        rows_of[e].append(r)
    n_turns = episodes["n_turns"].to_pylist()
    n_pol = episodes["n_policy_tokens"].to_pylist()
    for e, i in ep_pos.items():
        rows = sorted(rows_of.get(e, []), key=lambda r: _or(t_idx[r], -1))
        idx = [t_idx[r] for r in rows]
        if idx != list(range(len(rows))):
            c.by_episode[e].append(Issue("turns", e, None, "turn_idx",
                                         f"turn_idx must be 0..{len(rows) - 1} without gaps or repeats", source))
        if n_turns[i] is not None and n_turns[i] != len(rows):
            c.by_episode[e].append(Issue("episodes", e, None, "n_turns",
                                         f"says {n_turns[i]} but the batch has {len(rows)} turns", source))
        pol = int(sum(int(mask_sum[r]) for r in rows))
        if n_pol[i] is not None and n_pol[i] != pol:
            c.by_episode[e].append(Issue("episodes", e, None, "n_policy_tokens",
                                         f"says {n_pol[i]} but the turns' loss masks sum to {pol}", source))
        prev = None
        for r in rows:
            if t_run[r] is not None and t_run[r] != e_run[i]:
                c.by_episode[e].append(Issue("turns", e, t_idx[r], "run_id", "differs from the episode's run_id",
                                             source))
            if prev is not None and t_start[r] < prev:
                c.by_episode[e].append(Issue("turns", e, t_idx[r], "started_at",
                                             "turns are not in time order (started before the previous turn)", source))
            if t_start[r] < e_start[i] or t_end[r] > e_end[i]:
                c.by_episode[e].append(Issue("turns", e, t_idx[r], "started_at",
                                             "turn lies outside the episode's started_at..ended_at", source))
            prev = t_start[r]

    if events is not None and events.num_rows:
        ev_ep: list[str | None] = events["episode_id"].to_pylist()
        ev_idx: list[int | None] = events["turn_idx"].to_pylist()
        _common_checks(events, "gateway_events", c, ev_ep, ev_idx)
        for r, e in enumerate(ev_ep):
            if e is not None and e not in ep_pos:
                c.by_episode[e].append(Issue("gateway_events", e, ev_idx[r], "episode_id",
                                             "event belongs to no episode of this batch", source))
            elif e is not None and not 0 <= _or(ev_idx[r], 0) < _or(n_turns[ep_pos[e]], 1 << 31):
                c.by_episode[e].append(Issue("gateway_events", e, ev_idx[r], "turn_idx",
                                             "refers to a turn the episode does not have", source))
    return BatchReport(dict(c.by_episode))


def _or(v: int | None, default: int) -> int:
    return default if v is None else v


def _duplicates(ids: list[str | None]) -> np.ndarray:
    seen: dict[str, int] = {}
    out = np.zeros(len(ids), dtype=bool)
    for i, e in enumerate(ids):
        if e is None:
            continue
        if e in seen:
            out[i] = True
            out[seen[e]] = True
        else:
            seen[e] = i
    return out
