"""Reference environments behind one contract (installed as ``trajlake.envs``).

Every environment is reached through the registry (``trajlake.envs.registry``): ``make("mini-swe", split=...)``.
Importing this package registers the built-in environments (and their Gymnasium ids, when gymnasium is
installed: Mini SWE as ``trajlake/MiniSWE-v0``, Mini Web as ``trajlake/MiniWeb-v0``, tool-lookup as
``trajlake/ToolLookup-v0``); third-party ones come from the ``trajlake.envs`` entry-point
group. The helpers below resolve everything through the registry and the ``Env`` contract.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trajlake.envs.core import (
    Budget,
    Env,
    EnvError,
    LoggedStep,
    ReplayLog,
    ReplayReport,
    Requirement,
    ResetResult,
    Snapshot,
    StepResult,
)
from trajlake.envs.policy import Policy, PolicyOutput, TaskView
from trajlake.envs.registry import EnvSpec, UnknownEnvironmentError, make, names, register, spec

from trajlake.errors import TrajlakeError

register("mini-swe", "trajlake.envs.mini_swe.env:MiniSWEEnv", gym_id="trajlake/MiniSWE-v0",
         gym_kwargs={"split": "dev"})
register("mini-web", "trajlake.envs.mini_web.env:MiniWebEnv", gym_id="trajlake/MiniWeb-v0",
         gym_kwargs={"split": "dev"})
register("tool-lookup", "trajlake.envs.tool_lookup.env:ToolLookupEnv", gym_id="trajlake/ToolLookup-v0",
         gym_kwargs={"split": "dev"})


def make_env(name: str, split: str | None = None, **kwargs: Any) -> Env:
    """Create a registered environment over one split (None: all tasks)."""
    return make(name, split=split, **kwargs)


def list_tasks(name: str, split: str | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """The environment's task records of a split (None: all), sorted by task id."""
    env = make(name, split=split, **kwargs)
    try:
        return env.list_tasks()
    finally:
        env.close()


def task_rows(name: str, tasks: list[dict[str, Any]], **kwargs: Any) -> list[dict[str, Any]]:
    """``tasks`` table rows of an environment's task records."""
    env = make(name, **kwargs)
    try:
        return [env.task_row(t) for t in tasks]
    finally:
        env.close()


def policy_names(env_name: str) -> list[str]:
    """The built-in scripted policies of an environment."""
    cls = spec(env_name).env_class()
    return sorted(cls.policies()) if cls is not None else []


def make_policy(env_name: str, policy: str, policy_version: str) -> Policy:
    """A built-in policy of an environment (e.g. oracle, heuristic, random)."""
    cls = spec(env_name).env_class()
    policies = cls.policies() if cls is not None else {}
    if policy not in policies:
        raise TrajlakeError(f"unknown policy {policy!r} for environment {env_name!r}; policies: "
                            f"{', '.join(sorted(policies)) or 'none'}")
    return policies[policy](policy_version)


def check_injection(env_name: str, attack: str) -> None:
    """Raise naming the problem unless ``env_name`` can play the prompt-injection attack ``attack``."""
    cls = spec(env_name).env_class()
    attacks = cls.injection_attacks if cls is not None else ()
    if not attacks:
        raise TrajlakeError(f"environment {env_name!r} has no prompt-injection suite: it cannot play --injection "
                            f"{attack}")
    if attack not in attacks:
        raise TrajlakeError(f"unknown injection attack {attack!r} for environment {env_name!r}; attacks: "
                            f"{', '.join(attacks)}")


def task_view_fn(env: Env, *, oracle: bool = False) -> Callable[[str, str], TaskView]:
    """A function (task_id, task_version) -> TaskView: the public statement and tools; the known solution only
    for the oracle."""

    def view(task_id: str, task_version: str) -> TaskView:
        return env.task_view(task_id, task_version, oracle=oracle)

    return view


def env_names() -> list[str]:
    """Every registered environment name."""
    return names()


__all__ = [
    "Budget",
    "Env",
    "EnvError",
    "EnvSpec",
    "LoggedStep",
    "Policy",
    "PolicyOutput",
    "ReplayLog",
    "ReplayReport",
    "Requirement",
    "ResetResult",
    "Snapshot",
    "StepResult",
    "TaskView",
    "UnknownEnvironmentError",
    "check_injection",
    "env_names",
    "list_tasks",
    "make",
    "make_env",
    "make_policy",
    "names",
    "policy_names",
    "register",
    "spec",
    "task_rows",
    "task_view_fn",
]
