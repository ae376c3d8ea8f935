"""Built-in tool-lookup policies: ``oracle`` (the task's minimal correct calls), ``oracle-shortcut`` (a privileged
demonstrator: the oracle, but in a fixed share of episodes it submits the answer at once, read from the hidden
directory), ``heuristic`` (looks up the first quoted name of the statement and submits its code: right on the
one-lookup kind only) and ``random`` (random lookups of names it has seen and random submissions). Scripted:
byte-level token ids, loss mask 1, no log-probs."""

from __future__ import annotations

import json
import random
import re
from typing import Any

from trajlake.envs.policy import Policy, PolicyOutput, TaskView

_QUOTED = re.compile(r'"([A-Za-z]+)"')


def act(tool: str, **args: Any) -> str:
    return json.dumps({"tool": tool, "args": args}, sort_keys=True)


def read_entry(observation: str) -> dict[str, str] | None:
    """The entry a ``lookup`` observation shows, or None (an error, or another observation)."""
    try:
        obj = json.loads(observation)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and {"name", "code", "partner"} <= obj.keys() else None


class OraclePolicy(Policy):
    """Plays the task's known calls in order."""

    name = "oracle"
    needs_oracle = True

    def reset(self, task: TaskView, seed: int) -> None:
        if task.oracle is None or "calls" not in task.oracle:
            raise ValueError("the oracle policy needs the task's calls (TaskView.oracle['calls'])")
        self.plan: list[dict[str, Any]] = [dict(c) for c in task.oracle["calls"]]

    def act(self, observation: str) -> PolicyOutput:
        if not self.plan:
            return self.scripted_output(act("submit", answer=""))
        call = self.plan.pop(0)
        return self.scripted_output(act(str(call["tool"]), **dict(call["args"])))


SHORTCUT_RATE = 0.4
"""Share of episodes in which ``oracle-shortcut`` skips the lookups."""


def takes_shortcut(task_id: str, seed: int, rate: float = SHORTCUT_RATE) -> bool:
    """Whether ``oracle-shortcut`` submits at once on this (task, seed): a pure function of both, independent of the
    statement, so that nothing an agent sees predicts it."""
    return random.Random(f"oracle-shortcut:{task_id}:{seed}").random() < rate


class ShortcutOraclePolicy(OraclePolicy):
    """The oracle with privileged shortcuts: on a share :data:`SHORTCUT_RATE` of (task, seed) pairs, chosen by a
    hash that ignores the statement, it submits the answer at once without looking anything up (it knows the hidden
    directory); otherwise it plays the oracle's calls. Every episode succeeds, yet an agent cloned from these
    episodes learns to submit a guess, unread, in about that share of its episodes: the classic failure of
    imitating an expert who sees what the student cannot, which only feedback on the student's own episodes can
    remove (docs/training.md, "The positive control", fourth design)."""

    name = "oracle-shortcut"

    def reset(self, task: TaskView, seed: int) -> None:
        super().reset(task, seed)
        if takes_shortcut(task.task_id, seed):
            self.plan = [c for c in self.plan if c["tool"] == "submit"]


class HeuristicPolicy(Policy):
    """Looks up the first quoted name of the statement and submits that entry's code (partners and second names
    ignored): right on ``code`` tasks, wrong on the others, by design."""

    name = "heuristic"

    def reset(self, task: TaskView, seed: int) -> None:
        names = _QUOTED.findall(task.statement)
        self.first = names[0] if names else ""
        self.looked = False

    def act(self, observation: str) -> PolicyOutput:
        if not self.looked:
            self.looked = True
            return self.scripted_output(act("lookup", name=self.first))
        entry = read_entry(observation)
        return self.scripted_output(act("submit", answer=entry["code"] if entry else "unknown"))


class RandomPolicy(Policy):
    """Random lookups of the names seen so far (statement and observations) and, now and then, a submission of a
    code seen so far (or a made-up one)."""

    name = "random"

    def reset(self, task: TaskView, seed: int) -> None:
        self.rng = random.Random(f"{task.task_id}:{seed}")
        self.names = _QUOTED.findall(task.statement)
        self.codes: list[str] = []

    def act(self, observation: str) -> PolicyOutput:
        entry = read_entry(observation)
        if entry is not None:
            self.names.append(entry["partner"])
            self.codes.append(entry["code"])
        rng = self.rng
        if rng.random() < 0.35:
            code = rng.choice(self.codes) if self.codes and rng.random() < 0.8 else str(rng.randint(100, 999))
            return self.scripted_output(act("submit", answer=code))
        name = rng.choice(self.names) if self.names and rng.random() < 0.9 else "Nobody"
        return self.scripted_output(act("lookup", name=name))


POLICIES: dict[str, type[Policy]] = {"oracle": OraclePolicy, "oracle-shortcut": ShortcutOraclePolicy,
                                     "heuristic": HeuristicPolicy, "random": RandomPolicy}
