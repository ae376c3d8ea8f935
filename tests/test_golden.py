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


def test_a_1_0_lake_is_upgraded_in_place_by_its_first_writer(golden_lake) -> None:
    """Schema 1.1 made success and cost_usd nullable and added columns. A lake written under 1.0 reads the new
    columns as null without being touched; its first 1.1 writer upgrades the Delta schema, and every old row
    keeps its content hash."""
    from tests.conftest import make_episode
    from trajlake.schema import table_def

    expected = json.loads((GOLDEN / "expected.json").read_text())
    con = connect(golden_lake)
    assert con.execute("select count(*) from episodes where served_model is null and policy_lag is null"
                       ).fetchone() == (expected["episodes"],)
    assert "prompt_tokens" in scan(golden_lake, "turns").collect_schema().names()
    before = golden_lake.versions()

    ep, turns = make_episode("ungraded-1", run_id="new-run", success=None, cost_usd=None,
                             served_model="model-2026-01-01", verification_source=None, policy_lag=0)
    for t in turns:
        t["cost_usd"] = None
    with LakeWriter(open_lake(golden_lake.root), handle_signals=False) as w:
        w.write_batch([ep], turns).raise_if_rejected()
    schema = {f.name: f for f in golden_lake.delta("episodes").schema().fields}
    assert schema["success"].nullable and schema["cost_usd"].nullable and "served_model" in schema
    assert all(c.name in schema for c in table_def("episodes").columns)
    assert golden_lake.versions()["episodes"] > before["episodes"]

    rep = verify(golden_lake, strict=True)
    assert rep.ok, rep.problems
    con = connect(golden_lake)
    hashes = dict(con.execute("select episode_id, content_hash from episodes where run_id != 'new-run'").fetchall())
    assert hashes == expected["episode_hashes"]
    assert con.execute("select success, cost_usd, served_model, policy_lag from episodes where run_id = 'new-run'"
                       ).fetchall() == [(None, None, "model-2026-01-01", 0)]


def test_a_file_without_a_column_added_within_its_minor_version_reads_it_as_null(golden_lake) -> None:
    """Presence decides, not the file's version: a 1.1 file written before a column was added within 1.1 (as
    episodes.attack_success was) reads that column as a typed null."""
    import pyarrow.parquet as pq

    from trajlake.schema import PARQUET_SCHEMA_KEY, added_since, table_def

    lk = golden_lake
    f = lk.files("episodes")[0]
    path = lk.abs_path("episodes", f.path)
    t = pq.read_table(path)
    meta = dict(t.schema.metadata or {})
    meta[PARQUET_SCHEMA_KEY] = b"1.1"  # claims 1.1 but lacks every column added since 1.0
    pq.write_table(t.replace_schema_metadata(meta), path)
    read = lk.read_file("episodes", f)
    added = [c.name for c in added_since("episodes", "1.0")]
    assert "attack_success" in added and "policy_lag" in added
    assert read.column_names == table_def("episodes").column_names
    for name in added:
        assert read.column(name).null_count == read.num_rows, name
