"""Mini SWE: a small SWE-bench-like coding environment built from seeded mutations of bundled libraries.

- ``libraries/``: five small pure-Python libraries with pytest suites (data, not packages).
- :mod:`.mutate`: seeded AST mutators; :mod:`.patching`: unified diffs.
- :mod:`.build`: builds and checks ``tasks.json`` (``python -m trajlake.envs.mini_swe.build [--check]``).
- :mod:`.grading`: agent workspaces, the oracle fix and sandboxed SWE-bench style grading.

Fields of a task record that must never reach the agent: ``mutation``, ``mutation_diff``, ``fix_diff``,
``FAIL_TO_PASS`` and ``PASS_TO_PASS``. The agent sees ``statement`` and the workspace built by
:func:`materialize_workspace` (library source with the bug, visible tests only).
"""

from __future__ import annotations

from .grading import (
    TASKS_PATH,
    GradeResult,
    apply_fix,
    apply_mutation,
    grade,
    load_tasks,
    materialize_workspace,
)

ENV_ID = "mini-swe"

__all__ = [
    "ENV_ID",
    "TASKS_PATH",
    "GradeResult",
    "apply_fix",
    "apply_mutation",
    "grade",
    "load_tasks",
    "materialize_workspace",
]
