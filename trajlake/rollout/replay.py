"""Replay stored episodes under their pinned versions (``trajlake replay``): one episode, every episode of a run
(``--run``) or of an exported bundle (``--from DIR``, ``trajlake export hf``'s trajectories layout). The
environment comes from the registry by each episode's ``env_id``; each outcome says where the first state hash
diverged. Replay suites (``--pin-suite`` / ``--suite``: pinned episodes replayed against the current environment
code, compared turn by turn) are in ``trajlake.rollout.suites``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajlake.envs.core import Env, ReplayReport
from trajlake.envs.registry import make
from trajlake.errors import TrajlakeError
from trajlake.lake.store import LakeArg
from trajlake.query import connect
from trajlake.rollout.runner import replay_log_from_rows


@dataclass(frozen=True)
class ReplayOutcome:
    """What replaying one stored episode found."""

    episode_id: str
    report: ReplayReport
    digest_matches: bool
    """Whether the environment's image digest equals the recorded one (a differing digest is only a note)."""
    recorded_digest: str | None
    where: str
    """The first divergence in the episode's own terms ("turn 5 (step 2)", "the state after reset"), or ""."""
    recorded_env_version: str | None = None
    """The environment version the episode was recorded under."""
    env_version_now: str | None = None
    """The version of the environment code that replayed it."""

    @property
    def ok(self) -> bool:
        return self.report.ok

    def message(self) -> str:
        if self.ok:
            return (f"episode {self.episode_id}: replayed {self.report.steps_replayed} step(s); every state hash "
                    f"matches")
        return (f"episode {self.episode_id}: diverges at {self.where}: {self.report.message} "
                f"(expected {str(self.report.expected_hash)[:12]}, got {str(self.report.actual_hash)[:12]})")


def load_episode(lake: LakeArg, episode_id: str, as_of: str | None = None
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The committed episode row and its turns (in order); raises when the episode is not in the lake."""
    return next(_grouped(connect(lake, as_of), "select * from episodes where episode_id = ?",
                         "select * from turns where episode_id = ? order by turn_idx", [episode_id],
                         f"episode {episode_id!r} is not in the lake"))


def replay_episode(lake: LakeArg, episode_id: str, as_of: str | None = None
                   ) -> ReplayOutcome:
    """Re-run a stored episode in a fresh instance of its environment and compare every state hash."""
    episode, turns = load_episode(lake, episode_id, as_of)
    return next(replay_rows([(episode, turns)], run_env_kwargs(connect(lake, as_of), [episode["run_id"]])))


def bundle_env_kwargs(folder: str | Path) -> dict[str, dict[str, Any]]:
    """:func:`run_env_kwargs` of an exported bundle, from its ``data/runs`` shards (every run of the bundle); empty
    when the bundle holds no runs table (then its episodes replay with default environment arguments)."""
    import duckdb

    glob = Path(folder) / "data" / "runs" / "*.parquet"
    if not any(glob.parent.glob(glob.name)):
        return {}
    con = duckdb.connect(":memory:")
    try:
        con.execute("create view runs as select * from read_parquet('" + str(glob).replace("'", "''")
                    + "', union_by_name = true)")
        ids = [str(r[0]) for r in con.execute("select distinct run_id from runs").fetchall()]
        return run_env_kwargs(con, ids)
    finally:
        con.close()


def run_env_kwargs(con: Any, run_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The environment arguments each run was played with (``env_kwargs`` of its ``runs.config``: memory, ask-user
    variants, injections, budgets), by run id; runs without any are left out. A replay must build the environment
    the episode was played in: with default arguments a run with memory drifts at its first memory call."""
    ids = sorted(set(run_ids))
    if not ids:
        return {}
    rows = con.execute(f"select run_id, config from runs where run_id in ({', '.join('?' for _ in ids)})",
                       ids).fetchall()
    out: dict[str, dict[str, Any]] = {}
    for run_id, config in rows:
        kwargs = (json.loads(config) if isinstance(config, str) else dict(config or {})).get("env_kwargs")
        if kwargs:
            out[str(run_id)] = dict(kwargs)
    return out


class EnvPool:
    """One environment instance per (``env_id``, environment arguments), made on first use; ``replay`` resets an
    instance to each episode's task and seed."""

    def __init__(self) -> None:
        self._envs: dict[tuple[str, str], Env] = {}

    def get(self, env_id: str, kwargs: Mapping[str, Any] | None = None) -> Env:
        key = (env_id, json.dumps(dict(kwargs or {}), sort_keys=True, default=str))
        env = self._envs.get(key)
        if env is None:
            env = self._envs[key] = make(env_id, split=None, **dict(kwargs or {}))
        return env

    def close(self) -> None:
        for env in self._envs.values():
            env.close()


def replay_rows(episodes: Iterable[tuple[dict[str, Any], list[dict[str, Any]]]],
                env_kwargs: Mapping[str, Mapping[str, Any]] | None = None) -> Iterator[ReplayOutcome]:
    """Replay (episode row, its turns) pairs in the environment each was played in (``env_kwargs``: the runs'
    environment arguments by run id, see :func:`run_env_kwargs`; default arguments for a run not in it); yields
    each outcome as it is known."""
    pool = EnvPool()
    try:
        for episode, turns in episodes:
            log, turn_of_step = replay_log_from_rows(episode, turns)
            env = pool.get(episode["env_id"], (env_kwargs or {}).get(episode["run_id"]))
            report = env.replay(log)
            yield ReplayOutcome(episode["episode_id"], report, env.image_digest == episode["env_image_digest"],
                                episode["env_image_digest"], _where(report, turn_of_step),
                                episode.get("env_version"), getattr(env, "env_version", None))
    finally:
        pool.close()


def _where(report: ReplayReport, turn_of_step: list[int]) -> str:
    first = report.first_divergence
    if report.ok:
        return ""
    if first is None or first == -1:
        return "the state after reset"
    if first < len(turn_of_step):
        return f"turn {turn_of_step[first]} (step {first})"
    return f"step {first}"


def _grouped(con: Any, episodes_sql: str, turns_sql: str, params: list[Any], empty: str
             ) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(episode, turns) pairs from two queries ordered by episode_id (turns also by turn_idx); the turns are
    streamed, so a run of millions of turns holds one episode's at a time. ``empty``: the error when the first
    query finds no episode."""
    rel = con.execute(episodes_sql, params)
    cols = [d[0] for d in rel.description]
    episodes = [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]
    if not episodes:
        raise TrajlakeError(empty)
    rel = con.execute(turns_sql, params)
    tcols = [d[0] for d in rel.description]

    def stream() -> Iterator[dict[str, Any]]:
        while batch := rel.fetchmany(2048):
            for row in batch:
                yield dict(zip(tcols, row, strict=True))

    turns = stream()
    turn = next(turns, None)
    for episode in episodes:
        mine: list[dict[str, Any]] = []
        # both sides are ordered by episode id: turns of an id without an episode row (none in a lake's views)
        # sort before the next episode's and are passed over
        while turn is not None and turn["episode_id"] <= episode["episode_id"]:
            if turn["episode_id"] == episode["episode_id"]:
                mine.append(turn)
            turn = next(turns, None)
        yield episode, mine


def run_episodes(lake: LakeArg, run_id: str, as_of: str | None = None
                 ) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Every committed episode of ``run_id`` with its turns, ordered by episode id."""
    con = connect(lake, as_of)
    return _grouped(con, "select * from episodes where run_id = ? order by episode_id",
                    "select * from turns where run_id = ? order by episode_id, turn_idx", [run_id],
                    f"run {run_id!r}: no episodes to replay")


def bundle_episodes(folder: str | Path) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Every episode of an exported bundle (``trajlake export hf``, trajectories layout: ``data/episodes`` and
    ``data/turns`` Parquet shards, every split) with its turns, ordered by episode id."""
    import duckdb

    root = Path(folder)
    globs = {t: root / "data" / t / "*.parquet" for t in ("episodes", "turns")}
    for table, glob in globs.items():
        if not any(glob.parent.glob(glob.name)):
            raise TrajlakeError(f"--from {root}: no {table} shards at {glob} (expected a `trajlake export hf` "
                                f"folder with the trajectories layout, exported with --tables episodes,turns at least)")
    con = duckdb.connect(":memory:")

    def src(table: str) -> str:
        return "read_parquet('" + str(globs[table]).replace("'", "''") + "', union_by_name = true)"

    return _grouped(con, f"select * from {src('episodes')} order by episode_id",
                    f"select * from {src('turns')} order by episode_id, turn_idx", [],
                    f"--from {root}: no episodes to replay")


__all__ = ["EnvPool", "ReplayOutcome", "bundle_env_kwargs", "bundle_episodes", "load_episode", "replay_episode", "replay_rows",
           "run_env_kwargs", "run_episodes"]
