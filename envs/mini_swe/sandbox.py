"""Run a pytest suite in a sandbox and collect per-test outcomes by node id.

Two sandboxes:

- ``bwrap``: bubblewrap with a read-only view of ``/``, no network, private pid/ipc/uts namespaces and
  only the work folder (and a scratch folder) writable. Used when ``bwrap`` is on ``PATH`` and a probe run
  succeeds (it fails in containers without user namespaces, for example).
- ``rlimit``: a plain subprocess.

Both apply resource limits (CPU seconds, address space, file size, no core dumps) with
``resource.setrlimit`` in a tiny launcher that then ``exec``s the command; unlike ``preexec_fn`` this is
safe when the caller runs several suites from threads. Both run in a new session and are killed as a
group on timeout.

The suite runs in the same process as the code under test, so (as in SWE-bench) a deliberately
malicious patch could still tamper with pytest itself; the sandbox bounds what it can touch outside.

Outcomes come from a small pytest plugin (written next to the scratch folder and loaded with ``-p``)
that records every test's phase reports, so node ids are exact (parametrised ids included) and setup or
teardown errors are told apart from failures. Plugin auto-loading is disabled, so the result does not
depend on which pytest plugins happen to be installed.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from trajlake.envs.core import Requirement

__all__ = ["Limits", "PytestRun", "SandboxKind", "bwrap_available", "pytest_requirement", "resolve_sandbox",
           "run_pytest"]

SandboxKind = Literal["bwrap", "rlimit"]
PLUGIN_NAME = "trajlake_mini_swe_report"
REPORT_ENV = "TRAJLAKE_MINI_SWE_REPORT"

_PLUGIN_SOURCE = '''\
"""pytest plugin written by trajlake.envs.mini_swe.sandbox: per-test outcomes as JSON."""
import json
import os

# read (and hide from the code under test) where the report goes
_REPORT_PATH = os.environ.pop("TRAJLAKE_MINI_SWE_REPORT", None)
_RESULTS = {}
_MESSAGES = {}
_COLLECT_ERRORS = []
_RANK = {"passed": 0, "xfailed": 0, "skipped": 1, "xpassed": 2, "failed": 3, "error": 4}


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)[:300]
    return str(report.longrepr)[-300:]


def _record(nodeid, outcome, message=None):
    previous = _RESULTS.get(nodeid)
    if previous is None or _RANK[outcome] > _RANK[previous]:
        _RESULTS[nodeid] = outcome
        if message:
            _MESSAGES[nodeid] = message


def pytest_runtest_logreport(report):
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            _record(report.nodeid, "xfailed" if report.skipped else "xpassed")
        elif report.failed:
            _record(report.nodeid, "failed", _message(report))
        else:
            _record(report.nodeid, report.outcome)
    elif report.failed:
        _record(report.nodeid, "error", _message(report))
    elif report.skipped:
        _record(report.nodeid, "skipped")


def pytest_collectreport(report):
    if report.failed:
        _COLLECT_ERRORS.append((report.nodeid or "<session>") + ": " + _message(report))


def pytest_sessionfinish(session, exitstatus):
    if _REPORT_PATH:
        with open(_REPORT_PATH, "w", encoding="utf-8") as handle:
            json.dump({"tests": _RESULTS, "messages": _MESSAGES, "collect_errors": _COLLECT_ERRORS,
                       "exitstatus": int(exitstatus)}, handle)
'''

_LAUNCHER = (
    "import json, os, resource, sys\n"
    "for name, value in json.loads(sys.argv[1]).items():\n"
    "    which = getattr(resource, name)\n"
    "    soft, hard = resource.getrlimit(which)\n"
    "    if hard != resource.RLIM_INFINITY:\n"
    "        value = min(value, hard)\n"
    "    resource.setrlimit(which, (value, value if hard == resource.RLIM_INFINITY else hard))\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


@dataclass(frozen=True)
class Limits:
    """Resource limits of a sandboxed run."""

    cpu_s: int = 120
    memory_bytes: int = 4 * 1024**3
    file_bytes: int = 64 * 1024**2

    def as_rlimits(self) -> dict[str, int]:
        return {
            "RLIMIT_CPU": self.cpu_s,
            "RLIMIT_AS": self.memory_bytes,
            "RLIMIT_FSIZE": self.file_bytes,
            "RLIMIT_CORE": 0,
        }


@dataclass(frozen=True)
class PytestRun:
    """Result of one sandboxed pytest run."""

    outcomes: dict[str, str]
    messages: dict[str, str]
    collect_errors: list[str]
    exit_code: int | None
    timed_out: bool
    duration_s: float
    sandbox: SandboxKind
    report_error: str | None = None
    output_tail: str = field(default="", repr=False)


def _bwrap_args(writable: list[Path], cwd: Path) -> list[str]:
    exe = shutil.which("bwrap")
    if exe is None:
        raise RuntimeError("bwrap is not installed")
    args = [
        exe, "--die-with-parent", "--new-session",
        "--unshare-net", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
        "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
    ]
    for path in writable:
        args += ["--bind", str(path), str(path)]
    return [*args, "--chdir", str(cwd), "--"]


@functools.cache
def bwrap_available() -> bool:
    """True when ``bwrap`` exists and a probe run of this Python inside it works (cached per process)."""
    if shutil.which("bwrap") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="mini-swe-probe-") as tmp:
        probe = Path(tmp)
        marker = probe / "ok"
        code = f"open({str(marker)!r}, 'w').write('ok')"
        try:
            proc = subprocess.run(
                [*_bwrap_args([probe], probe), sys.executable, "-c", code],
                capture_output=True, timeout=30, check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return False
        return proc.returncode == 0 and marker.exists()


def _resolve_sandbox(sandbox: str) -> SandboxKind:
    if sandbox == "auto":
        forced = os.environ.get("TRAJLAKE_MINI_SWE_SANDBOX", "")
        if forced in ("bwrap", "rlimit"):
            sandbox = forced
        else:
            return "bwrap" if bwrap_available() else "rlimit"
    if sandbox == "bwrap":
        if not bwrap_available():
            raise RuntimeError("the bwrap sandbox was requested but bwrap is missing or does not work here")
        return "bwrap"
    if sandbox == "rlimit":
        return "rlimit"
    raise ValueError(f"unknown sandbox {sandbox!r} (auto, bwrap or rlimit)")


def run_pytest(
    workdir: str | Path,
    *,
    timeout_s: float = 60.0,
    sandbox: str = "auto",
    limits: Limits | None = None,
    pytest_args: tuple[str, ...] = (),
) -> PytestRun:
    """Run ``python -m pytest`` in ``workdir`` (which holds ``pytest.ini``) inside a sandbox.

    Never raises for anything the suite does: crashes, timeouts and missing reports are described in the
    returned :class:`PytestRun`.
    """
    work = Path(workdir).resolve()
    kind = _resolve_sandbox(sandbox)
    limits = limits or Limits()
    with tempfile.TemporaryDirectory(prefix="mini-swe-run-") as tmp:
        scratch = Path(tmp)
        runner = scratch / "runner"
        home = scratch / "home"
        for folder in (runner, home, scratch / "tmp"):
            folder.mkdir()
        (runner / f"{PLUGIN_NAME}.py").write_text(_PLUGIN_SOURCE, encoding="utf-8")
        report = scratch / "report.json"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "TMPDIR": str(scratch / "tmp"),
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
            "PYTHONPATH": str(runner),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            REPORT_ENV: str(report),
        }
        inifile = work / "pytest.ini"
        command = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN_NAME,
            "--rootdir", str(work), *(["-c", str(inifile)] if inifile.is_file() else []),
            "-o", "console_output_style=classic", "--color=no", *pytest_args,
        ]
        if kind == "bwrap":
            command = [*_bwrap_args([work, scratch], work), *command]
        launcher = [sys.executable, "-I", "-c", _LAUNCHER, json.dumps(limits.as_rlimits())]
        start = time.monotonic()
        timed_out = False
        proc = subprocess.Popen(
            [*launcher, *command],
            cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            output, _ = proc.communicate()
        duration = time.monotonic() - start
        tail = output.decode("utf-8", "replace")[-4000:]
        outcomes: dict[str, str] = {}
        messages: dict[str, str] = {}
        collect_errors: list[str] = []
        report_error: str | None = None
        try:
            data = json.loads(report.read_text(encoding="utf-8"))
            outcomes = {str(k): str(v) for k, v in data["tests"].items()}
            messages = {str(k): str(v) for k, v in data["messages"].items()}
            collect_errors = [str(e) for e in data["collect_errors"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            report_error = f"no pytest report ({type(exc).__name__})"
    return PytestRun(
        outcomes=dict(sorted(outcomes.items())),
        messages=messages,
        collect_errors=collect_errors,
        exit_code=None if timed_out else proc.returncode,
        timed_out=timed_out,
        duration_s=duration,
        sandbox=kind,
        report_error=report_error,
        output_tail=tail,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def resolve_sandbox(sandbox: str) -> SandboxKind:
    """The isolation a ``sandbox`` setting (auto, bwrap, rlimit) gives on this machine; raises when an explicit
    kind is not available."""
    return _resolve_sandbox(sandbox)


def pytest_requirement() -> Requirement:
    """Grading runs ``python -m pytest`` with this interpreter: is pytest importable by it?"""
    try:
        proc = subprocess.run([sys.executable, "-c", "import pytest; print(pytest.__version__)"],
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return Requirement("pytest", False, f"{sys.executable} could not run: {e}", "pip install pytest")
    if proc.returncode != 0:
        return Requirement("pytest", False, f"not importable by {sys.executable} (the grader runs the hidden "
                           f"tests with `python -m pytest`)", "pip install pytest")
    return Requirement("pytest", True, f"pytest {proc.stdout.strip()} ({sys.executable})")
