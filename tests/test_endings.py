"""Endings through the runner (issue 29): a wall-clock limit truncates an episode with reason ``timeout`` (a clock
the test moves, no sleeping), and Mini SWE's ``give_up`` ends one terminated, unsolved, told apart from other
failures; the oracle never gives up."""

from __future__ import annotations

import json
from typing import Any

from trajlake.envs import make_env, make_policy, task_view_fn
from trajlake.envs.mini_swe.grading import load_tasks as swe_tasks
from trajlake.envs.mini_swe.policies import OraclePolicy
from trajlake.envs.policy import Policy, PolicyOutput, TaskView

from trajlake.rollout.runner import play_episode, replay_log_from_rows


class Ticking:
    """A monotonic clock that moves ``step`` seconds every time it is read."""

    def __init__(self, step: float):
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        value = self.now
        self.now += self.step
        return value


def test_a_wall_clock_limit_truncates_a_rollout_episode_with_reason_timeout() -> None:
    """``--env-arg budget='{"max_steps": 40, "max_seconds": 30}'`` (one rollout's limit): the clock is read at reset
    and at the end of every step (the policy's own time included); 10 s a read, the fourth step ends 40 s after
    reset, past the limit. The episode is truncated (never terminated), reason timeout, graded unsolved, and its
    last observation says the time is spent. A replay re-runs the same actions without re-triggering it."""
    env = make_env("mini-web", split="dev", budget={"max_steps": 40, "max_seconds": 30})
    try:
        task = next(t for t in env.tasks if t["family"] == "orders/cheapest-rated")  # 11 oracle steps
        # the gullible policy plays the known solution on a benign task but is no oracle: an oracle that fails is
        # attributed ENV_BUG by the runner, whatever ended it
        env.clock = Ticking(10.0)
        rec = play_episode(env, make_policy("mini-web", "gullible", "g-v1"), run_id="clock", task_id=task["task_id"],
                           task_version=task["task_version"], seed=0, split="dev")
        ep = rec.episode
        assert (ep["truncated"], ep["terminated"], ep["termination_reason"]) == (True, False, "timeout")
        assert ep["error_class"] == "BUDGET_EXHAUSTED" and ep["success"] is False  # graded when cut
        assert sum(t["actor"] == "policy" for t in rec.turns) == 4
        last = rec.turns[-1]
        assert last["status"] == "BUDGET_EXHAUSTED" and "The time budget is spent" in last["raw_content"]
        # the same limit with a clock that never runs out: the same plan finishes its 11 steps and succeeds
        env.clock = Ticking(0.0)
        full = play_episode(env, make_policy("mini-web", "gullible", "g-v1"), run_id="clock", task_id=task["task_id"],
                            task_version=task["task_version"], seed=0, split="dev")
        assert full.episode["success"] and full.episode["termination_reason"] == "success"
        # wall time is not state: the cut episode replays (real clock) with every state hash matching
        log, _ = replay_log_from_rows(ep, rec.turns)
        env.clock = Ticking(0.0)
        assert env.replay(log).ok
    finally:
        env.close()


class GivesUp(Policy):
    """Reads one file, then gives up."""

    name = "quitter"

    def reset(self, task: TaskView, seed: int) -> None:
        self.actions = [json.dumps({"tool": "list_files", "args": {}}), json.dumps({"tool": "give_up", "args": {}})]

    def act(self, observation: str) -> PolicyOutput:
        return self.scripted_output(self.actions.pop(0))


def test_mini_swe_give_up_through_the_runner_is_a_terminated_failure_with_its_cost() -> None:
    env = make_env("mini-swe", split="dev")
    try:
        task = env.tasks[0]
        rec = play_episode(env, GivesUp("q-v1"), run_id="quit", task_id=task["task_id"],
                           task_version=task["task_version"], seed=0, split="dev", task_view=task_view_fn(env))
    finally:
        env.close()
    ep: dict[str, Any] = rec.episode
    assert (ep["terminated"], ep["truncated"], ep["termination_reason"]) == (True, False, "gave_up")
    # graded (a success column, not NULL) and unsolved: a decision of the model, not an environment failure
    assert ep["success"] is False and ep["error_class"] == "MODEL_BAD_PLAN"
    assert ep["reward_components"] == {"resolved": 0.0, "partial": 0.0} and ep["verification_source"] is not None
    assert ep["cost_usd"] is not None and ep["cost_usd"] > 0  # the policy's tokens are priced, as on any ending
    give_up_turns = [t for t in rec.turns if t.get("action_schema") == "give_up"]
    assert [t["actor"] for t in give_up_turns] == ["policy", "env"] and give_up_turns[1]["status"] == "OK"


def test_the_mini_swe_oracle_never_gives_up() -> None:
    """Its plan, made from the known fix of every task of every split, holds reads, edits, a test run and a submit,
    never give_up (an oracle that gave up would be an ENV_BUG signal for nothing)."""
    from trajlake.envs.mini_swe.env import TOOL_DOCS

    for t in swe_tasks():
        oracle = OraclePolicy("o-v1")
        oracle.reset(TaskView(t["task_id"], t["task_version"], t["statement"], TOOL_DOCS, {"fix_diff": t["fix_diff"]}),
                     0)
        tools = [json.loads(a)["tool"] for a in oracle.plan]
        assert "give_up" not in tools and tools[-1] == "submit", t["task_id"]
