"""Red-team tests of the SQL surface (issue 9): `trajlake sql` runs one read statement on a locked-down
connection; nothing it is given writes files, attaches databases, reads outside the lake or installs
extensions."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tests.conftest import run_cli
from trajlake import Lake, LakeWriter, open_lake
from trajlake.demo import write_demo
from trajlake.lake.delta_log import DELTA_LOG, log_entry_name
from trajlake.query import connect

pytestmark = pytest.mark.security


@pytest.fixture(scope="module")
def small_lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    lk = open_lake(tmp_path_factory.mktemp("sqlsec") / "lake", create=True)
    with LakeWriter(lk) as w:
        write_demo(w, seeds=1, n_tasks=3)
    return lk


def sql(capsys: pytest.CaptureFixture[str], lake: Lake, query: str) -> tuple[int, str, str]:
    return run_cli(capsys, "--lake", str(lake.root), "sql", query, "--format", "csv")


def episode_count(capsys: pytest.CaptureFixture[str], lake: Lake) -> int:
    code, out, _ = sql(capsys, lake, "SELECT count(*) AS n FROM episodes")
    assert code == 0
    return int(out.strip().splitlines()[-1])


def test_select_still_works(capsys, small_lake) -> None:
    assert episode_count(capsys, small_lake) > 0
    code, out, _ = sql(capsys, small_lake, "DESCRIBE episodes")
    assert code == 0 and "episode_id" in out


def test_copy_to_outside_and_over_lake_files_is_refused(capsys, small_lake, tmp_path) -> None:
    before = episode_count(capsys, small_lake)
    log = small_lake.root / "episodes" / DELTA_LOG / log_entry_name(1)
    data = next((small_lake.root / "episodes").rglob("*.parquet"))
    targets = [tmp_path / "out.csv", log, data, small_lake.root / "new.csv"]
    for target in targets:
        code, _, err = sql(capsys, small_lake, f"COPY (SELECT 1 AS x) TO '{target}' (FORMAT csv)")
        assert code != 0 and len(err.strip().splitlines()) == 1, err
        assert "read statements" in err
    assert not (tmp_path / "out.csv").exists() and not (small_lake.root / "new.csv").exists()
    assert episode_count(capsys, small_lake) == before


@pytest.mark.parametrize("query", [
    "ATTACH '{tmp}/evil.duckdb' AS evil",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "CREATE TABLE t AS SELECT 1",
    "SELECT 1; COPY (SELECT 1) TO '{tmp}/x.csv'",
    "PRAGMA enable_profiling",
    "",
    "   ",
])
def test_non_read_statements_are_refused_with_one_line(capsys, small_lake, tmp_path, query) -> None:
    code, _, err = sql(capsys, small_lake, query.format(tmp=tmp_path))
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and "AttributeError" not in err
    assert list(tmp_path.iterdir()) == []


def test_reading_files_outside_the_lake_is_refused(capsys, small_lake, tmp_path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret-hash:19000::::::\n")
    for query in (f"SELECT * FROM read_text('{secret}')", f"SELECT * FROM read_csv('{secret}')",
                  "SELECT * FROM read_text('/etc/passwd')", "SELECT * FROM read_csv('https://example.com/x.csv')"):
        code, out, _ = sql(capsys, small_lake, query)
        assert code != 0 and "secret-hash" not in out and "root:" not in out, query


def test_locked_configuration_cannot_be_reopened_from_python(small_lake, tmp_path) -> None:
    con = connect(small_lake, read_only=True)
    with pytest.raises(duckdb.Error):
        con.execute("SET enable_external_access = true")
    with pytest.raises(duckdb.Error):
        con.execute(f"SELECT * FROM read_text('{Path('/etc/passwd')}')")
    assert con.execute("SELECT count(*) FROM episodes").fetchone()[0] > 0  # type: ignore[index]
    con.close()


def test_python_default_connection_stays_writable_for_trusted_callers(small_lake) -> None:
    con = connect(small_lake)
    con.execute("CREATE TEMP TABLE scratch AS SELECT 1 AS x")
    con.execute("SET threads = 1")
    assert con.execute("SELECT x FROM scratch").fetchone() == (1,)
    con.close()


# -- round 3 (issue 26) ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("query", [
    "EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{target}' (FORMAT csv, HEADER false)",
    "/* hidden */ explain\nanalyze -- a comment\nCOPY (SELECT 1 AS x) TO '{target}' (FORMAT csv)",
    "EXPLAIN (ANALYZE, FORMAT json) COPY (SELECT 1 AS x) TO '{target}' (FORMAT csv)",
    "EXPLAIN ANALYZE INSTALL httpfs",
    "EXPLAIN ANALYZE LOAD delta",
    "EXPLAIN ANALYZE SET memory_limit = '1GB'",
])
def test_explain_analyze_does_not_run_what_it_explains(capsys, small_lake, query) -> None:
    """EXPLAIN ANALYZE runs its statement: a COPY inside it wrote a forged Delta commit into the lake."""
    before = episode_count(capsys, small_lake)
    target = small_lake.root / "episodes" / DELTA_LOG / log_entry_name(99)
    code, _, err = sql(capsys, small_lake, query.format(target=target))
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert not target.exists()
    assert episode_count(capsys, small_lake) == before


def test_explain_of_a_select_still_works(capsys, small_lake) -> None:
    for query in ("EXPLAIN SELECT count(*) FROM episodes", "EXPLAIN ANALYZE SELECT count(*) FROM episodes",
                  "explain (format json) select 1"):
        code, out, err = sql(capsys, small_lake, query)
        assert code == 0 and out.strip(), (query, err)


def test_community_extensions_are_off_and_a_runaway_query_stops_with_one_line(capsys, small_lake) -> None:
    con = connect(small_lake, read_only=True)
    try:
        assert con.execute("SELECT current_setting('allow_community_extensions')").fetchone() == (False,)
    finally:
        con.close()
    code, _, err = run_cli(capsys, "--lake", str(small_lake.root), "sql", "--timeout", "0.5",
                           "SELECT count(*) FROM range(100000000000) a")
    assert code != 0 and len(err.strip().splitlines()) == 1 and "longer than 0.5 s" in err, err


def test_reward_check_sql_runs_on_a_locked_connection(capsys, small_lake, tmp_path) -> None:
    """`reward-check --reward` SQL ran on an open DuckDB connection: a second statement, or a COPY, wrote files."""
    row = connect(small_lake).execute("SELECT run_id FROM runs LIMIT 1").fetchone()
    assert row is not None
    run = row[0]
    target = tmp_path / "reward.csv"
    for reward in (f"SELECT 1; COPY (SELECT 1 AS x) TO '{target}' (FORMAT csv)",
                   f"SELECT * FROM read_csv('{small_lake.root}/../x.csv')",
                   f"FROM trajectories; COPY (SELECT 1 AS x) TO '{target}'"):
        code, _, err = run_cli(capsys, "--lake", str(small_lake.root), "reward-check", "--run", run, "--reward",
                               reward)
        assert code != 0 and len(err.strip().splitlines()) == 1 and "--reward" in err, err
    assert not target.exists()
    code, out, err = run_cli(capsys, "--lake", str(small_lake.root), "reward-check", "--run", run, "--reward",
                             "SELECT traj_id, count(*) AS reward FROM trajectories GROUP BY traj_id", "--limit", "3")
    assert code == 0 and "wrong" in out.lower(), err


def test_extension_signatures_are_checked_once_per_file_and_always_for_read_only(small_lake, tmp_path,
                                                                                  monkeypatch) -> None:
    """Checking an extension's signature hashes the file (delta's is 82 MB; ~0.4-2 s a connection). A writable
    connection skips the check for a file this process already checked and that has not changed since; a
    read-only one (untrusted SQL) checks every time; a file changed after its check is checked again, and a
    tampered one refused."""
    import shutil

    import trajlake.query as q

    real = q._delta_file()
    copy = tmp_path / real.parent.name / real.name
    copy.parent.mkdir()
    shutil.copyfile(real, copy)
    monkeypatch.setattr(q, "_delta_file", lambda: copy)

    def unsigned_allowed(con: duckdb.DuckDBPyConnection) -> bool:
        return bool(con.execute("SELECT current_setting('allow_unsigned_extensions')").fetchone()[0])

    first, second, locked = connect(small_lake), connect(small_lake), connect(small_lake, read_only=True)
    assert (unsigned_allowed(first), unsigned_allowed(second), unsigned_allowed(locked)) == (False, True, False)
    assert second.execute("SELECT count(*) FROM episodes").fetchone() == first.execute(
        "SELECT count(*) FROM episodes").fetchone()
    with copy.open("r+b") as f:  # one byte of the signature (the file's last 256 bytes)
        f.seek(-100, 2)
        byte = f.read(1)
        f.seek(-100, 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(duckdb.Error, match="signature"):
        connect(small_lake)
