"""What the bundled task sets of the built-in environments share: splits by family, content versions, the
``tasks`` table row of a record, and the report of their ``build`` modules (``python -m ... build [--check]``)."""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: The share of template families each split gets, in per cent (train, dev, hidden).
SPLIT_WEIGHTS: tuple[tuple[str, int], ...] = (("train", 60), ("dev", 20), ("hidden", 20))


def split_for_family(family: str, salt: str, weights: Sequence[tuple[str, int]] = SPLIT_WEIGHTS) -> str:
    """Split of a template family: a salted sha256 bucket out of 100, cut by ``weights``. A family never crosses
    splits, and adding families never moves existing ones."""
    bucket = int(hashlib.sha256(f"{salt}:{family}".encode()).hexdigest(), 16) % 100
    for split, weight in weights:
        if bucket < weight:
            return split
        bucket -= weight
    return weights[-1][0]


def content_version(record: Mapping[str, Any], unversioned: Sequence[str] = ("task_version",), *,
                    ensure_ascii: bool = True) -> str:
    """First 16 hex chars of sha256 over the canonical JSON (sorted keys, no whitespace) of ``record`` without the
    keys ``unversioned``: a task version that changes exactly when the task's content does."""
    body = {k: v for k, v in record.items() if k not in unversioned}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=ensure_ascii, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def task_row(task: Mapping[str, Any], env_id: str, *, created_at: dt.datetime,
             provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tasks`` table row of a task record: its public fields with the environment's reading of its
    creation date and provenance (the solution, checks and hidden tests stay out of the lake)."""
    return {
        "task_id": task["task_id"], "task_version": task["task_version"], "env_id": env_id, "split": task["split"],
        "family": task["family"], "difficulty": task.get("difficulty"), "created_at": created_at,
        "statement": task["statement"], "provenance": dict(provenance),
        "has_oracle": bool(task.get("has_oracle", True)),
        "budget": {k: task["budget"].get(k) for k in ("max_steps", "max_tokens", "max_cost")},
    }


def build_arguments(module: str, doc: str | None, tasks_path: Path, check_help: str) -> argparse.ArgumentParser:
    """The command line of a ``build`` module (``python -m MODULE``): its docstring as help, ``--out`` (the tasks
    file to write, or to check) and ``--check`` (``check_help`` says how it checks)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=tasks_path, help="tasks file to write (or check)")
    parser.add_argument("--check", action="store_true", help=check_help)
    return parser


def report_check(path: Path, problems: Sequence[str]) -> int:
    """Print the problems a ``--check`` found and its verdict; the exit code (1 when any)."""
    for line in problems:
        print(f"MISMATCH {line}")
    print(f"checked {path}: {'FAILED, ' + str(len(problems)) + ' problem(s)' if problems else 'ok'}")
    return 1 if problems else 0


def report_build(tasks: list[dict[str, Any]], path: Path, write: Callable[[list[dict[str, Any]], Path], Any],
                 summary: Callable[[Sequence[dict[str, Any]]], str],
                 weights: Sequence[tuple[str, int]] = SPLIT_WEIGHTS) -> int:
    """Write a freshly built task set to ``path``, warning about empty splits; the exit code."""
    empty = [s for s, _ in weights if not any(t["split"] == s for t in tasks)]
    if empty:
        print(f"warning: no tasks in split(s) {empty}", file=sys.stderr)
    write(tasks, path)
    print(f"wrote {path}: {summary(tasks)}")
    return 0


__all__ = ["SPLIT_WEIGHTS", "build_arguments", "content_version", "report_build", "report_check", "split_for_family", "task_row"]
