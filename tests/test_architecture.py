"""The layers: imports point down, never up, and nothing inside the package imports its own facade.

Bottom first (docs/architecture.md): schema and errors; environments (contract, registry, policy interface,
gateway); lake (storage, hashing); record and query; io, evaluators and the trainer's math and data; rollout;
the trainer's loop; the CLI. Every import counts, including the ones inside functions.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: source folder -> the package it installs as (pyproject's package-dir)
PACKAGE_DIRS = {"trajlake": "trajlake", "envs": "trajlake.envs", "evaluators": "trajlake.evaluators",
                "schemas": "trajlake.schemas"}

#: (layer, module prefixes), bottom first. A module belongs to the longest prefix that matches it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("trajlake._version", "trajlake.errors", "trajlake.schemas", "trajlake.schema",
              "trajlake.provenance")),
    ("envs", ("trajlake.envs",)),
    ("lake", ("trajlake.lake",)),
    ("record/query", ("trajlake.record", "trajlake.query")),
    ("io/evaluators/train-data", ("trajlake.io", "trajlake.evaluators", "trajlake.demo", "trajlake.train.math",
                                  "trajlake.train.data",  # the reader's package: selection, stream, samples, collate
                                  # rendering, parsing and exactness checks of LM turns, which the trainer's
                                  # reader re-renders text-only episodes with (they import no policy)
                                  "trajlake.render")),
    ("rollout", ("trajlake.rollout", "trajlake.policies", "trajlake.proxy")),
    ("train-loop", ("trajlake.train",)),
    # the §8 matrix: trains (train-loop), plays (rollout), evaluates and exports (evaluators, io)
    ("experiment", ("trajlake.experiment",)),
    ("cli", ("trajlake.cli", "trajlake.__main__")),
]


def _layer(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for folder, package in PACKAGE_DIRS.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            if "libraries" in rel.parts:  # Mini SWE's task data, not trajlake code
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _imports(path: Path, module: str) -> list[tuple[int, str, str | None]]:
    """(line, imported module, imported name or None) for every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    out: list[tuple[int, str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out += [(node.lineno, target, a.name) for a in node.names]
    return out


def _violations() -> list[str]:
    modules = _modules()
    bad: list[str] = []
    for module, path in sorted(modules.items()):
        if module == "trajlake":  # the facade itself may import everything
            continue
        src = _layer(module)
        assert src is not None, f"{module} ({path}) belongs to no layer: add it to LAYERS and docs/architecture.md"
        for line, target, name in _imports(path, module):
            if target != "trajlake" and not target.startswith("trajlake."):
                continue
            if target == "trajlake":
                sub = f"trajlake.{name}" if name else None
                if sub is None or sub not in modules:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: imports the package facade (trajlake.{name})")
                    continue
                target = sub
            full = f"{target}.{name}" if name and f"{target}.{name}" in modules else target
            dst = _layer(full)
            if dst is not None and dst > src:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {module} ({LAYERS[src][0]}) imports {full} "
                           f"({LAYERS[dst][0]}), a layer above it")
    return bad


def test_imports_point_down_the_layers() -> None:
    bad = _violations()
    assert not bad, "\n".join(bad)


def test_the_check_sees_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is not vacuous: a lake module importing the CLI, or any module importing the facade, fails."""
    fake = tmp_path / "trajlake"
    (fake / "lake").mkdir(parents=True)
    (fake / "cli").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "cli" / "__init__.py").write_text("")
    (fake / "lake" / "__init__.py").write_text("")
    (fake / "lake" / "store.py").write_text("def f():\n    from trajlake.cli import app\n")
    (fake / "lake" / "other.py").write_text("from trajlake import connect\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE_DIRS", {"trajlake": "trajlake"})
    bad = _violations()
    assert any("store.py:2" in b and "a layer above it" in b for b in bad), bad
    assert any("other.py:1" in b and "facade" in b for b in bad), bad


#: Where exception types may be defined: the one module that lists them all.
ERRORS_MODULE = "trajlake.errors"


def _exception_classes_outside_errors() -> list[str]:
    """``file:line: Class`` for every public class outside ``trajlake.errors`` that derives from an exception
    (by a base named ``*Error``, ``*Exception`` or ``Exception``/``BaseException``, directly or through a class of
    the same module). Private control-flow exceptions (``_Name``) may stay where they are used."""
    bad: list[str] = []
    for module, path in sorted(_modules().items()):
        if module == ERRORS_MODULE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        local_exceptions: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in
                     node.bases}
            if any(b.endswith(("Error", "Exception")) or b in local_exceptions for b in bases):
                local_exceptions.add(node.name)
                if not node.name.startswith("_"):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}")
    return bad


def test_exception_types_are_defined_in_one_place() -> None:
    bad = _exception_classes_outside_errors()
    assert not bad, f"define exception types in {ERRORS_MODULE} (re-export them where they are raised):\n" + \
        "\n".join(bad)


def test_the_exception_check_sees_a_stray_exception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "trajlake"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "errors.py").write_text("class TrajlakeError(Exception):\n    pass\n")
    (fake / "thing.py").write_text("from trajlake.errors import TrajlakeError\n\n\nclass ThingError(TrajlakeError):"
                                   "\n    pass\n\n\nclass _Private(Exception):\n    pass\n\n\n"
                                   "class Sub(ThingError):\n    pass\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE_DIRS", {"trajlake": "trajlake"})
    assert _exception_classes_outside_errors() == ["trajlake/thing.py:4: ThingError", "trajlake/thing.py:12: Sub"]


def test_every_exception_type_is_a_trajlake_error() -> None:
    import trajlake.errors as errors

    types = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, BaseException)]
    assert len(types) > 20
    assert all(issubclass(t, errors.TrajlakeError) for t in types), \
        [t.__name__ for t in types if not issubclass(t, errors.TrajlakeError)]
