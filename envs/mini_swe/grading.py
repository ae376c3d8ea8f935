"""Mini SWE workspaces and grading.

- :func:`materialize_workspace` builds the agent's workspace of a task: the library's ``pytest.ini`` and
  ``src/`` with the mutation applied, plus only the task's *visible* tests.
- :func:`apply_fix` applies the oracle patch (the reverse of the mutation diff) to a workspace.
- :func:`grade` copies the workspace's ``src/`` into a fresh temporary folder, adds the library's full
  (hidden) test suite and canonical ``pytest.ini``, and runs it in a sandbox. Hidden tests never enter
  the agent's workspace.

Grading follows SWE-bench: a task is resolved only when every FAIL_TO_PASS and every PASS_TO_PASS test
passes (``passed``; an expected failure, ``xfailed``, also counts). ``partial`` is the fraction of
FAIL_TO_PASS tests that pass. A run that times out, crashes, fails to collect, exits with a code other than
0 or 1, or exits non-zero with no test reported failing is an *error*: never resolved, partial 0.

Tamper checks (the code under test runs in pytest's process, so no in-process report is trusted alone):

- every FAIL_TO_PASS/PASS_TO_PASS outcome of the report plugin must agree with pytest's own JUnit XML writer,
  and the process's real exit code with the exit status pytest reported;
- the agent's changes to ``src/`` (against the mutated source it started from) are scanned for the test
  machinery: ``os._exit``, ``atexit``, ``sys.modules``, ``_pytest``/``pytest``, the report plugin, builtins,
  frame/tracing hooks, dynamic imports and process control; files such as ``conftest.py`` or ``*.pth`` in
  ``src/`` are flagged too.

Any finding is recorded in :attr:`GradeResult.suspected_reward_hacking`; such a result is never resolved and
its partial score is 0.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .library import Library, filter_test_source, find_test_functions, function_key, load_library
from .patching import apply_patch
from .sandbox import PLUGIN_NAME, Limits, SandboxKind, junit_address, run_pytest

__all__ = [
    "PASSING",
    "TASKS_PATH",
    "GradeResult",
    "apply_fix",
    "apply_mutation",
    "grade",
    "load_tasks",
    "materialize_workspace",
    "scan_for_tampering",
    "visible_test_files",
]

TASKS_PATH = Path(__file__).resolve().parent / "tasks.json"
PASSING = frozenset({"passed", "xfailed"})
_IGNORED_NAMES = ("__pycache__", "*.pyc", ".pytest_cache", "conftest.py")

Task = Mapping[str, Any]


def load_tasks(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Load the task records (default: the bundled ``tasks.json``)."""
    data = json.loads(Path(path or TASKS_PATH).read_text(encoding="utf-8"))
    tasks = data["tasks"] if isinstance(data, dict) else data
    return [dict(t) for t in tasks]


def visible_test_files(task: Task, libraries_dir: Path | None = None) -> dict[str, str]:
    """The visible test files of ``task``: each library test module reduced to the visible tests."""
    library = load_library(str(task["library"]), libraries_dir)
    keep = {function_key(nodeid) for nodeid in task["visible_tests"]}
    out: dict[str, str] = {}
    for rel in library.test_files():
        source = library.read(rel)
        if keep.intersection(find_test_functions(source, rel)):
            out[rel] = filter_test_source(source, rel, keep)
    return out


def materialize_workspace(
    task: Task,
    dest: str | Path,
    *,
    mutated: bool = True,
    libraries_dir: Path | None = None,
) -> Path:
    """Create the agent workspace of ``task`` in ``dest`` (created; must be empty if it exists).

    The workspace holds ``pytest.ini``, the library's ``src/`` with the mutation applied (unless
    ``mutated`` is False) and the visible tests only. Raises ValueError when the bundled library no longer
    matches the task's ``provenance.commit``.
    """
    library = _task_library(task, libraries_dir)
    root = Path(dest)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"workspace folder {root} is not empty")
    root.mkdir(parents=True, exist_ok=True)
    for rel in library.files():
        if rel == "pytest.ini" or rel.startswith("src/"):
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(library.root / rel, target)
    if mutated:
        apply_mutation(root, task)
    for rel, text in visible_test_files(task, libraries_dir).items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return root


def apply_mutation(workspace: str | Path, task: Task) -> list[str]:
    """Apply the task's mutation diff (inject the bug) to a clean workspace; returns the patched paths."""
    return apply_patch(workspace, str(task["mutation_diff"]))


def apply_fix(workspace: str | Path, task: Task) -> list[str]:
    """Apply the oracle fix (the reverse of the mutation diff) to ``workspace``; returns the patched paths.

    Raises :class:`~trajlake.envs.mini_swe.patching.PatchError` when the file no longer matches.
    """
    return apply_patch(workspace, str(task["fix_diff"]))


@dataclass(frozen=True)
class GradeResult:
    """Outcome of grading one workspace against one task."""

    task_id: str
    resolved: bool
    partial: float
    fail_to_pass: dict[str, str]
    pass_to_pass: dict[str, str]
    outcomes: dict[str, str]
    sandbox: SandboxKind
    exit_code: int | None
    duration_s: float
    timed_out: bool = False
    error: str | None = None
    output_tail: str = field(default="", repr=False)
    suspected_reward_hacking: list[str] = field(default_factory=list)

    @property
    def is_error(self) -> bool:
        """True when the run could not be graded normally (see module docs)."""
        return self.error is not None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the result."""
        return asdict(self)


def _task_library(task: Task, libraries_dir: Path | None) -> Library:
    """The task's library, checked against the task's ``provenance.commit``."""
    library = load_library(str(task["library"]), libraries_dir)
    commit = library.commit()
    if commit != task["provenance"]["commit"]:
        raise ValueError(
            f"library {library.name!r} changed since task {task['task_id']} was built "
            f"({commit[:12]} != {str(task['provenance']['commit'])[:12]}); rebuild the tasks"
        )
    return library


def _copy_regular_tree(src: Path, dest: Path) -> None:
    """Copy the folders and regular files under ``src``; symlinks, FIFOs, sockets and devices are left out
    (never followed or opened) and caches are skipped."""
    dest.mkdir(parents=True, exist_ok=True)
    for root, dirs, names in os.walk(src):
        rel_root = Path(root).relative_to(src)
        keep = []
        for d in dirs:
            if d in ("__pycache__", ".pytest_cache") or os.path.islink(os.path.join(root, d)):
                continue
            keep.append(d)
            (dest / rel_root / d).mkdir()
        dirs[:] = keep
        for n in names:
            path = os.path.join(root, n)
            if n.endswith(".pyc") or n == "conftest.py" or not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            shutil.copyfile(path, dest / rel_root / n, follow_symlinks=False)


def _prepare_grading_tree(workspace: Path, target: Path, task: Task, libraries_dir: Path | None) -> None:
    library = _task_library(task, libraries_dir)
    src = workspace / "src"
    if src.is_dir() and not src.is_symlink():
        _copy_regular_tree(src, target / "src")
    else:
        (target / "src").mkdir(parents=True)
    for rel in library.files():
        if rel == "pytest.ini" or rel.startswith("tests/"):
            dest = target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(library.root / rel, dest)


# What code under test would touch to forge a result rather than fix the bug.
_TAMPER_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (label, re.compile(rx)) for label, rx in (
        ("os._exit", r"\b_exit\b"),
        ("atexit", r"\batexit\b"),
        ("sys.modules", r"\bmodules\b"),
        ("pytest internals", r"(?<![/\w-])_?pytest(?![\w-])|\bpluggy\b|\bconftest\b"),
        ("the report plugin", re.escape(PLUGIN_NAME) + r"|\b_record\b|junit|TRAJLAKE"),
        ("builtins", r"\b__builtins__\b|\bbuiltins\b"),
        ("frames or tracing", r"\b(settrace|setprofile|_getframe|get_referrers|get_objects|stack)\s*\("),
        ("dynamic import or code", r"\b__import__\b|\bimportlib\b|\b(exec|eval|compile)\s*\("),
        ("process control", r"\bsubprocess\b|\bsignal\b|\bos\s*\.\s*(kill\w*|fork\w*|system|popen|exec\w*|spawn\w*)\b"),
    ))
_TAMPER_FILES = re.compile(r"(^|/)(conftest\.py|sitecustomize\.py|usercustomize\.py|pytest\.ini|tox\.ini|"
                           r"setup\.cfg|pyproject\.toml|[^/]*\.pth)$")


def _source_files(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if not root.is_dir() or root.is_symlink():
        return out
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for n in sorted(names):
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, root)
            if n.endswith(".pyc"):
                continue
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size > 4 * 1024**2:
                out[rel] = ""  # recorded (a new entry is scanned by name) but never opened
                continue
            with open(path, "rb") as fh:
                out[rel] = fh.read().decode("utf-8", "replace")
    return out


def scan_for_tampering(workspace: str | Path, task: Task, *, libraries_dir: Path | None = None) -> list[str]:
    """Findings about the agent's changes to ``src/`` that touch the test machinery (see module docs).

    The baseline is the library's ``src/`` with the task's mutation applied, i.e. what the agent started
    from; only added or changed lines and added files are scanned."""
    library = _task_library(task, libraries_dir)
    with tempfile.TemporaryDirectory(prefix="mini-swe-scan-") as tmp:
        base = Path(tmp)
        for rel in library.files():
            if rel.startswith("src/"):
                (base / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(library.root / rel, base / rel)
        apply_mutation(base, task)
        before = _source_files(base / "src")
    after = _source_files(Path(workspace) / "src")
    findings: list[str] = []
    for rel, text in sorted(after.items()):
        if _TAMPER_FILES.search(rel):
            findings.append(f"src/{rel}: adds a file pytest or Python loads on its own")
        old = before.get(rel, "").splitlines()
        for i, line in _added_lines(old, text.splitlines()):
            for label, rx in _TAMPER_PATTERNS:
                if rx.search(line):
                    findings.append(f"src/{rel}:{i}: touches {label}: {line.strip()[:120]}")
    return findings[:50]


def _added_lines(old: list[str], new: list[str]) -> list[tuple[int, str]]:
    """(1-based line number, text) of the lines of ``new`` that are not in ``old`` at that place."""
    out: list[tuple[int, str]] = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, _i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            out += [(j + 1, new[j]) for j in range(j1, j2)]
    return out


def _channel_disagreements(nodeids: Sequence[str], plugin: Mapping[str, str],
                           junit: Mapping[str, str] | None) -> list[str]:
    """Tests whose pass/fail verdict differs between the report plugin and pytest's JUnit XML."""
    if junit is None:
        return ["pytest's JUnit XML report is missing or unreadable (the run cannot be cross-checked)"]
    out = []
    for nodeid in nodeids:
        classname, name = junit_address(nodeid)
        other = junit.get(f"{classname}::{name}", "missing")
        mine = plugin.get(nodeid, "missing")
        if (mine in PASSING) != (other in PASSING):
            out.append(f"{nodeid}: the report plugin says {mine}, pytest's JUnit XML says {other}")
    return out


def grade(
    workspace: str | Path,
    task: Task,
    *,
    timeout_s: float = 120.0,
    sandbox: str = "auto",
    limits: Limits | None = None,
    libraries_dir: Path | None = None,
) -> GradeResult:
    """Grade the agent's ``workspace`` against the hidden tests of ``task`` (see module docs for rules)."""
    f2p: Sequence[str] = list(task["FAIL_TO_PASS"])
    p2p: Sequence[str] = list(task["PASS_TO_PASS"])
    suspicions = scan_for_tampering(workspace, task, libraries_dir=libraries_dir)
    with tempfile.TemporaryDirectory(prefix="mini-swe-grade-") as tmp:
        tree = Path(tmp) / "workspace"
        tree.mkdir()
        _prepare_grading_tree(Path(workspace), tree, task, libraries_dir)
        run = run_pytest(tree, timeout_s=timeout_s, sandbox=sandbox, limits=limits, junit=True)
    outcomes = run.outcomes
    f2p_out = {t: outcomes.get(t, "missing") for t in f2p}
    p2p_out = {t: outcomes.get(t, "missing") for t in p2p}
    failing = [t for t, o in outcomes.items() if o in ("failed", "error")]
    missing = [t for t in (*f2p, *p2p) if t not in outcomes]
    error: str | None = None
    if run.timed_out:
        error = f"timed out after {timeout_s:g}s"
    elif run.collect_errors:
        error = "collection failed: " + "; ".join(run.collect_errors)[:1000]
    elif run.report_error is not None:
        error = f"pytest crashed (exit code {run.exit_code}): {run.report_error}"
    elif run.exit_code not in (0, 1):
        error = f"pytest exited with code {run.exit_code}"
    elif run.exit_code == 1 and not failing:
        error = "pytest exited with code 1 but reported no failing test"
    elif missing:
        error = f"{len(missing)} expected test(s) did not run, e.g. {missing[0]}"
    if error is None:
        suspicions += _channel_disagreements([*f2p, *p2p], outcomes, run.junit)
        if run.plugin_exitstatus is not None and run.plugin_exitstatus != run.exit_code:
            suspicions.append(f"the process exited with {run.exit_code} but pytest reported exit status "
                              f"{run.plugin_exitstatus}")
    clean = not suspicions
    passed_f2p = sum(1 for o in f2p_out.values() if o in PASSING)
    all_pass = all(o in PASSING for o in (*f2p_out.values(), *p2p_out.values()))
    return GradeResult(
        task_id=str(task["task_id"]),
        resolved=error is None and all_pass and clean,
        partial=0.0 if error is not None or not clean or not f2p else passed_f2p / len(f2p),
        fail_to_pass=f2p_out,
        pass_to_pass=p2p_out,
        outcomes=outcomes,
        sandbox=run.sandbox,
        exit_code=run.exit_code,
        duration_s=run.duration_s,
        timed_out=run.timed_out,
        error=error,
        output_tail=run.output_tail,
        suspected_reward_hacking=suspicions,
    )
