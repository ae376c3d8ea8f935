"""The Mini SWE environment: fix a seeded bug in a small library; hidden tests grade the result.

Actions are JSON objects ``{"tool": NAME, "args": {...}}``. Tools (every call passes the permission gateway):

- ``list_files {}``: the workspace's files;
- ``read_file {"path"}``: a file with line numbers;
- ``search {"pattern", "path"?}``: lines containing a fixed string;
- ``edit {"path", "old", "new"}``: replace the one occurrence of ``old`` by ``new``;
- ``run_tests {"command"}``: run the *visible* tests, e.g. ``"pytest -q"`` (only ``pytest`` may run);
- ``submit {}``: end the episode; the hidden tests grade the workspace (SWE-bench rules).

The state hash covers the workspace's files and whether the episode was submitted; observations carry no
timings, so a replay under pinned versions reproduces every state hash.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from trajlake.envs.core import (
    Budget,
    BudgetTracker,
    Env,
    EnvError,
    Requirement,
    ResetResult,
    Snapshot,
    StepResult,
    stable_hash,
)
from trajlake.envs.gateway import Gateway, Permissions, ToolSpec
from trajlake.envs.mini_swe.grading import TASKS_PATH, GradeResult, grade, load_tasks, materialize_workspace
from trajlake.envs.mini_swe.sandbox import pytest_requirement, resolve_sandbox, run_pytest
from trajlake.envs.policy import Policy, TaskView

ENV_ID = "mini-swe"
ENV_VERSION = "1.0"
TASKS_CREATED_AT = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)
MAX_READ_LINES = 400
MAX_OUTPUT_CHARS = 32_000
_IGNORED = {"__pycache__", ".pytest_cache"}
UNTRUSTED = "untrusted_tool_output"

TOOL_DOCS: dict[str, dict[str, Any]] = {
    "list_files": {"description": "List the workspace's files.", "args": {}},
    "read_file": {"description": "Show a file with line numbers.", "args": {"path": "relative path"}},
    "search": {"description": "Lines containing a fixed string.", "args": {"pattern": "text", "path": "dir or file"}},
    "edit": {"description": "Replace the single occurrence of `old` by `new` in a file.",
             "args": {"path": "relative path", "old": "exact text", "new": "replacement"}},
    "run_tests": {"description": "Run the visible tests.", "args": {"command": "e.g. 'pytest -q'"}},
    "submit": {"description": "Finish; hidden tests grade the workspace.", "args": {}},
}


@cache
def _code_digest() -> str:
    """Hash of this environment's code and task data (the image digest written to every episode)."""
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    files = sorted([*here.glob("*.py"), TASKS_PATH, *(here.parent / n for n in ("core.py", "gateway.py"))])
    files += sorted(p for p in (here / "libraries").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for p in files:
        h.update(str(p.relative_to(here.parent)).encode() + b"\0" + p.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


class MiniSWEEnv(Env):
    """Mini SWE over the bundled tasks of one split (or all). Not thread-safe; one episode at a time."""

    env_id = ENV_ID
    env_version = ENV_VERSION
    verification_source = "hidden_tests"

    def __init__(self, split: str | None = None, *, tasks: Sequence[Mapping[str, Any]] | None = None,
                 workdir: str | os.PathLike[str] | None = None, sandbox: str = "auto",
                 budget: Budget | None = None, test_timeout_s: float = 60.0):
        all_tasks = [dict(t) for t in (tasks if tasks is not None else load_tasks())]
        self.tasks = sorted((t for t in all_tasks if split is None or t["split"] == split),
                                 key=lambda t: t["task_id"])
        if not self.tasks:
            raise EnvError(f"no Mini SWE tasks in split {split!r}")
        self.by_id: dict[str, list[dict[str, Any]]] = {}
        for t in self.tasks:
            self.by_id.setdefault(t["task_id"], []).append(t)
        self.split = split
        self.sandbox = sandbox
        self.sandbox_kind: str | None = None
        self.budget_override = budget
        self.test_timeout_s = test_timeout_s
        self._workdir = Path(workdir) if workdir else None
        self._ws: Path | None = None
        self.task: dict[str, Any] | None = None
        self.gateway: Gateway | None = None
        self.tracker = BudgetTracker(Budget())
        self.submitted = False
        self.done = False
        self.grade_result: GradeResult | None = None
        self._taint: tuple[str, ...] = ()

    # -- contract ----------------------------------------------------------------------------------------------
    @property
    def image_digest(self) -> str:
        return _code_digest()

    def list_tasks(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self.tasks]

    def task_row(self, task: Mapping[str, Any]) -> dict[str, Any]:
        return task_row(task)

    def task_view(self, task_id: str, task_version: str, *, oracle: bool = False) -> TaskView:
        t = self.task_for(0, task_version, task_id)
        secret: Mapping[str, Any] | None = {"fix_diff": t["fix_diff"]} if oracle else None
        return TaskView(task_id, task_version, t["statement"], TOOL_DOCS, secret)

    @classmethod
    def policies(cls) -> Mapping[str, Callable[[str], Policy]]:
        from trajlake.envs.mini_swe.policies import POLICIES

        return POLICIES

    def requirements(self) -> list[Requirement]:
        """Grading runs the hidden tests with ``python -m pytest`` in a sandbox: both must be there."""
        out: list[Requirement] = []
        try:
            kind = resolve_sandbox(self.sandbox)
            note = ("bubblewrap: no network, read-only system" if kind == "bwrap" else
                    "rlimit fallback: resource limits only, no filesystem or network isolation "
                    "(install bubblewrap for isolation)")
            out.append(Requirement("sandbox", True, f"{kind} ({note})"))
        except Exception as e:  # an explicit sandbox="bwrap" without a working bwrap
            out.append(Requirement("sandbox", False, str(e), "apt-get install bubblewrap, or use sandbox='auto'"))
        out.append(pytest_requirement())
        return out

    def task_for(self, seed: int, task_version: str | None = None, task_id: str | None = None) -> dict[str, Any]:
        if task_id is None:
            task = self.tasks[seed % len(self.tasks)]
            if task_version is not None and task["task_version"] != task_version:
                raise EnvError(f"seed {seed} picks {task['task_id']} at version {task['task_version']}, "
                               f"not {task_version}")
            return task
        versions = self.by_id.get(task_id)
        if not versions:
            raise EnvError(f"unknown task {task_id!r} (split {self.split!r})")
        if task_version is None:
            return versions[-1]
        for t in versions:
            if t["task_version"] == task_version:
                return t
        raise EnvError(f"task {task_id!r} has no version {task_version!r}; pinned replays need that version")

    def reset(self, seed: int, task_version: str | None = None, *, task_id: str | None = None) -> ResetResult:
        self._cleanup()
        task = self.task_for(seed, task_version, task_id)
        base = self._workdir
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        self._ws = Path(tempfile.mkdtemp(prefix="mini-swe-", dir=base))
        materialize_workspace(task, self._ws / "repo")
        self.task = task
        b = task.get("budget") or {}
        self.tracker = BudgetTracker(self.budget_override or Budget(b.get("max_steps"), b.get("max_tokens"),
                                                                    b.get("max_cost")))
        self.submitted = self.done = False
        self.grade_result = None
        self._taint = ()
        self.gateway = Gateway(self.workspace, Permissions(
            capabilities=frozenset({"read", "write", "exec"}), exec_allowlist=frozenset({"pytest"}),
            irreversible_budget=1), self._tools(), self.state_hash)
        obs = self._intro(task)
        return ResetResult(episode_id=str(uuid.uuid4()), observation=obs, state_hash=self.state_hash(),
                           task_id=task["task_id"], task_version=task["task_version"], seed=seed)

    def step(self, action: str, idempotency_key: str | None = None, *, tokens: int = 0,
             cost_usd: float = 0.0) -> StepResult:
        if self.task is None or self.gateway is None:
            raise EnvError("step before reset")
        if self.done:
            raise EnvError("the episode is over; call reset")
        tool, args, problem = _parse(action)
        t0 = time.perf_counter()
        res = self.gateway.call(tool, args, idempotency_key=idempotency_key, taint=self._taint)
        tool_seconds = time.perf_counter() - t0  # the tool's own time: the sandboxed test runs dominate it
        obs = res.output if problem is None else f"{problem}\n{res.output}"
        status = res.status if problem is None else "MODEL_INVALID_ACTION"
        comps: dict[str, float] = {}
        terminated = truncated = False
        reason: str | None = None
        if tool == "submit" and res.executed and self.grade_result is not None:
            terminated, comps = True, self._rewards()
            reason = "success" if self.grade_result.resolved else "submitted"
        spent = self.tracker.add(tokens, cost_usd)
        if not terminated and spent is not None:
            truncated, reason = True, spent
            comps = self._final_grade()
            obs += f"\nThe {spent.removeprefix('budget_')} budget is spent: the episode ends here."
            if status == "OK":
                status = "BUDGET_EXHAUSTED"
        self.done = terminated or truncated
        self._taint = (UNTRUSTED,) if res.executed else ()
        return StepResult(observation=_clip(obs), reward_components=comps, terminated=terminated,
                          truncated=truncated, status=status, cost_usd=0.0, state_hash=self.state_hash(),
                          termination_reason=reason, tool=tool or None,
                          tool_seconds=tool_seconds, gateway_events=(res.event,), taint=self._taint)

    def count_external_step(self, tokens: int, cost_usd: float) -> StepResult | None:
        """Count a step that never reached the environment (an injected fault) against the budgets; when
        that spends a budget the episode is truncated and graded, and the final result is returned."""
        if self.done:
            return None
        spent = self.tracker.add(tokens, cost_usd)
        if spent is None:
            return None
        comps = self._final_grade()
        self.done = True
        return StepResult(observation=f"The {spent.removeprefix('budget_')} budget is spent.", reward_components=comps,
                          terminated=False, truncated=True, status="BUDGET_EXHAUSTED", cost_usd=0.0,
                          state_hash=self.state_hash(), termination_reason=spent)

    def snapshot(self) -> Snapshot:
        if self.task is None or self.gateway is None:
            raise EnvError("snapshot before reset")
        files = {rel: (self.workspace / rel).read_bytes() for rel in self._files()}
        payload = (files, self.submitted, self.done, self.grade_result, self._taint, self.tracker.state(),
                   self.gateway.export_state(), self.task["task_id"], self.task["task_version"])
        return Snapshot(self.env_id, self.env_version, self.state_hash(), payload)

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.env_id != self.env_id or snapshot.env_version != self.env_version:
            raise EnvError("snapshot of another environment or version")
        files, submitted, done, grade_result, taint, tracker, gw_state, task_id, task_version = snapshot.payload
        if self.task is None or (self.task["task_id"], self.task["task_version"]) != (task_id, task_version):
            raise EnvError("restore needs the environment reset on the snapshot's task")
        assert self.gateway is not None
        for rel in self._files():
            if rel not in files:
                (self.workspace / rel).unlink()
        for rel, data in files.items():
            p = self.workspace / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if not p.exists() or p.read_bytes() != data:
                p.write_bytes(data)
        self.submitted, self.done, self.grade_result, self._taint = submitted, done, grade_result, taint
        self.tracker.set_state(tracker)
        self.gateway.import_state(gw_state)
        if self.state_hash() != snapshot.state_hash:
            raise EnvError("restore did not reproduce the snapshot's state hash")

    def close(self) -> None:
        self._cleanup()

    # -- state -------------------------------------------------------------------------------------------------
    @property
    def workspace(self) -> Path:
        if self._ws is None:
            raise EnvError("no workspace: call reset")
        return self._ws / "repo"

    def _files(self) -> list[str]:
        out = []
        for root, dirs, names in os.walk(self.workspace):
            dirs[:] = sorted(d for d in dirs if d not in _IGNORED)
            for n in sorted(names):
                if n.endswith(".pyc"):
                    continue
                out.append(os.path.relpath(os.path.join(root, n), self.workspace))
        return sorted(out)

    def state_hash(self) -> str:
        files = {rel: hashlib.sha256((self.workspace / rel).read_bytes()).hexdigest() for rel in self._files()}
        return stable_hash({"files": files, "submitted": self.submitted})

    def _cleanup(self) -> None:
        if self._ws is not None:
            shutil.rmtree(self._ws, ignore_errors=True)
            self._ws = None

    # -- tools -------------------------------------------------------------------------------------------------
    def _tools(self) -> list[ToolSpec]:
        s = {"type": "string", "maxLength": 20_000}
        return [
            ToolSpec("list_files", "read", "read", {"type": "object", "properties": {}, "additionalProperties": False},
                     self._list_files),
            ToolSpec("read_file", "read", "read", {"type": "object", "properties": {"path": s}, "required": ["path"],
                                                   "additionalProperties": False}, self._read_file, path_args=("path",)),
            ToolSpec("search", "read", "read", {"type": "object", "properties": {"pattern": {"type": "string",
                                                                                          "maxLength": 200}, "path": s},
                                                "required": ["pattern"], "additionalProperties": False}, self._search,
                     path_args=("path",)),
            ToolSpec("edit", "write", "write", {"type": "object", "properties": {"path": s, "old": s, "new": s},
                                                "required": ["path", "old", "new"], "additionalProperties": False},
                     self._edit, path_args=("path",)),
            ToolSpec("run_tests", "exec", "read", {"type": "object", "properties": {"command": {
                "type": "string", "maxLength": 500}}, "required": ["command"], "additionalProperties": False},
                     self._run_tests, exec_arg="command"),
            ToolSpec("submit", "write", "irreversible", {"type": "object", "properties": {},
                                                         "additionalProperties": False}, self._submit),
        ]

    def _list_files(self, args: dict[str, Any]) -> str:
        return "\n".join(self._files())

    def _read_file(self, args: dict[str, Any]) -> str:
        p = self.workspace / args["path"]
        if not p.is_file():
            return f"error: no such file: {args['path']}"
        lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
        shown = [f"{i:>5}| {line}" for i, line in enumerate(lines[:MAX_READ_LINES], start=1)]
        if len(lines) > MAX_READ_LINES:
            shown.append(f"... ({len(lines) - MAX_READ_LINES} more lines)")
        return "\n".join(shown)

    def _search(self, args: dict[str, Any]) -> str:
        base = self.workspace / args.get("path", ".")
        pattern = args["pattern"]
        hits = []
        targets = [base] if base.is_file() else [self.workspace / r for r in self._files()
                                                 if (self.workspace / r).is_relative_to(base)]
        for p in targets:
            try:
                text = p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            for i, line in enumerate(text.splitlines(), start=1):
                if pattern in line:
                    hits.append(f"{p.relative_to(self.workspace)}:{i}: {line}")
        return "\n".join(hits[:200]) if hits else "no matches"

    def _edit(self, args: dict[str, Any]) -> str:
        p = self.workspace / args["path"]
        if not p.is_file():
            return f"error: no such file: {args['path']}"
        text = p.read_text(encoding="utf-8")
        n = text.count(args["old"]) if args["old"] else 0
        if n != 1:
            return f"error: `old` occurs {n} times in {args['path']}; it must occur exactly once"
        p.write_text(text.replace(args["old"], args["new"], 1), encoding="utf-8")
        return f"edited {args['path']}"

    def _run_tests(self, args: dict[str, Any]) -> str:
        argv: list[str] = args["command"]
        extra = [a for a in argv[1:] if a not in ("-q", "-x", "-v")]
        run = run_pytest(self.workspace, timeout_s=self.test_timeout_s, sandbox=self.sandbox, pytest_args=tuple(extra))
        self.sandbox_kind = run.sandbox
        return _summarise(run.outcomes, run.exit_code, run.timed_out, run.collect_errors)

    def _submit(self, args: dict[str, Any]) -> str:
        assert self.task is not None
        self.grade_result = grade(self.workspace, self.task, timeout_s=self.test_timeout_s, sandbox=self.sandbox)
        self.sandbox_kind = self.grade_result.sandbox
        self.submitted = True
        g = self.grade_result
        if g.error:
            return f"submitted; grading failed: {g.error.splitlines()[0] if g.error else ''}"
        return f"submitted; resolved: {'yes' if g.resolved else 'no'}"

    def _rewards(self) -> dict[str, float]:
        g = self.grade_result
        if g is None:
            return {"resolved": 0.0, "partial": 0.0}
        return {"resolved": 1.0 if g.resolved else 0.0, "partial": float(g.partial)}

    def _final_grade(self) -> dict[str, float]:
        """Hidden tests also run when an episode ends without a submit (budget): the workspace is graded."""
        assert self.task is not None
        self.grade_result = grade(self.workspace, self.task, timeout_s=self.test_timeout_s, sandbox=self.sandbox)
        self.sandbox_kind = self.grade_result.sandbox
        return self._rewards()

    def _intro(self, task: Mapping[str, Any]) -> str:
        tools = "\n".join(f"- {n}: {d['description']} args: {json.dumps(d['args'])}" for n, d in TOOL_DOCS.items())
        return (f"{task['statement']}\n\nWorkspace files:\n" + "\n".join(self._files()) +
                f"\n\nAct with one JSON object per turn: {{\"tool\": NAME, \"args\": {{...}}}}. Tools:\n{tools}")


def _parse(action: str) -> tuple[str, Any, str | None]:
    try:
        obj = json.loads(action)
    except (ValueError, TypeError):
        return "<unparsed>", action if isinstance(action, str) else "", \
            "invalid action: expected a JSON object {\"tool\": NAME, \"args\": {...}}"
    if not isinstance(obj, dict) or not isinstance(obj.get("tool"), str):
        return "<unparsed>", {}, "invalid action: expected a JSON object with a string field \"tool\""
    return obj["tool"], obj.get("args", {}), None


def _summarise(outcomes: Mapping[str, str], exit_code: int | None, timed_out: bool,
               collect_errors: Sequence[str] = ()) -> str:
    if timed_out:
        return "tests timed out"
    if collect_errors:
        return "test collection failed:\n" + "\n".join(e.splitlines()[-1] if e else "" for e in collect_errors[:5])
    passed = sorted(k for k, v in outcomes.items() if v in ("passed", "xfailed"))
    failed = sorted(k for k, v in outcomes.items() if v not in ("passed", "xfailed", "skipped"))
    lines = [f"{len(passed)} passed, {len(failed)} failed (exit code {exit_code})"]
    lines += [f"FAILED {k}" for k in failed[:50]]
    return "\n".join(lines)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_OUTPUT_CHARS else text[:MAX_OUTPUT_CHARS] + "\n... (output cut)"


def task_row(task: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tasks`` table row of a Mini SWE task (hidden tests and fixes stay out of the lake's task table)."""
    prov = task["provenance"]
    return {
        "task_id": task["task_id"], "task_version": task["task_version"], "env_id": ENV_ID, "split": task["split"],
        "family": task["family"], "difficulty": task.get("difficulty"), "created_at": TASKS_CREATED_AT,
        "statement": task["statement"],
        "provenance": {k: prov.get(k) for k in ("generator", "source", "commit", "mutator", "seed", "diff_hash")},
        "has_oracle": bool(task.get("has_oracle", True)),
        "budget": {k: task["budget"].get(k) for k in ("max_steps", "max_tokens", "max_cost")},
    }
