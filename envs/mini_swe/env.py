"""The Mini SWE environment: fix a seeded bug in a small library; hidden tests grade the result.

Actions are JSON objects ``{"tool": NAME, "args": {...}}``. Tools (every call passes the permission gateway):

- ``list_files {}``: the workspace's files;
- ``read_file {"path"}``: a file with line numbers;
- ``search {"pattern", "path"?}``: lines containing a fixed string;
- ``edit {"path", "old", "new"}``: replace the one occurrence of ``old`` by ``new``;
- ``run_tests {"command"}``: run the *visible* tests, e.g. ``"pytest -q"`` (only ``pytest`` may run);
- ``submit {}``: end the episode; the hidden tests grade the workspace (SWE-bench rules).

With ``memory`` on, the episodic memory tools too (``memory_write``, ``memory_read``, ``memory_list``;
:mod:`trajlake.envs.memory`).

The state hash covers the workspace's files and whether the episode was submitted (and the memory's notes, when
it holds any); observations carry no timings, so a replay under pinned versions reproduces every state hash.

Code the agent writes runs inside :mod:`.sandbox`; the environment's own file access never follows a
symlink out of the workspace and never opens a FIFO, socket or device the agent's code left behind (the
tools, the state hash, snapshots and ``restore`` look at entries with ``lstat`` first). Without a working
bubblewrap the environment refuses to start unless the caller opts in with ``allow_unisolated=True`` (or
``TRAJLAKE_ALLOW_UNISOLATED=1``); the isolation each episode had is in :attr:`MiniSWEEnv.sandbox_kind`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from trajlake.envs import taskset
from trajlake.envs.core import (
    Budget,
    EnvError,
    EvalDocument,
    Requirement,
    ResetResult,
    Snapshot,
    StepResult,
    spent_notice,
    stable_hash,
)
from trajlake.envs.gateway import Gateway, Permissions, ToolSpec
from trajlake.envs.mini_swe.documents import evaluation_documents
from trajlake.envs.mini_swe.grading import TASKS_PATH, GradeResult, grade, load_tasks, materialize_workspace
from trajlake.envs.mini_swe.injection import ATTACKS, INJECTION_MARK, attack_achieved, injected_tasks, plant
from trajlake.envs.mini_swe.patching import replace_once
from trajlake.envs.mini_swe.sandbox import pytest_requirement, resolve_sandbox, run_pytest
from trajlake.envs.policy import Policy
from trajlake.envs.tool_env import ToolEnv, clip, code_digest, describe_tools, parse_action
from trajlake.schemas.vocab import Capability, FaultKind, Status, TerminationReason

ENV_ID = "mini-swe"
ENV_VERSION = "1.1"  # 1.1: the give_up tool (the intro lists it)
TASKS_CREATED_AT = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)
MAX_READ_LINES = 400
MAX_FILE_BYTES = 4 * 1024**2  # the tools never read more than this from one file
UNISOLATED_ENV = "TRAJLAKE_ALLOW_UNISOLATED"
# run_tests accepts these options and test paths (node ids) inside the workspace, nothing else: options
# such as -o, -c, -p, --rootdir or --junitxml would let the agent reconfigure pytest or write elsewhere.
RUN_TESTS_FLAGS = frozenset({"-q", "-qq", "-v", "-vv", "-x", "-l", "-rA", "-ra", "--tb=short", "--tb=long",
                             "--tb=line", "--tb=no", "--tb=native", "--exitfirst", "--quiet", "--verbose"})
RUN_TESTS_VALUE_FLAGS = frozenset({"-k", "--maxfail"})
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
    "give_up": {"description": "Stop without submitting (the task is not solved; nothing is graded).", "args": {}},
}


@cache
def _code_digest() -> str:
    """Hash of this environment's code and task data (the image digest written to every episode)."""
    here = Path(__file__).resolve().parent
    return code_digest(here, TASKS_PATH, *sorted(p for p in (here / "libraries").rglob("*")
                                                 if p.is_file() and "__pycache__" not in p.parts))


class MiniSWEEnv(ToolEnv):
    """Mini SWE over the bundled tasks of one split (or all). Not thread-safe; one episode at a time.

    ``injection``: an attack name (``important_instructions`` or ``tool_knowledge``) to play the attacked
    variants of the tasks (:mod:`.injection`) instead of the benign set. ``protected_paths``: globs the gateway
    keeps every path argument away from (e.g. ``("tests", ".env")``: a defence against the injection goals).
    ``memory``: episodic memory tools (``True`` or a mapping of limits; :mod:`trajlake.envs.memory`)."""

    env_id = ENV_ID
    env_version = ENV_VERSION
    tool_docs = TOOL_DOCS
    verification_source = "hidden_tests"
    injection_attacks = ATTACKS
    fault_kinds = (FaultKind.FLAKY_TEST_RUN,)
    _taint: tuple[str, ...]  # ToolEnv's, declared again for mypy (it reads trajlake.envs imports as untyped)

    def __init__(self, split: str | None = None, *, tasks: Sequence[Mapping[str, Any]] | None = None,
                 workdir: str | os.PathLike[str] | None = None, sandbox: str = "auto",
                 budget: Budget | Mapping[str, Any] | None = None, test_timeout_s: float = 60.0,
                 allow_unisolated: bool | None = None, injection: str | None = None,
                 protected_paths: Sequence[str] = (), memory: Any = None):
        super().__init__(tasks if tasks is not None else load_tasks(), split, injection=injection,
                         injected=injected_tasks, budget=budget, what="Mini SWE", memory=memory)
        if isinstance(protected_paths, str):
            protected_paths = [p for p in protected_paths.split(",") if p]  # --env-arg protected_paths=tests,.env
        self.protected_paths = tuple(protected_paths)
        self.sandbox = sandbox
        self.sandbox_kind: str | None = None  # Env.sandbox_kind: bwrap or rlimit, decided at each reset
        self.allow_unisolated = (os.environ.get(UNISOLATED_ENV, "") in ("1", "true", "yes")
                                 if allow_unisolated is None else bool(allow_unisolated))
        self.test_timeout_s = test_timeout_s
        self._workdir = Path(workdir) if workdir else None
        self._ws: Path | None = None
        self.submitted = False
        self.gave_up = False
        self.grade_result: GradeResult | None = None
        self._executed_args: list[str] = []
        self._originals: dict[str, bytes] = {}

    # -- contract ----------------------------------------------------------------------------------------------
    @property
    def image_digest(self) -> str:
        return _code_digest()

    def task_row(self, task: Mapping[str, Any]) -> dict[str, Any]:
        return task_row(task)

    def oracle_view(self, task: Mapping[str, Any]) -> Mapping[str, Any]:
        """The known fix."""
        return {"fix_diff": task["fix_diff"]}

    @classmethod
    def policies(cls) -> Mapping[str, Callable[[str], Policy]]:
        from trajlake.envs.mini_swe.policies import POLICIES

        return POLICIES

    @classmethod
    def evaluation_documents(cls, task_ids: Sequence[str]) -> list[EvalDocument]:
        """Gold patch, hidden test names and hidden test bodies of the bundled tasks among ``task_ids``."""
        return evaluation_documents(task_ids)

    def requirements(self) -> list[Requirement]:
        """Grading runs the hidden tests with ``python -m pytest`` in a sandbox: both must be there."""
        out: list[Requirement] = []
        try:
            kind = resolve_sandbox(self.sandbox)
            if kind == "bwrap":
                out.append(Requirement("sandbox", True, "bwrap (unprivileged user namespace, no capabilities, no "
                                       "network; only the workspace, Python and pytest are mounted)"))
            else:
                allowed = " (allowed by allow_unisolated)" if self.allow_unisolated else ""
                out.append(Requirement(
                    "sandbox", self.allow_unisolated, "rlimit fallback: resource limits only; agent code can read "
                    f"the hidden tests, the lake and $HOME and reach the network{allowed}",
                    "install bubblewrap (apt-get install bubblewrap), or opt in with --allow-unisolated"))
        except Exception as e:  # an explicit sandbox="bwrap" without a working bwrap
            out.append(Requirement("sandbox", False, str(e), "apt-get install bubblewrap, or use sandbox='auto'"))
        out.append(pytest_requirement())
        return out

    def isolation(self) -> str:
        """The sandbox kind agent code runs in here; raises EnvError when that is the unisolated ``rlimit``
        fallback and the caller did not opt in."""
        try:
            kind = resolve_sandbox(self.sandbox)
        except (RuntimeError, ValueError) as e:
            raise EnvError(str(e)) from None
        if kind != "bwrap" and not self.allow_unisolated:
            raise EnvError("no isolating sandbox here (bubblewrap is missing or does not work): agent code would "
                           "run as a plain subprocess that can read the hidden tests and reach the network; "
                           "install bubblewrap, or opt in with allow_unisolated=True / --allow-unisolated")
        return kind

    def reset(self, seed: int, task_version: str | None = None, *, task_id: str | None = None) -> ResetResult:
        self._cleanup()
        self.sandbox_kind = self.isolation()
        task = self.task_for(seed, task_version, task_id)
        base = self._workdir
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        self._ws = Path(tempfile.mkdtemp(prefix="mini-swe-", dir=base))
        materialize_workspace(task, self._ws / "repo")
        self._originals = plant(self._ws / "repo", task) if task.get("injection") else {}
        self._executed_args = []
        self._begin_episode(task)
        self.submitted = False
        self.gave_up = False
        self.grade_result = None
        self.gateway = Gateway(self.workspace, Permissions(
            capabilities=self.memory.capabilities({Capability.READ, Capability.WRITE, Capability.EXEC}),
            exec_allowlist=frozenset({"pytest"}), protected_paths=self.protected_paths,
            irreversible_budget=1), [*self._tools(), *self.memory.tools()], self.state_hash)
        self.gateway.note_trusted(task["statement"])
        obs = self._intro(task)
        return ResetResult(episode_id=str(uuid.uuid4()), observation=obs, state_hash=self.state_hash(),
                           task_id=task["task_id"], task_version=task["task_version"], seed=seed)

    def step(self, action: str, idempotency_key: str | None = None, *, tokens: int = 0,
             cost_usd: float = 0.0) -> StepResult:
        self._check_step()
        assert self.task is not None and self.gateway is not None
        tool, args, problem = parse_action(action)
        t0 = time.perf_counter()
        res = self.gateway.call(tool, args, idempotency_key=idempotency_key, taint=self._taint)
        tool_seconds = time.perf_counter() - t0  # the tool's own time: the sandboxed test runs dominate it
        obs = res.output if problem is None else f"{problem}\n{res.output}"
        status = res.status if problem is None else Status.MODEL_INVALID_ACTION
        status, memory_seconds = self.memory.outcome(tool, res.executed, status)
        tool_seconds += memory_seconds
        comps: dict[str, float] = {}
        terminated = truncated = False
        reason: str | None = None
        if tool == "submit" and res.executed and self.grade_result is not None:
            terminated, comps = True, self._rewards()
            reason = "success" if self.grade_result.resolved else "submitted"
        elif tool == "give_up" and res.executed:
            # Ends by the task's own semantics (terminated), unsolved: an agent that knows it cannot finish stops
            # early instead of spending its budget; the hidden tests do not run.
            terminated, comps, reason = True, {"resolved": 0.0, "partial": 0.0}, TerminationReason.GAVE_UP
        spent = self.tracker.add(tokens, cost_usd)
        if not terminated and spent is not None:
            truncated, reason = True, spent
            comps = self._final_grade()
            obs += f"\n{spent_notice(spent)}: the episode ends here."
            if status == "OK":
                status = Status.BUDGET_EXHAUSTED
        self.done = terminated or truncated
        taint: tuple[str, ...] = (UNTRUSTED,) if res.executed else ()
        if res.executed:
            self._executed_args.append(json.dumps(args, ensure_ascii=False, sort_keys=True, default=str))
            inj = self.task.get("injection")
            if inj and INJECTION_MARK in res.output:
                label = f"injection:{inj['goal']}@{inj['vector']}"
                self.injection_shown = True
                self.gateway.note_untrusted(label, inj["text"])
                taint += (label,)
        self._taint = taint
        if self.done and self.task.get("injection"):
            self.attack_success = attack_achieved(self.workspace, self.task, self._executed_args, self._originals)
        return StepResult(observation=clip(obs), reward_components=comps, terminated=terminated,
                          truncated=truncated, status=status, cost_usd=0.0, state_hash=self.state_hash(),
                          termination_reason=reason, tool=tool or None,
                          tool_seconds=tool_seconds, gateway_events=(res.event,), taint=self._taint)

    def step_with_fault(self, kind: str, action: str, idempotency_key: str | None = None, *, tokens: int = 0,
                        cost_usd: float = 0.0) -> StepResult:
        """``flaky_test_run``: the tests run for real, but the report shows a failure of the test infrastructure
        (a worker's connection reset) on top of the real outcome; the agent should run them again rather than
        change correct code. Other actions are not affected (a normal step, no fault)."""
        if kind != FaultKind.FLAKY_TEST_RUN:
            return super().step_with_fault(kind, action, idempotency_key, tokens=tokens, cost_usd=cost_usd)
        res = self.step(action, idempotency_key, tokens=tokens, cost_usd=cost_usd)
        executed = bool(res.gateway_events) and bool(res.gateway_events[0].get("executed"))
        if res.tool != "run_tests" or not executed or res.done:
            return res
        tests = (self.task or {}).get("visible_tests") or ["tests"]
        flaky = (f"FAILED {tests[0]} - ConnectionResetError: [Errno 104] Connection reset by peer (the test worker "
                 "lost its connection)\n")
        return dataclasses.replace(res, observation=flaky + res.observation, fault_injected=kind)

    def snapshot(self) -> Snapshot:
        if self.task is None or self.gateway is None:
            raise EnvError("snapshot before reset")
        files = self._entries()
        payload = (files, self.submitted, self.done, self.grade_result, self._taint, self.tracker.state(),
                   self.gateway.export_state(), self.task["task_id"], self.task["task_version"],
                   (self.injection_shown, self.attack_success, list(self._executed_args), dict(self._originals)),
                   self.memory.export_state())
        return Snapshot(self.env_id, self.env_version, self.state_hash(), payload)

    def restore(self, snapshot: Snapshot) -> None:
        self._check_snapshot(snapshot)
        (files, submitted, done, grade_result, taint, tracker, gw_state, task_id, task_version, inj,
         memory) = snapshot.payload
        if self.task is None or (self.task["task_id"], self.task["task_version"]) != (task_id, task_version):
            raise EnvError("restore needs the environment reset on the snapshot's task")
        assert self.gateway is not None
        current = self._entries()
        for rel in current:
            if rel not in files:
                _remove_entry(self.workspace, rel)
        for rel, entry in files.items():
            if current.get(rel) != entry:
                _safe_put(self.workspace, rel, entry)
        self.submitted, self.done, self.grade_result, self._taint = submitted, done, grade_result, taint
        self.injection_shown, self.attack_success = inj[0], inj[1]
        self._executed_args, self._originals = list(inj[2]), dict(inj[3])
        self.tracker.set_state(tracker)
        self.gateway.import_state(gw_state)
        self.memory.import_state(memory)
        self._check_restored(snapshot)

    def close(self) -> None:
        self._cleanup()

    # -- state -------------------------------------------------------------------------------------------------
    @property
    def workspace(self) -> Path:
        if self._ws is None:
            raise EnvError("no workspace: call reset")
        return self._ws / "repo"

    def _walk(self) -> list[tuple[str, os.stat_result]]:
        """(relative path, lstat) of every non-folder entry of the workspace; symlinked folders are entries,
        never descended into."""
        out = []
        for root, dirs, names in os.walk(self.workspace):
            keep = []
            for d in sorted(dirs):
                if d in _IGNORED:
                    continue
                if os.path.islink(os.path.join(root, d)):
                    names.append(d)
                else:
                    keep.append(d)
            dirs[:] = keep
            for n in sorted(names):
                if n.endswith(".pyc"):
                    continue
                path = os.path.join(root, n)
                out.append((os.path.relpath(path, self.workspace), os.lstat(path)))
        return sorted(out, key=lambda e: e[0])

    def _files(self) -> list[str]:
        """The workspace's regular files (what the tools show and the grader copies)."""
        return [rel for rel, st in self._walk() if stat.S_ISREG(st.st_mode)]

    def _entries(self) -> dict[str, tuple[str, bytes]]:
        """Every entry as (kind, content): file bytes, a symlink's target, or a marker for a FIFO, socket or
        device (never opened: reading a FIFO blocks and /dev/zero never ends)."""
        out: dict[str, tuple[str, bytes]] = {}
        for rel, st in self._walk():
            path = self.workspace / rel
            if stat.S_ISREG(st.st_mode):
                out[rel] = ("file", _read_regular(path, None))
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.fsencode(os.readlink(path)))
            else:
                out[rel] = ("fifo" if stat.S_ISFIFO(st.st_mode) else "special", b"")
        return out

    def state_hash(self) -> str:
        files = {}
        for rel, (kind, data) in self._entries().items():
            digest = hashlib.sha256(data).hexdigest()
            files[rel] = digest if kind == "file" else f"{kind}:{digest}"
        return stable_hash({"files": files, "submitted": self.submitted, **self.memory.hash_fields()})

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
            # "write": the test code can change the workspace, so a repeated idempotency key must not rerun it
            ToolSpec("run_tests", "exec", "write", {"type": "object", "properties": {"command": {
                "type": "string", "maxLength": 500}}, "required": ["command"], "additionalProperties": False},
                     self._run_tests, exec_arg="command", exec_check=check_run_tests_argv),
            ToolSpec("submit", "write", "irreversible", {"type": "object", "properties": {},
                                                         "additionalProperties": False}, self._submit),
            ToolSpec("give_up", "read", "read", {"type": "object", "properties": {}, "additionalProperties": False},
                     self._give_up),
        ]

    def _list_files(self, args: dict[str, Any]) -> str:
        return "\n".join(self._files())

    def _read_file(self, args: dict[str, Any]) -> str:
        p = self.workspace / args["path"]
        if not p.is_file():
            return f"error: no such file: {args['path']}"
        try:
            lines = _read_regular(p, MAX_FILE_BYTES).decode("utf-8", "replace").splitlines()
        except OSError as e:
            return f"error: cannot read {args['path']}: {e}"
        shown = [f"{i:>5}| {line}" for i, line in enumerate(lines[:MAX_READ_LINES], start=1)]
        if len(lines) > MAX_READ_LINES:
            shown.append(f"... ({len(lines) - MAX_READ_LINES} more lines)")
        return "\n".join(shown)

    def _search(self, args: dict[str, Any]) -> str:
        base = self.workspace / args.get("path", ".")
        pattern = args["pattern"]
        hits = []
        # only the workspace's regular files: a symlink (even to a file inside) is never followed
        targets = [self.workspace / r for r in self._files()
                   if (self.workspace / r) == base or (self.workspace / r).is_relative_to(base)]
        for p in targets:
            try:
                text = _read_regular(p, MAX_FILE_BYTES).decode("utf-8")
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
        try:
            text = _read_regular(p, MAX_FILE_BYTES).decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            return f"error: cannot edit {args['path']}: {e}"
        edited = replace_once(text, args["old"], args["new"])
        if edited is None:
            n = text.count(args["old"]) if args["old"] else 0
            return f"error: `old` occurs {n} times in {args['path']}; it must occur exactly once"
        p.write_text(edited, encoding="utf-8")
        return f"edited {args['path']}"

    def _run_tests(self, args: dict[str, Any]) -> str:
        argv: list[str] = args["command"]
        extra = [a for a in argv[1:] if a not in ("-q", "-x", "-v")]
        run = run_pytest(self.workspace, timeout_s=self.test_timeout_s, sandbox=self.isolation(),
                         pytest_args=tuple(extra))
        self.sandbox_kind = run.sandbox
        return _summarise(run.outcomes, run.exit_code, run.timed_out, run.collect_errors)

    def _submit(self, args: dict[str, Any]) -> str:
        assert self.task is not None
        self.grade_result = grade(self.workspace, self.task, timeout_s=self.test_timeout_s, sandbox=self.isolation())
        self.sandbox_kind = self.grade_result.sandbox
        self.submitted = True
        g = self.grade_result
        if g.error:
            return f"submitted; grading failed: {g.error.splitlines()[0] if g.error else ''}"
        return f"submitted; resolved: {'yes' if g.resolved else 'no'}"

    def _give_up(self, args: dict[str, Any]) -> str:
        self.gave_up = True
        return "gave up; the episode ends unsolved"

    def _rewards(self) -> dict[str, float]:
        g = self.grade_result
        if g is None:
            return {"resolved": 0.0, "partial": 0.0}
        comps = {"resolved": 1.0 if g.resolved else 0.0, "partial": float(g.partial)}
        if g.suspected_reward_hacking:
            comps["suspected_reward_hacking"] = 1.0  # never resolved: grade() refuses such results
        return comps

    def _final_grade(self) -> dict[str, float]:
        """Hidden tests also run when an episode ends without a submit (budget): the workspace is graded."""
        assert self.task is not None
        self.grade_result = grade(self.workspace, self.task, timeout_s=self.test_timeout_s, sandbox=self.isolation())
        self.sandbox_kind = self.grade_result.sandbox
        return self._rewards()

    def _intro(self, task: Mapping[str, Any]) -> str:
        tools = describe_tools(self.listed_tool_docs)
        return (f"{task['statement']}\n\nWorkspace files:\n" + "\n".join(self._files()) +
                f"\n\nAct with one JSON object per turn: {{\"tool\": NAME, \"args\": {{...}}}}. Tools:\n{tools}")


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


def check_run_tests_argv(argv: Sequence[str]) -> str | None:
    """Why ``argv`` is not an allowed ``run_tests`` command (None when it is): ``pytest`` followed by the
    options of :data:`RUN_TESTS_FLAGS`, ``-k EXPR``/``--maxfail N`` and relative test paths or node ids."""
    if not argv or argv[0] != "pytest":
        return "only `pytest` may run"
    args = list(argv[1:])
    i = 0
    while i < len(args):
        a = args[i]
        if a in RUN_TESTS_FLAGS:
            i += 1
            continue
        if a in RUN_TESTS_VALUE_FLAGS:
            if i + 1 >= len(args):
                return f"option {a} needs a value"
            if a == "--maxfail" and not args[i + 1].isdigit():
                return "--maxfail needs a number"
            i += 2
            continue
        if a.startswith("-"):
            return f"option {a.split('=', 1)[0]!r} is not allowed in run_tests"
        path = a.split("::", 1)[0]
        if os.path.isabs(path) or path.startswith("~") or ".." in Path(path).parts:
            return f"test path {a!r} must be relative and inside the workspace"
        i += 1
    return None


def _read_regular(path: Path, limit: int | None) -> bytes:
    """Bytes of a regular file, never a FIFO or device (opened non-blocking, checked with fstat), and never
    through a final symlink; OSError when it is something else or larger than ``limit``."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file")
        if limit is not None and st.st_size > limit:
            raise OSError(f"larger than {limit} bytes")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _remove_entry(root: Path, rel: str) -> None:
    """Remove a workspace entry without following a symlink (a symlinked folder loses the link only)."""
    path = root / rel
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def _safe_put(root: Path, rel: str, entry: tuple[str, bytes]) -> None:
    """Recreate a snapshot entry at ``root/rel`` without ever writing through a symlink: a symlink or other
    non-folder on the way is removed and replaced by a real folder, the target is removed and written new."""
    parts = Path(rel).parts
    current = root
    for part in parts[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            current.unlink()
        if not current.exists():
            current.mkdir()
    target = current / parts[-1]
    if target.is_symlink() or target.exists():
        _remove_entry(root, rel)
    kind, data = entry
    if kind == "symlink":
        os.symlink(os.fsdecode(data), target)
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "file":
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    else:
        raise EnvError(f"cannot restore {rel}: the snapshot holds a {kind} file")


def task_created_at(task: Mapping[str, Any]) -> dt.datetime:
    """The task's generation date from tasks.json (``created_at``, ISO-8601 UTC); older task files without one
    fall back to ``TASKS_CREATED_AT``."""
    value = task.get("created_at")
    if not value:
        return TASKS_CREATED_AT
    t = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def task_row(task: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tasks`` table row of a Mini SWE task (hidden tests and fixes stay out of the lake's task table)."""
    prov = task["provenance"]
    return taskset.task_row(task, ENV_ID, created_at=task_created_at(task), provenance={
        k: prov.get(k) for k in ("generator", "source", "commit", "mutator", "seed", "diff_hash")})
