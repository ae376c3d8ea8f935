"""Run a pytest suite in a sandbox and collect per-test outcomes by node id.

Two sandboxes (``docs/security.md`` states what each promises):

- ``bwrap``: two nested bubblewraps. The outer one (run as the caller) builds a fresh mount namespace that
  holds only the system libraries (``/usr``), the interpreter's installation with its site-packages hidden,
  pytest and its few dependencies (bound one by one), the workspace (``/workspace``), a report folder and
  private ``/tmp``, ``/proc``, ``/dev``; no network, IPC, UTS, PID or cgroup sharing. Inside it the launcher
  drops to an unprivileged host user (when trajlake runs as root) and applies the rlimits; the inner
  bubblewrap then maps that user to uid 1000 in a new user namespace with every capability dropped.
  trajlake's package data (tasks, hidden tests), the lake and ``$HOME`` are not in the sandbox at all.
- ``rlimit``: a plain subprocess with the same rlimits, a scrubbed environment and (when possible) the
  unprivileged user; it hides nothing and does not block the network.

Both run under a supervising launcher that is a child subreaper: when the command ends or the timeout
fires, every descendant dies, including daemons that called ``setsid``. Output goes to a file of which only
the tail is read. ``RLIMIT_NPROC`` bounds processes (the kernel ignores it for host root, which is why the
sandbox drops to an unprivileged user).

The suite runs in the same process as the code under test, so a malicious patch can tamper with pytest
itself; :mod:`.grading` therefore cross-checks two report channels and scans the patch (see there).

Outcomes come from a small pytest plugin (written next to the scratch folder and loaded with ``-p``)
that records every test's phase reports, so node ids are exact (parametrised ids included) and setup or
teardown errors are told apart from failures. Plugin auto-loading is disabled, so the result does not
depend on which pytest plugins happen to be installed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from trajlake.envs.core import Requirement

__all__ = ["Limits", "PytestRun", "SandboxKind", "bwrap_available", "junit_address", "pytest_requirement",
           "resolve_sandbox", "run_pytest"]

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

# The launcher runs as a separate Python process (isolated mode, -I) in two roles:
# - "supervise" (on the host): becomes a child subreaper, forks the command into a new session and, when the
#   command ends or the host asks it to stop (SIGTERM), kills every descendant, including daemons that called
#   setsid (they are re-parented to the subreaper, not to init). In the rlimit sandbox the child drops to the
#   unprivileged user and applies the rlimits before exec.
# - "drop" (inside the outer bubblewrap, still root there): drops to the unprivileged user, applies the rlimits
#   and execs the inner bubblewrap, which maps that user into a fresh user namespace with no capabilities.
_LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
argv = sys.argv[2:]

def drop():
    uid, gid = cfg.get("uid"), cfg.get("gid")
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)

def limit():
    for name, value in cfg["rlimits"].items():
        which = getattr(resource, name)
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))

if cfg["mode"] == "drop":
    drop()
    limit()
    os.execv(argv[0], argv)

libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER

def tree():
    me, parent = os.getpid(), {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/" + entry + "/stat", "rb") as fh:
                    parent[int(entry)] = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = set(), {me}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in found}
        found |= frontier
    return found

def kill_tree():
    while True:
        for pid in tree():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return

def stop(signum, frame):
    kill_tree()
    os._exit(137)

signal.signal(signal.SIGTERM, stop)
child = os.fork()
if child == 0:
    os.setsid()
    if cfg["mode"] == "supervise-drop":
        drop()
        limit()
    os.execv(argv[0], argv)
_, status = os.waitpid(child, 0)
code = os.waitstatus_to_exitcode(status)
kill_tree()
os._exit(code if code >= 0 else 128 - code)
"""

@dataclass(frozen=True)
class Limits:
    """Resource limits of a sandboxed run (per process; ``nproc`` counts the unprivileged user's processes)."""

    cpu_s: int = 120
    memory_bytes: int = 4 * 1024**3
    file_bytes: int = 64 * 1024**2
    nproc: int = 256

    def as_rlimits(self) -> dict[str, int]:
        return {
            "RLIMIT_CPU": self.cpu_s,
            "RLIMIT_AS": self.memory_bytes,
            "RLIMIT_FSIZE": self.file_bytes,
            "RLIMIT_CORE": 0,
            "RLIMIT_NPROC": self.nproc,
        }


@dataclass(frozen=True)
class PytestRun:
    """Result of one sandboxed pytest run.

    ``junit`` holds the outcomes pytest's own JUnit XML writer reported (a second channel next to the report
    plugin; None when no JUnit file was asked for or it could not be read); ``plugin_exitstatus`` is the exit
    status pytest reported to the plugin, to be compared with the process's real ``exit_code``."""

    outcomes: dict[str, str]
    messages: dict[str, str]
    collect_errors: list[str]
    exit_code: int | None
    timed_out: bool
    duration_s: float
    sandbox: SandboxKind
    report_error: str | None = None
    output_tail: str = field(default="", repr=False)
    junit: dict[str, str] | None = None
    plugin_exitstatus: int | None = None


# Paths inside the bubblewrap sandbox.
BOX_WORKSPACE = "/workspace"
BOX_RUNTIME = "/opt/trajlake-pytest"
BOX_RUNNER = "/opt/trajlake-runner"
BOX_REPORT = "/opt/trajlake-report"
# Host user the sandboxed code runs as when trajlake itself runs as root (``nobody`` on most systems);
# inside the user namespace it appears as SANDBOX_UID.
HOST_UNPRIVILEGED_UID = 65534
SANDBOX_UID = 1000
# pytest and the packages it imports; bound read-only into the sandbox one by one, so no other installed
# package (trajlake's task data and hidden tests among them) is visible.
PYTEST_MODULES = (
    "pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py", "exceptiongroup", "tomli")
OUTPUT_TAIL_BYTES = 4000


def _module_paths() -> list[Path]:
    out: list[Path] = []
    for name in PYTEST_MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        if spec.submodule_search_locations:
            out += [Path(p) for p in spec.submodule_search_locations]
        elif spec.origin and spec.origin not in ("built-in", "frozen"):
            out.append(Path(spec.origin))
    return out


def _interpreter() -> tuple[Path, Path]:
    """The real interpreter binary (not a venv symlink) and the installation prefix holding its stdlib."""
    exe = Path(os.path.realpath(sys.executable))
    return exe, Path(sys.base_prefix).resolve()


def _dirs(path: str, made: set[str]) -> list[str]:
    """bwrap arguments creating the missing ancestors of ``path`` world-traversable (bwrap makes them 0700,
    which the unprivileged user could not enter)."""
    out: list[str] = []
    parts = Path(path).parts
    for i in range(2, len(parts)):
        d = str(Path(*parts[:i]))
        if d not in made:
            made.add(d)
            out += ["--perms", "0755", "--dir", d]
    return out


def _outer_bwrap_args(work: Path, runner: Path, report: Path) -> list[str]:
    """The outer bubblewrap: a fresh mount namespace holding only the system libraries, the interpreter,
    pytest, the workspace and the report folder; private /tmp, /proc, /dev; no network, IPC, UTS, PID or
    cgroup sharing. It runs as the caller; the inner one (see :func:`_inner_bwrap_args`) drops everything."""
    exe = shutil.which("bwrap")
    if exe is None:
        raise RuntimeError("bwrap is not installed")
    args = [exe, "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid", "--unshare-net",
            "--unshare-uts", "--unshare-cgroup-try"]
    if os.geteuid() != 0:
        args.append("--unshare-user")
    made: set[str] = set()
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    if os.path.exists("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    interpreter, prefix = _interpreter()
    for runtime in (prefix, interpreter):
        system = str(runtime).startswith(("/usr/", "/bin/", "/lib")) or str(runtime) == "/usr"
        if not system and (runtime == prefix or not runtime.is_relative_to(prefix)):
            args += [*_dirs(str(runtime), made), "--ro-bind", str(runtime), str(runtime)]
    # hide every site-packages of the interpreter's installation (trajlake may be installed there)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for lib in ("lib", "lib64", "local/lib"):
        for leaf in ("site-packages", "dist-packages"):
            hidden = prefix / lib / version / leaf
            if hidden.is_dir():
                args += ["--tmpfs", str(hidden)]
    if Path("/usr/lib/python3/dist-packages").is_dir():
        args += ["--tmpfs", "/usr/lib/python3/dist-packages"]
    args += [*_dirs(BOX_RUNTIME + "/x", made)]
    for module in _module_paths():
        args += ["--ro-bind", str(module), f"{BOX_RUNTIME}/{module.name}"]
    args += ["--ro-bind", str(runner), BOX_RUNNER, "--bind", str(report), BOX_REPORT]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", str(work), BOX_WORKSPACE,
             "--chdir", BOX_WORKSPACE, "--"]
    return args


def _inner_bwrap_args() -> list[str]:
    """The inner bubblewrap, started as the unprivileged user: a new user namespace mapping that user to a
    non-zero uid, every capability dropped, and fresh namespaces again except the PID namespace: it shares
    the outer one (the kernel refuses a nested /proc mount under bubblewrap's masked /proc)."""
    exe = shutil.which("bwrap") or "/usr/bin/bwrap"
    return [exe, "--unshare-ipc", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--bind", "/", "/", "--proc", "/proc",
            "--dev", "/dev", "--chdir", BOX_WORKSPACE, "--"]


@functools.cache
def _can_drop_unboxed() -> bool:
    """True when we are root and this interpreter still runs after dropping to the unprivileged user (it may
    live under a folder that user cannot enter, e.g. /root/.pyenv): the rlimit sandbox then drops too."""
    if os.geteuid() != 0:
        return False
    config = json.dumps({"mode": "drop", "rlimits": {}, "uid": HOST_UNPRIVILEGED_UID, "gid": HOST_UNPRIVILEGED_UID})
    try:
        proc = subprocess.run([sys.executable, "-I", "-c", _LAUNCHER, config, sys.executable, "-I", "-c",
                               "import pytest"], capture_output=True, timeout=30, check=False, cwd="/")
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def _launch_config(mode: str, limits: Limits) -> str:
    drop = os.geteuid() == 0 and (mode == "drop" or _can_drop_unboxed())
    return json.dumps({"mode": mode, "rlimits": limits.as_rlimits(),
                       "uid": HOST_UNPRIVILEGED_UID if drop else None, "gid": HOST_UNPRIVILEGED_UID if drop else None})


def _launcher(mode: str, limits: Limits, python: str) -> list[str]:
    return [python, "-I", "-c", _LAUNCHER, _launch_config(mode, limits)]


def _hand_over(*paths: Path) -> None:
    """Give the run's folders to the unprivileged user the code runs as (only needed when we are root)."""
    if os.geteuid() != 0:
        return
    for top in paths:
        os.lchown(top, HOST_UNPRIVILEGED_UID, HOST_UNPRIVILEGED_UID)
        for root, dirs, files in os.walk(top):
            for name in (*dirs, *files):
                os.lchown(os.path.join(root, name), HOST_UNPRIVILEGED_UID, HOST_UNPRIVILEGED_UID)


@functools.cache
def bwrap_available() -> bool:
    """True when ``bwrap`` exists and a probe run of the interpreter in the full sandbox (both bubblewrap
    layers, the user drop) works (cached per process)."""
    if shutil.which("bwrap") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="mini-swe-probe-") as tmp:
        probe = Path(tmp)
        for d in ("work", "runner", "report"):
            (probe / d).mkdir()
        _hand_over(probe / "work", probe / "report")
        code = f"open({BOX_WORKSPACE + '/ok'!r}, 'w').write('ok')"
        interpreter, _ = _interpreter()
        command = [*_outer_bwrap_args(probe / "work", probe / "runner", probe / "report"),
                   *_launcher("drop", Limits(), str(interpreter)), *_inner_bwrap_args(),
                   str(interpreter), "-S", "-c", code]
        try:
            proc = subprocess.run(command, capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return False
        return proc.returncode == 0 and (probe / "work" / "ok").exists()


def resolve_sandbox(sandbox: str) -> SandboxKind:
    """The sandbox kind ``sandbox`` (auto, bwrap or rlimit) stands for here; ``auto`` honours
    ``TRAJLAKE_MINI_SWE_SANDBOX`` and otherwise picks bwrap when it works."""
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


_resolve_sandbox = resolve_sandbox  # the name older callers import


def run_pytest(
    workdir: str | Path,
    *,
    timeout_s: float = 60.0,
    sandbox: str = "auto",
    limits: Limits | None = None,
    pytest_args: tuple[str, ...] = (),
    junit: bool = False,
) -> PytestRun:
    """Run ``python -m pytest`` in ``workdir`` (which holds ``pytest.ini``) inside a sandbox.

    ``timeout_s`` bounds the whole run, children included (a child that keeps the output open or daemonises
    is killed with the rest). Output goes to a file the caller reads only the last few KiB of. With ``junit``
    pytest also writes a JUnit XML report whose outcomes come back in :attr:`PytestRun.junit`.

    Never raises for anything the suite does: crashes, timeouts and missing reports are described in the
    returned :class:`PytestRun`.
    """
    work = Path(workdir).resolve()
    kind = resolve_sandbox(sandbox)
    limits = limits or Limits()
    with tempfile.TemporaryDirectory(prefix="mini-swe-run-") as tmp:
        scratch = Path(tmp)
        runner, report_dir, home = scratch / "runner", scratch / "report", scratch / "home"
        for folder in (runner, report_dir, home):
            folder.mkdir()
        (runner / f"{PLUGIN_NAME}.py").write_text(_PLUGIN_SOURCE, encoding="utf-8")
        output_path = scratch / "output.log"
        boxed = kind == "bwrap"
        ws = BOX_WORKSPACE if boxed else str(work)
        rep = BOX_REPORT if boxed else str(report_dir)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": "/tmp" if boxed else str(home),
            "TMPDIR": "/tmp" if boxed else str(home),
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
            "PYTHONPATH": f"{BOX_RUNNER}:{BOX_RUNTIME}" if boxed else str(runner),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            REPORT_ENV: f"{rep}/report.json",
        }
        junit_args = [f"--junitxml={rep}/junit.xml", "-o", "junit_family=xunit2"] if junit else []
        ini = ["-c", f"{ws}/pytest.ini"] if (work / "pytest.ini").is_file() else []
        pytest_tail = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN_NAME, "--rootdir", ws, *ini,
                       "-o", "console_output_style=classic", "--color=no", *junit_args, *pytest_args]
        if boxed:
            interpreter, _ = _interpreter()
            command = [*_launcher("supervise", limits, sys.executable),
                       *_outer_bwrap_args(work, runner, report_dir),
                       *_launcher("drop", limits, str(interpreter)), *_inner_bwrap_args(),
                       str(interpreter), "-S", *pytest_tail]
        else:
            command = [*_launcher("supervise-drop", limits, sys.executable), sys.executable, *pytest_tail]
        if boxed or _can_drop_unboxed():
            _hand_over(work, report_dir, home)
        start = time.monotonic()
        timed_out = False
        with open(output_path, "wb") as out:
            proc = subprocess.Popen(command, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop(proc)
            finally:
                _kill_group(proc)
        duration = time.monotonic() - start
        tail = _read_tail(output_path, OUTPUT_TAIL_BYTES)
        outcomes: dict[str, str] = {}
        messages: dict[str, str] = {}
        collect_errors: list[str] = []
        report_error: str | None = None
        plugin_status: int | None = None
        try:
            data = json.loads(_read_regular(report_dir / "report.json", 16 * 1024**2))
            outcomes = {str(k): str(v) for k, v in data["tests"].items()}
            messages = {str(k): str(v) for k, v in data["messages"].items()}
            collect_errors = [str(e) for e in data["collect_errors"]]
            plugin_status = int(data["exitstatus"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            report_error = f"no pytest report ({type(exc).__name__})"
        junit_outcomes = _read_junit(report_dir / "junit.xml") if junit else None
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
        junit=junit_outcomes,
        plugin_exitstatus=plugin_status,
    )


def _read_regular(path: Path, limit: int) -> str:
    """Text of a regular file (never a FIFO, device or symlink), at most ``limit`` bytes, else OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise OSError(f"{path.name} is larger than {limit} bytes")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _read_tail(path: Path, n: int) -> str:
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - n))
            return fh.read(n).decode("utf-8", "replace")
    except OSError:
        return ""


def junit_address(nodeid: str) -> tuple[str, str]:
    """(classname, name) pytest's JUnit writer gives the test ``nodeid`` (see ``mangle_test_address``)."""
    path, _, rest = nodeid.partition("::")
    names = rest.split("::") if rest else []
    module = path.replace("/", ".").removesuffix(".py") if path.endswith(".py") else path.replace("/", ".")
    parts = [module, *names]
    return ".".join(parts[:-1]), parts[-1]


def _read_junit(path: Path) -> dict[str, str] | None:
    """Outcome per (classname::name) key from pytest's JUnit XML: passed, failed, error, skipped or xfailed."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(_read_regular(path, 64 * 1024**2))
    except (OSError, ET.ParseError):
        return None
    rank = {"passed": 0, "xfailed": 0, "skipped": 1, "failed": 3, "error": 4}
    out: dict[str, str] = {}
    for case in root.iter("testcase"):
        key = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        if case.find("error") is not None:
            outcome = "error"
        elif case.find("failure") is not None:
            outcome = "failed"
        else:
            skipped = case.find("skipped")
            if skipped is not None:
                outcome = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        if key not in out or rank[outcome] > rank[out[key]]:
            out[key] = outcome
    return out


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ask the supervisor to kill its whole tree; kill it outright if it does not exit promptly."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


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
