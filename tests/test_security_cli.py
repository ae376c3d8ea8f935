"""Red-team tests of the CLI's input handling (issue 9): each bad input gets one line in the project's words and
a non-zero exit, and nothing is created on the way."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.security


@pytest.fixture
def lake_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    lake = tmp_path / "lake"
    code, _, _ = run_cli(capsys, "--lake", str(lake), "init")
    assert code == 0
    return lake


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, _, err = run_cli(capsys, *args)
    lines = err.strip().splitlines()
    assert code != 0, args
    assert len(lines) == 1 and lines[0].startswith("error"), err
    assert "Traceback" not in err and "Errno" not in err, err
    return lines[0]


@pytest.mark.parametrize("args", [
    ["rollout", "--seeds", "0-99999999999", "--no-preflight"],
    ["rollout", "--seeds=-3", "--no-preflight"],
    ["compact", "--orphan-grace-hours", "-1"],
    ["compact", "--retention-hours", "-1"],
    ["sql", ""],
])
def test_bad_numbers_and_empty_sql_are_one_line_errors(capsys, lake_dir, args) -> None:
    refused(capsys, "--lake", str(lake_dir), *args)


def test_zero_workers_is_refused(capsys, lake_dir) -> None:
    code, _, err = run_cli(capsys, "--lake", str(lake_dir), "rollout", "--workers", "0", "--no-preflight")
    assert code != 0 and "--workers" in err and "Traceback" not in err


def test_init_on_a_file_names_the_problem(capsys, tmp_path) -> None:
    target = tmp_path / "a-file"
    target.write_text("not a lake")
    line = refused(capsys, "--lake", str(target), "init")
    assert "is a file" in line
    assert target.read_text() == "not a lake"


def test_export_into_an_impossible_folder_is_one_line(capsys, lake_dir) -> None:
    line = refused(capsys, "--lake", str(lake_dir), "export", "hf", "--out", "/proc/trajlake-x")
    assert "--out" in line


def test_browse_does_not_create_a_folder_tree(capsys, lake_dir, tmp_path) -> None:
    out = tmp_path / "missing" / "deeper" / "x.html"
    line = refused(capsys, "--lake", str(lake_dir), "browse", "--out", str(out))
    assert "does not exist" in line
    assert not (tmp_path / "missing").exists()


def test_rollout_refuses_to_run_unisolated_without_the_opt_in(capsys, lake_dir, monkeypatch) -> None:
    monkeypatch.setenv("TRAJLAKE_MINI_SWE_SANDBOX", "rlimit")  # as on a machine without bubblewrap
    monkeypatch.delenv("TRAJLAKE_ALLOW_UNISOLATED", raising=False)
    # a model's policy (the scripted ones are trusted and fall back with a warning: test_security.py)
    line = refused(capsys, "--lake", str(lake_dir), "rollout", "--seeds", "0", "--policy", "openai:m",
                   "--policy-arg", "base_url=http://127.0.0.1:9/v1")
    assert "--allow-unisolated" in line and "nothing was written" in line
