"""The buffered lake writer: validate, hash, buffer, and commit episodes in batches.

Commit point: an episode's turns and gateway events are committed first, then its episode row. Readers (the
views of ``trajlake.connect``) show turns and events only when their episode row exists, so no partial episode
is ever visible. A crash between the two commits leaves orphan turns: invisible, listed by ``verify`` and
removed by ``compact``. The writer encodes the files; the lake's commit protocol (``trajlake.lake.commit``: the
last id check, the compare-and-swap, late duplicates) commits them, one call per flush.

Buffering: Delta commits are expensive (each writes a log entry), so episodes are buffered and committed when
the buffer holds ``max_turn_rows`` turn rows or ``max_buffer_bytes`` bytes, when the oldest buffered episode is
``max_age_seconds`` old (checked on every add), on ``flush()``/``close()``, at interpreter exit, and on
SIGTERM/SIGINT when ``handle_signals`` is on. An episode is *acknowledged* once the ``flush`` that committed it
has returned.

Memory: an automatic flush commits on a background thread while new appends fill the next buffer. The commit
streams: it hashes and encodes the turns a row group at a time (``ROW_GROUP_BYTES``) and lets go of each part
of the buffer once it is in the file, so ``max_buffer_bytes`` bounds what the writer holds in all, the buffer
being filled plus what the commit has not written yet (an append waits for room). Past that, a commit works in
~90-100 MB (two row groups in flight, the Parquet encoder's scratch, memory freed since the last trim), measured
by bench/bench_lake.py. Below the default buffer the writer also has glibc hand large freed blocks straight back
(``release_memory_eagerly``): otherwise the heap keeps the freed arrays of earlier appends, which a small buffer
pays more than its own size for.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import functools
import os
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajlake._version import __version__
from trajlake.errors import ConflictError, Issue, TrajlakeError, ValidationError
from trajlake.lake.commit import (
    CommitOutcome,
    CommittedEpisodes,
    commit_episodes,
    commit_keyed_rows,
    drop_episodes,
    remove_uncommitted,
)
from trajlake.lake.hashing import episode_hashes, hash_rows_array
from trajlake.lake.store import ROW_GROUP_BYTES, ROW_GROUP_ROWS, DataFileSink, Lake
from trajlake.record import memory
from trajlake.record.episode import utcnow
from trajlake.record.recorder import EpisodeRecorder
from trajlake.record.validate import conform, loose_schema, validate_batch
from trajlake.schema import SCHEMA_VERSION

_LIVE_WRITERS: weakref.WeakSet[LakeWriter] = weakref.WeakSet()
# All the batch data a writer holds (the buffer being filled plus what a background commit has not written):
# with the ~100 MB a commit works in and ~185 MB of imports, a default writer stays under 512 MB (issue 16).
DEFAULT_BUFFER_BYTES = 128 * 1024 * 1024
_TRIM_EVERY_BYTES = 64 * 1024 * 1024
_SIGNALS_INSTALLED = False


@dataclass
class WriteResult:
    """Outcome of handing episodes to the writer."""

    accepted: list[str] = field(default_factory=list)
    """Episode ids accepted into the buffer (committed at the next flush)."""
    duplicates: list[str] = field(default_factory=list)
    """Episode ids already in the lake (or buffer) with identical content: no-ops."""
    rejected: dict[str, list[Issue]] = field(default_factory=dict)
    """Invalid or conflicting episodes, with their issues; nothing of them is written."""

    def raise_if_rejected(self) -> None:
        issues = [i for v in self.rejected.values() for i in v]
        if issues:
            raise ValidationError(issues)

    def merge(self, other: WriteResult) -> None:
        self.accepted += other.accepted
        self.duplicates += other.duplicates
        self.rejected.update(other.rejected)


@functools.cache
def _empty(name: str) -> pa.Table:
    return loose_schema(name).empty_table()  # tables are immutable: one per table name serves every call


def _set_column(t: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return t.set_column(t.schema.get_field_index(name), name, values)


@dataclass
class _Batch:
    """A buffer detached for committing; ``turns`` is consumed (and released) a row group at a time."""

    eps: list[pa.Table]
    turns: deque[tuple[pa.Table, int]]  # (table, its bytes as counted in the buffer)
    events: list[pa.Table]  # the episodes and events are small: held until the end of the commit


class LakeWriter:
    """Buffered writer for episodes (with turns and gateway events), tasks and runs."""

    def __init__(self, lake: Lake, *, max_turn_rows: int = 50_000, max_buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                 max_age_seconds: float = 30.0, handle_signals: bool = True,
                 release_memory_eagerly: bool | None = None):
        """``release_memory_eagerly`` (default: on when ``max_buffer_bytes`` is below the default) serves the
        process's allocations of 1 MiB or more from their own pages, handed back to the OS when freed (glibc's
        ``M_MMAP_THRESHOLD``; process-wide, left alone when the user set ``MALLOC_MMAP_THRESHOLD_``). Otherwise
        glibc keeps the freed arrays of earlier appends in its heap, which costs a small buffer more than its
        own size (bench/bench_lake.py: 2.6x of a 64 MiB buffer with 2,000-token rows, 2.0x with it); the
        price is CPU (~20% more of the writer's at 2,000-token rows), so pass ``False`` where memory is ample."""
        self.lake = lake
        if release_memory_eagerly or (release_memory_eagerly is None and max_buffer_bytes < DEFAULT_BUFFER_BYTES):
            memory.release_large_allocations_eagerly()
        self.max_turn_rows = max_turn_rows
        self.max_buffer_bytes = max_buffer_bytes
        self.max_age_seconds = max_age_seconds
        self._eps: list[pa.Table] = []
        self._turns: list[pa.Table] = []
        self._events: list[pa.Table] = []
        self._buffered: set[str] = set()  # episode ids in the buffer
        self._turn_bytes: list[int] = []
        self._bytes = 0
        self._turn_rows = 0
        self._oldest: float | None = None
        self._lock = threading.RLock()
        self._inflight = 0  # bytes of the buffer a commit has taken and not yet written
        self._untrimmed = 0  # bytes released since memory was last handed back to the OS
        self._room = threading.Condition()
        self._committed_ids = CommittedEpisodes(lake)  # the id look-ups, with their file and footer caches
        self.committed = 0
        self.late_conflicts: dict[str, list[Issue]] = {}
        self.closed = False
        self.late_duplicates: list[str] = []
        # times an episodes commit found the table moved since its check (another writer's commit) and
        # re-checked before trying again (its compare-and-swap; see ``lake.commit``)
        self.commit_conflicts = 0
        self._bg: threading.Thread | None = None
        self._bg_error: BaseException | None = None
        self._bg_committed: list[str] = []
        _LIVE_WRITERS.add(self)
        if handle_signals:
            _install_signal_handlers()

    @property
    def committing(self) -> bool:
        """Whether a background commit is running (its episodes are not acknowledged yet)."""
        return self._bg is not None and self._bg.is_alive()

    # -- context manager -------------------------------------------------------------------------------------
    def __enter__(self) -> LakeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Flush what is buffered. Raises ConflictError for episodes that lost a concurrent-write race."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        _LIVE_WRITERS.discard(self)
        if self.late_conflicts:
            raise ConflictError(
                "; ".join(str(i[0]) for i in self.late_conflicts.values())
            )

    # -- the single-episode API ------------------------------------------------------------------------------
    def start_episode(self, **kwargs: Any) -> EpisodeRecorder:
        """Begin recording an episode; see ``EpisodeRecorder`` for the arguments."""
        return EpisodeRecorder(self, **kwargs)

    # -- the batch API ---------------------------------------------------------------------------------------
    def write_batch(self, episodes: pa.Table | Sequence[Mapping[str, Any]],
                    turns: pa.Table | Sequence[Mapping[str, Any]],
                    gateway_events: pa.Table | Sequence[Mapping[str, Any]] | None = None,
                    *, source: str | None = None, dry_run: bool = False,
                    check_existing: bool = True) -> WriteResult:
        """Validate a batch and buffer its valid episodes; invalid ones are returned in ``rejected``.

        Tables must use the column names of schema v1 (``trajlake schema``); missing nullable and bookkeeping
        columns are filled. Raises ValidationError only for structural problems (unknown or missing columns).
        With ``dry_run`` everything is checked (against the lake too) but nothing is buffered.
        ``check_existing=False`` skips the early look-up of committed ids (for writers that know their ids are
        new, like a resumed rollout); the flush still drops duplicates exactly (see ``lake.commit``)."""
        ep = conform(to_table(episodes, "episodes"), "episodes", source)
        tu = conform(to_table(turns, "turns"), "turns", source)
        ev = conform(to_table(gateway_events, "gateway_events"), "gateway_events", source)
        # Denormalised run_id of turns/events comes from their episode when not given.
        run_of: dict[str, str] | None = None
        for name in ("tu", "ev"):
            t = tu if name == "tu" else ev
            if t.num_rows and t["run_id"].null_count:
                if run_of is None:
                    run_of = dict(zip(ep["episode_id"].to_pylist(), ep["run_id"].to_pylist(), strict=True))
                filled = [r if r is not None else run_of.get(e) for e, r in
                          zip(t["episode_id"].to_pylist(), t["run_id"].to_pylist(), strict=True)]
                t = _set_column(t, "run_id", pa.array(filled, pa.string()))
                if name == "tu":
                    tu = t
                else:
                    ev = t
        report = validate_batch(ep, tu, ev, source)
        result = WriteResult()
        for e, issues in report.by_episode.items():
            result.rejected[e if e is not None else "<missing episode_id>"] = issues
        bad = [e for e in report.by_episode if e is not None]
        if report.by_episode:
            ep, tu, ev = (drop_episodes(t, bad) for t in (ep, tu, ev))
            if None in report.by_episode:  # rows without an episode id cannot be attributed: drop those rows
                ep, tu, ev = (t.filter(pc.is_valid(t["episode_id"])) for t in (ep, tu, ev))
        if ep.num_rows == 0:
            return result
        with self._lock:
            ids = ep["episode_id"].to_pylist()
            if self._bg is not None and not self._bg.is_alive():
                # (not ``self._bg_committed += self._wait_background()``: that reads the list before the call
                # empties it and then extends it with itself, doubling it on every commit)
                done = self._wait_background()  # a failed background commit surfaces here
                self._bg_committed += done
            if any(e in self._buffered for e in ids):
                self.flush()  # classify against committed content (rare: the same id twice in one writer)
            existing = self._committed_ids.lookup(ids, ep["run_id"].to_pylist(), refresh=dry_run) \
                if check_existing or dry_run else {}
            given = ep["content_hash"].null_count < ep.num_rows or tu["content_hash"].null_count < tu.num_rows
            if existing or given:
                # Hashes are needed now: to tell duplicates from conflicts, or to check the given ones.
                ep, tu, ev, hash_issues = _hash(ep, tu, ev, source)
                result.rejected.update(hash_issues)
                skip = list(hash_issues)
                for e, h in zip(ep["episode_id"].to_pylist(), ep["content_hash"].to_pylist(), strict=True):
                    old = existing.get(e)
                    if old is None or e in hash_issues:
                        continue
                    skip.append(e)
                    if old == h:
                        result.duplicates.append(e)
                    else:
                        result.rejected[e] = [Issue("episodes", e, None, "content_hash",
                                                    "episode id already exists with different content", source)]
                if skip:
                    ep, tu, ev = (drop_episodes(t, skip) for t in (ep, tu, ev))
            if dry_run:
                result.accepted += ep["episode_id"].to_pylist()
                return result
            # Otherwise hashing waits for the flush, where it runs once, vectorised, over the whole buffer.
            if ep.num_rows:
                tu_bytes = tu.nbytes  # (walks every column's buffers: once per append)
                size = ep.nbytes + tu_bytes + (ev.nbytes if ev.num_rows else 0)
                if self._eps and self._bytes + size > self.max_buffer_bytes:
                    self._flush_background()  # the batch does not fit: commit what is buffered first
                self._wait_for_room(size)
                self._eps.append(ep)
                self._turns.append(tu)
                self._turn_bytes.append(tu_bytes)
                if ev.num_rows:
                    self._events.append(ev)
                for e in ep["episode_id"].to_pylist():
                    self._buffered.add(e)
                    result.accepted.append(e)
                self._bytes += size
                self._turn_rows += tu.num_rows
                self._oldest = self._oldest or time.monotonic()
            if self._should_flush():
                self._flush_background()
        return result

    def _wait_for_room(self, size: int) -> None:
        """Block while the buffer plus what a background commit still holds would pass ``max_buffer_bytes``
        (the commit releases the buffer as it writes it). A batch bigger than the whole budget goes in alone."""
        with self._room:
            while (self._bg is not None and self._bg.is_alive() and self._inflight
                   and self._bytes + self._inflight + size > self.max_buffer_bytes):
                self._room.wait(0.05)

    def _release(self, size: int) -> None:
        with self._room:
            self._inflight = max(0, self._inflight - size)
            self._room.notify_all()

    def _should_flush(self) -> bool:
        if not self._eps:
            return False
        return (self._turn_rows >= self.max_turn_rows or self._bytes >= self.max_buffer_bytes
                or (self._oldest is not None and time.monotonic() - self._oldest >= self.max_age_seconds))

    # -- committing ------------------------------------------------------------------------------------------
    def _take_buffer(self) -> _Batch | None:
        """Detach the buffered episodes (under the lock) for committing; their bytes count as in flight until
        the commit has written them."""
        if not self._eps:
            return None
        batch = _Batch(self._eps, deque(zip(self._turns, self._turn_bytes, strict=True)), self._events)
        self._eps, self._turns, self._events, self._turn_bytes = [], [], [], []
        self._buffered.clear()
        with self._room:
            self._inflight += self._bytes
        self._bytes = self._turn_rows = 0
        self._oldest = None
        return batch

    def _wait_background(self) -> list[str]:
        """Wait for the background commit, re-raise its error; returns the ids it committed (once)."""
        if self._bg is not None:
            self._bg.join()
            self._bg = None
        err, self._bg_error = self._bg_error, None
        if err is not None:
            raise TrajlakeError(f"a background commit failed: {err}") from err
        done, self._bg_committed = self._bg_committed, []
        return done

    def _flush_background(self) -> None:
        """Commit the buffer on a background thread while the caller keeps validating new batches: hashing and
        writing Parquet overlap with the next appends (the two use different cores)."""
        done = self._wait_background()
        self._bg_committed += done
        batch = self._take_buffer()
        if batch is None:
            return

        def work() -> None:
            try:
                committed = self._commit(batch)
                self._bg_committed += committed
            except BaseException as e:  # handed to the caller on its next call
                self._bg_error = e

        self._bg = threading.Thread(target=work, name="trajlake-commit", daemon=False)
        self._bg.start()

    def flush(self) -> list[str]:
        """Commit everything buffered (turns and events first, then episode rows) and wait for it.

        Returns the ids committed since the last ``flush`` (also those an automatic flush committed in the
        background): once it returns, they are acknowledged."""
        with self._lock:
            done = self._wait_background()
            batch = self._take_buffer()
            if batch is None:
                return done
            return done + self._commit(batch)

    def _commit(self, batch: _Batch) -> list[str]:
        try:
            return self._commit_streaming(batch)
        finally:
            with self._room:  # whatever happened, the batch no longer holds memory
                batch.turns.clear()
                self._inflight = 0
                self._room.notify_all()
            memory.return_free_memory()

    def _write_turns(self, sink: DataFileSink, group: pa.Table, size: int, hashes: Future[pa.Array], now: pa.Scalar,
                     bad: dict[str, list[Issue]], turn_keys: list[pa.Table]) -> None:
        """Write one row group of turns with its hashes, keep (episode_id, turn_idx, hash), release its bytes."""
        h = hashes.result()
        _check_given(group, h, "turns", bad)
        group = _set_column(group, "content_hash", h)
        group = _set_column(group, "written_at", pa.nulls(group.num_rows, now.type).fill_null(now))
        sink.write(group)
        # copies, so that nothing of the buffer's chunks outlives this row group
        turn_keys.append(pa.table({"episode_id": pa.concat_arrays(group["episode_id"].chunks),
                                   "turn_idx": pa.concat_arrays(group["turn_idx"].chunks), "hash": h}))
        del group
        self._release(size)
        self._untrimmed += size
        # a trim walks the heaps: not after every small row group, but often enough that what waits for it stays
        # a fraction of the buffer
        if self._untrimmed >= min(_TRIM_EVERY_BYTES, self.max_buffer_bytes // 4):
            self._untrimmed = 0
            memory.return_free_memory()

    def _commit_streaming(self, batch: _Batch) -> list[str]:
        """Hash and write the turns a row group at a time (releasing the buffer as it goes), then the events
        and episodes; the lake's commit protocol (``lake.commit.commit_episodes``) re-checks the ids and commits
        turns, events, episodes."""
        now = pa.scalar(utcnow(), pa.timestamp("us", tz="UTC"))
        bad: dict[str, list[Issue]] = {}
        turn_keys: list[pa.Table] = []
        with self.lake.open_sink("turns") as sink, ThreadPoolExecutor(1, "trajlake-hash") as hasher:
            # Two stages on two cores: row group k+1 is hashed while row group k is encoded (both release the GIL).
            pending: tuple[pa.Table, int, Future[pa.Array]] | None = None
            for group, size in _row_groups(batch.turns, ROW_GROUP_BYTES):
                nxt = (group, size, hasher.submit(hash_rows_array, group, "turns"))
                del group
                if pending is not None:
                    self._write_turns(sink, *pending, now, bad, turn_keys)
                pending = nxt
                del nxt
            if pending is not None:
                self._write_turns(sink, *pending, now, bad, turn_keys)
            pending = None
            turn_actions = sink.close()
        try:
            ep = pa.concat_tables(batch.eps)
            ev = pa.concat_tables(batch.events) if batch.events else to_table(None, "gateway_events")
            batch.eps.clear()
            batch.events.clear()
            ep, ev = _hash_small(ep, pa.concat_tables(turn_keys) if turn_keys else _KEYS_EMPTY, ev, None, bad)
            ep, ev = (_set_column(t, "written_at", pa.nulls(t.num_rows, now.type).fill_null(now)) for t in (ep, ev))
            if bad:  # given hashes were checked when buffered; this only guards against misuse
                self.late_conflicts.update(bad)
            event_actions = self.lake.write_files("gateway_events", drop_episodes(ev, list(bad))) if ev.num_rows else []
        except BaseException:
            remove_uncommitted(self.lake, turn_actions)
            raise
        try:
            ep = drop_episodes(ep, list(bad))
            # written before the check, so that the window between the check and the commit holds only commits
            ep_actions = self.lake.write_files("episodes", ep)
        except BaseException:
            remove_uncommitted(self.lake, turn_actions, event_actions)
            raise
        outcome = CommitOutcome()
        try:
            commit_episodes(self.lake, ep, turn_actions, event_actions, ep_actions,
                            committed_ids=self._committed_ids, rejected=list(bad), outcome=outcome)
        finally:  # what a failed commit found before it failed is reported too
            self.late_duplicates += outcome.late_duplicates
            self.late_conflicts.update(outcome.late_conflicts)
            self.commit_conflicts += outcome.commit_conflicts
        self.committed += len(outcome.committed)
        return outcome.committed

    # -- tasks and runs --------------------------------------------------------------------------------------
    def write_tasks(self, tasks: pa.Table | Sequence[Mapping[str, Any]]) -> int:
        """Add task rows; rows whose (task_id, task_version) already exist are skipped. Returns rows added."""
        return self._write_keyed("tasks", tasks)

    def write_runs(self, runs: pa.Table | Sequence[Mapping[str, Any]]) -> int:
        """Add run rows; an existing run id with identical content is a no-op, different content an error."""
        return self._write_keyed("runs", runs)

    def _write_keyed(self, name: str, rows: pa.Table | Sequence[Mapping[str, Any]]) -> int:
        from trajlake.record.validate import _Collector, _common_checks

        t = conform(to_table(rows, name), name)
        if name == "runs":
            t = _set_column(t, "trajlake_version", pc.fill_null(t["trajlake_version"], __version__))
        key = "run_id" if name == "runs" else "task_id"
        c = _Collector(None)
        keys = t[key].to_pylist()
        _common_checks(t, name, c, keys, None)
        if c.by_episode:
            raise ValidationError([i for v in c.by_episode.values() for i in v])
        now = utcnow()
        t = _set_column(t, "written_at", pa.array([now] * t.num_rows, pa.timestamp("us", tz="UTC")))
        return commit_keyed_rows(self.lake, name, t)


def to_table(data: pa.Table | Sequence[Mapping[str, Any]] | None, name: str) -> pa.Table:
    """Rows (dicts keyed by column name) or an Arrow table, as an Arrow table with the columns' schema types.

    List columns (token ids, masks, log-probs) may hold 1-D numpy arrays instead of Python lists: such a column
    becomes one Arrow list array from the concatenated values, without a Python object per token (the rollout
    recorder passes arrays; converting Python lists costs ~60 ns per element, most of a step's recording cost).
    """
    if data is None:
        return _empty(name)
    if isinstance(data, pa.Table):
        return data
    rows = list(data)
    if not rows:
        return to_table(None, name)
    loose = loose_schema(name)
    names = list(dict.fromkeys(k for r in rows for k in r))
    unknown = [n for n in names if n not in loose.names]
    if unknown:
        raise ValidationError([Issue(name, None, None, u, "unknown column (see `trajlake schema`)") for u in unknown])
    columns: list[pa.Array] = []
    fields = [loose.field(n) for n in names]
    for f in fields:
        values = [r.get(f.name) for r in rows]
        if pa.types.is_timestamp(f.type):
            for i, v in enumerate(values):
                if isinstance(v, dt.datetime) and v.tzinfo is None:
                    r = rows[i]
                    raise ValidationError([Issue(name, r.get("episode_id"), r.get("turn_idx") if name != "episodes"
                                                 else None, f.name, f"row {i}: timestamps must be timezone-aware (UTC)")])
        try:
            arr = _numpy_list_column(values, f.type) if pa.types.is_list(f.type) else None
            columns.append(arr if arr is not None else pa.array(values, type=f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
            bad = _first_bad_row(values, f.type)  # the error path only: name the row that does not convert
            r = rows[bad] if bad is not None else {}
            raise ValidationError([Issue(name, r.get("episode_id"), r.get("turn_idx") if name != "episodes" else None,
                                         f.name, f"row {bad}: cannot convert: {e}" if bad is not None
                                         else f"cannot convert rows: {e}")]) from e
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _first_bad_row(values: list[Any], t: pa.DataType) -> int | None:
    for i, v in enumerate(values):
        try:
            if isinstance(v, np.ndarray) and pa.types.is_list(t):
                pa.array(v).cast(t.value_type)
            else:
                pa.array([v], type=t)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            return i
    return None


def _numpy_list_column(values: list[Any], t: pa.DataType) -> pa.Array | None:
    """A list column whose values are all 1-D numpy arrays or None, as one ListArray; None when it is not."""
    if not any(isinstance(v, np.ndarray) for v in values):
        return None
    if not all(v is None or (isinstance(v, np.ndarray) and v.ndim == 1) for v in values):
        return None
    parts = [v for v in values if v is not None]
    lengths = np.fromiter((0 if v is None else v.shape[0] for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError(f"{int(offsets[-1]):,} list elements in one batch; write smaller batches")
    # a safe cast: out-of-range ids or fractional values fail as they would for Python lists
    child = pa.array(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)).cast(t.value_type)
    mask = pa.array([v is None for v in values], pa.bool_()) if len(parts) < len(values) else None
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), child, type=t, mask=mask)


_KEYS_EMPTY = pa.table({"episode_id": pa.array([], pa.string()), "turn_idx": pa.array([], pa.int32()),
                        "hash": pa.array([], pa.string())})


def _row_groups(turns: deque[tuple[pa.Table, int]], max_bytes: int) -> Iterator[tuple[pa.Table, int]]:
    """The buffered turn tables as row-group-sized tables (no copy) with their buffered bytes, taking each
    buffered table off the queue (the caller releases the bytes once the group is written)."""
    while turns:
        taken: list[pa.Table] = []
        rows = size = 0
        while turns and (not taken or (rows + turns[0][0].num_rows <= ROW_GROUP_ROWS
                                       and size + turns[0][1] <= max_bytes)):
            t, n = turns.popleft()
            taken.append(t)
            rows += t.num_rows
            size += n
        group = taken[0] if len(taken) == 1 else pa.concat_tables(taken)
        del taken
        yield group, size
        del group


def _check_given(t: pa.Table, hashes: pa.Array, name: str, issues: dict[str, list[Issue]],
                 source: str | None = None) -> None:
    """Report rows whose given content_hash differs from the computed one."""
    if "content_hash" not in t.column_names:
        return  # gateway events have no hash column of their own: they count in their episode's
    given = t["content_hash"].combine_chunks()
    if given.null_count == len(given):
        return
    wrong = pc.fill_null(pc.not_equal(given, hashes), False)
    if not pc.any(wrong).as_py():
        return
    rows = t.filter(wrong)
    turn = rows["turn_idx"].to_pylist() if name != "episodes" else [None] * rows.num_rows
    for e, i in zip(rows["episode_id"].to_pylist(), turn, strict=True):
        issues.setdefault(e, []).append(Issue(name, e, i, "content_hash",
                                              "given hash does not match the canonical encoding", source))


def _hash_small(ep: pa.Table, turn_keys: pa.Table, ev: pa.Table, source: str | None,
                issues: dict[str, list[Issue]]) -> tuple[pa.Table, pa.Table]:
    """Hash the events and the episodes (over their turns' hashes, ``turn_keys``: episode_id, turn_idx, hash);
    report mismatching given hashes into ``issues``."""
    ev_hashes = hash_rows_array(ev, "gateway_events")
    _check_given(ev, ev_hashes, "gateway_events", issues, source)
    event_keys = pa.table({"episode_id": ev["episode_id"], "turn_idx": ev["turn_idx"], "event_idx": ev["event_idx"],
                           "hash": ev_hashes})
    e_hash = pa.array(episode_hashes(ep, turn_keys, event_keys), pa.string())
    _check_given(ep, e_hash, "episodes", issues, source)
    ep = _set_column(ep, "content_hash", e_hash)
    ep = _set_column(ep, "schema_version", pc.fill_null(ep["schema_version"], SCHEMA_VERSION))
    ep = _set_column(ep, "writer_version", pc.fill_null(ep["writer_version"], __version__))
    return ep, ev


def _hash(ep: pa.Table, tu: pa.Table, ev: pa.Table, source: str | None
          ) -> tuple[pa.Table, pa.Table, pa.Table, dict[str, list[Issue]]]:
    """Set content hashes (turns, then episodes over their turns and events); report mismatching given ones."""
    issues: dict[str, list[Issue]] = {}
    t_hash = hash_rows_array(tu, "turns")
    _check_given(tu, t_hash, "turns", issues, source)
    keys = pa.table({"episode_id": tu["episode_id"], "turn_idx": tu["turn_idx"], "hash": t_hash})
    ep, ev = _hash_small(ep, keys, ev, source, issues)
    return ep, _set_column(tu, "content_hash", t_hash), ev, issues


def _flush_all() -> None:
    for w in list(_LIVE_WRITERS):
        with contextlib.suppress(Exception):
            w.flush()


def _install_signal_handlers() -> None:
    global _SIGNALS_INSTALLED
    if _SIGNALS_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    _SIGNALS_INSTALLED = True
    atexit.register(_flush_all)
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: FrameType | None, _prev: Any = previous) -> None:
            _flush_all()
            if callable(_prev):
                _prev(signum, frame)
            else:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, handler)
