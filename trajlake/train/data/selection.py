"""Which episodes the trainer reads: ``Selection`` and ``select_episodes`` over the small ``episodes`` table (runs,
splits, environment versions, policy versions, success, terminated only, maximum policy lag, a time-travel pin),
and the table versions every later read is pinned to."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from trajlake.errors import TrajlakeError
from trajlake.lake.store import Lake, LakeArg, as_lake
from trajlake.schema import arrow_schema

EPISODE_COLUMNS: tuple[str, ...] = (
    "episode_id", "run_id", "task_id", "env_id", "env_version", "env_seed", "group_id", "attempt",
    "policy_version_start", "policy_lag", "success", "terminated", "truncated", "termination_reason",
    "reward_total", "reward_components", "cost_usd", "n_turns", "n_policy_tokens", "split", "error_class")
"""Columns of ``select_episodes``'s table (``split`` in addition to the ones the trainer uses)."""


@dataclass(frozen=True)
class Selection:
    """Which episodes to read. Every field is optional; a None field selects everything. A field that takes a
    sequence also accepts one string (one value)."""

    runs: Sequence[str] | None = None
    """``episodes.run_id`` in this set (also prunes the partitions read)."""
    splits: Sequence[str] | None = None
    """``episodes.split`` in this set (train, dev, hidden, test, unknown)."""
    env_versions: Sequence[str] | None = None
    """``episodes.env_version`` in this set."""
    policy_versions: Sequence[str] | None = None
    """``episodes.policy_version_start`` in this set (episodes are pinned to the version they started with)."""
    success: bool | None = None
    """True: only successful episodes (B1 trains on successes); False: only graded failures. Ungraded episodes
    (``success`` null) are in neither set."""
    terminated_only: bool = False
    """Only episodes that ended by task semantics (drops truncated ones)."""
    max_policy_lag: int | None = None
    """``episodes.policy_lag`` <= this. A null lag (unknown: offline data, older schema versions) counts as 0, so
    pre-recorded data is not dropped by a lag bound meant for the learner's own rollouts."""
    as_of: str | dict[str, int] | None = None
    """Time-travel pin, as ``Lake.resolve_as_of`` (``table=version,...``, a JSON object, an ISO-8601 instant).
    None: the tables' versions when the selection is read."""


ALL_EPISODES = Selection()
"""The default selection: every episode."""


def _values(name: str, v: Sequence[str] | None) -> list[str] | None:
    if v is None:
        return None
    if isinstance(v, str):
        return [v]
    out = list(v)
    if not all(isinstance(x, str) for x in out):
        raise TrajlakeError(f"Selection.{name}: expected strings, got {out!r}")
    return out


def pinned_versions(lake: Lake, as_of: str | dict[str, int] | None) -> dict[str, int]:
    """Versions of every table: the pin, else the current ones (so every later read sees the same snapshot)."""
    return lake.resolve_as_of(as_of) or lake.versions()


def _selection_mask(t: pa.Table, s: Selection) -> pa.ChunkedArray | pa.Array | None:
    conds: list[Any] = []
    for col, name in (("run_id", "runs"), ("split", "splits"), ("env_version", "env_versions"),
                      ("policy_version_start", "policy_versions")):
        vals = _values(name, getattr(s, name))
        if vals is not None:
            conds.append(pc.is_in(t[col], value_set=pa.array(vals, pa.string())))
    if s.success is not None:
        conds.append(pc.equal(t["success"], pa.scalar(bool(s.success))))
    if s.terminated_only:
        conds.append(pc.equal(t["terminated"], pa.scalar(True)))
    if s.max_policy_lag is not None:
        lag = pc.fill_null(t["policy_lag"], pa.scalar(0, pa.int32()))
        conds.append(pc.less_equal(lag, pa.scalar(int(s.max_policy_lag), pa.int32())))
    if not conds:
        return None
    mask = conds[0]
    for c in conds[1:]:
        mask = pc.and_kleene(mask, c)
    return pc.fill_null(mask, False)


def _episode_schema() -> pa.Schema:
    full = arrow_schema("episodes")
    return pa.schema([full.field(c).with_nullable(True) for c in EPISODE_COLUMNS])


def select_episodes(lake: LakeArg, selection: Selection = ALL_EPISODES) -> pa.Table:
    """One row per selected episode, sorted by ``episode_id``, with the columns ``EPISODE_COLUMNS``. Reads only
    those columns of the ``episodes`` table (never the turns), pruning ``run_id`` partitions when ``runs`` is
    given, at the pinned version (``selection.as_of``)."""
    lk = as_lake(lake)
    version = pinned_versions(lk, selection.as_of)["episodes"]
    runs = _values("runs", selection.runs)
    pfilter = [("run_id", "in", runs)] if runs is not None else None
    schema = _episode_schema()
    parts = []
    for _, t in lk.iter_tables("episodes", version, columns=list(EPISODE_COLUMNS), partition_filters=pfilter):
        mask = _selection_mask(t, selection)
        if mask is not None:
            t = t.filter(mask)
        if t.num_rows:
            parts.append(t.select(list(EPISODE_COLUMNS)).cast(schema))
    if not parts:
        return schema.empty_table()
    table = pa.concat_tables(parts)
    return table.take(pc.sort_indices(table, sort_keys=[("episode_id", "ascending")]))



__all__ = ["ALL_EPISODES", "EPISODE_COLUMNS", "Selection", "pinned_versions", "select_episodes"]
