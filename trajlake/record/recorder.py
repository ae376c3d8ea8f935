"""Record one episode turn by turn (``LakeWriter.start_episode``): the single-episode API beside the episode builder.

``EpisodeRecorder`` collects turns and gateway events as plain rows, derives the episode row with the one episode
builder (``record.episode.build_episode``) when finished, and hands the episode to its writer's ``write_batch``.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trajlake.errors import TrajlakeError
from trajlake.record.episode import build_episode, group_id_for, utcnow
from trajlake.schemas.vocab import Actor, Role, Status

if TYPE_CHECKING:
    from trajlake.record.writer import LakeWriter, WriteResult


def new_episode_id() -> str:
    """A time-ordered unique id (UUIDv7 layout), so file statistics prune id look-ups."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | (rand >> 68 & 0xFFF) << 64 | 0b10 << 62 | (rand & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))


class EpisodeRecorder:
    """Records one episode turn by turn; ``finish`` validates it and hands it to the writer.

    Arguments of ``LakeWriter.start_episode``: run_id, task_id, task_version, env_id, env_version (required);
    split (default "unknown"), env_image_digest, env_seed, group_id (default ``record.episode.group_id_for``),
    attempt (default 0), policy_version (used for policy turns), episode_id (default: a new
    time-ordered id), started_at (default now, UTC)."""

    def __init__(self, writer: LakeWriter, *, run_id: str, task_id: str, task_version: str, env_id: str,
                 env_version: str, split: str = "unknown", env_image_digest: str | None = None,
                 env_seed: int | None = None, group_id: str | None = None, attempt: int = 0,
                 policy_version: str | None = None, episode_id: str | None = None,
                 started_at: dt.datetime | None = None, sandbox: str | None = None):
        self.writer = writer
        self.episode_id = episode_id or new_episode_id()
        self.policy_version = policy_version
        self.started_at = started_at or utcnow()
        self.ep: dict[str, Any] = {
            "episode_id": self.episode_id, "run_id": run_id, "task_id": task_id, "task_version": task_version,
            "split": split, "env_id": env_id, "env_version": env_version, "env_image_digest": env_image_digest,
            "env_seed": env_seed,
            "group_id": group_id or group_id_for(task_id, task_version, env_seed, env_version),
            "attempt": attempt, "started_at": self.started_at, "sandbox": sandbox,
        }
        self.turns: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.finished = False

    def add_turn(self, role: str, content: str | None = None, *, actor: str | None = None,
                 token_ids: Sequence[int] | None = None, loss_mask: Sequence[int] | None = None,
                 behavior_logprobs: Sequence[float] | None = None, policy_version: str | None = None,
                 started_at: dt.datetime | None = None, ended_at: dt.datetime | None = None,
                 **fields: Any) -> int:
        """Append a turn; returns its turn_idx. ``actor`` defaults from the role (assistant: policy, tool: env).
        ``loss_mask`` defaults to all 1 for policy turns with token ids and all 0 otherwise. Other keyword
        arguments are turn columns (tool_args, status, cost_usd, ...)."""
        if self.finished:
            raise TrajlakeError(f"episode {self.episode_id}: add_turn after finish")
        actor = actor or {Role.ASSISTANT: Actor.POLICY, Role.TOOL: Actor.ENV, Role.ENV: Actor.ENV,
                          Role.USER: Actor.USER}.get(role, Actor.SYSTEM)
        if token_ids is not None and loss_mask is None:
            loss_mask = [1 if actor == Actor.POLICY else 0] * len(token_ids)
        if actor == Actor.POLICY and policy_version is None:
            policy_version = self.policy_version
        end = ended_at or utcnow()
        start = started_at or end
        row = {
            "episode_id": self.episode_id, "run_id": self.ep["run_id"], "turn_idx": len(self.turns),
            "role": role, "actor": actor, "policy_version": policy_version, "raw_content": content,
            "token_ids": list(token_ids) if token_ids is not None else None,
            "loss_mask": list(loss_mask) if loss_mask is not None else None,
            "behavior_logprobs": list(behavior_logprobs) if behavior_logprobs is not None else None,
            "started_at": start, "ended_at": end,
            "latency_ms": fields.pop("latency_ms", (end - start).total_seconds() * 1000.0),
            "status": fields.pop("status", Status.OK),
            "tokens": fields.pop("tokens", len(token_ids) if token_ids is not None else 0),
            "cost_usd": fields.pop("cost_usd", None), "tool_seconds": fields.pop("tool_seconds", 0.0),
        }
        row.update(fields)
        self.turns.append(row)
        return len(self.turns) - 1

    def add_gateway_event(self, **fields: Any) -> None:
        """Record a gateway decision (columns of gateway_events) for the current or given turn_idx."""
        ev = {"episode_id": self.episode_id, "run_id": self.ep["run_id"],
              "turn_idx": fields.pop("turn_idx", max(0, len(self.turns) - 1)),
              "event_idx": 0, "taint": [], "at": utcnow()}
        ev.update(fields)
        ev["event_idx"] = sum(1 for e in self.events if e["turn_idx"] == ev["turn_idx"])
        self.events.append(ev)

    def finish(self, *, terminated: bool, truncated: bool, termination_reason: str, success: bool | None,
               reward_components: Mapping[str, float] | None = None, reward_total: float | None = None,
               error_class: str | None = None, ended_at: dt.datetime | None = None,
               **fields: Any) -> WriteResult:
        """Close the episode and hand it to the writer. Raises ValidationError if it is invalid."""
        if self.finished:
            raise TrajlakeError(f"episode {self.episode_id}: finish called twice")
        self.finished = True
        ended = ended_at or utcnow()
        if self.turns:
            ended = max(ended, max(t["ended_at"] for t in self.turns))
        comps = dict(reward_components or {})
        reported = {k: fields.pop(k) for k in ("tokens_in", "tokens_out", "cost_usd") if k in fields}
        ep = dict(self.ep)
        ep.update({
            "policy_version_start": self.policy_version, "policy_version_end": self.policy_version,
            "ended_at": ended, "terminated": terminated, "truncated": truncated,
            "termination_reason": termination_reason, "error_class": error_class, "success": success,
            "reward_total": float(sum(comps.values())) if reward_total is None else reward_total,
            "reward_components": comps, "wall_seconds": (ended - self.started_at).total_seconds(),
            "injection_attempted": False,
        })
        ep.update(fields)
        pol = [t["policy_version"] for t in self.turns if t["actor"] == Actor.POLICY and t["policy_version"]]
        if pol and "policy_version_start" not in fields:
            ep["policy_version_start"], ep["policy_version_end"] = pol[0], pol[-1]
        ep = build_episode(ep, self.turns, reported_tokens_in=reported.get("tokens_in"),
                           reported_tokens_out=reported.get("tokens_out"),
                           reported_cost_usd=reported.get("cost_usd"))
        res = self.writer.write_batch([ep], self.turns, self.events or None)
        res.raise_if_rejected()
        return res


__all__ = ["EpisodeRecorder", "new_episode_id"]
