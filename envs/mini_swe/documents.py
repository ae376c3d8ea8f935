"""The evaluation documents of Mini SWE tasks (``MiniSWEEnv.evaluation_documents``): what the contamination
scan compares with the training side beside each statement. They come from the bundled task file and
libraries."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from trajlake.envs.core import EvalDocument
from trajlake.envs.mini_swe.grading import load_tasks
from trajlake.envs.mini_swe.library import find_test_functions, function_key, load_library


def _added_lines(diff: str) -> str:
    return "\n".join(line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))


@functools.cache
def _bundled_records() -> dict[str, dict[str, Any]]:
    return {t["task_id"]: t for t in load_tasks()}


@functools.cache
def _test_bodies(library: str) -> dict[str, str]:
    """``path::name`` -> source of each test function of a Mini SWE library."""
    lib = load_library(library)
    out: dict[str, str] = {}
    for rel in lib.test_files():
        lines = lib.read(rel).splitlines()
        for key, (lo, hi) in find_test_functions(lib.read(rel), rel).items():
            out[key] = "\n".join(lines[lo - 1:hi])
    return out


def evaluation_documents(task_ids: Sequence[str]) -> list[EvalDocument]:
    """Gold patch (the fix's added lines), hidden test names and hidden test bodies of Mini SWE tasks (the
    statement comes from the ``tasks`` table). Tasks not in the bundled task file contribute nothing."""
    records = _bundled_records()
    docs: list[EvalDocument] = []
    for tid in task_ids:
        rec = records.get(tid)
        if rec is None:
            continue
        if rec.get("fix_diff"):
            docs.append(EvalDocument(tid, "gold_patch", _added_lines(rec["fix_diff"]), code=True))
        visible = set(rec.get("visible_tests") or ())
        hidden = sorted(t for t in [*rec.get("FAIL_TO_PASS", ()), *rec.get("PASS_TO_PASS", ())] if t not in visible)
        if hidden:
            docs.append(EvalDocument(tid, "hidden_test_names", "\n".join(hidden), code=True))
            bodies = _test_bodies(rec["library"])
            keys = dict.fromkeys(function_key(t) for t in hidden)
            text = "\n\n".join(bodies[k] for k in keys if k in bodies)
            if text:
                docs.append(EvalDocument(tid, "hidden_tests", text, code=True))
    return docs
