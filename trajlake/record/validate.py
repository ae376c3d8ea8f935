"""Validation of a batch of episodes before anything is written.

Every check is vectorised over Arrow columns; failures become ``Issue`` objects that name the table, episode,
turn and field. ``validate_batch`` returns the issues grouped by episode, so the writer can reject invalid
episodes and still land the valid ones of the same batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, NoReturn, SupportsIndex, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajlake.errors import Issue, ValidationError
from trajlake.lake.values import impossible_token_values, one_array
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
    plan = _plan(name, table.schema)
    if plan is None:
        _raise_structural(table, name, source)
    issues: list[Issue] = []
    cols: list[pa.ChunkedArray | pa.Array] = []
    n = table.num_rows
    for f, at, cast in plan:
        if at < 0:
            cols.append(_nulls(f.type, n))
            continue
        col = table.column(at)
        if not cast:
            cols.append(col)
            continue
        try:
            cols.append(col.cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            issues.append(Issue(name, None, None, f.name, f"cannot convert {col.type} to {f.type}: {e}", source))
            cols.append(_nulls(f.type, n))
    if issues:
        raise ValidationError(issues)
    return pa.Table.from_arrays(cols, schema=loose_schema(name))


_Plan = list[tuple[pa.Field, int, bool]]
# Per table, the plans of the input schemas seen last: a writer appends batches of one shape many times, and
# working out the columns' order, casts and gaps took most of conform's time per append.
_PLANS: dict[str, list[tuple[pa.Schema, _Plan | None]]] = {}
_MAX_PLANS = 8
_NULL_ROWS = 4096
_NULLS: dict[pa.DataType, pa.Array] = {}


def _plan(name: str, given: pa.Schema) -> _Plan | None:
    """For each column of ``name``'s schema: (field, position in ``given`` or -1 when missing, whether it needs
    a cast); None when ``given`` has a structural problem (unknown or missing required columns, naive
    timestamps). Depends on the input schema only, so it is cached per schema."""
    seen = _PLANS.setdefault(name, [])
    for s, p in seen:
        if s.equals(given):
            return p
    known = table_def(name).column_set
    plan: _Plan | None = []
    at = {f.name: i for i, f in enumerate(given)}
    if len(at) < len(given) or any(c not in known for c in given.names):
        plan = None  # (repeated names: the error path reports them)
    for f in arrow_schema(name):
        i = at.get(f.name, -1)
        if i < 0:
            if not f.nullable and not _filled_by_writer(name, f.name):
                plan = None
        elif pa.types.is_timestamp(given.field(i).type) and given.field(i).type.tz is None:
            plan = None
        if plan is not None:
            plan.append((f, i, i >= 0 and given.field(i).type != f.type))
    seen.insert(0, (given, plan))
    del seen[_MAX_PLANS:]
    return plan


@cache
def loose_schema(name: str) -> pa.Schema:
    """The table's schema without the non-null flags: missing required values are reported per row by
    validate_batch."""
    schema = arrow_schema(name)
    return pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)


def _nulls(t: pa.DataType, n: int) -> pa.Array:
    """``n`` nulls of type ``t``: a slice of a cached array for batch-sized ``n`` (no allocation per append)."""
    if n > _NULL_ROWS:
        return pa.nulls(n, t)
    block = _NULLS.get(t)
    if block is None:
        block = _NULLS[t] = pa.nulls(_NULL_ROWS, t)
    return block.slice(0, n)


def _raise_structural(table: pa.Table, name: str, source: str | None) -> NoReturn:
    """Report every structural problem of ``table`` (and impossible casts) as one ValidationError."""
    schema = arrow_schema(name)
    known = table_def(name).column_set
    issues = [Issue(name, None, None, c, "unknown column (see `trajlake schema`)", source)
              for c in table.column_names if c not in known]
    present = set(table.column_names)
    for f in schema:
        if f.name not in present:
            if not f.nullable and not _filled_by_writer(name, f.name):
                issues.append(Issue(name, None, None, f.name, "required column is missing", source))
            continue
        col = table.column(f.name)
        if pa.types.is_timestamp(col.type) and col.type.tz is None:
            issues.append(Issue(name, None, None, f.name, "timestamps must be timezone-aware (UTC)", source))
            continue
        if col.type != f.type:
            try:
                col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                issues.append(Issue(name, None, None, f.name, f"cannot convert {col.type} to {f.type}: {e}",
                                    source))
    raise ValidationError(issues)


def _np(a: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(one_array(a).to_numpy(zero_copy_only=False))


def _bool(a: pa.ChunkedArray | pa.Array) -> np.ndarray:
    a = one_array(a)
    return np.asarray((a.fill_null(False) if a.null_count else a).to_numpy(zero_copy_only=False), dtype=bool)


def _valid(a: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return _bool(a.is_valid()) if a.null_count else np.ones(len(a), dtype=bool)


def _ints(a: pa.ChunkedArray | pa.Array, null: int) -> np.ndarray:
    """An integer (or timestamp: microseconds) column as int64, ``null`` where it is null."""
    a = one_array(a)
    if pa.types.is_timestamp(a.type):
        a = a.view(pa.int64())
    if a.null_count:
        a = a.fill_null(null)
    return np.asarray(a.to_numpy(zero_copy_only=False), dtype=np.int64)


def _negative(a: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Rows whose number is below 0 (null and NaN are not)."""
    v = _np(a)  # integers with nulls come back as floats with NaN, which compares false
    return np.asarray(v < 0, dtype=bool)


def _before(later: pa.ChunkedArray | pa.Array, earlier: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Rows where timestamp ``later`` < ``earlier`` (false where either is null)."""
    a, b = one_array(later), one_array(earlier)
    out = _ints(a, 0) < _ints(b, 0)
    if a.null_count or b.null_count:
        out &= _valid(a) & _valid(b)
    return out


def _list_lengths(a: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Per row, the list's length, -1 for a null list."""
    a = one_array(a)
    lengths = np.diff(np.asarray(a.offsets.to_numpy(zero_copy_only=False), dtype=np.int64))
    if a.null_count:
        lengths[~_valid(a)] = -1
    return lengths


def _empty_strings(a: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Rows holding the empty string (not null), from the string offsets."""
    a = one_array(a)
    n = len(a)
    if n == 0 or a.null_count == n:
        return np.zeros(n, dtype=bool)
    wide = pa.types.is_large_string(a.type)
    offsets = np.frombuffer(a.buffers()[1], dtype=np.int64 if wide else np.int32)[a.offset: a.offset + n + 1]
    out = np.diff(offsets) == 0
    return out & _valid(a) if a.null_count else out


class _Lazy(Sequence[Any]):
    """A column's Python values, converted on first use (only a batch with issues needs them)."""

    def __init__(self, col: pa.ChunkedArray | pa.Array) -> None:
        self._col = col
        self._values: list[Any] | None = None

    def _list(self) -> list[Any]:
        if self._values is None:
            self._values = self._col.to_pylist()
        return self._values

    def __len__(self) -> int:
        return len(self._col)

    @overload
    def __getitem__(self, i: SupportsIndex) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: SupportsIndex | slice) -> Any:
        return self._list()[i]


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

    def add(self, table: str, ep_ids: Sequence[str | None], turn_idx: Sequence[int | None] | None,
            rows: np.ndarray, field: str, message: str) -> None:
        if not rows.any():
            return
        for r in np.flatnonzero(rows).tolist():
            ep = ep_ids[r]
            ti = turn_idx[r] if turn_idx is not None else None
            self.by_episode[ep].append(Issue(table, ep, ti, field, message, self.source))


def _common_checks(t: pa.Table, name: str, c: _Collector, ep_ids: Sequence[str | None],
                   turn_idx: Sequence[int | None] | None) -> None:
    """Required values, enum values and non-empty ids: O(columns) Arrow calls, none unless a column can fail
    (a batch is validated on every append, so the per-call cost matters more than the per-row one)."""
    for column, required, enum, id_column in _checked_columns(name):
        arr = t.column(column)
        nulls = arr.null_count
        if required and nulls:
            c.add(name, ep_ids, turn_idx, _bool(arr.is_null()), column, "required value is null")
        if enum is not None and nulls < len(arr):
            bad = ~_bool(pc.is_in(arr, value_set=_enum_values(enum)))
            if nulls:
                bad &= _valid(arr)
            if bad.any():
                vals = arr.to_pylist()
                for r in np.flatnonzero(bad).tolist():
                    c.by_episode[ep_ids[r]].append(Issue(
                        name, ep_ids[r], turn_idx[r] if turn_idx is not None else None, column,
                        f"{vals[r]!r} is not one of {', '.join(enum)}", c.source))
        if id_column and pa.types.is_string(arr.type):
            c.add(name, ep_ids, turn_idx, _empty_strings(arr), column, "must not be empty")


@cache
def _checked_columns(name: str) -> list[tuple[str, bool, tuple[str, ...] | None, bool]]:
    """(column, required, enum values, must not be empty) for the columns of ``name`` with something to check."""
    out = []
    for col in table_def(name).columns:
        required = not col.nullable and not _filled_by_writer(name, col.name)
        id_column = col.name in ("episode_id", "run_id", "task_id")
        if required or col.enum is not None or id_column:
            out.append((col.name, required, col.enum, id_column))
    return out


@cache
def _enum_values(values: tuple[str, ...]) -> pa.Array:
    return pa.array(values, pa.string())


# Every reason once, and per reason (plus a last slot for "none of them") whether it may end a terminated or a
# truncated episode: one look-up answers both.
_REASONS = tuple(sorted(TERMINATED_REASONS | TRUNCATED_REASONS))
_TERMINATED_OK = np.array([r in TERMINATED_REASONS for r in _REASONS] + [False])
_TRUNCATED_OK = np.array([r in TRUNCATED_REASONS for r in _REASONS] + [False])


def validate_batch(episodes: pa.Table, turns: pa.Table, events: pa.Table | None = None,
                   source: str | None = None) -> BatchReport:
    """Check conformed tables; return issues grouped by episode id.

    Vectorised over whole columns (numpy on the Arrow buffers where it can, a few Arrow kernels where it
    cannot); the rows' Python values are only built for the batches that have issues to report."""
    c = _Collector(source)
    ep_ids = _Lazy(episodes.column("episode_id"))
    t_ep = _Lazy(turns.column("episode_id"))
    t_idx = _Lazy(turns.column("turn_idx"))
    _common_checks(episodes, "episodes", c, ep_ids, None)
    _common_checks(turns, "turns", c, t_ep, t_idx)

    # --- episodes: termination semantics and time order
    term, trunc = _bool(episodes["terminated"]), _bool(episodes["truncated"])
    c.add("episodes", ep_ids, None, term & trunc, "terminated", "terminated and truncated are both true")
    c.add("episodes", ep_ids, None, ~term & ~trunc, "terminated",
          "an episode ends either terminated (task semantics) or truncated (budget/infrastructure)")
    reason = episodes["termination_reason"]
    has_reason = _valid(reason)
    code = _ints(pc.index_in(reason, value_set=_enum_values(_REASONS)), len(_REASONS))
    term_ok, trunc_ok = _TERMINATED_OK[code], _TRUNCATED_OK[code]
    c.add("episodes", ep_ids, None, has_reason & ((term & ~term_ok) | (trunc & ~term & ~trunc_ok)),
          "termination_reason",
          "reason does not match terminated/truncated (budgets, timeout and env_failure are truncations)")
    c.add("episodes", ep_ids, None, _before(episodes["ended_at"], episodes["started_at"]),
          "ended_at", "ended_at is before started_at")
    for f in ("tokens_in", "tokens_out", "cost_usd", "tool_seconds", "wall_seconds", "n_turns", "attempt",
              "policy_lag"):
        c.add("episodes", ep_ids, None, _negative(episodes[f]), f, "must not be negative")
    c.add("episodes", ep_ids, None, _duplicates(episodes.column("episode_id"), ep_ids), "episode_id",
          "episode id appears more than once in the batch")

    # --- turns: token-level arrays
    tok, mask, lp = turns["token_ids"], turns["loss_mask"], turns["behavior_logprobs"]
    tok_len, mask_len, lp_len = _list_lengths(tok), _list_lengths(mask), _list_lengths(lp)
    c.add("turns", t_ep, t_idx, (tok_len >= 0) & (mask_len < 0), "loss_mask", "token_ids given without loss_mask")
    c.add("turns", t_ep, t_idx, (mask_len >= 0) & (tok_len != mask_len), "loss_mask",
          "length differs from token_ids")
    c.add("turns", t_ep, t_idx, (lp_len >= 0) & (tok_len != lp_len), "behavior_logprobs",
          "length differs from token_ids")
    bad_vals, mask_sum = _mask_stats(one_array(mask))
    c.add("turns", t_ep, t_idx, bad_vals, "loss_mask", "values must be 0 or 1")
    for rows, field, message in impossible_token_values(turns):
        c.add("turns", t_ep, t_idx, rows, field, message)
    is_policy = _bool(pc.equal(turns["actor"], "policy"))
    c.add("turns", t_ep, t_idx, (mask_sum > 0) & ~is_policy, "loss_mask",
          "only policy turns may carry loss_mask 1 (tool, system, user and env text is 0)")
    pv = turns["policy_version"]
    if pv.null_count:
        c.add("turns", t_ep, t_idx, (mask_sum > 0) & ~_valid(pv), "policy_version",
              "a turn with loss_mask 1 needs a policy_version")
    c.add("turns", t_ep, t_idx, _before(turns["ended_at"], turns["started_at"]), "ended_at",
          "ended_at is before started_at")
    for f in ("latency_ms", "tokens", "cost_usd", "tool_seconds", "prompt_tokens"):
        c.add("turns", t_ep, t_idx, _negative(turns[f]), f, "must not be negative")

    # --- turns against their episode: contiguity, order, counts, time bounds (vectorised: no loop per row)
    n_ep = episodes.num_rows
    # position of each turn's episode in this batch (-1: no episode id, or an id the batch does not have)
    pos = _ints(pc.index_in(turns["episode_id"], value_set=episodes["episode_id"]), -1)
    has_ep = _valid(turns["episode_id"])
    if not has_ep.all():
        pos[~has_ep] = -1
    c.add("turns", t_ep, t_idx, has_ep & (pos < 0), "episode_id", "turn belongs to no episode of this batch")
    ep_valid = _valid(episodes["episode_id"])
    rows = np.flatnonzero(pos >= 0)
    p = pos[rows]
    ti = _ints(turns["turn_idx"], -1)[rows]
    order = np.lexsort((ti, p))  # by episode, then turn_idx: the order the contiguity and time checks need
    rows, p, ti = rows[order], p[order], ti[order]
    count = np.bincount(p, minlength=n_ep)
    first = np.concatenate(([0], np.cumsum(count)[:-1])).astype(np.int64) if n_ep else np.zeros(0, np.int64)
    rank = np.arange(rows.shape[0], dtype=np.int64) - first[p]
    gaps = np.bincount(p, weights=(ti != rank), minlength=n_ep) > 0
    for i in np.flatnonzero(gaps & ep_valid):
        c.by_episode[ep_ids[i]].append(Issue("turns", ep_ids[i], None, "turn_idx",
                                             f"turn_idx must be 0..{count[i] - 1} without gaps or repeats", source))
    n_turns = _ints(episodes["n_turns"], -1)
    for i in np.flatnonzero((n_turns >= 0) & (n_turns != count) & ep_valid):
        c.by_episode[ep_ids[i]].append(Issue("episodes", ep_ids[i], None, "n_turns",
                                             f"says {n_turns[i]} but the batch has {count[i]} turns", source))
    pol = np.bincount(p, weights=mask_sum[rows], minlength=n_ep).astype(np.int64)
    n_pol = _ints(episodes["n_policy_tokens"], -1)
    for i in np.flatnonzero((n_pol >= 0) & (n_pol != pol) & ep_valid):
        c.by_episode[ep_ids[i]].append(Issue("episodes", ep_ids[i], None, "n_policy_tokens",
                                             f"says {n_pol[i]} but the turns' loss masks sum to {pol[i]}", source))
    if rows.shape[0]:
        run_bad = _foreign_run(episodes["run_id"], turns["run_id"], p, rows)
        t_start = _ints(turns["started_at"], 0)[rows]
        t_end = _ints(turns["ended_at"], 0)[rows]
        e_start = _ints(episodes["started_at"], 0)[p]
        e_end = _ints(episodes["ended_at"], 0)[p]
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
        ev_ep = _Lazy(events["episode_id"])
        ev_idx = _Lazy(events["turn_idx"])
        _common_checks(events, "gateway_events", c, ev_ep, ev_idx)
        ev_has = _valid(events["episode_id"])
        ev_pos = _ints(pc.index_in(events["episode_id"], value_set=episodes["episode_id"]), -1)
        ev_pos[~ev_has] = -1
        c.add("gateway_events", ev_ep, ev_idx, ev_has & (ev_pos < 0), "episode_id",
              "event belongs to no episode of this batch")
        limit = np.where(n_turns >= 0, n_turns, 1 << 31)[np.maximum(ev_pos, 0)]
        ti_ev = _ints(events["turn_idx"], 0)
        c.add("gateway_events", ev_ep, ev_idx, (ev_pos >= 0) & ((ti_ev < 0) | (ti_ev >= limit)), "turn_idx",
              "refers to a turn the episode does not have")
    return BatchReport(dict(c.by_episode))


def _foreign_run(ep_run: pa.ChunkedArray, turn_run: pa.ChunkedArray, p: np.ndarray, rows: np.ndarray
                 ) -> np.ndarray:
    """For the turns ``rows`` (of episodes at positions ``p``): a run_id given and different from their
    episode's. Most batches come from one run: then one comparison of distinct values answers it."""
    e_one, t_one = one_array(ep_run), one_array(turn_run)
    if not t_one.null_count and not e_one.null_count:
        runs = pc.unique(e_one)
        if len(runs) == 1 and pc.all(pc.equal(t_one, runs[0])).as_py():
            return np.zeros(rows.shape[0], dtype=bool)
    e_run = e_one.take(pa.array(p))
    t_run = t_one.take(pa.array(rows))
    return _bool(pc.and_(t_run.is_valid(), pc.not_equal(t_run, e_run).fill_null(True)))


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
    valid = _valid(mask)
    lengths = np.diff(offsets)
    nonempty = lengths > 0
    starts = offsets[:-1][nonempty]  # empty lists add nothing, so each segment ends where the next one starts

    def per_turn(x: np.ndarray, dtype: type = np.int64) -> np.ndarray:
        out = np.zeros(n, dtype=np.int64)
        if starts.shape[0]:
            out[nonempty] = np.add.reduceat(x, starts, dtype=dtype)
        return np.where(valid, out, 0)

    if v.dtype == np.int8 and (v.shape[0] == 0 or int(v.view(np.uint8).max()) <= 1):
        # 0s and 1s: summed as unsigned bytes into uint32 (twice as fast as int8 into int64; a list holds
        # fewer than 2**31 values, so the count cannot overflow)
        return np.zeros(n, dtype=bool), per_turn(v.view(np.uint8), np.uint32)
    binary = (v == 0) | (v == 1)
    return per_turn(~binary) > 0, per_turn(v == 1)


def _or(v: int | None, default: int) -> int:
    return default if v is None else v


def _duplicates(col: pa.ChunkedArray, ids: Sequence[str | None]) -> np.ndarray:
    """Rows whose (non-null) id occurs more than once; one Arrow call when there are none."""
    out = np.zeros(len(ids), dtype=bool)
    if pc.count_distinct(col).as_py() == len(col) - col.null_count:
        return out
    seen: dict[str, int] = {}
    for i in range(len(ids)):
        e = ids[i]
        if e is None:
            continue
        if e in seen:
            out[i] = True
            out[seen[e]] = True
        else:
            seen[e] = i
    return out
