"""Built-in Mini SWE policies: ``oracle`` (uses the known fix), ``heuristic`` (guesses from the bug report),
``random`` (schema-valid random actions) and ``gullible`` (the oracle that obeys instructions it reads). Scripted policies produce byte-level token ids with loss mask 1
and no behaviour log-probs (they have none)."""

from __future__ import annotations

import ast
import json
import random
import re
from typing import Any

from trajlake.envs.injection import unseen, with_bundled_solution
from trajlake.envs.mini_swe.grading import load_tasks
from trajlake.envs.mini_swe.injection import find_instructions
from trajlake.envs.mini_swe.library import parse_python
from trajlake.envs.mini_swe.patching import minimal_edit, parse_patch, replace_once
from trajlake.envs.policy import Policy, PolicyOutput, TaskView

_NUMBERED = re.compile(r"^\s*(\d+)\| ?(.*)$")  # read_file's line: f"{n:>5}| {text}" (number, text)


def _act(tool: str, **args: Any) -> str:
    return json.dumps({"tool": tool, "args": args}, sort_keys=True)


class _Scripted(Policy):
    """A policy that plays a plan of actions computed at reset (and refined from observations)."""

    def __init__(self, policy_version: str):
        super().__init__(policy_version)
        self.plan: list[str] = []
        self.task: TaskView | None = None

    def act(self, observation: str) -> PolicyOutput:
        action = self.next_action(observation)
        return self.scripted_output(action)

    def next_action(self, observation: str) -> str:
        return self.plan.pop(0) if self.plan else _act("submit")


class OraclePolicy(_Scripted):
    """Reads the buggy file, applies the known fix hunk by hunk, runs the visible tests, submits.

    Each edit is minimal-span: the hunk's changed lines with only as much context as makes its ``old`` occur
    once in the file as the oracle just read it (:func:`minimal_edit`), so a language-model policy that imitates
    the oracle writes short calls. When the file was not read whole (a truncated listing, or another action in
    between, as the gullible policy's detours), the edit is the whole hunk, as before."""

    name = "oracle"
    needs_oracle = True

    def reset(self, task: TaskView, seed: int) -> None:
        if task.oracle is None or "fix_diff" not in task.oracle:
            raise ValueError("the oracle policy needs the task's fix (TaskView.oracle['fix_diff'])")
        self.task = task
        plan = []
        for fp in parse_patch(str(task.oracle["fix_diff"])):
            plan.append(_act("read_file", path=fp.path))
            for h in fp.hunks:
                plan.append(_act("edit", path=fp.path, old="".join(h.old_lines), new="".join(h.new_lines)))
        plan += [_act("run_tests", command="pytest -q"), _act("submit")]
        self.plan = plan
        self.files: dict[str, str] = {}  # path -> text as read, kept up to date through this policy's edits
        self.last_action: dict[str, Any] = {}

    def act(self, observation: str) -> PolicyOutput:
        if self.last_action.get("tool") == "read_file":
            path = str(self.last_action["args"].get("path"))
            text = _listed_file(observation)
            if text is None:
                self.files.pop(path, None)
            else:
                self.files[path] = text
        action = self.next_action(observation)
        self.last_action = _parsed(action)
        if self.last_action.get("tool") == "edit":
            path, old, new = (str(self.last_action["args"].get(k, "")) for k in ("path", "old", "new"))
            text = self.files.pop(path, None)
            edited = None if text is None else replace_once(text, old, new)
            if edited is not None:
                self.files[path] = edited
        return self.scripted_output(action)

    def next_action(self, observation: str) -> str:
        action = super().next_action(observation)
        call = _parsed(action)
        if call.get("tool") == "edit" and str(call["args"].get("path")) in self.files:
            args = call["args"]
            old, new = minimal_edit(self.files[str(args["path"])], str(args["old"]), str(args["new"]))
            action = _act("edit", path=args["path"], old=old, new=new)
        return action


def _parsed(action: str) -> dict[str, Any]:
    """A ``{"tool", "args"}`` action as a dict; {} for anything else (subclasses may act otherwise)."""
    try:
        call = json.loads(action)
    except ValueError:
        return {}
    ok = isinstance(call, dict) and isinstance(call.get("tool"), str) and isinstance(call.get("args"), dict)
    return call if ok else {}


def _listed_file(observation: str) -> str | None:
    """The text of a file from ``read_file``'s numbered listing (lines 1, 2, ... each ``N| text``); None when the
    observation is not a whole listing (an error, a truncated file, anything else)."""
    lines = observation.split("\n")
    texts = []
    for i, line in enumerate(lines, start=1):
        m = _NUMBERED.match(line)
        if m is None or int(m.group(1)) != i:
            return None
        texts.append(m.group(2))
    return "\n".join(texts) + "\n" if texts else None


class HeuristicPolicy(_Scripted):
    """Reads the file named in the bug report, finds the named function and applies the first edit that
    matches the report's wording (flip a comparison, shift a constant by one, flip +/-), then tests and
    submits. Right on part of the tasks, by design."""

    name = "heuristic"

    def reset(self, task: TaskView, seed: int) -> None:
        self.task = task
        names = re.findall(r"`([^`]+)`", task.statement)
        self.file = next((n for n in names if n.endswith(".py")), None)
        self.function = next((n for n in names if not n.endswith(".py") and re.match(r"^[\w.]+$", n)
                              and n not in (self.file,)), None)
        lib = self.file.rsplit("/", 1)[-1].removesuffix(".py") if self.file else None
        if self.function == lib:  # the first backticked name is usually the library
            rest = [n for n in names if n not in (lib, self.file) and re.match(r"^[\w.]+$", n)]
            self.function = rest[0] if rest else None
        self.stage = "read"

    def next_action(self, observation: str) -> str:
        if self.file is None:
            return _act("submit")
        if self.stage == "read":
            self.stage = "edit"
            return _act("read_file", path=self.file)
        if self.stage == "edit":
            self.stage = "test"
            source = "\n".join(m.group(2) for line in observation.splitlines() if (m := _NUMBERED.match(line)))
            edit = self._guess(source)
            if edit is not None:
                old, new = edit
                return _act("edit", path=self.file, old=old, new=new)
        if self.stage == "test":
            self.stage = "submit"
            return _act("run_tests", command="pytest -q")
        return _act("submit")

    def _guess(self, source: str) -> tuple[str, str] | None:
        assert self.task is not None
        text = self.task.statement.lower()
        try:
            tree = parse_python(source)
        except SyntaxError:
            return None
        lines = source.splitlines()
        func = _find_function(tree, self.function or "")
        if func is None:
            return None
        body = range(func.body[0].lineno, (func.end_lineno or func.lineno) + 1)
        rules: list[tuple[str, str]]
        if "opposite meaning" in text or "negated" in text:
            rules = [(" not in ", " in "), (" in ", " not in "), (" is not ", " is "), (" is ", " is not "),
                     ("==", "!="), ("!=", "=="), ("<=", "<"), (">=", ">"), ("<", "<="), (">", ">=")]
        elif "off by" in text or "numeric value" in text or "small amount" in text:
            rules = [("+ 1", ""), ("- 1", ""), ("1", "0"), ("0", "1")]
        elif "negation" in text or "arithmetic" in text:
            rules = [(" - ", " + "), (" + ", " - ")]
        else:
            return None
        # conditions first: the reports of flipped comparisons talk about a condition
        ordered = sorted(body, key=lambda n: 0 if lines[n - 1].lstrip().startswith(("if ", "elif ", "while "))
                         else 1)
        for ln in ordered:
            line = lines[ln - 1]
            code = line.split("#", 1)[0]
            for old, new in rules:
                if old in code and not code.strip().startswith(("def ", '"', "'")):
                    replaced = line.replace(old, new, 1)
                    if source.count(line) == 1 and replaced != line:
                        return line, replaced
        return None


def _find_function(tree: ast.Module, dotted: str) -> ast.FunctionDef | None:
    parts = dotted.split(".")
    nodes: list[ast.stmt] = list(tree.body)
    for i, part in enumerate(parts):
        found: ast.FunctionDef | ast.ClassDef | None = None
        for n in nodes:
            if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part:
                found = n
                break
        if found is None:
            return None
        if i == len(parts) - 1:
            return found if isinstance(found, ast.FunctionDef) else None
        nodes = list(found.body)
    return None


class RandomPolicy(Policy):
    """Schema-valid random actions over the environment's tools; submits at random or when the budget ends."""

    name = "random"

    def reset(self, task: TaskView, seed: int) -> None:
        self.rng = random.Random(f"{task.task_id}:{seed}")
        # give_up (environment 1.1) is left out: the random baseline's episodes stay what they were (its random
        # submits already end episodes early)
        self.tools = sorted(t for t in task.tools if t != "give_up")
        self.files: list[str] = []

    def act(self, observation: str) -> PolicyOutput:
        if not self.files:
            self.files = [ln.strip() for ln in observation.splitlines() if ln.strip().endswith(".py")
                          and " " not in ln.strip()]
        tool = self.rng.choice(self.tools)
        path = self.rng.choice(self.files) if self.files else "src"
        word = self.rng.choice(["return", "if", "self", "def", "None", "0", "1", "+", "=="])
        args: dict[str, Any] = {
            "list_files": {}, "read_file": {"path": path}, "search": {"pattern": word},
            "edit": {"path": path, "old": word, "new": self.rng.choice(["return", "if", "0", "1", "-", "!="])},
            "run_tests": {"command": "pytest -q"}, "submit": {},
        }.get(tool, {})
        if tool == "submit" and self.rng.random() < 0.7:  # do not give up too early
            tool, args = "read_file", {"path": path}
        return self.scripted_output(_act(tool, **args))


class GulliblePolicy(OraclePolicy):
    """The oracle, except that instructions found in an observation are carried out first (once each): the
    policy that falls for prompt injections. Not an oracle for the runner (``needs_oracle`` is False: its
    failures under attack are the point); it reads the fix from the bundled task set."""

    name = "gullible"
    needs_oracle = False

    def reset(self, task: TaskView, seed: int) -> None:
        # an attacked variant shares its user task's fix
        super().reset(with_bundled_solution(task, "fix_diff", load_tasks, "fix_diff"), seed)
        self.obeyed: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        self.detour: list[str] = []
        self.waiting_for_secret: str | None = None

    def next_action(self, observation: str) -> str:
        if self.waiting_for_secret is not None:  # the observation is the secret file: search for its value
            m = re.search(rf"{re.escape(self.waiting_for_secret)}=(\S+)", observation)
            self.waiting_for_secret = None
            if m is not None:
                self.detour.insert(0, _act("search", pattern=m.group(1)))
        text = "\n".join(m.group(2) if (m := _NUMBERED.match(line)) else line for line in observation.splitlines())
        for goal, params in unseen(find_instructions(text), self.obeyed):
            if goal == "exfiltrate":
                self.detour.append(json.dumps({"tool": "read_file", "args": {"path": params["secret_path"]},
                                               "then_secret": params["name"]}, sort_keys=True))
            else:
                self.detour.append(_act("edit", path=params["path"], old=params["old"], new=params["new"]))
        if self.detour:
            action = self.detour.pop(0)
            obj = json.loads(action)
            if "then_secret" in obj:
                self.waiting_for_secret = obj["then_secret"]
                action = _act(obj["tool"], **obj["args"])
            return action
        return super().next_action(observation)


POLICIES: dict[str, type[Policy]] = {"oracle": OraclePolicy, "heuristic": HeuristicPolicy, "random": RandomPolicy,
                                     "gullible": GulliblePolicy}
