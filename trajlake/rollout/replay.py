"""Replay a stored episode under its pinned versions (``trajlake replay``): the environment comes from the
registry by the episode's ``env_id``; the outcome says where the first state hash diverged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trajlake.envs.core import ReplayReport
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
    con = connect(lake, as_of)
    rel = con.execute("select * from episodes where episode_id = ?", [episode_id])
    cols = [d[0] for d in rel.description]
    rows = rel.fetchall()
    if not rows:
        raise TrajlakeError(f"episode {episode_id!r} is not in the lake")
    episode = dict(zip(cols, rows[0], strict=True))
    rel = con.execute("select * from turns where episode_id = ? order by turn_idx", [episode_id])
    tcols = [d[0] for d in rel.description]
    return episode, [dict(zip(tcols, r, strict=True)) for r in rel.fetchall()]


def replay_episode(lake: LakeArg, episode_id: str, as_of: str | None = None
                   ) -> ReplayOutcome:
    """Re-run a stored episode in a fresh instance of its environment and compare every state hash."""
    episode, turns = load_episode(lake, episode_id, as_of)
    log, turn_of_step = replay_log_from_rows(episode, turns)
    env = make(episode["env_id"], split=None)
    try:
        digest_ok = env.image_digest == episode["env_image_digest"]
        report = env.replay(log)
    finally:
        env.close()
    first = report.first_divergence
    if report.ok:
        where = ""
    elif first is None or first == -1:
        where = "the state after reset"
    elif first < len(turn_of_step):
        where = f"turn {turn_of_step[first]} (step {first})"
    else:
        where = f"step {first}"
    return ReplayOutcome(episode_id, report, digest_ok, episode["env_image_digest"], where)


__all__ = ["ReplayOutcome", "load_episode", "replay_episode"]
