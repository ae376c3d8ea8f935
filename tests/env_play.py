"""A scripted policy played in an environment step by step, without the runner: the environments' own tests."""

from __future__ import annotations

from trajlake.envs.core import Env, StepResult
from trajlake.envs.policy import Policy


def play_policy(env: Env, policy: Policy, task_id: str, task_version: str, *, seed: int = 0,
                oracle: bool | None = None, max_steps: int = 80) -> list[StepResult]:
    """Reset ``env`` on a task, give ``policy`` the task's view (with the known solution when ``oracle``; by
    default when the policy needs it) and play until the episode ends or ``max_steps`` steps; the step results.
    Idempotency keys are ``k0``, ``k1``, ..."""
    r = env.reset(seed, task_id=task_id)
    policy.reset(env.task_view(task_id, task_version, oracle=policy.needs_oracle if oracle is None else oracle), seed)
    observation, results = r.observation, []
    for i in range(max_steps):
        res = env.step(policy.act(observation).action, f"k{i}")
        results.append(res)
        observation = res.observation
        if res.done:
            break
    return results
