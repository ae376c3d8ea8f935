"""Which code wrote a run: the git commit of a source checkout (and whether its tree was dirty), or, for an
installed package, a hash of the installed files. Recorded as ``runs.code_version``."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

from trajlake._version import __version__

_PACKAGE_DIR = Path(__file__).resolve().parent
_SOURCE_SUFFIXES = (".py", ".json", ".sql", ".ini", ".typed")


def code_version() -> str:
    """``git:<commit>`` (``+dirty`` when tracked files differ from it) for a source checkout, else
    ``pkg:<version>+sha256:<hash of the installed trajlake files>``. ``$TRAJLAKE_CODE_VERSION`` overrides."""
    return os.environ.get("TRAJLAKE_CODE_VERSION") or _detect()


@functools.cache
def _detect() -> str:
    commit = _git_commit(_PACKAGE_DIR.parent)
    if commit is not None:
        return commit
    return f"pkg:{__version__}+sha256:{installed_files_hash()[:16]}"


def _git(root: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _git_commit(root: Path) -> str | None:
    top = _git(root, "rev-parse", "--show-toplevel")
    # only the checkout trajlake itself lives in (an installed package inside some other repository is not)
    if top is None or Path(top).resolve() != root.resolve() or not (root / "pyproject.toml").exists():
        return None
    commit = _git(root, "rev-parse", "HEAD")
    if not commit:
        return None
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    return f"git:{commit}" + ("+dirty" if dirty else "")


@functools.cache
def installed_files_hash() -> str:
    """sha256 over the installed trajlake package's source and data files (paths and bytes, sorted)."""
    h = hashlib.sha256()
    for p in sorted(_PACKAGE_DIR.rglob("*")):
        if p.is_file() and p.suffix in _SOURCE_SUFFIXES and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(_PACKAGE_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


__all__ = ["code_version", "installed_files_hash"]
