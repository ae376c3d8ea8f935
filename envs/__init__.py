"""Reference environments behind one contract (installed as ``trajlake.envs``).

Importing this package registers each environment with Gymnasium (when it is installed): Mini SWE as
``trajlake/MiniSWE-v0``, Mini Web as ``trajlake/MiniWeb-v0``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trajlake.envs.core import (
    Budget,
    Env,
    EnvError,
    LoggedStep,
    ReplayLog,
    ReplayReport,
    ResetResult,
    Snapshot,
    StepResult,
)

from trajlake.errors import TrajlakeError

ENV_NAMES = ("mini-swe",)


def _check(name: str) -> None:
    if name not in ENV_NAMES:
        raise TrajlakeError(f"unknown environment {name!r}; environments: {', '.join(ENV_NAMES)}")


def make_env(name: str, split: str | None = None, **kwargs: Any) -> Env:
    """Create an environment by id (``mini-swe``) over one split (None: all tasks)."""
    _check(name)
    from trajlake.envs.mini_swe.env import MiniSWEEnv

    return MiniSWEEnv(split, **kwargs)


def list_tasks(name: str, split: str | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """The environment's task records of a split (None: all), sorted by task id."""
    _check(name)
    from trajlake.envs.mini_swe.grading import load_tasks

    tasks = load_tasks(kwargs.get("tasks_path"))
    return sorted((t for t in tasks if split is None or t["split"] == split), key=lambda t: t["task_id"])


def task_rows(name: str, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tasks`` table rows of an environment's task records."""
    _check(name)
    from trajlake.envs.mini_swe.env import task_row

    return [task_row(t) for t in tasks]


def make_policy(env_name: str, policy: str, policy_version: str) -> Any:
    """A built-in policy of an environment: oracle, heuristic or random."""
    _check(env_name)
    from trajlake.envs.mini_swe.policies import POLICIES

    if policy not in POLICIES:
        raise TrajlakeError(f"unknown policy {policy!r}; policies: {', '.join(sorted(POLICIES))}")
    return POLICIES[policy](policy_version)


def task_view_fn(env: Env, *, oracle: bool = False) -> Callable[[str, str], Any]:
    """A function (task_id, task_version) -> TaskView: the public statement and tools; the fix only for the
    oracle."""
    from trajlake.envs.mini_swe.env import TOOL_DOCS, MiniSWEEnv

    from trajlake.rollout.policy import TaskView

    assert isinstance(env, MiniSWEEnv)

    def view(task_id: str, task_version: str) -> TaskView:
        t = env.task_for(0, task_version, task_id)
        secret: Mapping[str, Any] | None = {"fix_diff": t["fix_diff"]} if oracle else None
        return TaskView(task_id, task_version, t["statement"], TOOL_DOCS, secret)

    return view


def _register_gymnasium() -> None:
    try:
        import gymnasium
    except ImportError:
        return
    if "trajlake/MiniSWE-v0" not in gymnasium.registry:
        gymnasium.register(id="trajlake/MiniSWE-v0", entry_point="trajlake.envs.gym:MiniSWEGymEnv")
    if "trajlake/MiniWeb-v0" not in gymnasium.registry:
        gymnasium.register(id="trajlake/MiniWeb-v0", entry_point="trajlake.envs.gym:MiniWebGymEnv")


_register_gymnasium()

__all__ = [
    "ENV_NAMES",
    "Budget",
    "Env",
    "EnvError",
    "LoggedStep",
    "ReplayLog",
    "ReplayReport",
    "ResetResult",
    "Snapshot",
    "StepResult",
    "list_tasks",
    "make_env",
    "make_policy",
    "task_rows",
    "task_view_fn",
]
