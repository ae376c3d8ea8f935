"""Mini Web: a shop-and-tickets website served over HTTP on loopback, judged on its SQLite backend.

- :mod:`.data`: schema, seeded content, canonical dump (the state hash); :mod:`.app`: the site and its server;
- :mod:`.dom`: served HTML -> accessibility tree with element ids; :mod:`.env`: the environment;
- :mod:`.build`: the task set (``python -m trajlake.envs.mini_web.build [--check]``); :mod:`.grading`: success
  predicates and attacker goals; :mod:`.injection`: attacked task variants; :mod:`.underspecified`: task variants
  that leave out what only the user knows, and the simulated user who answers ``ask_user``; :mod:`.policies`:
  scripted policies.

Fields of a task record that must never reach the agent: ``oracle``, ``checks``, ``ledger``, ``answer``,
``vectors``, ``plant``, ``injection`` and ``intent`` (an underspecified variant's omitted detail: the agent learns
it only by asking). The agent sees ``statement``, the pages and the user's answers.
"""

from __future__ import annotations

from trajlake.envs.policy import TaskView

from .env import ENV_ID, ENV_VERSION, TOOL_DOCS, MiniWebEnv, task_row
from .grading import TASKS_PATH, load_tasks
from .policies import POLICIES

__all__ = ["ENV_ID", "ENV_VERSION", "POLICIES", "TASKS_PATH", "TOOL_DOCS", "MiniWebEnv", "load_tasks", "task_row",
           "task_view"]


def task_view(env: MiniWebEnv, task_id: str, task_version: str, oracle: bool = False) -> TaskView:
    """The policy's view of a task (``MiniWebEnv.task_view``): statement and tools; the solution steps only for
    the oracle (and gullible) policies."""
    return env.task_view(task_id, task_version, oracle=oracle)
