"""Gymnasium adapter: any trajlake environment as a ``gymnasium.Env`` with text spaces.

``info`` is deterministic and typed: ``task_id``, ``task_version`` and ``state_hash`` after reset; ``status``,
``state_hash``, ``tool`` and ``termination_reason`` after a step (no ids, clocks or free-form side channels).
"""

from __future__ import annotations

from typing import Any

import gymnasium
from gymnasium import spaces
from trajlake.envs.core import Env

MAX_TEXT = 1_000_000
# Unicode text: every code point of the Basic Multilingual Plane except surrogates.
CHARSET = frozenset(chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF)


class TrajlakeGymEnv(gymnasium.Env[str, str]):
    """Wraps a trajlake ``Env``: reward is the sum of the step's reward components."""

    metadata = {"render_modes": []}  # noqa: RUF012  (gymnasium declares it as an instance attribute)

    def __init__(self, env: Env | None = None, *, name: str | None = None, **kwargs: Any):
        if env is None:
            if name is None:
                raise ValueError("TrajlakeGymEnv needs an Env or the registered name of one")
            from trajlake.envs.registry import make

            env = make(name, **kwargs)
        self.env = env
        self.observation_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=CHARSET)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(0, 2**31 - 1))
        r = self.env.reset(seed, (options or {}).get("task_version"), task_id=(options or {}).get("task_id"))
        return r.observation, {"task_id": r.task_id, "task_version": r.task_version, "state_hash": r.state_hash}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        res = self.env.step(action)
        info = {"status": res.status, "state_hash": res.state_hash, "tool": res.tool or "",
                "termination_reason": res.termination_reason or ""}
        return res.observation, float(sum(res.reward_components.values())), res.terminated, res.truncated, info

    def close(self) -> None:
        self.env.close()


class MiniSWEGymEnv(TrajlakeGymEnv):
    """``trajlake/MiniSWE-v0``."""

    def __init__(self, split: str | None = "dev", **kwargs: Any):
        super().__init__(name="mini-swe", split=split, **kwargs)


class MiniWebGymEnv(TrajlakeGymEnv):
    """``trajlake/MiniWeb-v0`` (``split=None``: every task; other keywords go to ``MiniWebEnv``)."""

    def __init__(self, split: str | None = "dev", **kwargs: Any):
        super().__init__(name="mini-web", split=split, **kwargs)
