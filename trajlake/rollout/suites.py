"""Replay suites: a fixed set of stored episodes, pinned in the lake, replayed against the *current* environment
code to tell an environment change from a policy change (``trajlake replay --run ID --pin-suite NAME``,
``trajlake replay --suite NAME``, ``trajlake diagnose --suite NAME``).

Where a suite lives: ``<lake>/_trajlake/suites/<NAME>.json``, one JSON document per suite, written once and never
replaced (like the published policy versions under ``_trajlake/policies/``). It holds the name, when it was made,
where its episodes came from, the lake table versions they were read at, and per episode its id, environment id
and version, task id and version and ``content_hash`` (which covers the episode row and every turn).

Reading a suite's episodes: at the pinned table versions (Delta time travel), so nothing written since can change
what is replayed. ``trajlake compact`` rewrites small files and vacuums the ones it replaced, after which the
pinned versions' files are gone; the episodes are then read at the current versions and each must have the
``content_hash`` pinned (a committed episode's content never changes, only the file holding it), else the suite
is refused naming the episode.

Comparing: unlike ``trajlake replay --run`` (which insists on the recorded environment version and compares state
hashes), a suite replays each recorded action on whatever version the environment has now and compares, turn by
turn, what the environment answered then and now: the observation after reset, then per step ``status``, the
observation text (``raw_content``), ``reward_components``, ``env_state_hash``, and whether and how the episode
ended (``terminated`` / ``truncated`` / ``termination_reason``). The first difference is the episode's drift: the
recorded turn, the field, the value then and now. A changed ``env_version`` alone is not drift, only reported.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trajlake.envs.core import Env
from trajlake.errors import TrajlakeError, one_line
from trajlake.lake.store import META_DIR, Lake
from trajlake.query import connect
from trajlake.rollout.replay import EnvPool, run_env_kwargs
from trajlake.rollout.runner import replay_log_from_rows
from trajlake.schemas.vocab import TerminationReason

SUITES_DIR = "suites"
"""Folder under the lake's META_DIR holding one JSON document per replay suite (``<name>.json``)."""
SUITE_FORMAT = 1
"""Version of the suite document's layout (its ``format`` key)."""
_SUITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_SNIPPET = 80


@dataclass(frozen=True)
class PinnedEpisode:
    """One episode of a replay suite, as pinned."""

    episode_id: str
    env_id: str
    env_version: str
    """The environment version the episode was recorded under."""
    task_id: str
    task_version: str
    content_hash: str | None
    """The episode's ``content_hash`` when pinned (covers its row and turns); None only in suites pinned before
    the hash was kept, which are then readable only at their pinned versions."""


@dataclass(frozen=True)
class ReplaySuite:
    """A pinned set of episodes to replay against the current environment code (``trajlake replay --suite``)."""

    name: str
    episodes: tuple[PinnedEpisode, ...]
    versions: Mapping[str, int]
    """The lake table versions the episodes are read at, pinned when the suite was made."""
    created_at: str
    """UTC time the suite was pinned (ISO 8601)."""
    source: str
    """Where the episodes came from (``run <id>``)."""

    @property
    def episode_ids(self) -> tuple[str, ...]:
        return tuple(e.episode_id for e in self.episodes)

    @property
    def as_of(self) -> str:
        """The pinned versions as ``table=version,...`` (what ``--as-of`` takes)."""
        return ",".join(f"{t}={v}" for t, v in sorted(self.versions.items()))

    @property
    def env_versions(self) -> dict[str, list[str]]:
        """Environment id -> the versions its pinned episodes were recorded under."""
        out: dict[str, set[str]] = {}
        for e in self.episodes:
            out.setdefault(e.env_id, set()).add(e.env_version)
        return {k: sorted(v) for k, v in sorted(out.items())}


@dataclass(frozen=True)
class Drift:
    """The first place a replayed episode differs from its recording."""

    turn_idx: int
    """``turn_idx`` of the recorded turn whose field differs (0: the observation after reset)."""
    field: str
    """The differing column: ``task_version`` (the task cannot be reset any more), ``raw_content`` (the
    observation text), ``status``, ``reward_components``, ``env_state_hash``, ``terminated``, ``truncated``,
    ``termination_reason``, or ``error`` (the environment raised)."""
    expected: str
    """The recorded value (text cut to 80 characters)."""
    got: str
    """The value on the current environment code."""


@dataclass(frozen=True)
class SuiteOutcome:
    """What replaying one pinned episode against the current environment code found."""

    episode: PinnedEpisode
    env_version_now: str
    """The version of the environment code that replayed it."""
    steps: int
    """Recorded steps replayed (up to and including the first difference)."""
    drift: Drift | None
    """None when every compared field matched."""

    @property
    def ok(self) -> bool:
        return self.drift is None

    @property
    def episode_id(self) -> str:
        return self.episode.episode_id

    def message(self) -> str:
        if self.drift is None:
            return f"episode {self.episode_id}: matched ({self.steps} step(s) replayed)"
        d = self.drift
        return (f"episode {self.episode_id}: drifted at turn {d.turn_idx}, field {d.field}: recorded {d.expected!r}, "
                f"now {d.got!r}")

    def row(self) -> dict[str, Any]:
        """One output row (``trajlake replay --suite --format json``)."""
        d = self.drift
        return {"episode_id": self.episode_id, "result": "matched" if d is None else "drifted", "steps": self.steps,
                "turn": None if d is None else d.turn_idx, "field": None if d is None else d.field,
                "expected": None if d is None else d.expected, "got": None if d is None else d.got,
                "env_id": self.episode.env_id, "env_version": self.episode.env_version,
                "env_version_now": self.env_version_now}


ROW_COLUMNS = ["episode_id", "result", "steps", "turn", "field", "expected", "got", "env_id", "env_version",
               "env_version_now"]
"""The columns of ``SuiteOutcome.row``, in output order."""


# -- comparing one episode ---------------------------------------------------------------------------------------


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _cut(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= _SNIPPET else text[:_SNIPPET - 3] + "..."


def _components(value: Any) -> dict[str, float]:
    """A reward_components value as read (a dict, DuckDB's key/value list, or null) as a plain dict."""
    if not value:
        return {}
    if isinstance(value, Mapping):
        return {str(k): float(v) for k, v in value.items()}
    return {str(kv["key"]): float(kv["value"]) for kv in value}


def _same_components(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-12) for k in a)


def _show_components(c: Mapping[str, float]) -> str:
    return json.dumps(dict(sorted(c.items())), sort_keys=True)


def compare_episode(env: Env, pinned: PinnedEpisode, episode: dict[str, Any],
                    turns: Sequence[dict[str, Any]]) -> SuiteOutcome:
    """Replay one recorded episode's actions on ``env`` (the current code, whatever its version) and compare what
    it answers with what was recorded, turn by turn; stops at the first difference."""
    ordered = sorted(turns, key=lambda t: t["turn_idx"])
    now = str(getattr(env, "env_version", ""))

    def drifted(steps: int, turn: int, name: str, expected: Any, got: Any) -> SuiteOutcome:
        return SuiteOutcome(pinned, now, steps, Drift(turn, name, _cut(expected), _cut(got)))

    if not ordered:
        raise TrajlakeError(f"episode {pinned.episode_id}: no turns to replay")
    first = ordered[0]
    try:
        r = env.reset(int(episode["env_seed"]), episode["task_version"], task_id=episode["task_id"])
    except Exception as e:  # any failure of the current code to start the task is its drift
        return drifted(0, first["turn_idx"], "task_version", f"{episode['task_id']}@{episode['task_version']}",
                       one_line(e))
    if first.get("observation_hash") and _sha(r.observation) != first["observation_hash"]:
        return drifted(0, first["turn_idx"], "raw_content", first.get("raw_content"), r.observation)
    if first.get("env_state_hash") and r.state_hash != first["env_state_hash"]:
        return drifted(0, first["turn_idx"], "env_state_hash", first["env_state_hash"], r.state_hash)
    # the steps `trajlake replay` replays (calls an injected fault kept from running are left out), each with the
    # recorded turn that answered it: the turn after its policy turn
    log, turn_of_step = replay_log_from_rows(episode, ordered)
    position = {t["turn_idx"]: i for i, t in enumerate(ordered)}
    answers = [ordered[position[p] + 1] for p in turn_of_step]
    steps = 0
    ended: tuple[int, str] | None = None
    for step, obs in zip(log.steps, answers, strict=True):
        if ended is not None:  # the current code ended the episode before the recording did
            return drifted(steps, ended[0], ended[1], "False (the recording goes on)", "True (ended here)")
        try:
            res = env.step(step.action, step.idempotency_key, tokens=step.tokens, cost_usd=step.cost_usd)
        except Exception as e:  # the current code failing where the recorded one answered is drift
            return drifted(steps, obs["turn_idx"], "error", "an answer", one_line(e))
        steps += 1
        perturbed = obs.get("fault_injected") is not None  # a fault rewrote the answer the agent saw then
        if not perturbed and res.status != obs.get("status"):
            return drifted(steps, obs["turn_idx"], "status", obs.get("status"), res.status)
        if not perturbed and obs.get("observation_hash") and _sha(res.observation) != obs["observation_hash"]:
            return drifted(steps, obs["turn_idx"], "raw_content", obs.get("raw_content"), res.observation)
        recorded, current = _components(obs.get("reward_components")), _components(res.reward_components)
        if not _same_components(recorded, current):
            return drifted(steps, obs["turn_idx"], "reward_components", _show_components(recorded),
                           _show_components(current))
        if res.state_hash != step.state_hash:
            return drifted(steps, obs["turn_idx"], "env_state_hash", step.state_hash, res.state_hash)
        if obs is ordered[-1]:  # the recording ends with this answer: the episode must end the same way
            for name in ("terminated", "truncated"):
                if bool(getattr(res, name)) != bool(episode[name]):
                    return drifted(steps, obs["turn_idx"], name, bool(episode[name]), bool(getattr(res, name)))
            reason = res.termination_reason or (TerminationReason.BUDGET_STEPS if res.truncated
                                                else TerminationReason.SUBMITTED)
            if episode.get("termination_reason") and str(reason) != episode["termination_reason"]:
                return drifted(steps, obs["turn_idx"], "termination_reason", episode["termination_reason"], reason)
        elif res.done:
            ended = (obs["turn_idx"], "terminated" if res.terminated else "truncated")
    return SuiteOutcome(pinned, now, steps, None)


def episodes_env_kwargs(lake: Lake, episodes: Iterable[tuple[PinnedEpisode, dict[str, Any], list[dict[str, Any]]]]
                        ) -> dict[str, dict[str, Any]]:
    """The environment arguments of the runs the episodes belong to (``runs.config``, read at the lake's current
    versions: a run's config never changes), by run id."""
    con = connect(lake)
    try:
        return run_env_kwargs(con, [episode["run_id"] for _, episode, _ in episodes])
    finally:
        con.close()


def compare_rows(episodes: Iterable[tuple[PinnedEpisode, dict[str, Any], list[dict[str, Any]]]],
                 env_kwargs: Mapping[str, Mapping[str, Any]] | None = None) -> Iterator[SuiteOutcome]:
    """Compare (pinned, episode row, turns) triples on the current registered code, each in an environment made
    with its run's arguments (``env_kwargs`` by run id, :func:`trajlake.rollout.replay.run_env_kwargs`); yields
    each outcome as it is known."""
    pool = EnvPool()
    try:
        for pinned, episode, turns in episodes:
            env = pool.get(pinned.env_id, (env_kwargs or {}).get(episode["run_id"]))
            yield compare_episode(env, pinned, episode, turns)
    finally:
        pool.close()


# -- reading episodes --------------------------------------------------------------------------------------------


def _fetch(con: Any, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    rel = con.execute(sql, params)
    cols = [d[0] for d in rel.description]
    return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]


def _read(lake: Lake, versions: Mapping[str, int] | None, where: str, params: list[Any]
          ) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Episodes matching ``where`` (over the episodes view) with their turns, ordered by episode id, read whole
    (a suite is small) so that a missing data file fails here, not half-way through a replay."""
    con = connect(lake, dict(versions) if versions is not None else None)
    try:
        episodes = _fetch(con, f"select * from episodes where {where} order by episode_id", params)
        turns = _fetch(con, f"select * from turns where episode_id in (select episode_id from episodes where "
                            f"{where}) order by episode_id, turn_idx", params)
    finally:
        con.close()
    by_episode: dict[str, list[dict[str, Any]]] = {}
    for t in turns:
        by_episode.setdefault(t["episode_id"], []).append(t)
    return [(e, by_episode.get(e["episode_id"], [])) for e in episodes]


def _pinned_of(episode: Mapping[str, Any]) -> PinnedEpisode:
    return PinnedEpisode(episode["episode_id"], episode["env_id"], episode["env_version"], episode["task_id"],
                         episode["task_version"], episode.get("content_hash"))


def run_for_pinning(lake: Lake, run_id: str, episode_ids: Sequence[str] | None = None
                    ) -> tuple[dict[str, int], list[tuple[PinnedEpisode, dict[str, Any], list[dict[str, Any]]]]]:
    """The lake's current table versions and the episodes of ``run_id`` read at them (only ``episode_ids`` when
    given; each must be in the run): what ``pin_suite`` pins once they replay cleanly."""
    versions = lake.versions()
    if episode_ids:
        rows = _read(lake, versions, "run_id = ? and list_contains(?, episode_id)", [run_id, list(episode_ids)])
        missing = sorted(set(episode_ids) - {e["episode_id"] for e, _ in rows})
        if missing:
            raise TrajlakeError(f"--episodes: episode {missing[0]!r} is not an episode of run {run_id!r}"
                                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    else:
        rows = _read(lake, versions, "run_id = ?", [run_id])
    if not rows:
        raise TrajlakeError(f"run {run_id!r}: no episodes to pin")
    return versions, [(_pinned_of(e), e, t) for e, t in rows]


@dataclass
class SuiteRead:
    """The episodes of a suite and how they were read."""

    suite: ReplaySuite
    episodes: list[tuple[PinnedEpisode, dict[str, Any], list[dict[str, Any]]]] = field(default_factory=list)
    read_at: str = ""
    """``pinned versions`` or ``current versions`` (after the pinned files were vacuumed; content hashes
    checked)."""


def read_suite(lake: Lake, suite: ReplaySuite) -> SuiteRead:
    """The suite's episodes with their turns: at the pinned versions, or where compaction has vacuumed those
    files, at the current versions with every pinned ``content_hash`` checked. Raises naming the first episode
    that is gone or whose content differs from what was pinned."""
    ids = list(suite.episode_ids)
    where = "list_contains(?, episode_id)"
    import duckdb

    try:
        rows = _read(lake, suite.versions, where, [ids])
        read_at = "pinned versions"
    except (duckdb.Error, OSError, TrajlakeError) as pinned_error:
        if any(e.content_hash is None for e in suite.episodes):
            raise TrajlakeError(f"replay suite {suite.name!r}: cannot read the lake at the pinned versions "
                                f"{suite.as_of} ({one_line(pinned_error)}) and the suite keeps no content hashes "
                                f"to check a newer read against") from None
        rows = _read(lake, None, where, [ids])
        read_at = "current versions (the pinned files were vacuumed; content hashes checked)"
    found = {e["episode_id"]: (e, t) for e, t in rows}
    out = []
    for p in suite.episodes:
        if p.episode_id not in found:
            raise TrajlakeError(f"replay suite {suite.name!r}: pinned episode {p.episode_id} is not in the lake "
                                f"(read at the {read_at.split(' (')[0]})")
        episode, turns = found[p.episode_id]
        if p.content_hash is not None and episode.get("content_hash") != p.content_hash:
            raise TrajlakeError(f"replay suite {suite.name!r}: episode {p.episode_id}: content_hash "
                                f"{str(episode.get('content_hash'))[:12]} differs from the pinned "
                                f"{p.content_hash[:12]}: the lake no longer holds the episode that was pinned")
        out.append((p, episode, turns))
    return SuiteRead(suite, out, read_at)


# -- storing suites ----------------------------------------------------------------------------------------------


def check_suite_name(name: str) -> None:
    """Raises unless ``name`` can name a suite (and its file)."""
    if not _SUITE_NAME.match(name or ""):
        raise TrajlakeError(f"replay suite name {name!r}: use letters, digits, '_', '.', '-' (at most 100, starting "
                            f"with a letter or digit)")


def suite_exists(lake: Lake, name: str) -> bool:
    check_suite_name(name)
    return lake.storage.exists(META_DIR, SUITES_DIR, f"{name}.json")


def pin_suite(lake: Lake, name: str, versions: Mapping[str, int], outcomes: Sequence[SuiteOutcome],
              source: str) -> ReplaySuite:
    """Store the replay suite ``name``: the episodes of ``outcomes`` (each must have matched) read at
    ``versions``. An existing suite of that name is never replaced (pin another name)."""
    if suite_exists(lake, name):
        raise TrajlakeError(f"replay suite {name!r} exists already; pin the new set under another name")
    if not outcomes:
        raise TrajlakeError(f"replay suite {name!r}: no episodes to pin")
    bad = [o for o in outcomes if not o.ok]
    if bad:
        raise TrajlakeError(f"replay suite {name!r}: not pinned: {len(bad)} episode(s) do not replay on the current "
                            f"environment code (first: {bad[0].message()})")
    suite = ReplaySuite(name, tuple(sorted((o.episode for o in outcomes), key=lambda e: e.episode_id)),
                        dict(versions), dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), source)
    doc = {"format": SUITE_FORMAT, "name": suite.name, "created_at": suite.created_at, "source": source,
           "versions": dict(suite.versions), "env_versions": suite.env_versions,
           "episodes": [{"episode_id": e.episode_id, "env_id": e.env_id, "env_version": e.env_version,
                         "task_id": e.task_id, "task_version": e.task_version, "content_hash": e.content_hash}
                        for e in suite.episodes]}
    data = json.dumps(doc, indent=1).encode("utf-8")
    if lake.is_local:
        # create, never replace: a second pin of the same name at the same moment fails instead of overwriting
        target = lake.root / META_DIR / SUITES_DIR / f"{name}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        try:
            os.link(tmp, target)
        except FileExistsError:
            raise TrajlakeError(f"replay suite {name!r} exists already; pin the new set under another name") from None
        finally:
            tmp.unlink(missing_ok=True)
    else:  # object stores without a conditional put: checked just above, a simultaneous pin may win instead
        lake.storage.write_bytes(data, META_DIR, SUITES_DIR, f"{name}.json")
    return suite


def load_suite(lake: Lake, name: str) -> ReplaySuite:
    """The replay suite ``name`` stored in the lake; raises when there is none."""
    if not suite_exists(lake, name):
        raise TrajlakeError(f"replay suite {name!r} is not in the lake; pin one with `trajlake replay --run ID "
                            f"--pin-suite {name}`")
    where = f"{META_DIR}/{SUITES_DIR}/{name}.json"
    try:
        doc = json.loads(lake.storage.read_bytes(META_DIR, SUITES_DIR, f"{name}.json"))
        if "episodes" in doc:
            episodes = tuple(PinnedEpisode(e["episode_id"], e["env_id"], e["env_version"], e["task_id"],
                                           e["task_version"], e.get("content_hash")) for e in doc["episodes"])
            versions = {str(k): int(v) for k, v in doc["versions"].items()}
        else:  # the first layout (ids and an as-of string): read at those versions only, details from the rows
            versions = lake.resolve_as_of(doc["as_of"]) or {}
            episodes = tuple(PinnedEpisode(i, "", "", "", "", None) for i in doc["episode_ids"])
        return _filled(lake, ReplaySuite(doc["name"], episodes, versions, doc["created_at"], doc["source"]))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise TrajlakeError(f"replay suite {name!r}: {where} is not a replay suite document: "
                            f"{type(e).__name__}: {one_line(e)}") from None


def _filled(lake: Lake, suite: ReplaySuite) -> ReplaySuite:
    """A first-layout suite's per-episode details, from the rows at its pinned versions."""
    if all(e.env_id for e in suite.episodes):
        return suite
    rows = {e["episode_id"]: e for e, _ in _read(lake, suite.versions, "list_contains(?, episode_id)",
                                                  [list(suite.episode_ids)])}
    return ReplaySuite(suite.name, tuple(_pinned_of(rows[e.episode_id]) if e.episode_id in rows else e
                                         for e in suite.episodes), suite.versions, suite.created_at, suite.source)


def list_suites(lake: Lake) -> list[str]:
    """Names of the replay suites pinned in the lake, sorted."""
    try:
        names = lake.storage.listdir(META_DIR, SUITES_DIR)
    except FileNotFoundError:
        return []
    return sorted(n[:-5] for n in names if n.endswith(".json") and _SUITE_NAME.match(n[:-5]))


def replay_suite(lake: Lake, name: str) -> tuple[SuiteRead, list[SuiteOutcome]]:
    """Load the suite ``name``, read its episodes and replay them all on the current environment code."""
    read = read_suite(lake, load_suite(lake, name))
    return read, list(compare_rows(read.episodes, episodes_env_kwargs(lake, read.episodes)))


def suite_evidence(read: SuiteRead, outcomes: Sequence[SuiteOutcome]) -> dict[str, Any]:
    """What ``diagnose``'s first node is given: the suite, how many episodes replayed, which drifted and where."""
    s = read.suite
    return {"name": s.name, "source": s.source, "as_of": s.as_of, "read_at": read.read_at,
            "env_versions": s.env_versions, "episodes": len(outcomes),
            "drifted": [o.episode_id for o in outcomes if not o.ok],
            "drifts": [o.row() for o in outcomes if not o.ok]}


__all__ = ["ROW_COLUMNS", "SUITES_DIR", "SUITE_FORMAT", "Drift", "PinnedEpisode", "ReplaySuite", "SuiteOutcome",
           "SuiteRead", "check_suite_name", "compare_episode", "compare_rows", "episodes_env_kwargs", "list_suites",
           "load_suite", "pin_suite", "read_suite", "replay_suite", "run_for_pinning", "suite_evidence", "suite_exists"]
