"""The commit protocol: how a writer's files become committed rows, each episode once, whoever else commits.

Episodes (``commit_episodes``): a flush's turns and gateway events are committed first, then its episode rows.
Readers show turns and events only when their episode row exists, so no partial episode is ever visible; a crash
between the commits leaves orphan turns (invisible, listed by ``verify``, removed by ``compact``). The ids are
checked against the lake (``CommittedEpisodes``) and the episode rows committed as the version of the episodes
table right after the one checked, or not at all: a compare-and-swap on the Delta log
(``Lake.commit_if_unchanged``). A writer that loses it re-checks its ids against only what the winners added,
drops those now present (a late duplicate for identical content, a late conflict otherwise), retracts their
turns and events (already committed) and tries again. Runs and tasks (``commit_keyed_rows``) are committed the
same way, re-read whole (they are small).

On a local lake the check and the commits also run under a per-lake file lock (``_trajlake/commit.lock``): the
writer processes of one machine then take turns and never race. Object storage has no lock and needs none for
correctness; the compare-and-swap also covers writers on several machines sharing a local-looking folder.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import json
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from deltalake.transaction import AddAction, RemoveAction

from trajlake.errors import ConflictError, Issue, TrajlakeError
from trajlake.lake.hashing import hash_rows
from trajlake.lake.store import Lake

# Tries of the episodes (and runs/tasks) compare-and-swap: each loss means another writer committed, so the lake
# as a whole progresses; the bound only ends one writer's run of bad luck (with jittered backoff between tries).
_CAS_ATTEMPTS = 200
# How stale the early duplicate check's file list may be (the commit re-checks exactly).
_REFRESH_SECONDS = 1.0

FileRange = tuple[str | None, str, str | None, str | None]
"""(run_id partition, path, min episode_id, max episode_id) of a data file of the episodes table."""


@dataclass
class CommitOutcome:
    """What ``commit_episodes`` did with a flush's episodes."""

    committed: list[str] = field(default_factory=list)
    """Episode ids committed (acknowledged once the call returns)."""
    late_duplicates: list[str] = field(default_factory=list)
    """Ids another writer committed first with identical content: dropped, nothing of them committed twice."""
    late_conflicts: dict[str, list[Issue]] = field(default_factory=dict)
    """Ids another writer committed first with different content: dropped, with the issue to report."""
    commit_conflicts: int = 0
    """Times the episodes commit found the table moved since its check and re-checked before trying again."""


def commit_episodes(lake: Lake, episodes: pa.Table, turn_actions: list[AddAction], event_actions: list[AddAction],
                    episode_actions: list[AddAction], *, committed_ids: CommittedEpisodes,
                    rejected: Sequence[str] = (), outcome: CommitOutcome | None = None) -> CommitOutcome:
    """Commit a flush's written, uncommitted files: turns, then gateway events, then the episode rows
    (``episodes``, the rows of ``episode_actions``, with their content hashes) as a compare-and-swap, each id once.

    ``rejected``: ids whose turns the turn files still hold but that must not be committed (their given hashes
    were wrong). Files of ids dropped before their commit are rewritten without them and the old ones deleted;
    whatever fails before a table's commit leaves no uncommitted file behind. ``committed_ids`` is the writer's
    id look-up (its footer cache). ``outcome`` is filled as the protocol goes (a caller that passes its own sees
    the late duplicates and conflicts found before a failure too); returns it."""
    outcome = CommitOutcome() if outcome is None else outcome
    with _commit_lock(lake):
        outcome.committed = _commit_checked(lake, episodes, turn_actions, event_actions, episode_actions,
                                            list(rejected), committed_ids, outcome)
    return outcome


def _late(ep: pa.Table, existing: dict[str, str], outcome: CommitOutcome) -> list[str]:
    """Sort ids another writer committed first into late duplicates (same content) and late conflicts;
    returns them (to drop)."""
    mine = dict(zip(ep["episode_id"].to_pylist(), ep["content_hash"].to_pylist(), strict=True))
    for e, h in existing.items():
        if h == mine[e]:
            outcome.late_duplicates.append(e)
        else:
            outcome.late_conflicts[e] = [Issue("episodes", e, None, "content_hash",
                                               "episode id was committed concurrently with different content")]
    return list(existing)


def _commit_checked(lake: Lake, ep: pa.Table, turn_actions: list[AddAction], event_actions: list[AddAction],
                    ep_actions: list[AddAction], bad: list[str], committed_ids: CommittedEpisodes,
                    outcome: CommitOutcome) -> list[str]:
    """Check the ids against the lake, commit turns and events, then the episode rows as the next version
    of the episodes table after the one checked (``Lake.commit_if_unchanged``). Another writer committing
    episodes in between makes that fail: the ids are re-checked against only what it added, any found are
    dropped (and their turns and events, already committed, retracted), and the commit is tried again.
    So two writers racing with one id commit it once, on object storage as on a local lake (where the
    commit lock serialises writers of one machine, and the compare-and-swap catches everyone else)."""
    run_ids = ep["run_id"].to_pylist()
    version, acts = lake.latest_snapshot("episodes")
    seen = set(acts["path"].to_pylist())
    existing = committed_ids.lookup(ep["episode_id"].to_pylist(), run_ids, files=file_ranges(acts))
    late = _late(ep, existing, outcome) if existing else []
    try:
        if bad or late:
            # not committed yet: filter the written files (the buffer is gone, released as it was written);
            # the turn files still hold the turns of episodes whose hashes were bad
            turn_actions = lake.drop_rows("turns", turn_actions, "episode_id", [*bad, *late])
        if late:
            event_actions = lake.drop_rows("gateway_events", event_actions, "episode_id", late)
            ep = drop_episodes(ep, late)
            ep_actions = _rewrite_episodes(lake, ep, ep_actions)
    except BaseException:
        remove_uncommitted(lake, turn_actions, event_actions, ep_actions)
        raise
    if ep.num_rows == 0:
        remove_uncommitted(lake, turn_actions, event_actions, ep_actions)
        return []
    try:
        lake.commit("turns", list(turn_actions))
        if event_actions:
            lake.commit("gateway_events", list(event_actions))
    except BaseException:
        remove_uncommitted(lake, [], [], ep_actions)
        raise
    # From here turns and events are committed: a failure leaves them as orphans (invisible; compact
    # removes them), never as partial episodes.
    for attempt in range(_CAS_ATTEMPTS):
        # The first try refreshes the table and commits only if nothing was committed since the check (the
        # common case on a local lake, whose writers take turns under the lock); later tries commit on the
        # snapshot just re-checked, so a commit in between makes the conditional put fail.
        if lake.commit_if_unchanged("episodes", ep_actions, version, refresh=attempt == 0) is not None:
            return list(ep["episode_id"].to_pylist())
        outcome.commit_conflicts += 1
        if attempt:  # lost a put to another writer: spread the racers
            time.sleep(random.uniform(0, min(0.25, 0.004 * 2 ** min(attempt, 6))))
        # What did other writers add since the last check? A compaction's rewrites show up too; they hold no
        # id of ours, since ours were not in the lake at the last check.
        version, acts = lake.latest_snapshot("episodes")
        added = [f for f in file_ranges(acts) if f[1] not in seen]
        seen.update(f[1] for f in added)
        existing = committed_ids.lookup(ep["episode_id"].to_pylist(), run_ids, files=added) if added else {}
        if existing:
            drop = _late(ep, existing, outcome)
            ep = drop_episodes(ep, drop)
            turn_actions = _retract(lake, "turns", turn_actions, drop)
            event_actions = _retract(lake, "gateway_events", event_actions, drop)
            ep_actions = _rewrite_episodes(lake, ep, ep_actions)
            if ep.num_rows == 0:
                return []
    remove_uncommitted(lake, [], [], ep_actions)
    raise TrajlakeError(f"episodes: could not commit after {_CAS_ATTEMPTS} attempts (other writers "
                        f"kept committing first); the turns and events of {ep.num_rows} episode(s) are "
                        f"committed orphans that `trajlake compact` removes")


def _rewrite_episodes(lake: Lake, ep: pa.Table, old: list[AddAction]) -> list[AddAction]:
    """Replace a flush's uncommitted episodes files by ones holding ``ep`` (late ids dropped). The old
    files go first; should the write fail, a clean-up of ``old`` finds them gone, which is no error."""
    remove_uncommitted(lake, [], [], old)
    return lake.write_files("episodes", ep) if ep.num_rows else []


def _retract(lake: Lake, name: str, actions: list[AddAction], ids: list[str]) -> list[AddAction]:
    """Take the rows of ``ids`` out of a flush's committed files of ``name`` (their episodes turned out
    to be another writer's): one transaction removes the files that hold them and adds them rewritten
    without. Returns the flush's files of ``name`` now live."""
    wanted = sorted(ids)
    hit = [a for a in actions if _may_hold(a, wanted)]
    if not hit:
        return actions
    new = lake.drop_rows(name, hit, "episode_id", ids, delete_old=False)
    now = int(time.time() * 1000)
    removes = [RemoveAction(a.path, True, now, a.size, dict(a.partition_values)) for a in hit]
    lake.commit_rewritten(name, removes, new, clean_up_on=BaseException)
    gone = {a.path for a in hit}
    return [a for a in actions if a.path not in gone] + new


def commit_keyed_rows(lake: Lake, name: str, t: pa.Table) -> int:
    """Add the rows of ``runs`` or ``tasks`` (``t``, validated, in the table's schema) whose key is not in the
    table yet, as a compare-and-swap like the episodes'; returns rows added. A run id already committed with
    a different definition is a ConflictError (a task key already there is skipped, whatever its content)."""
    pk = ["run_id"] if name == "runs" else ["task_id", "task_version"]
    new_keys = list(zip(*(t[c].to_pylist() for c in pk), strict=True))
    new_hashes = hash_rows(t, name)
    with _commit_lock(lake):
        # The same compare-and-swap as episodes: the rows are committed as the version after the one checked,
        # or checked again (tasks and runs are small: the whole table is re-read).
        for _ in range(_CAS_ATTEMPTS):
            version, _acts = lake.latest_snapshot(name)
            existing: dict[tuple[Any, ...], str] = {}
            for _f, old in lake.iter_tables(name, version):
                for k, h in zip(zip(*(old[c].to_pylist() for c in pk), strict=True), hash_rows(old, name),
                                strict=True):
                    existing[k] = h
            keep = []
            seen: set[tuple[Any, ...]] = set()
            for i, (k, h) in enumerate(zip(new_keys, new_hashes, strict=True)):
                if k in existing or k in seen:
                    if name == "runs" and existing.get(k, h) != h:
                        raise ConflictError(f"runs: run {k[0]!r} already exists with a different definition")
                    continue
                seen.add(k)
                keep.append(i)
            if not keep:
                return 0
            actions = lake.write_files(name, t.take(keep))
            if lake.commit_if_unchanged(name, actions, version) is not None:
                return len(keep)
            for a in actions:
                lake.remove_file(name, a.path)
            time.sleep(random.uniform(0, 0.02))
        raise TrajlakeError(f"{name}: could not commit after {_CAS_ATTEMPTS} attempts (other writers "
                            f"kept committing first)")


class CommittedEpisodes:
    """The content hashes of episode ids already committed to a lake's episodes table, for one writer: the early
    duplicate check of each append (``lookup``) and the commit's exact check (``lookup(..., files=...)``).

    Only files of the ids' run partitions whose episode_id range can contain one of the ids are read (two
    columns each); time-ordered ids (``record.recorder.new_episode_id``) make that a handful of recent files.
    Memory stays bounded by the batch, not by the lake."""

    def __init__(self, lake: Lake):
        self.lake = lake
        self._delta: Any = None  # cached DeltaTable of episodes, refreshed incrementally
        self._refreshed = 0.0
        self._files_version = -1  # the episodes' files (run, path, min id, max id) as of that version
        self._files: list[FileRange] | None = None
        self._id_bounds: dict[str, tuple[str | None, str | None]] = {}  # data file -> its own episode_id range

    def lookup(self, ids: list[str], run_ids: list[str], refresh: bool = True,
               files: list[FileRange] | None = None) -> dict[str, str]:
        """content_hash of those ``ids`` already committed in the lake (or in ``files``, given by the commit path:
        an exact snapshot of the episodes table, or the files a concurrent writer added since one). Without
        ``refresh`` the file list may be up to ``_REFRESH_SECONDS`` old (early reports; the commit re-checks)."""
        if not ids:
            return {}
        if files is None:
            if self._delta is None:
                self._delta = self.lake.delta("episodes")
                self._refreshed = time.monotonic()
            elif refresh or time.monotonic() - self._refreshed > _REFRESH_SECONDS:
                # Early duplicate reports may use a slightly stale file list; the flush re-checks exactly.
                self._delta.update_incremental()
                self._refreshed = time.monotonic()
            if self._files is None or self._files_version != self._delta.version():
                # once per table version, not per append
                self._files_version = self._delta.version()
                self._files = file_ranges(pa.table(self._delta.get_add_actions(flatten=True)))
            files = self._files
        if not files:
            return {}
        wanted = sorted(set(ids))
        runs = set(run_ids)
        paths = []
        # Files are skipped by the episode_id range in their own Parquet footer, not by the Delta log's
        # statistics: an edited log must not make a second copy of an episode look new. Data files never
        # change (their name records their checksum), so each footer is read once per writer.
        for run, path, _log_lo, _log_hi in files:
            if run not in runs:
                continue
            lo, hi = self._file_id_bounds(path)
            if lo is not None and hi is not None and bisect.bisect_left(wanted, lo) >= bisect.bisect_right(wanted, hi):
                continue  # no wanted id falls inside this file's [min, max]
            paths.append(self.lake.abs_path("episodes", path))
        if not paths:
            return {}
        dataset = pads.dataset(paths, format="parquet", filesystem=self.lake.filesystem)
        found = dataset.to_table(columns=["episode_id", "content_hash"],
                                 filter=pads.field("episode_id").isin(pa.array(wanted, pa.string())))
        return dict(zip(found["episode_id"].to_pylist(), found["content_hash"].to_pylist(), strict=True))

    def _file_id_bounds(self, path: str) -> tuple[str | None, str | None]:
        """(min, max) episode_id of an episodes data file from its Parquet footer; (None, None) when unknown."""
        bounds = self._id_bounds.get(path)
        if bounds is None:
            bounds = (None, None)
            with contextlib.suppress(Exception):  # unreadable footer: read the file instead of skipping it
                meta = pq.ParquetFile(self.lake.abs_path("episodes", path), filesystem=self.lake.filesystem).metadata
                col = meta.schema.to_arrow_schema().get_field_index("episode_id")
                groups = [meta.row_group(i).column(col).statistics for i in range(meta.num_row_groups)]
                if col >= 0 and groups and all(g is not None and g.has_min_max for g in groups):
                    bounds = (min(str(g.min) for g in groups), max(str(g.max) for g in groups))
            self._id_bounds[path] = bounds
        return bounds


def drop_episodes(t: pa.Table, ids: list[str]) -> pa.Table:
    """``t`` without the rows whose episode_id is in ``ids``."""
    if not ids or t.num_rows == 0:
        return t
    return t.filter(pc.invert(pc.is_in(t["episode_id"], value_set=pa.array(ids, pa.string()))))


def file_ranges(acts: pa.Table) -> list[FileRange]:
    """(run_id partition, path, min episode_id, max episode_id) of each file in a Delta add-actions table."""
    n = acts.num_rows

    def col(name: str) -> list[Any]:
        return acts[name].to_pylist() if name in acts.column_names else [None] * n

    return list(zip(col("partition.run_id"), col("path"), col("min.episode_id"), col("max.episode_id"), strict=True))


def _may_hold(action: AddAction, wanted: list[str]) -> bool:
    """Whether a data file a flush wrote may hold one of the ``wanted`` (sorted) episode ids, by the
    episode_id range in its statistics (its own, just computed: not read back from a log)."""
    try:
        stats = json.loads(action.stats or "{}")
        lo, hi = stats["minValues"]["episode_id"], stats["maxValues"]["episode_id"]
    except (KeyError, TypeError, ValueError):
        return True
    return bisect.bisect_left(wanted, lo) < bisect.bisect_right(wanted, hi)


def remove_uncommitted(lake: Lake, *action_lists: Sequence[Any]) -> None:
    """Delete uncommitted data files: turns, then gateway_events, then episodes (in that order)."""
    for actions, name in zip(action_lists, ("turns", "gateway_events", "episodes"), strict=False):
        for a in actions:
            lake.remove_file(name, a.path)


@contextlib.contextmanager
def _commit_lock(lake: Lake) -> Iterator[None]:
    """Serialise check-and-commit across processes on one machine (local lakes): they then never race, so never
    redo a check. Object storage has no lock and needs none for correctness: the episodes commit is a
    compare-and-swap on the Delta log (``_commit_checked``), which also covers writers on several
    machines sharing a local-looking folder."""
    if not lake.is_local:
        yield
        return
    path = lake.meta_dir / "commit.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


__all__ = ["CommitOutcome", "CommittedEpisodes", "FileRange", "commit_episodes", "commit_keyed_rows",
           "drop_episodes", "file_ranges", "remove_uncommitted"]
