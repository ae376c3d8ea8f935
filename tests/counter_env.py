"""A third-party environment for the registry tests: it lives only here, outside trajlake's code.

"Counter": the agent must bring a counter to the task's target and submit. Actions are JSON
``{"tool": "inc" | "dec" | "submit", "args": {}}``. Budget: target + 3 steps.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trajlake.envs.core import (
    Budget,
    BudgetTracker,
    Env,
    EnvError,
    EvalDocument,
    ResetResult,
    Snapshot,
    StepResult,
    stable_hash,
)
from trajlake.envs.policy import Policy, PolicyOutput, TaskView

TASKS = [{"task_id": f"counter/{n}", "task_version": "v1", "split": "dev" if n % 2 else "train", "target": n}
         for n in range(1, 5)]
TOOLS = {"inc": {"description": "add one", "args": {}}, "dec": {"description": "subtract one", "args": {}},
         "submit": {"description": "finish", "args": {}}}


def worked_solution(task: Mapping[str, Any]) -> str:
    """The task's solution written out: what a model that saw it in training would have memorised."""
    n = task["target"]
    return (f"Worked solution of {task['task_id']}: starting from zero, call inc exactly {n} time(s) until "
            f"the counter shows {n}, never call dec, and only then call submit to finish the episode.")


class CounterEnv(Env):
    env_id = "counter"
    env_version = "1"
    verification_source = "counter_state"
    sandbox_kind = "none"

    def __init__(self, split: str | None = None, **_: Any):
        self.tasks = [t for t in TASKS if split is None or t["split"] == split]
        if not self.tasks:
            raise EnvError(f"no counter tasks in split {split!r}")
        self.task: dict[str, Any] | None = None
        self.count = 0
        self.done = False
        self.tracker = BudgetTracker(Budget())

    @property
    def image_digest(self) -> str:
        return "sha256:counter-test"

    def list_tasks(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self.tasks]

    def task_row(self, task: Mapping[str, Any]) -> dict[str, Any]:
        return {"task_id": task["task_id"], "task_version": task["task_version"], "env_id": self.env_id,
                "split": task["split"], "family": "counter", "difficulty": None,
                "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "statement": self._statement(task),
                "provenance": {"generator": "tests.counter_env", "source": None, "commit": None, "mutator": None,
                               "seed": None, "diff_hash": None},
                "has_oracle": True, "budget": {"max_steps": task["target"] + 3, "max_tokens": None, "max_cost": None}}

    def task_view(self, task_id: str, task_version: str, *, oracle: bool = False) -> TaskView:
        task = self._task(task_id)
        return TaskView(task_id, task_version, self._statement(task), TOOLS,
                        {"target": task["target"]} if oracle else None)

    @classmethod
    def policies(cls) -> Mapping[str, Callable[[str], Policy]]:
        return {"oracle": CounterOracle, "lazy": LazyPolicy}

    @classmethod
    def evaluation_documents(cls, task_ids: Sequence[str]) -> list[EvalDocument]:
        by_id = {t["task_id"]: t for t in TASKS}
        return [EvalDocument(tid, "worked_solution", worked_solution(by_id[tid]))
                for tid in task_ids if tid in by_id]

    def _task(self, task_id: str) -> dict[str, Any]:
        for t in TASKS:
            if t["task_id"] == task_id:
                return t
        raise EnvError(f"unknown task {task_id!r}")

    @staticmethod
    def _statement(task: Mapping[str, Any]) -> str:
        return f"Bring the counter to {task['target']} and submit."

    def state_hash(self) -> str:
        return stable_hash({"count": self.count, "done": self.done})

    def reset(self, seed: int, task_version: str | None = None, *, task_id: str | None = None) -> ResetResult:
        self.task = self._task(task_id) if task_id else self.tasks[seed % len(self.tasks)]
        self.count, self.done = 0, False
        self.tracker = BudgetTracker(Budget(max_steps=self.task["target"] + 3))
        return ResetResult(str(uuid.uuid4()), self._statement(self.task), self.state_hash(), self.task["task_id"],
                           self.task["task_version"], seed)

    def step(self, action: str, idempotency_key: str | None = None, *, tokens: int = 0,
             cost_usd: float = 0.0) -> StepResult:
        if self.task is None or self.done:
            raise EnvError("step before reset or after the end")
        try:
            tool = json.loads(action)["tool"]
        except (ValueError, KeyError, TypeError):
            tool = None
        comps: dict[str, float] = {}
        status, terminated, reason = "OK", False, None
        if tool == "inc":
            self.count += 1
        elif tool == "dec":
            self.count -= 1
        elif tool == "submit":
            terminated = self.done = True
            comps = {"resolved": float(self.count == self.task["target"])}
            reason = "success" if comps["resolved"] else "submitted"
        else:
            status = "MODEL_INVALID_ACTION"
        spent = self.tracker.add(tokens, cost_usd)
        truncated = False
        if not terminated and spent is not None:
            truncated = self.done = True
            reason, comps = spent, {"resolved": float(self.count == self.task["target"])}
        return StepResult(f"count = {self.count}", comps, terminated, truncated, status, 0.0, self.state_hash(),
                          termination_reason=reason, tool=tool)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.env_id, self.env_version, self.state_hash(), (self.count, self.done))

    def restore(self, snapshot: Snapshot) -> None:
        self.count, self.done = snapshot.payload

    def close(self) -> None:
        pass


class CounterOracle(Policy):
    name = "oracle"
    needs_oracle = True

    def reset(self, task: TaskView, seed: int) -> None:
        assert task.oracle is not None
        self.left = int(task.oracle["target"])

    def act(self, observation: str) -> PolicyOutput:
        tool = "inc" if self.left > 0 else "submit"
        self.left -= 1
        return self.scripted_output(json.dumps({"tool": tool, "args": {}}))


class LazyPolicy(Policy):
    name = "lazy"

    def reset(self, task: TaskView, seed: int) -> None:
        pass

    def act(self, observation: str) -> PolicyOutput:
        return self.scripted_output(json.dumps({"tool": "submit", "args": {}}))
