"""Episode, turn, task and run rows (schema v1) from the importers' specs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajlake.io.importers._common import (
    EpisodeSpec,
    Loc,
    RunInfo,
    canonical_json,
    clean_components,
    clean_str,
    lay_out,
    render_turn,
    sha256_text,
)
from trajlake.io.importers._tokenize import PrefixError, TurnTokenizer
from trajlake.record.episode import build_episode
from trajlake.schemas.vocab import Actor, Role, Split

INT32 = 1 << 31
INT64 = 1 << 63


@dataclass
class ImportContext:
    """What every row of one import shares."""

    fmt: str
    path: Path
    file_hash: str
    run_id: str
    format_version: str
    tokenizer: TurnTokenizer | None = None

    @property
    def env_id(self) -> str:
        return f"import/{self.fmt}"


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    return {k: clean_str(v) if isinstance(v, str) else v for k, v in row.items()}


def build_rows(spec: EpisodeSpec, ctx: ImportContext, episode_id: str, where: str
               ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None]:
    """(episode row, turn rows, task row or None) of one episode. Raises ValidationError when ``--tokenizer``
    is given and the conversation fails the prefix-consistency check."""
    loc = Loc(where, episode_id)
    start, end = lay_out(spec)
    for i, t in enumerate(spec.turns):
        if not 0 <= t.tokens < INT32:
            loc.fail("tokens", f"{t.tokens} does not fit in int32", turn=i, table="turns")
    if not 0 <= spec.attempt < INT32:
        loc.fail("attempt", f"{spec.attempt} does not fit in int32")
    tok_lists: list[list[int]] | None = None
    if ctx.tokenizer is not None:
        try:
            tok_lists = ctx.tokenizer.encode_turns([clean_str(render_turn(t)) for t in spec.turns],
                                                   untrusted=[t.actor != Actor.POLICY for t in spec.turns])
        except PrefixError as e:
            loc.fail("token_ids", e.message, turn=e.turn, table="turns")
    turns: list[dict[str, Any]] = []
    for i, t in enumerate(spec.turns):
        policy = t.actor == Actor.POLICY
        pv = (t.policy_version or spec.policy_version or "unknown") if policy else None
        row: dict[str, Any] = {
            "episode_id": episode_id, "run_id": ctx.run_id, "turn_idx": i, "role": t.role, "actor": t.actor,
            "policy_version": pv, "raw_content": t.content,
            "action_schema": t.action_schema, "tool_call_id": t.tool_call_id, "tool_args": t.tool_args,
            "observation_hash": sha256_text(t.content) if t.content is not None and t.role in (Role.TOOL, Role.ENV)
            else None,
            "started_at": t.started_at, "ended_at": t.ended_at, "latency_ms": float(t.latency_ms or 0.0),
            "status": t.status, "tokens": int(t.tokens), "prompt_tokens": t.prompt_tokens if policy else None,
            "cost_usd": None if t.cost_usd is None else float(t.cost_usd),
            "tool_seconds": float(t.tool_seconds),
            "reward_components": clean_components(t.reward_components) if t.reward_components else None,
        }
        if tok_lists is not None and ctx.tokenizer is not None:
            ids = tok_lists[i]
            row["token_ids"] = ids
            row["loss_mask"] = [1 if policy and t.trainable else 0] * len(ids)
            row["tokenizer_id"] = ctx.tokenizer.tokenizer_id
            row["tokens"] = len(ids)
        turns.append(_clean(row))
    comps = clean_components(spec.reward_components)
    pol = [r["policy_version"] for r in turns if r["actor"] == Actor.POLICY and r["policy_version"]]
    # aggregates come from the one episode builder; the source's own usage and cost, when it reports them,
    # win over counts from the turns
    episode = build_episode(_clean({
        "episode_id": episode_id, "run_id": ctx.run_id, "task_id": spec.task_id, "task_version": spec.task_version,
        "split": Split.UNKNOWN, "env_id": ctx.env_id, "env_version": spec.env_version, "env_image_digest": None,
        "env_seed": spec.env_seed, "attempt": spec.attempt,
        "policy_version_start": pol[0] if pol else spec.policy_version,
        "policy_version_end": pol[-1] if pol else spec.policy_version,
        "started_at": start, "ended_at": end,
        "terminated": spec.terminated, "truncated": spec.truncated, "termination_reason": spec.termination_reason,
        "error_class": spec.error_class, "success": spec.success,
        "reward_total": float(sum(comps.values())) if spec.reward_total is None else float(spec.reward_total),
        "reward_components": comps, "wall_seconds": (end - start).total_seconds(), "injection_attempted": False,
        "final_state_hash": None, "sandbox": spec.sandbox,
        "served_model": spec.served_model, "verification_source": spec.verification_source,
        "source_format": ctx.fmt, "source_file_hash": ctx.file_hash, "source_format_version": ctx.format_version,
    }), turns, reported_tokens_in=spec.tokens_in, reported_tokens_out=spec.tokens_out,
        reported_cost_usd=spec.cost_usd, reported_tool_seconds=spec.tool_seconds)
    for name in ("tokens_in", "tokens_out"):
        if not 0 <= episode[name] < INT64:
            loc.fail(name, f"{episode[name]} does not fit in int64")
    task = None
    if spec.task is not None:
        ts = spec.task
        task = _clean({
            "task_id": spec.task_id, "task_version": spec.task_version, "env_id": ctx.env_id, "split": Split.UNKNOWN,
            "family": ts.family, "difficulty": None, "created_at": ts.created_at or start,
            "statement": clean_str(ts.statement),
            "provenance": {"generator": ctx.env_id, "source": ts.source, "commit": ts.commit, "mutator": None,
                           "seed": None, "diff_hash": None},
            "has_oracle": False,
            "budget": {"max_steps": ts.max_steps if ts.max_steps is None or ts.max_steps < 1 << 31 else None,
                       "max_tokens": ts.max_tokens, "max_cost": ts.max_cost},
        })
    return episode, turns, task


def run_row(ctx: ImportContext, run: RunInfo, explicit: bool) -> dict[str, Any]:
    """The ``runs`` row of an import. For the default (file-derived) run id it describes the file."""
    config = {"importer": ctx.fmt, "source_format_version": ctx.format_version, **run.config,
              **(run.late_config() if run.late_config is not None else {})}
    if not explicit:
        config.update({"source_file": ctx.path.name, "source_file_hash": ctx.file_hash})
    return _clean({
        "run_id": ctx.run_id, "created_at": run.created_at,
        "label": None if explicit else f"import {ctx.fmt}: {ctx.path.name}",
        "config": canonical_json(config), "policy_name": run.policy_name, "policy_version": run.policy_name,
        "code_version": run.code_version,
    })
