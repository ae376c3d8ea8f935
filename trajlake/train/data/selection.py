"""Which episodes the trainer reads: ``Selection`` and ``select_episodes`` over the small ``episodes`` table (runs,
splits, environment versions, policy versions, success, terminated only, maximum policy lag, maximum staleness
behind the learner, a trajectory TTL by time and by environment version, a time-travel pin), and the table versions
every later read is pinned to."""

from __future__ import annotations

import datetime as dt
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
    "reward_total", "reward_components", "cost_usd", "n_turns", "n_policy_tokens", "split", "error_class",
    "ended_at", "policy_version_end")
"""Columns of ``select_episodes``'s table (``split`` in addition to the ones the trainer uses; ``ended_at`` for the
trajectory's age, ``policy_version_end`` for a partial rollout's staleness)."""


@dataclass(frozen=True)
class EnvAge:
    """A trajectory TTL (``max_env_age``): how old an episode may be to be trained on, by time and by environment
    version. Either bound may be None (not checked); an episode must pass both."""

    seconds: float | None = None
    """Age by time: now - ``episodes.ended_at`` <= this many seconds (``now``: ``Selection.now``)."""
    versions: int | None = None
    """Age by environment version: the episode's ``env_version`` is at most this many versions behind the current
    one of its ``env_id`` (0: only the current version). The order of versions is ``Selection.env_version_order``
    when given, else the order in which the lake first saw them (the first ``started_at`` of each (env_id,
    env_version) in the whole ``episodes`` table at the pinned version); the current one is
    ``Selection.current_env_version`` when given, else the newest. An episode whose version is not in the order,
    or is newer than the current one, has no defined age and is left out."""


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
    max_staleness: int | None = None
    """Staleness bound: the episode's ``policy_version_start`` is at most this many versions behind
    ``learner_version`` in ``policy_version_order`` (the published versions, oldest first), and not ahead of it. An
    episode whose version is not in the order is left out (its staleness is unknown). An episode that switched
    versions at a turn boundary is counted by its first (oldest) version, or by its last with
    ``staleness_version = "end"``. Needs ``policy_version_order``."""
    staleness_version: str = "start"
    """Which version of an episode ``max_staleness`` counts: ``start`` (``policy_version_start``, every segment
    trained) or ``end`` (``policy_version_end``: a partial rollout whose old prefix is not trained on)."""
    policy_version_order: Sequence[str] | None = None
    """The published policy versions, oldest first (``PolicyVersions.all()``), for ``max_staleness``."""
    learner_version: str | None = None
    """The learner's version now, for ``max_staleness`` (None: the last of ``policy_version_order``)."""
    max_env_age: EnvAge | None = None
    """The trajectory TTL, by time and by environment version (``EnvAge``)."""
    now: dt.datetime | None = None
    """The time ``max_env_age.seconds`` is measured to (timezone-aware; None: when the selection is read)."""
    env_version_order: dict[str, Sequence[str]] | None = None
    """Per ``env_id``, its environment versions oldest first, for ``max_env_age.versions`` (None: the order in which
    the lake first saw them)."""
    current_env_version: dict[str, str] | None = None
    """Per ``env_id``, the environment version now running, for ``max_env_age.versions`` (None or a missing
    env_id: the newest in the order)."""
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


def staleness_of(policy_version: str | None, order: Sequence[str], learner_version: str | None = None) -> int | None:
    """Versions ``policy_version`` is behind ``learner_version`` (default: the newest) in ``order`` (the published
    versions, oldest first); None when either is not in the order."""
    learner = order[-1] if learner_version is None and order else learner_version
    if policy_version not in order or learner not in order:
        return None
    return list(order).index(str(learner)) - list(order).index(str(policy_version))


def env_version_ages(env_ids: Sequence[str], env_versions: Sequence[str], order: dict[str, Sequence[str]],
                     current: dict[str, str] | None = None) -> list[int | None]:
    """Per row, how many environment versions ``env_version`` is behind the current version of its ``env_id``
    (``current``, else the newest of ``order[env_id]``); None when the version is not in the order or is newer
    than the current one (an age that is not defined)."""
    out: list[int | None] = []
    for env_id, version in zip(env_ids, env_versions, strict=True):
        versions = list(order.get(env_id, ()))
        now = (current or {}).get(env_id, versions[-1] if versions else None)
        if version not in versions or now not in versions:
            out.append(None)
            continue
        age = versions.index(now) - versions.index(version)
        out.append(age if age >= 0 else None)
    return out


def env_versions_in_lake_order(lake: Lake, version: int) -> dict[str, list[str]]:
    """Per ``env_id``, its environment versions in the order the lake first saw them (the first ``started_at`` of
    each version over the whole ``episodes`` table at ``version``; ties by name)."""
    first: dict[tuple[str, str], Any] = {}
    for _, t in lake.iter_tables("episodes", version, columns=["env_id", "env_version", "started_at"]):
        for env_id, env_version, started in zip(t["env_id"].to_pylist(), t["env_version"].to_pylist(),
                                                t["started_at"].to_pylist(), strict=True):
            key = (env_id, env_version)
            if key not in first or started < first[key]:
                first[key] = started
    out: dict[str, list[str]] = {}
    for (env_id, env_version), _started in sorted(first.items(), key=lambda kv: (kv[1], kv[0][1])):
        out.setdefault(env_id, []).append(env_version)
    return out


def _check(s: Selection) -> None:
    if s.max_staleness is not None:
        if s.policy_version_order is None:
            raise TrajlakeError("Selection.max_staleness needs policy_version_order (the published versions)")
        if s.max_staleness < 0:
            raise TrajlakeError(f"Selection.max_staleness = {s.max_staleness}: must be >= 0")
    if s.staleness_version not in ("start", "end"):
        raise TrajlakeError(f"Selection.staleness_version = {s.staleness_version!r}: 'start' or 'end'")
    age = s.max_env_age
    if age is not None:
        if age.seconds is not None and not age.seconds >= 0:
            raise TrajlakeError(f"Selection.max_env_age.seconds = {age.seconds}: must be >= 0")
        if age.versions is not None and age.versions < 0:
            raise TrajlakeError(f"Selection.max_env_age.versions = {age.versions}: must be >= 0")
    if s.now is not None and s.now.tzinfo is None:
        raise TrajlakeError("Selection.now: must be timezone-aware (UTC)")


def _age_mask(t: pa.Table, s: Selection, now: dt.datetime, env_order: dict[str, Sequence[str]] | None) -> list[Any]:
    """The conditions of ``max_staleness`` and ``max_env_age`` on the rows of ``t``."""
    conds: list[Any] = []
    if s.max_staleness is not None:
        assert s.policy_version_order is not None
        column = "policy_version_end" if s.staleness_version == "end" else "policy_version_start"
        stale = [staleness_of(v, s.policy_version_order, s.learner_version) for v in t[column].to_pylist()]
        conds.append(pa.array([x is not None and 0 <= x <= s.max_staleness for x in stale], pa.bool_()))
    age = s.max_env_age
    if age is not None and age.seconds is not None:
        oldest = now - dt.timedelta(seconds=float(age.seconds))
        conds.append(pc.greater_equal(t["ended_at"], pa.scalar(oldest, t.schema.field("ended_at").type)))
    if age is not None and age.versions is not None:
        ages = env_version_ages(t["env_id"].to_pylist(), t["env_version"].to_pylist(), env_order or {},
                                s.current_env_version)
        conds.append(pa.array([a is not None and a <= int(age.versions) for a in ages], pa.bool_()))
    return conds


def _selection_mask(t: pa.Table, s: Selection, now: dt.datetime | None = None,
                    env_order: dict[str, Sequence[str]] | None = None) -> pa.ChunkedArray | pa.Array | None:
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
    conds += _age_mask(t, s, now or dt.datetime.now(dt.UTC), env_order)
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
    _check(selection)
    lk = as_lake(lake)
    version = pinned_versions(lk, selection.as_of)["episodes"]
    now = selection.now or dt.datetime.now(dt.UTC)
    age = selection.max_env_age
    env_order = selection.env_version_order
    if age is not None and age.versions is not None and env_order is None:
        env_order = dict(env_versions_in_lake_order(lk, version))
    runs = _values("runs", selection.runs)
    pfilter = [("run_id", "in", runs)] if runs is not None else None
    schema = _episode_schema()
    parts = []
    for _, t in lk.iter_tables("episodes", version, columns=list(EPISODE_COLUMNS), partition_filters=pfilter):
        mask = _selection_mask(t, selection, now, env_order)
        if mask is not None:
            t = t.filter(mask)
        if t.num_rows:
            parts.append(t.select(list(EPISODE_COLUMNS)).cast(schema))
    if not parts:
        return schema.empty_table()
    table = pa.concat_tables(parts)
    return table.take(pc.sort_indices(table, sort_keys=[("episode_id", "ascending")]))



__all__ = ["ALL_EPISODES", "EPISODE_COLUMNS", "EnvAge", "Selection", "env_version_ages", "env_versions_in_lake_order",
           "pinned_versions", "select_episodes", "staleness_of"]
