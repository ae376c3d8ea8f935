"""Golden files of schema v1: every later version of trajlake must keep reading them identically."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trajlake import LakeWriter, connect, open_lake, scan, verify
from trajlake.io.jsonl import ingest_jsonl

GOLDEN = Path(__file__).resolve().parent / "golden" / "v1"


@pytest.fixture
def golden_lake(tmp_path: Path):
    dst = tmp_path / "lake"
    shutil.copytree(GOLDEN / "lake", dst)  # reading creates caches inside a lake: never in the repository
    return open_lake(dst)


def test_golden_lake_reads_and_verifies(golden_lake) -> None:
    expected = json.loads((GOLDEN / "expected.json").read_text())
    rep = verify(golden_lake, strict=True)
    assert rep.ok, rep.problems
    con = connect(golden_lake)
    for table in ("episodes", "turns", "gateway_events"):
        assert con.execute(f"select count(*) from {table}").fetchone() == (expected[table],)
    assert dict(con.execute("select episode_id, content_hash from episodes").fetchall()) == expected["episode_hashes"]
    assert scan(golden_lake, "turns").select("token_ids").collect().height == expected["turns"]


def test_golden_interchange_file_ingests_to_the_same_hashes(tmp_path: Path) -> None:
    expected = json.loads((GOLDEN / "expected.json").read_text())["episode_hashes"]
    lake = open_lake(tmp_path / "fresh", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        summary = ingest_jsonl(w, GOLDEN / "episodes.jsonl")
    assert summary.episodes_written == 8 and summary.tasks_written == 2 and not summary.rejected
    got = dict(connect(lake).execute("select episode_id, content_hash from episodes").fetchall())
    assert got and all(expected[e] == h for e, h in got.items())
