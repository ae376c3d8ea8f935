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
from trajlake.schemas.vocab import TERMINATED_REASONS, TRUNCATED_REASONS

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
        if not rows.any():
            return
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
    reason = episodes["termination_reason"]
    has_reason = _bool(reason.is_valid())
    term_ok = _bool(pc.is_in(reason, value_set=_enum_values(tuple(sorted(TERMINATED_REASONS)))))
    trunc_ok = _bool(pc.is_in(reason, value_set=_enum_values(tuple(sorted(TRUNCATED_REASONS)))))
    c.add("episodes", ep_ids, None, has_reason & ((term & ~term_ok) | (trunc & ~term & ~trunc_ok)),
          "termination_reason",
          "reason does not match terminated/truncated (budgets, timeout and env_failure are truncations)")
    c.add("episodes", ep_ids, None, _bool(pc.less(episodes["ended_at"], episodes["started_at"])),
          "ended_at", "ended_at is before started_at")
    for f in ("tokens_in", "tokens_out", "cost_usd", "tool_seconds", "wall_seconds", "n_turns", "attempt",
              "policy_lag"):
        c.add("episodes", ep_ids, None, _bool(pc.less(episodes[f], 0)), f, "must not be negative")
    dup = _duplicates(ep_ids)
    c.add("episodes", ep_ids, None, dup, "episode_id", "episode id appears more than once in the batch")

    # --- turns: token-level arrays
    tok, mask, lp = turns["token_ids"], turns["loss_mask"], turns["behavior_logprobs"]
    tok_len = _np(pc.list_value_length(tok).fill_null(-1))
    mask_len = _np(pc.list_value_length(mask).fill_null(-1))
    lp_len = _np(pc.list_value_length(lp).fill_null(-1))
    c.add("turns", t_ep, t_idx, (tok_len >= 0) & (mask_len < 0), "loss_mask", "token_ids given without loss_mask")
    c.add("turns", t_ep, t_idx, (mask_len >= 0) & (tok_len != mask_len), "loss_mask",
          "length differs from token_ids")
    c.add("turns", t_ep, t_idx, (lp_len >= 0) & (tok_len != lp_len), "behavior_logprobs",
          "length differs from token_ids")
    bad_vals, mask_sum = _mask_stats(mask.combine_chunks() if isinstance(mask, pa.ChunkedArray) else mask)
    c.add("turns", t_ep, t_idx, bad_vals, "loss_mask", "values must be 0 or 1")
    is_policy = _bool(pc.equal(turns["actor"], "policy"))
    c.add("turns", t_ep, t_idx, (mask_sum > 0) & ~is_policy, "loss_mask",
          "only policy turns may carry loss_mask 1 (tool, system, user and env text is 0)")
    c.add("turns", t_ep, t_idx, (mask_sum > 0) & _bool(turns["policy_version"].is_null()), "policy_version",
          "a turn with loss_mask 1 needs a policy_version")
    c.add("turns", t_ep, t_idx, _bool(pc.less(turns["ended_at"], turns["started_at"])), "ended_at",
          "ended_at is before started_at")
    for f in ("latency_ms", "tokens", "cost_usd", "tool_seconds", "prompt_tokens"):
        c.add("turns", t_ep, t_idx, _bool(pc.less(turns[f], 0)), f, "must not be negative")

    # --- turns against their episode: contiguity, order, counts, time bounds (vectorised: no loop per row)
    n_ep = episodes.num_rows
    # position of each turn's episode in this batch (-1: no episode id, or an id the batch does not have)
    has_ep = _bool(turns["episode_id"].is_valid())
    pos = np.where(has_ep, _np(pc.index_in(turns["episode_id"], value_set=episodes["episode_id"]).fill_null(-1)),
                   -1).astype(np.int64)
    c.add("turns", t_ep, t_idx, has_ep & (pos < 0), "episode_id", "turn belongs to no episode of this batch")
    ep_valid = _bool(episodes["episode_id"].is_valid())
    rows = np.flatnonzero(pos >= 0)
    p = pos[rows]
    ti = _np(turns["turn_idx"].fill_null(-1)).astype(np.int64)[rows]
    order = np.lexsort((ti, p))  # by episode, then turn_idx: the order the contiguity and time checks need
    rows, p, ti = rows[order], p[order], ti[order]
    count = np.bincount(p, minlength=n_ep)
    first = np.concatenate(([0], np.cumsum(count)[:-1])).astype(np.int64) if n_ep else np.zeros(0, np.int64)
    rank = np.arange(rows.shape[0], dtype=np.int64) - first[p]
    gaps = np.bincount(p, weights=(ti != rank), minlength=n_ep) > 0
    for i in np.flatnonzero(gaps & ep_valid):
        c.by_episode[ep_ids[i]].append(Issue("turns", ep_ids[i], None, "turn_idx",
                                             f"turn_idx must be 0..{count[i] - 1} without gaps or repeats", source))
    n_turns = _np(episodes["n_turns"].fill_null(-1)).astype(np.int64)
    for i in np.flatnonzero((n_turns >= 0) & (n_turns != count) & ep_valid):
        c.by_episode[ep_ids[i]].append(Issue("episodes", ep_ids[i], None, "n_turns",
                                             f"says {n_turns[i]} but the batch has {count[i]} turns", source))
    pol = np.bincount(p, weights=mask_sum[rows], minlength=n_ep).astype(np.int64)
    n_pol = _np(episodes["n_policy_tokens"].fill_null(-1)).astype(np.int64)
    for i in np.flatnonzero((n_pol >= 0) & (n_pol != pol) & ep_valid):
        c.by_episode[ep_ids[i]].append(Issue("episodes", ep_ids[i], None, "n_policy_tokens",
                                             f"says {n_pol[i]} but the turns' loss masks sum to {pol[i]}", source))
    if rows.shape[0]:
        e_run = episodes["run_id"].take(pa.array(p))
        t_run = turns["run_id"].take(pa.array(rows))
        run_bad = _bool(pc.and_(t_run.is_valid(), pc.not_equal(t_run, e_run).fill_null(True)))
        t_start = _np(turns["started_at"].cast(pa.int64()).fill_null(0))[rows]
        t_end = _np(turns["ended_at"].cast(pa.int64()).fill_null(0))[rows]
        e_start = _np(episodes["started_at"].cast(pa.int64()).fill_null(0))[p]
        e_end = _np(episodes["ended_at"].cast(pa.int64()).fill_null(0))[p]
        earlier = np.zeros(rows.shape[0], dtype=bool)
        earlier[1:] = (t_start[1:] < t_start[:-1]) & (p[1:] == p[:-1])
        outside = (t_start < e_start) | (t_end > e_end)
        for bad, field, message in (
                (run_bad, "run_id", "differs from the episode's run_id"),
                (earlier, "started_at", "turns are not in time order (started before the previous turn)"),
                (outside, "started_at", "turn lies outside the episode's started_at..ended_at")):
            for k in np.flatnonzero(bad & ep_valid[p]):
                r = int(rows[k])
                c.by_episode[t_ep[r]].append(Issue("turns", t_ep[r], t_idx[r], field, message, source))

    if events is not None and events.num_rows:
        ev_ep: list[str | None] = events["episode_id"].to_pylist()
        ev_idx: list[int | None] = events["turn_idx"].to_pylist()
        _common_checks(events, "gateway_events", c, ev_ep, ev_idx)
        ev_has = _bool(events["episode_id"].is_valid())
        ev_pos = np.where(ev_has, _np(pc.index_in(events["episode_id"], value_set=episodes["episode_id"])
                                      .fill_null(-1)), -1).astype(np.int64)
        c.add("gateway_events", ev_ep, ev_idx, ev_has & (ev_pos < 0), "episode_id",
              "event belongs to no episode of this batch")
        limit = np.where(n_turns >= 0, n_turns, 1 << 31)[np.maximum(ev_pos, 0)]
        ti_ev = _np(events["turn_idx"].fill_null(0)).astype(np.int64)
        c.add("gateway_events", ev_ep, ev_idx, (ev_pos >= 0) & ((ti_ev < 0) | (ti_ev >= limit)), "turn_idx",
              "refers to a turn the episode does not have")
    return BatchReport(dict(c.by_episode))


def _mask_stats(mask: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per turn: whether its loss mask has a value other than 0/1 (or a null), and its number of 1s.

    Works on the list's offsets and flat values with segment sums (``np.add.reduceat``), one pass over the
    tokens; the common case, an int8 mask of 0s and 1s, needs no temporary array per token."""
    n = len(mask)
    if n == 0:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)
    offsets = np.asarray(mask.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    v = mask.values.slice(lo, hi - lo).to_numpy(zero_copy_only=False)  # int8, or float with NaN for nulls
    offsets -= lo
    valid = _bool(mask.is_valid())
    lengths = np.diff(offsets)
    nonempty = lengths > 0
    starts = offsets[:-1][nonempty]  # empty lists add nothing, so each segment ends where the next one starts

    def per_turn(x: np.ndarray) -> np.ndarray:
        out = np.zeros(n, dtype=np.int64)
        if starts.shape[0]:
            out[nonempty] = np.add.reduceat(x, starts, dtype=np.int64)
        return np.where(valid, out, 0)

    if v.dtype == np.int8 and bool((v.view(np.uint8) <= 1).all()):
        return np.zeros(n, dtype=bool), per_turn(v)
    binary = (v == 0) | (v == 1)
    return per_turn(~binary) > 0, per_turn(v == 1)


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
