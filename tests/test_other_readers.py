"""Other engines read the lake's tables straight from the Delta log, with no trajlake code: Polars
(``read_delta``/``scan_delta``), DuckDB's own ``delta`` extension (from its PyPI package) and pyarrow through
delta-rs. They must see the rows ``trajlake sql`` sees, given the two rules docs/scale.md states: read through the
log (never a glob), and keep turns/gateway events whose episode row exists (the commit point)."""

from __future__ import annotations

import pathlib
import shutil
from pathlib import Path

import deltalake
import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import make_episode, run_cli
from trajlake import Lake, LakeWriter, open_lake
from trajlake.demo import write_demo

TABLES = ("episodes", "turns", "tasks", "runs", "gateway_events")


@pytest.fixture(scope="module")
def lake_with_orphan(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    """A demo lake, plus the turns of an episode whose episode row was never committed (a writer that died
    between its two commits) and a compaction's leftovers (removed files still on disk)."""
    lk = open_lake(tmp_path_factory.mktemp("readers") / "lake", create=True)
    with LakeWriter(lk, handle_signals=False) as w:
        write_demo(w, seeds=1, n_tasks=6)
    with LakeWriter(lk, handle_signals=False) as w:  # a second commit, so the pinned version below differs
        for i in range(3):
            ep, turns = make_episode(f"late-{i}", run_id="run-late")
            w.write_batch([ep], turns)
    d = deltalake.DeltaTable(lk.table_uri("turns"))
    some = pa.table(d.to_pyarrow_dataset().head(3))
    orphan = some.set_column(some.schema.get_field_index("episode_id"), "episode_id",
                             pa.array(["orphan-episode"] * some.num_rows, pa.string()))
    lk.append("turns", orphan)
    return lk


def _sql_count(capsys: pytest.CaptureFixture[str], lk: Lake, table: str) -> int:
    code, out, err = run_cli(capsys, "sql", "--lake", str(lk.root), "-f", "csv", f"select count(*) from {table}")
    assert code == 0, err
    return int(out.strip().splitlines()[-1])


def _duckdb() -> duckdb.DuckDBPyConnection:
    """DuckDB with the delta extension loaded from the duckdb-extension-delta package (no download)."""
    import duckdb_extension_delta

    con = duckdb.connect(config={"autoinstall_known_extensions": False})
    version = con.sql("PRAGMA version").fetchone()
    assert version is not None
    ext = pathlib.Path(duckdb_extension_delta.__file__).parent / "extensions" / version[0] / "delta.duckdb_extension"
    con.execute(f"LOAD '{ext}'")
    return con


def test_polars_duckdb_and_pyarrow_read_what_trajlake_sql_reads(
        lake_with_orphan: Lake, capsys: pytest.CaptureFixture[str]) -> None:
    root = lake_with_orphan.root
    con = _duckdb()
    episodes = pl.read_delta(str(root / "episodes"))
    committed = set(episodes["episode_id"].to_list())
    assert len(committed) == episodes.height > 0
    for table in TABLES:
        path = str(root / table)
        expected = _sql_count(capsys, lake_with_orphan, table)
        polars_df = pl.read_delta(path)
        duck = con.execute(f"SELECT * FROM delta_scan('{path}')").arrow().read_all()
        arrow = deltalake.DeltaTable(path).to_pyarrow_dataset().to_table()
        if table in ("turns", "gateway_events"):
            # the commit point: rows count once their episode row exists
            polars_df = polars_df.filter(pl.col("episode_id").is_in(list(committed)))
            duck = duck.filter(pc.is_in(duck["episode_id"], value_set=pa.array(sorted(committed))))
            arrow = arrow.filter(pc.is_in(arrow["episode_id"], value_set=pa.array(sorted(committed))))
        assert polars_df.height == duck.num_rows == arrow.num_rows == expected, table
        # the partition column (absent from the data files) is restored from the log by every reader
        if table in ("episodes", "turns", "gateway_events") and expected:
            assert polars_df["run_id"].null_count() == 0
            assert set(polars_df["run_id"].unique().to_list()) == set(duck["run_id"].to_pylist())
    # the orphan is in the raw table and only there
    raw_turns = pl.scan_delta(str(root / "turns")).filter(pl.col("episode_id") == "orphan-episode").collect()
    assert raw_turns.height == 3
    assert _sql_count(capsys, lake_with_orphan, "turns_uncommitted") == 3


def test_other_readers_agree_on_values_and_versions(lake_with_orphan: Lake,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    root = lake_with_orphan.root
    code, out, err = run_cli(capsys, "sql", "--lake", str(root), "-f", "csv",
                             "select run_id, count(*), sum(n_turns), sum(n_policy_tokens), sum(reward_total) "
                             "from episodes group by run_id order by run_id")
    assert code == 0, err
    expected = [line.split(",") for line in out.strip().splitlines()[1:]]
    got = (pl.scan_delta(str(root / "episodes")).group_by("run_id")
           .agg(pl.len(), pl.col("n_turns").sum(), pl.col("n_policy_tokens").sum(), pl.col("reward_total").sum())
           .sort("run_id").collect())
    assert [r[0] for r in expected] == got["run_id"].to_list()
    for row, (run, n, turns, tokens, reward) in zip(expected, got.iter_rows(), strict=True):
        assert (int(row[1]), int(row[2]), int(row[3])) == (n, turns, tokens), run
        assert float(row[4]) == pytest.approx(reward)
    # token-level columns too: summed loss masks over committed turns
    con = _duckdb()
    path = str(root / "turns")
    masked = con.execute(
        f"SELECT sum(list_sum(loss_mask)) FROM delta_scan('{path}') t "
        f"WHERE episode_id IN (SELECT episode_id FROM delta_scan('{root / 'episodes'}'))").fetchone()
    code, out, err = run_cli(capsys, "sql", "--lake", str(root), "-f", "csv",
                             "select sum(list_sum(loss_mask)) from turns")
    assert code == 0, err
    assert masked is not None and int(out.strip().splitlines()[-1]) == int(masked[0])
    # time travel: version 1 of episodes is the first commit, pinned the same way everywhere
    code, out, err = run_cli(capsys, "sql", "--lake", str(root), "--as-of", "episodes=1", "-f", "csv",
                             "select count(*) from episodes")
    assert code == 0, err
    at_v1 = int(out.strip().splitlines()[-1])
    assert 0 < at_v1 < pl.read_delta(str(root / "episodes")).height
    assert pl.read_delta(str(root / "episodes"), version=1).height == at_v1
    assert con.execute(f"SELECT count(*) FROM delta_scan('{root / 'episodes'}', version=1)").fetchone() == (at_v1,)
    assert deltalake.DeltaTable(str(root / "episodes"), version=1).to_pyarrow_dataset().count_rows() == at_v1


def test_readers_follow_the_log_after_compaction(lake_with_orphan: Lake, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """After compaction the removed files stay on disk until vacuum: a glob double-counts, the log does not."""
    root = tmp_path / "copy"
    shutil.copytree(lake_with_orphan.root, root)
    before = _sql_count(capsys, Lake.open(root), "episodes")
    code, _, err = run_cli(capsys, "compact", "--lake", str(root), "--retention-hours", "1000")
    assert code == 0, err
    globbed = sum(pq.ParquetFile(f).metadata.num_rows for f in (root / "episodes").rglob("*.parquet"))
    assert globbed > before  # the old small files and the merged one are both on disk
    assert pl.read_delta(str(root / "episodes")).height == before == _sql_count(capsys, Lake.open(root), "episodes")
