"""The one episode builder: every writer derives an episode's aggregate columns from its turns here.

The rollout runner, ``EpisodeRecorder``, the importers and the demo all call ``build_episode``, so
``n_turns``, ``n_policy_tokens``, ``tokens_in``/``tokens_out``, ``tool_seconds``, ``cost_usd``,
``faults_injected`` and ``group_id`` mean the same thing whoever wrote the episode (``schemas/episodes.v1.json``
states each definition; ``docs/eval.md`` the metrics built on them):

- ``tokens_out``: tokens the policy generated, the sum of ``turns.tokens`` over policy turns.
- ``tokens_in``: tokens the policy read, summed over its calls: each policy turn's ``prompt_tokens`` (the
  context it was given) or, when that is null, the tokens of every earlier turn of the episode (the whole
  history). This is what a model API bills as input. A source that reports the policy model's own usage
  (an API's prompt/completion counts) gives those counts instead (``reported_tokens_in``/``_out``).
- ``cost_usd``: the sum of the turns' ``cost_usd``; null when no turn has cost data. ``price_turns`` fills
  the turns' costs from a run's ``CostModel`` (tokens at the policy's prices, tool seconds at the tool price).
- ``group_id``: ``task_id:task_version:env_seed:env_version`` (``unseeded`` for a null seed): the episodes
  GRPO/RLOO compare (same task, seed and environment version).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from trajlake.schemas.vocab import Actor

#: Price of one second of tool time when a run sets none: about one on-demand cloud vCPU-second
#: (0.04 USD per vCPU-hour). A run's config records the price it used.
DEFAULT_TOOL_SECOND_USD = 0.04 / 3600


@dataclass(frozen=True)
class CostModel:
    """Prices that turn recorded usage into ``cost_usd`` (recorded in ``runs.config`` as ``cost_model``)."""

    price_in: float = 0.0
    """USD per million input (prompt) tokens of the policy model."""
    price_out: float = 0.0
    """USD per million output tokens of the policy model."""
    price_tool_second: float = DEFAULT_TOOL_SECOND_USD
    """USD per second of tool time (sandboxed test runs, page loads, ...)."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (isinstance(value, int | float) and value >= 0 and np.isfinite(value)):
                raise ValueError(f"cost model: {name} must be a non-negative number, not {value!r}")

    def policy_turn(self, prompt_tokens: int, output_tokens: int) -> float:
        return (prompt_tokens * self.price_in + output_tokens * self.price_out) / 1e6

    def env_turn(self, tool_seconds: float) -> float:
        return tool_seconds * self.price_tool_second

    def to_config(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def for_run(cls, policy_args: Mapping[str, Any], price_in: float = 0.0, price_out: float = 0.0,
                price_tool_second: float | None = None) -> CostModel:
        """A run's cost model: the explicit prices, else a language-model policy's ``price_in``/``price_out``
        settings (``--policy-arg``), so the prices a policy is given are the ones its turns are charged."""
        p_in = price_in or float(policy_args.get("price_in", 0) or 0)
        p_out = price_out or float(policy_args.get("price_out", 0) or 0)
        if price_tool_second is None:
            return cls(p_in, p_out)
        return cls(p_in, p_out, price_tool_second)


def utcnow() -> dt.datetime:
    """Now, timezone-aware in UTC: the clock every writer of episodes stamps rows with (``started_at``,
    ``ended_at``, ``written_at``, a run's ``created_at``)."""
    return dt.datetime.now(dt.UTC)


def group_id_for(task_id: str, task_version: str, env_seed: int | None, env_version: str) -> str:
    """The GRPO/RLOO group of an episode: same task, seed and environment version."""
    seed = "unseeded" if env_seed is None else str(int(env_seed))
    return f"{task_id}:{task_version}:{seed}:{env_version}"


def _n(values: Any) -> int:
    return 0 if values is None else len(values)


def context_tokens(turns: Sequence[Mapping[str, Any]]) -> list[int]:
    """Per turn, the tokens of context it was given: ``prompt_tokens`` when recorded, else the tokens of every
    earlier turn (turns in ``turn_idx`` order)."""
    out: list[int] = []
    history = 0
    for t in turns:
        given = t.get("prompt_tokens")
        out.append(int(given) if given is not None else history)
        history += int(t.get("tokens") or 0)
    return out


def price_turns(turns: Sequence[dict[str, Any]], model: CostModel) -> None:
    """Fill the ``cost_usd`` of turns that have none from ``model``, in place: a policy turn costs its context
    and output tokens, an environment turn its tool seconds (plus any cost the environment itself reported,
    which is already in ``cost_usd`` and kept)."""
    ctx = context_tokens(turns)
    for t, c in zip(turns, ctx, strict=True):
        if t.get("actor") == Actor.POLICY:
            if t.get("cost_usd") is None:
                t["cost_usd"] = model.policy_turn(c, int(t.get("tokens") or 0))
        elif t.get("actor") == Actor.ENV:
            t["cost_usd"] = float(t.get("cost_usd") or 0.0) + model.env_turn(float(t.get("tool_seconds") or 0.0))


def _sum_mask(turns: Iterable[Mapping[str, Any]]) -> int:
    total = 0
    for t in turns:
        m = t.get("loss_mask")
        if m is not None:
            total += int(np.sum(np.asarray(m, dtype=np.int64))) if len(m) else 0
    return total


def build_episode(episode: Mapping[str, Any], turns: Sequence[Mapping[str, Any]], *,
                  reported_tokens_in: int | None = None, reported_tokens_out: int | None = None,
                  reported_cost_usd: float | None = None, reported_tool_seconds: float | None = None
                  ) -> dict[str, Any]:
    """The episode row with its aggregate columns derived from ``turns`` (in ``turn_idx`` order).

    ``episode`` gives everything else (ids, versions, seeds, outcome, rewards, timing). Derived columns it
    already has are replaced, except ``policy_version_start``/``_end`` (kept when given) and ``group_id``
    (kept when given: a caller may group by more than the default key). ``reported_*`` are counts the source
    itself reports for the policy model (API usage, a log's cost, its own tool time): they win over the counts
    from the turns."""
    row = dict(episode)
    policy = [t for t in turns if t.get("actor") == Actor.POLICY]
    row["n_turns"] = len(turns)
    row["n_policy_tokens"] = _sum_mask(turns)
    row["tokens_out"] = int(reported_tokens_out) if reported_tokens_out is not None else \
        sum(int(t.get("tokens") or 0) for t in policy)
    if reported_tokens_in is not None:
        row["tokens_in"] = int(reported_tokens_in)
    else:
        ctx = context_tokens(turns)
        row["tokens_in"] = sum(c for t, c in zip(turns, ctx, strict=True) if t.get("actor") == Actor.POLICY)
    row["tool_seconds"] = float(reported_tool_seconds) if reported_tool_seconds is not None else \
        float(sum(float(t.get("tool_seconds") or 0.0) for t in turns))
    costs = [float(t["cost_usd"]) for t in turns if t.get("cost_usd") is not None]
    row["cost_usd"] = float(reported_cost_usd) if reported_cost_usd is not None else \
        (float(sum(costs)) if costs else None)
    row["faults_injected"] = sum(1 for t in turns if t.get("fault_injected"))
    if not row.get("group_id"):
        row["group_id"] = group_id_for(row["task_id"], row["task_version"], row.get("env_seed"),
                                       row["env_version"])
    versions = [t["policy_version"] for t in policy if t.get("policy_version")]
    if versions:
        row.setdefault("policy_version_start", versions[0])
        row.setdefault("policy_version_end", versions[-1])
        if row["policy_version_start"] is None:
            row["policy_version_start"] = versions[0]
        if row["policy_version_end"] is None:
            row["policy_version_end"] = versions[-1]
    return row


__all__ = ["DEFAULT_TOOL_SECOND_USD", "CostModel", "build_episode", "context_tokens", "group_id_for", "price_turns",
           "utcnow"]
