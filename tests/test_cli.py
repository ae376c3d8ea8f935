"""The CLI end to end: formats, exit codes, one-line errors, ingest all-or-nothing."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_episode
from tests.conftest import run_cli as run
from trajlake.io.jsonl import episode_to_json


@pytest.fixture
def lake_dir(tmp_path: Path) -> Path:
    return tmp_path / "lake"


COMMANDS = ["init", "info", "sql", "verify", "compact", "ingest", "schema", "demo", "rollout", "replay", "quickstart",
            "doctor", "eval", "diagnose", "browse", "contamination", "reward-check", "best-of", "train", "proxy", "export",
            "experiment"]


def test_help_for_every_command(capsys) -> None:
    for cmd in COMMANDS:
        code, out, _ = run(capsys, cmd, "--help")
        assert code == 0 and "Usage" in out, cmd


def test_commands_are_registered_in_their_order() -> None:
    """The command files (one per group) register in the order `trajlake --help` has always listed them."""
    import typer

    from trajlake.cli import app

    assert list(typer.main.get_command(app).commands) == COMMANDS  # type: ignore[attr-defined]


def test_demo_info_sql_verify(capsys, lake_dir: Path) -> None:
    code, out, _ = run(capsys, "--lake", str(lake_dir), "demo", "--seeds", "1", "--tasks", "10")
    assert code == 0 and "30 new episode(s)" in out
    code, out, _ = run(capsys, "--lake", str(lake_dir), "info", "--format", "json")
    rows = {r["table"]: r for r in json.loads(out)}
    assert rows["episodes"]["rows"] == 30 and rows["tasks"]["rows"] == 10 and rows["runs"]["rows"] == 3
    assert rows["turns"]["version"] >= 1 and rows["episodes"]["schema_version"] == "1.1"
    code, out, _ = run(capsys, "--lake", str(lake_dir), "info")
    assert "--as-of episodes=" in out
    code, out, _ = run(capsys, "--lake", str(lake_dir), "sql",
                       "select run_id, count(*) as n from episodes group by 1 order by 1", "--format", "csv")
    assert code == 0
    parsed = list(csv.reader(io.StringIO(out)))
    assert parsed == [["run_id", "n"], ["demo-B0", "10"], ["demo-B1", "10"], ["demo-R1", "10"]]
    code, out, _ = run(capsys, "--lake", str(lake_dir), "sql", "select reward_components from episodes limit 1",
                       "-f", "json")
    assert set(json.loads(out)[0]["reward_components"]) == {"resolved", "partial"}
    code, out, _ = run(capsys, "--lake", str(lake_dir), "verify")
    assert code == 0 and out.startswith("OK")
    code, out, _ = run(capsys, "--lake", str(lake_dir), "demo", "--seeds", "1", "--tasks", "10")
    assert "0 new episode(s)" in out  # idempotent


def test_sql_as_of(capsys, lake_dir: Path) -> None:
    run(capsys, "--lake", str(lake_dir), "demo", "--seeds", "1", "--tasks", "3")
    _, out, _ = run(capsys, "--lake", str(lake_dir), "info", "-f", "json")
    pins = ",".join(f"{r['table']}={r['version']}" for r in json.loads(out))
    run(capsys, "--lake", str(lake_dir), "demo", "--seeds", "2", "--tasks", "3")
    _, out, _ = run(capsys, "--lake", str(lake_dir), "sql", "select count(*) as n from episodes", "-f", "json")
    assert json.loads(out) == [{"n": 18}]
    _, out, _ = run(capsys, "--lake", str(lake_dir), "sql", "select count(*) as n from episodes", "--as-of", pins,
                    "-f", "json")
    assert json.loads(out) == [{"n": 9}]


def test_errors_are_one_line_and_nonzero(capsys, tmp_path: Path, lake_dir: Path) -> None:
    code, _, err = run(capsys, "--lake", str(tmp_path / "missing"), "info")
    assert code == 1 and err.count("\n") == 1 and "trajlake init" in err and "Traceback" not in err
    run(capsys, "--lake", str(lake_dir), "init")
    code, _, err = run(capsys, "--lake", str(lake_dir), "sql", "select * from nope")
    assert code == 1 and err.startswith("error:") and err.count("\n") == 1
    code, _, err = run(capsys, "--lake", str(lake_dir), "sql", "select 1", "--as-of", "garbage")
    assert code == 1 and "--as-of" in err


def test_lake_from_environment(tmp_path: Path) -> None:
    env = {"TRAJLAKE_LAKE": str(tmp_path / "envlake"), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "trajlake", "init"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "envlake" / "_trajlake" / "lake.json").exists()


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_ingest_roundtrip_and_reimport(capsys, tmp_path: Path, lake_dir: Path) -> None:
    run(capsys, "--lake", str(lake_dir), "init")
    lines = [json.dumps({"type": "run", "run_id": "run-1", "created_at": "2026-01-01T00:00:00Z", "label": "B0"})]
    for i in range(3):
        ep, turns = make_episode(f"e{i}")
        for t in turns:  # the interchange format lets turns omit what the episode implies
            del t["episode_id"], t["turn_idx"]
        lines.append(episode_to_json(ep, turns))
    f = _jsonl(tmp_path / "in.jsonl", lines)
    code, out, err = run(capsys, "--lake", str(lake_dir), "ingest", str(f), "--format", "trajlake-jsonl")
    assert code == 0, err
    assert "3 episode(s) written" in out and "1 run(s)" in out
    code, out, _ = run(capsys, "--lake", str(lake_dir), "ingest", str(f))
    assert code == 0 and "0 episode(s) written, 3 already present" in out
    _, out, _ = run(capsys, "--lake", str(lake_dir), "sql", "select count(*) as n from turns", "-f", "json")
    assert json.loads(out) == [{"n": 15}]


def test_ingest_bad_line_writes_nothing(capsys, tmp_path: Path, lake_dir: Path) -> None:
    run(capsys, "--lake", str(lake_dir), "init")
    good = episode_to_json(*make_episode("good"))
    ep, turns = make_episode("bad")
    turns[3]["loss_mask"] = [1, 1, 1]
    bad = episode_to_json(ep, turns)
    f = _jsonl(tmp_path / "in.jsonl", [good, bad])
    code, _, err = run(capsys, "--lake", str(lake_dir), "ingest", str(f))
    assert code == 1
    assert f"{f}:2" in err and "episode bad" in err and "turn 3" in err and "loss_mask" in err
    _, out, _ = run(capsys, "--lake", str(lake_dir), "info", "-f", "json")
    assert all(r["rows"] == 0 for r in json.loads(out))
    # --skip-invalid lands the good one, still exits 1
    code, out, err = run(capsys, "--lake", str(lake_dir), "ingest", str(f), "--skip-invalid")
    assert code == 1 and "1 episode(s) written" in out and "1 rejected" in out


@pytest.mark.parametrize("line, needle", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"episode_id": "x"}', "turns"),
    ('{"episode_id": "x", "turns": [], "started_at": "2026-01-01T00:00:00"}', "started_at"),
    ('{"episode_id": "x", "turns": [{"token_ids": ["a"]}]}', "token_ids[0]"),
    ('{"episode_id": "x", "turns": [], "bogus": 1}', "bogus"),
    ('{"type": "weird"}', "unknown line type"),
])
def test_ingest_malformed_lines(capsys, tmp_path: Path, lake_dir: Path, line: str, needle: str) -> None:
    run(capsys, "--lake", str(lake_dir), "init")
    f = _jsonl(tmp_path / "bad.jsonl", [episode_to_json(*make_episode("ok")), line])
    code, _, err = run(capsys, "--lake", str(lake_dir), "ingest", str(f))
    assert code == 1 and f"{f}:2" in err and needle in err, err
    _, out, _ = run(capsys, "--lake", str(lake_dir), "sql", "select count(*) as n from _turns_all", "-f", "json")
    assert json.loads(out) == [{"n": 0}]


def test_verify_exit_code_names_file(capsys, lake_dir: Path) -> None:
    run(capsys, "--lake", str(lake_dir), "demo", "--seeds", "1", "--tasks", "2")
    victim = next((lake_dir / "turns").rglob("*.parquet"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(data)
    code, out, err = run(capsys, "--lake", str(lake_dir), "verify")
    assert code == 1 and victim.name in err and "FAILED" in out


def test_compact_command(capsys, lake_dir: Path) -> None:
    run(capsys, "--lake", str(lake_dir), "demo", "--seeds", "1", "--tasks", "2")
    run(capsys, "--lake", str(lake_dir), "demo", "--seeds", "2", "--tasks", "2")
    code, out, _ = run(capsys, "--lake", str(lake_dir), "compact", "-f", "json")
    assert code == 0
    rows = {r["table"]: r for r in json.loads(out)}
    assert rows["turns"]["files_after"] < rows["turns"]["files_before"]
    assert run(capsys, "--lake", str(lake_dir), "verify")[0] == 0


def test_schema_command(capsys) -> None:
    code, out, _ = run(capsys, "schema", "--table", "turns", "-f", "json")
    cols = {r["column"]: r for r in json.loads(out)}
    assert cols["loss_mask"]["type"] == "list<int8>" and code == 0
    code, out, _ = run(capsys, "schema", "-f", "markdown")
    assert out.startswith("# trajlake schema")
