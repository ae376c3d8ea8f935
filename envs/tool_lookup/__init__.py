"""tool-lookup: a positive-control environment in which the agent must call a tool and read its answer.

- :mod:`.tasks`: the task set, generated from (family, seed) (hidden directories of made-up names, statements,
  answers, the oracle's calls; splits by template family);
- :mod:`.env`: the environment (``lookup`` and ``submit`` through the gateway, the ``directory_busy`` fault);
- :mod:`.policies`: scripted policies (``oracle``, ``heuristic``, ``random``).

Fields of a task record that must never reach the agent: ``directory``, ``answer`` and ``plan``. The agent sees
``statement`` and the lookups' answers. docs/tool_lookup.md describes the design.
"""

from __future__ import annotations

from .env import ENV_VERSION, TOOL_DOCS, ToolLookupEnv
from .policies import POLICIES
from .tasks import ENV_ID, load_tasks, make_task

__all__ = ["ENV_ID", "ENV_VERSION", "POLICIES", "TOOL_DOCS", "ToolLookupEnv", "load_tasks", "make_task"]
