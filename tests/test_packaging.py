"""Packaging: envs/ and evaluators/ ship as trajlake.envs / trajlake.evaluators, never as top-level names."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed() -> None:
    cfg = _config()
    listed = set(cfg["packages"])
    for dotted, folder in cfg["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([dotted, *rel.parts]) if rel.parts else dotted
            if "libraries" in rel.parts:  # Mini SWE's task libraries are data, not packages of trajlake
                continue
            assert name in listed, f"{init.parent} is a package but {name} is missing from pyproject packages"


def test_no_generic_top_level_names(tmp_path: Path) -> None:
    code = ("import importlib.util as u, trajlake.envs, trajlake.evaluators, trajlake.schemas;"
            "print(u.find_spec('envs') is None, u.find_spec('evaluators') is None, u.find_spec('schemas') is None)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True"]


@pytest.mark.slow
def test_wheel_layout(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path), str(ROOT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = tmp_path.glob("trajlake-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"trajlake"}, tops
    assert "trajlake/envs/__init__.py" in names and "trajlake/evaluators/__init__.py" in names
    # the packaged table definitions are the repository's, byte for byte (an editable install cannot show this)
    with zipfile.ZipFile(whl) as z:
        for table in ("episodes", "turns", "tasks", "runs", "gateway_events"):
            assert z.read(f"trajlake/schemas/{table}.v1.json") == (ROOT / "schemas" / f"{table}.v1.json").read_bytes()
        assert z.read("trajlake/schemas/vocab.py") == (ROOT / "schemas" / "vocab.py").read_bytes()
        assert "trajlake/envs/mini_swe/tasks.json" in names and "trajlake/evaluators/taxonomy.sql" in names
