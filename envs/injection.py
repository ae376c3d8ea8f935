"""What the prompt-injection suites of the built-in environments share: how an attacked variant is named after
its user task, how instructions are found in observation text, and how a gullible policy (the oracle that obeys
them) learns its user task's solution. Each environment's ``injection`` module has its goals and payloads."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trajlake.envs.policy import TaskView

VARIANT_MARK = "/inj/"
"""Between a user task's id and the attacker goal in the id of an attacked variant (``<task>/inj/<goal>``)."""

Instruction = tuple[str, dict[str, str]]
"""An instruction found in observation text: (goal, its parameters)."""


def variant_task_id(task_id: str, goal: str) -> str:
    """The id of the attacked variant of a task for one attacker goal."""
    return f"{task_id}{VARIANT_MARK}{goal}"


def base_task_id(task_id: str) -> str:
    """The user task an attacked variant was made from (a benign task's own id)."""
    return task_id.split(VARIANT_MARK, 1)[0]


def find_instructions(patterns: Mapping[str, re.Pattern[str]], text: str) -> list[Instruction]:
    """Instructions of the known goal kinds (``patterns``: goal -> its regex with named groups) in ``text``."""
    return [(goal, m.groupdict()) for goal, rx in patterns.items() for m in rx.finditer(text)]


def unseen(found: Iterable[Instruction], seen: set[tuple[str, tuple[tuple[str, str], ...]]]) -> list[Instruction]:
    """The instructions of ``found`` not met before; ``seen`` remembers them (a gullible policy obeys each once)."""
    out = []
    for goal, params in found:
        key = (goal, tuple(sorted(params.items())))
        if key not in seen:
            seen.add(key)
            out.append((goal, params))
    return out


def with_bundled_solution(task: TaskView, key: str, records: Callable[[], Iterable[Mapping[str, Any]]],
                          field: str) -> TaskView:
    """``task`` with its known solution (``oracle[key]``, from the ``field`` of the bundled record of its user task)
    when the caller passed none: a gullible policy is no oracle for the runner (its failures under attack are the
    point), yet it plays its user task's solution."""
    if task.oracle is not None and key in task.oracle:
        return task
    base = base_task_id(task.task_id)
    for record in records():
        if record["task_id"] == base:
            return TaskView(task.task_id, task.task_version, task.statement, task.tools, {key: record[field]})
    raise ValueError(f"the gullible policy plays bundled tasks only; {base!r} is not one")


__all__ = ["VARIANT_MARK", "Instruction", "base_task_id", "find_instructions", "unseen", "variant_task_id",
           "with_bundled_solution"]
