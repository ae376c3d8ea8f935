"""The Mini SWE source libraries (data under ``libraries/``) and helpers to slice their test files.

Each library lives in ``libraries/<name>/`` with ``pytest.ini`` (``pythonpath = src``), its code under
``src/`` and its pytest suite under ``tests/test_*.py``. The folder is data, not a Python package.
"""

from __future__ import annotations

import ast
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LIBRARIES_DIR",
    "Library",
    "filter_test_source",
    "find_test_functions",
    "function_key",
    "list_libraries",
    "load_library",
]

LIBRARIES_DIR = Path(__file__).resolve().parent / "libraries"
_SKIP_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


@dataclass(frozen=True)
class Library:
    """One library: its name and the folder holding ``pytest.ini``, ``src/`` and ``tests/``."""

    name: str
    root: Path

    def files(self) -> list[str]:
        """All data files of the library (posix paths relative to the root), sorted."""
        out: list[str] = []
        for path in self.root.rglob("*"):
            rel = path.relative_to(self.root)
            if path.is_file() and not _SKIP_PARTS.intersection(rel.parts) and path.suffix != ".pyc":
                out.append(rel.as_posix())
        return sorted(out)

    def source_files(self) -> list[str]:
        """The library's Python sources under ``src/`` (the files mutators may change)."""
        return [f for f in self.files() if f.startswith("src/") and f.endswith(".py")]

    def test_files(self) -> list[str]:
        """The library's test modules, ``tests/test_*.py``."""
        return [f for f in self.files() if f.startswith("tests/") and Path(f).name.startswith("test_")
                and f.endswith(".py")]

    def read(self, rel: str) -> str:
        """Text of one library file."""
        return (self.root / rel).read_text(encoding="utf-8")

    def commit(self) -> str:
        """Content hash of all library files: sha256 over sorted (path, size, bytes) records."""
        digest = hashlib.sha256(b"trajlake/mini-swe/library/1\n")
        for rel in self.files():
            data = (self.root / rel).read_bytes()
            digest.update(rel.encode() + b"\x00" + str(len(data)).encode() + b"\x00" + data)
        return digest.hexdigest()


def list_libraries(root: Path | None = None) -> list[str]:
    """Names of the libraries available under ``root`` (default: the bundled ``libraries/`` folder)."""
    base = root or LIBRARIES_DIR
    return sorted(p.name for p in base.iterdir() if (p / "pytest.ini").is_file() and (p / "src").is_dir())


def load_library(name: str, root: Path | None = None) -> Library:
    """Return the library called ``name``; raise KeyError when it does not exist."""
    base = root or LIBRARIES_DIR
    path = base / name
    if not (path / "pytest.ini").is_file():
        raise KeyError(f"unknown Mini SWE library {name!r}")
    return Library(name, path)


def function_key(nodeid: str) -> str:
    """Test node id without its parametrisation: ``tests/t.py::test_x[1-2]`` -> ``tests/t.py::test_x``."""
    head, bracket, _ = nodeid.partition("[")
    return head if bracket else nodeid


# CPython 3.11 (up to at least 3.11.7) keeps the AST converter's recursion counter in shared module state, so two
# threads parsing at once can fail with "SystemError: AST constructor recursion depth mismatch" (gh-106905).
# The task builder and checker parse from worker threads; one lock makes that safe and costs microseconds.
_PARSE_LOCK = threading.Lock()


def parse_python(source: str) -> ast.Module:
    """``ast.parse`` that is safe to call from several threads at once."""
    with _PARSE_LOCK:
        return ast.parse(source)


def find_test_functions(source: str, path: str) -> dict[str, tuple[int, int]]:
    """Map ``path::name`` (or ``path::Class::name``) of each test function to its 1-based line span.

    The span includes decorators. Classes named ``Test*`` contribute their ``test*`` methods.
    """
    spans: dict[str, tuple[int, int]] = {}
    tree = parse_python(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            spans[f"{path}::{node.name}"] = _span(node)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test"):
                    spans[f"{path}::{node.name}::{item.name}"] = _span(item)
    return spans


def _span(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[int, int]:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return first, node.end_lineno or node.lineno


def filter_test_source(source: str, path: str, keep: set[str]) -> str:
    """Return the test module with every test function whose key is not in ``keep`` removed.

    Functions are removed by line span, so the remaining code keeps its formatting. A ``Test*`` class
    that loses all of its tests is removed as a whole.
    """
    tree = parse_python(source)
    drop: list[tuple[int, int]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            if f"{path}::{node.name}" not in keep:
                drop.append(_span(node))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            methods = [i for i in node.body if isinstance(i, ast.FunctionDef | ast.AsyncFunctionDef)
                       and i.name.startswith("test")]
            gone = [m for m in methods if f"{path}::{node.name}::{m.name}" not in keep]
            if methods and len(gone) == len(methods):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                drop.append((first, node.end_lineno or node.lineno))
            else:
                drop.extend(_span(m) for m in gone)
    lines = source.splitlines(keepends=True)
    removed: set[int] = set()
    for first, last in drop:
        removed.update(range(first, last + 1))
    kept = [line for number, line in enumerate(lines, start=1) if number not in removed]
    text = "".join(kept)
    while "\n\n\n\n" in text:
        text = text.replace("\n\n\n\n", "\n\n\n")
    return text.rstrip("\n") + "\n"
