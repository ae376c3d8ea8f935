"""What the built-in environments (Mini SWE, Mini Web) share: a split of bundled task records, actions that are
JSON tool calls passing the permission gateway, per-task budgets, and attacked task variants (an injection
suite). ``ToolEnv`` holds the episode state they have in common; the functions parse actions, describe the
tools, clip observations and hash an environment's code."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trajlake.envs.core import Budget, BudgetTracker, Env, EnvError, Snapshot, SplitTasks, TrackedBudget
from trajlake.envs.gateway import Gateway
from trajlake.envs.memory import EpisodicMemory, MemoryConfig, memory_tool_docs
from trajlake.envs.policy import TaskView

MAX_OUTPUT_CHARS = 32_000
#: The envs-level modules a built-in environment runs on: part of its image digest with its own package.
SHARED_MODULES = ("core.py", "gateway.py", "injection.py", "memory.py", "taskset.py", "tool_env.py")


def code_digest(package: Path, *data: Path) -> str:
    """``sha256:`` hash of an environment's code and task data: the ``.py`` files of its ``package`` folder, the
    shared envs-level modules and the ``data`` files, each with its path below the envs folder."""
    files = sorted([*package.glob("*.py"), *(package.parent / n for n in SHARED_MODULES)]) + list(data)
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(package.parent)).encode() + b"\0" + p.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def parse_action(action: str) -> tuple[str, Any, str | None]:
    """(tool, args, problem) of an action ``{"tool": NAME, "args": {...}}``; ``problem`` says why it is not one
    (the tool is then ``<unparsed>``)."""
    try:
        obj = json.loads(action)
    except (ValueError, TypeError):
        return "<unparsed>", action if isinstance(action, str) else "", \
            "invalid action: expected a JSON object {\"tool\": NAME, \"args\": {...}}"
    if not isinstance(obj, dict) or not isinstance(obj.get("tool"), str):
        return "<unparsed>", {}, "invalid action: expected a JSON object with a string field \"tool\""
    try:  # JSON's "\ud800" decodes to a lone surrogate: no page, file or observation could hold it
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return "<unparsed>", {}, "invalid action: the action holds a lone surrogate (\\ud800-\\udfff), not text"
    return obj["tool"], obj.get("args", {}), None


def describe_tools(tool_docs: Mapping[str, Mapping[str, Any]]) -> str:
    """One line per tool, for the first observation: ``- name: description args: {...}``."""
    return "\n".join(f"- {n}: {d['description']} args: {json.dumps(d['args'])}" for n, d in tool_docs.items())


def clip(text: str) -> str:
    """An observation cut to ``MAX_OUTPUT_CHARS``, saying so."""
    return text if len(text) <= MAX_OUTPUT_CHARS else text[:MAX_OUTPUT_CHARS] + "\n... (output cut)"


def _as_budget(budget: Budget | Mapping[str, Any] | None, what: str) -> Budget | None:
    if not isinstance(budget, Mapping):
        return budget
    keys = [f.name for f in dataclasses.fields(Budget)]
    unknown = sorted(set(budget) - set(keys))
    if unknown:
        raise EnvError(f"{what}: budget: unknown key(s) {', '.join(unknown)}; expected {', '.join(keys)}")
    return Budget(**budget)


class ToolEnv(SplitTasks, TrackedBudget, Env):
    """The episode state and contract methods both built-in environments share. A subclass calls
    ``super().__init__`` with its task records, calls ``_begin_episode(task)`` in ``reset`` before building its
    gateway, and says what its oracle knows (``oracle_view``)."""

    task: dict[str, Any] | None
    gateway: Gateway | None
    injection_shown: bool
    """The injected payload reached an observation in this episode."""
    _taint: tuple[str, ...] = ()
    """Taint labels of the last observation (the gateway traces call arguments back to untrusted text)."""
    clock: Callable[[], float] = time.monotonic
    """The wall clock a budget's ``max_seconds`` reads (seconds, monotonic), from reset to the end of each step;
    a test sets its own on the instance instead of sleeping."""
    memory: EpisodicMemory
    """The episode's memory store (``envs/memory.py``): emptied at every reset; off unless the run turns it on."""
    listed_tool_docs: Mapping[str, Mapping[str, Any]]
    """The tools this instance lists to the policy (``task_view``, the first observation): the class's
    ``tool_docs``, plus the memory tools when memory is on (``tool_docs_for`` of the same arguments)."""

    def __init__(self, tasks: Sequence[Mapping[str, Any]], split: str | None, *, injection: str | None,
                 injected: Callable[[Sequence[Mapping[str, Any]], str], list[dict[str, Any]]],
                 budget: Budget | Mapping[str, Any] | None, what: str, memory: Any = None):
        """The records of ``split`` (the attacked variants ``injected`` makes under the attack ``injection``; ``what``
        names the environment in errors); ``budget`` overrides every task's own (a mapping, as ``--env-arg
        budget='{"max_steps": 10}'`` or a training config's ``env_args`` give it, is read as a :class:`Budget`);
        ``memory`` turns episodic memory on (``True`` or a mapping of :class:`MemoryConfig` fields)."""
        try:
            self.memory = EpisodicMemory(MemoryConfig.parse(memory))
            self.listed_tool_docs = self.memory.tool_docs(self.tool_docs)
        except EnvError as e:
            raise EnvError(f"{what}: {e}") from None
        self.index_tasks(injected(tasks, injection) if injection else tasks, split, what)
        self.injection = injection
        self.budget_override = _as_budget(budget, what)
        self.task = None
        self.gateway = None
        self.tracker = BudgetTracker(Budget())
        self.done = False
        self.injection_shown = False
        self.attack_success: bool | None = None
        self._taint = ()

    @property
    def injection_attempted(self) -> bool:
        """The injected payload reached an observation in this episode (``episodes.injection_attempted``)."""
        return self.injection_shown

    @classmethod
    def tool_docs_for(cls, env_kwargs: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
        """The class's tools, with the memory tools when ``env_kwargs`` turns memory on."""
        return memory_tool_docs(cls.tool_docs, env_kwargs.get("memory"))

    def task_view(self, task_id: str, task_version: str, *, oracle: bool = False) -> TaskView:
        """Statement and tools; what the oracle knows (``oracle_view``) only when ``oracle``."""
        t = self.task_for(0, task_version, task_id)
        return TaskView(task_id, task_version, t["statement"], self.listed_tool_docs,
                        self.oracle_view(t) if oracle else None)

    def oracle_view(self, task: Mapping[str, Any]) -> Mapping[str, Any]:
        """The known solution of a task record, as ``TaskView.oracle`` gives it to the oracle policy."""
        raise NotImplementedError

    def _begin_episode(self, task: dict[str, Any]) -> None:
        """Make ``task`` the current one, with its budgets (or the override) and no injection seen yet."""
        self.task = task
        self.tracker = BudgetTracker(self.budget_override or Budget.of_task(task), clock=self.clock)
        self.memory.clear()  # episodic: nothing written in an earlier episode (or run) on this instance survives
        self.done = False
        self.injection_shown = False
        # None on benign tasks; on an attacked variant False until the grader reads the executed effects
        self.attack_success = False if task.get("injection") else None
        self._taint = ()

    def _check_step(self) -> None:
        """Raise unless an episode is under way."""
        if self.task is None or self.gateway is None:
            raise EnvError("step before reset")
        if self.done:
            raise EnvError("the episode is over; call reset")

    def _check_snapshot(self, snapshot: Snapshot) -> None:
        """Raise unless this environment (and version) made ``snapshot``."""
        if snapshot.env_id != self.env_id or snapshot.env_version != self.env_version:
            raise EnvError("snapshot of another environment or version")

    def _check_restored(self, snapshot: Snapshot) -> None:
        """Raise unless the state after a restore is the snapshot's."""
        if self.state_hash() != snapshot.state_hash:
            raise EnvError("restore did not reproduce the snapshot's state hash")


__all__ = ["MAX_OUTPUT_CHARS", "SHARED_MODULES", "ToolEnv", "clip", "code_digest", "describe_tools",
           "parse_action"]
