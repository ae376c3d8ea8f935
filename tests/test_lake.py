from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import make_episode
from trajlake import (
    SCHEMA_VERSION,
    ConflictError,
    Lake,
    LakeNotFoundError,
    LakeWriter,
    SchemaVersionError,
    TrajlakeError,
    compact,
    connect,
    lake_versions,
    open_lake,
    scan,
    verify,
)
from trajlake.lake.delta_log import (
    DELTA_LOG,
    checkpoint_version,
    log_entry_name,
    log_entry_version,
    version_name,
)
from trajlake.record.validate import conform
from trajlake.record.writer import to_table


def write(lake: Lake, *episodes):
    eps, turns = [], []
    for ep, tu in episodes:
        eps.append(ep)
        turns += tu
    with LakeWriter(lake, handle_signals=False) as w:
        return w.write_batch(eps, turns)


def test_open_missing_lake(tmp_path) -> None:
    with pytest.raises(LakeNotFoundError, match="trajlake init"):
        open_lake(tmp_path / "nope")


def test_same_episode_twice_is_noop(lake: Lake) -> None:
    r1 = write(lake, make_episode())
    v = lake.versions()
    r2 = write(lake, make_episode())
    assert r1.accepted == ["ep-1"] and r2.duplicates == ["ep-1"] and not r2.accepted
    assert lake.versions() == v  # nothing committed
    assert connect(lake).execute("select count(*) from episodes").fetchone() == (1,)


def test_same_id_different_content_is_rejected(lake: Lake) -> None:
    write(lake, make_episode())
    r = write(lake, make_episode(reward_total=0.5))
    assert "ep-1" in r.rejected and "different content" in str(r.rejected["ep-1"][0])
    assert connect(lake).execute("select reward_total from episodes").fetchall() == [(1.0,)]


def test_time_travel(lake: Lake) -> None:
    write(lake, make_episode("a"))
    v1 = lake.versions()
    write(lake, make_episode("b"))
    con_old = connect(lake, v1)
    assert con_old.execute("select list(episode_id order by episode_id) from episodes").fetchone() == (["a"],)
    assert con_old.execute("select count(distinct episode_id) from turns").fetchone() == (1,)
    assert lake_versions(con_old) == v1
    pins = ",".join(f"{k}={v}" for k, v in v1.items())
    assert connect(lake, pins).execute("select count(*) from episodes").fetchone() == (1,)
    assert connect(lake).execute("select count(*) from episodes").fetchone() == (2,)
    assert scan(lake, "episodes", v1).collect().height == 1
    assert scan(lake, "turns").collect().height == 10
    with pytest.raises(TrajlakeError, match="versions 0"):
        connect(lake, "episodes=99")
    with pytest.raises(TrajlakeError, match="neither"):
        connect(lake, "yesterday")


def _orphan_turns(lake: Lake, episode_id: str) -> None:
    _, turns = make_episode(episode_id)
    t = conform(to_table(turns, "turns"), "turns")
    t = t.set_column(t.schema.get_field_index("run_id"), "run_id", pa.array(["run-1"] * t.num_rows))
    from trajlake.lake.hashing import hash_rows

    t = t.set_column(t.schema.get_field_index("content_hash"), "content_hash", pa.array(hash_rows(t, "turns")))
    import datetime as dt

    t = t.set_column(t.schema.get_field_index("written_at"), "written_at",
                     pa.array([dt.datetime.now(dt.UTC)] * t.num_rows, pa.timestamp("us", tz="UTC")))
    lake.append("turns", t)


def test_commit_point_hides_orphans_and_compact_removes_them(lake: Lake) -> None:
    write(lake, make_episode("a"))
    _orphan_turns(lake, "crashed")
    con = connect(lake)
    assert con.execute("select count(distinct episode_id) from turns").fetchone() == (1,)
    assert con.execute("select count(*) from turns_uncommitted").fetchone() == (5,)
    rep = verify(lake)
    assert rep.ok and rep.orphan_episodes == ["crashed"] and "uncommitted" in rep.notes[0]
    assert not verify(lake, strict=True).ok
    # within the grace period compaction leaves them (their writer may be committing)
    assert compact(lake, orphan_grace_hours=1.0).orphan_rows_removed == 0
    rep = compact(lake, orphan_grace_hours=0.0)
    assert rep.orphan_rows_removed == 5
    assert verify(lake, strict=True).ok
    assert connect(lake).execute("select count(*) from _turns_all").fetchone() == (5,)


def test_compact_merges_files_and_keeps_pinned_versions_readable(lake: Lake) -> None:
    for i in range(6):
        write(lake, make_episode(f"e{i}"))
    before = lake.versions()
    n_files = len(lake.files("turns"))
    rep = compact(lake, retention_hours=168)
    assert n_files == 6 and len(lake.files("turns")) == 1 and rep.files_after["episodes"] == 1
    assert connect(lake).execute("select count(*) from turns").fetchone() == (30,)
    old = connect(lake, before)  # retention keeps the removed files for the old version
    assert old.execute("select count(*) from turns").fetchone() == (30,)
    assert verify(lake).ok
    # vacuum with zero retention drops the old files: the old version is no longer readable
    compact(lake, retention_hours=0)
    assert connect(lake).execute("select count(*) from turns").fetchone() == (30,)


def test_flipped_byte_is_detected_and_named(lake: Lake) -> None:
    write(lake, make_episode("a", n_steps=30))
    (f,) = lake.files("turns")
    path = lake.abs_path("turns", f.path)
    data = bytearray(Path(path).read_bytes())
    for pos in (len(data) // 3, len(data) // 2, 4 + 40):
        corrupt = bytearray(data)
        corrupt[pos] ^= 0x01
        Path(path).write_bytes(corrupt)
        rep = verify(lake)
        assert not rep.ok, f"flip at {pos} went unnoticed"
        assert any(f.path in p for p in rep.problems), rep.problems
    Path(path).write_bytes(data)
    assert verify(lake).ok


def test_missing_data_file_is_named(lake: Lake) -> None:
    write(lake, make_episode("a"))
    (f,) = lake.files("episodes")
    os.remove(lake.abs_path("episodes", f.path))
    rep = verify(lake)
    assert not rep.ok and "missing" in rep.problems[0] and f.path in rep.problems[0]


def test_tampered_value_fails_hash_check(lake: Lake) -> None:
    write(lake, make_episode("a"))
    (f,) = lake.files("episodes")
    path = lake.abs_path("episodes", f.path)
    t = pq.read_table(path)
    t = t.set_column(t.schema.get_field_index("reward_total"), "reward_total", pa.array([42.0]))
    pq.write_table(t, path)
    rep = verify(lake)
    assert not rep.ok and "checksum mismatch" in rep.problems[0]
    assert any("episode a" in p and "content_hash mismatch" in p for p in rep.problems), rep.problems


def test_future_major_version_refused(lake: Lake) -> None:
    meta = lake.meta_dir / "lake.json"
    info = json.loads(meta.read_text())
    info["schema_version"] = "2.0"
    meta.write_text(json.dumps(info))
    with pytest.raises(SchemaVersionError, match="major version 2"):
        open_lake(lake.root)


def test_future_major_version_in_data_file_refused(lake: Lake) -> None:
    write(lake, make_episode("a"))
    (f,) = lake.files("episodes")
    path = lake.abs_path("episodes", f.path)
    t = pq.read_table(path)
    md = dict(t.schema.metadata)
    md[b"trajlake.schema_version"] = b"2.0"
    pq.write_table(t.replace_schema_metadata(md), path)
    with pytest.raises(SchemaVersionError):
        lake.read_file("episodes", f)
    rep = verify(lake)
    assert not rep.ok and any("major version 2" in p for p in rep.problems), rep.problems


def test_data_files_record_schema_version_and_avoid_dictionary_on_lists(lake: Lake) -> None:
    write(lake, make_episode("a"))
    (f,) = lake.files("turns")
    pf = pq.ParquetFile(lake.abs_path("turns", f.path))
    assert pf.schema_arrow.metadata[b"trajlake.schema_version"] == SCHEMA_VERSION.encode() == b"1.1"
    rg = pf.metadata.row_group(0)
    encodings = {rg.column(i).path_in_schema: rg.column(i).encodings for i in range(rg.num_columns)}
    assert not any("DICTIONARY" in e for e in encodings["token_ids.list.element"])
    assert rg.column(0).compression == "ZSTD"


def test_tasks_and_runs_are_keyed(lake: Lake) -> None:
    import datetime as dt

    run = {"run_id": "r", "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "label": "B0"}
    with LakeWriter(lake, handle_signals=False) as w:
        assert w.write_runs([run]) == 1
        assert w.write_runs([run]) == 0
        with pytest.raises(ConflictError):
            w.write_runs([{**run, "label": "B1"}])
    assert connect(lake).execute("select count(*) from runs").fetchone() == (1,)


def test_writer_buffers_and_flushes_by_size_and_age(lake: Lake) -> None:
    w = LakeWriter(lake, max_turn_rows=12, max_age_seconds=3600, handle_signals=False)
    w.write_batch(*[[x] if isinstance(x, dict) else x for x in make_episode("a")])
    assert lake.versions()["episodes"] == 0  # buffered
    w.write_batch(*[[x] if isinstance(x, dict) else x for x in make_episode("b")])
    w.write_batch(*[[x] if isinstance(x, dict) else x for x in make_episode("c")])  # 15 turn rows >= 12
    assert w._wait_background() == ["a", "b", "c"]  # the automatic flush commits on a background thread
    assert lake.versions()["episodes"] == 1
    w.max_age_seconds = 0.0
    time.sleep(0.01)
    w.write_batch(*[[x] if isinstance(x, dict) else x for x in make_episode("d")])
    assert w.flush() == ["d"]
    assert lake.versions()["episodes"] == 2
    w.close()
    assert connect(lake).execute("select count(*) from episodes").fetchone() == (4,)


def test_extension_directory_is_inside_the_lake(lake: Lake) -> None:
    con = connect(lake)
    (d,) = con.execute("select current_setting('extension_directory')").fetchone()
    assert d.startswith(str(lake.root))
    assert con.execute("select current_setting('autoinstall_known_extensions')").fetchone() == (False,)


def test_background_commit_failure_surfaces(lake: Lake, monkeypatch) -> None:
    w = LakeWriter(lake, max_turn_rows=1, handle_signals=False)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(lake, "write_files", boom)
    ep, turns = make_episode("a")
    w.write_batch([ep], turns)  # triggers a background commit that fails
    with pytest.raises(TrajlakeError, match="disk full"):
        w.flush()
    monkeypatch.undo()
    assert connect(lake).execute("select count(*) from episodes").fetchone() == (0,)


def test_expired_log_entries_are_cleaned_up_with_checkpoints_only(lake: Lake, monkeypatch) -> None:
    # delta-rs's clean-up lists the whole log, so trajlake asks for it only where a checkpoint is written; with a
    # zero retention every entry a checkpoint covers must still go then (and the table stay readable)
    import deltalake

    lake.delta("runs").alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds",
                                                   "delta.checkpointInterval": "5"})
    hooks: list[tuple[int, bool]] = []
    original = deltalake.DeltaTable.create_write_transaction

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        hooks.append((self.version() + 1, kwargs["post_commithook_properties"].cleanup_expired_logs))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(deltalake.DeltaTable, "create_write_transaction", spy)
    log = lake.root / "runs" / DELTA_LOG
    with LakeWriter(lake, handle_signals=False) as w:
        for i in range(11):  # versions 2..12: compare-and-swap commits, and plain ones through Lake.commit
            if i % 2 == 0:
                w.write_runs([{"run_id": f"r{i}", "created_at": dt.datetime(2026, 3, 1, tzinfo=dt.UTC),
                               "label": "r", "policy_name": "p", "policy_version": "1"}])
            else:
                _f, stored = next(iter(lake.iter_tables("runs")))
                row = stored.slice(0, 1).set_column(stored.schema.get_field_index("run_id"), "run_id",
                                                    pa.array([f"r{i}"]))
                lake.commit("runs", lake.write_files("runs", row))
            entries = sorted(v for p in log.glob("*.json") if (v := log_entry_version(p.name)) is not None)
            v = lake.versions()["runs"]
            if v >= 4:  # the checkpoint of version 4 (and 9) covers every older entry: they are gone
                assert entries[0] == (v + 1) // 5 * 5 - 1, (v, entries)
    assert [v for v, cleanup in hooks if cleanup] == [4, 9]
    assert sorted(v for v, _ in hooks) == list(range(2, 13))
    assert (log / f"{version_name(9)}.checkpoint.parquet").exists()
    assert connect(lake).execute("select count(*) from runs").fetchone() == (11,)


def test_log_entry_names_are_the_ones_delta_rs_writes(lake: Lake) -> None:
    assert log_entry_name(7) == "00000000000000000007.json" and version_name(7) == "00000000000000000007"
    on_disk = sorted(p.name for p in (lake.root / "episodes" / DELTA_LOG).iterdir())
    assert on_disk[0] == log_entry_name(0)
    assert [log_entry_version(n) for n in on_disk if n.endswith(".json")] == list(range(lake.versions()["episodes"] + 1))
    assert log_entry_version("00000000000000000009.checkpoint.parquet") is None
    assert log_entry_version("_commit_1234.json.tmp") is None and log_entry_version("7.json") is None
    assert checkpoint_version("00000000000000000009.checkpoint.parquet") == 9
    assert checkpoint_version("00000000000000000019.checkpoint.0000000001.0000000002.parquet") == 19
    assert checkpoint_version(log_entry_name(9)) is None


def test_commit_rewritten_replaces_live_files_or_leaves_nothing_behind(lake: Lake, monkeypatch) -> None:
    from deltalake.transaction import RemoveAction

    from trajlake.lake.store import ConcurrentChangeError

    with LakeWriter(lake, handle_signals=False) as w:
        w.write_runs([{"run_id": "r1", "created_at": dt.datetime(2026, 3, 1, tzinfo=dt.UTC), "label": "r",
                       "policy_name": "p", "policy_version": "1"}])
    (old,) = lake.files("runs")
    _f, rows = next(iter(lake.iter_tables("runs")))

    def remove(path: str) -> RemoveAction:
        return RemoveAction(path, False, int(time.time() * 1000), old.size, old.partition_values)

    def exists(adds: list) -> list[bool]:
        return [os.path.exists(lake.abs_path("runs", a.path)) for a in adds]

    adds = lake.write_files("runs", rows)
    with pytest.raises(ConcurrentChangeError):  # a removed file is no longer live: nothing committed
        lake.commit_rewritten("runs", [remove("gone.parquet")], adds)
    assert exists(adds) == [False] and lake.files("runs") == [old]
    # an error that does not say the commit failed leaves the files, unless the caller says it does
    monkeypatch.setattr(lake, "commit", lambda *a, **k: (_ for _ in ()).throw(OSError("lost connection")))
    for clean_up_on, kept in ((TrajlakeError, [True]), (BaseException, [False])):
        adds = lake.write_files("runs", rows)
        with pytest.raises(OSError):
            lake.commit_rewritten("runs", [remove(old.path)], adds, clean_up_on=clean_up_on)
        assert exists(adds) == kept
    monkeypatch.undo()
    adds = lake.write_files("runs", rows)
    assert lake.commit_rewritten("runs", [remove(old.path)], adds) == lake.versions()["runs"]
    assert [f.path for f in lake.files("runs")] == [a.path for a in adds]
    assert connect(lake).execute("select run_id from runs").fetchall() == [("r1",)]


def test_commit_path_sees_another_lake_objects_commits(lake: Lake) -> None:
    # the commit path skips refreshing its cached table while the next log entry does not exist (a stat instead
    # of a listing): a commit by anyone else must still be seen, and a compare-and-swap on the old version fail
    other = Lake.open(lake.location)
    version, _ = lake.latest_snapshot("episodes")
    assert lake.latest_snapshot("episodes")[0] == version  # nothing new: no refresh needed, same answer
    write(Lake.open(lake.location), make_episode("x"))
    assert other.latest_snapshot("episodes")[0] == version + 1
    newer, acts = lake.latest_snapshot("episodes")
    assert newer == version + 1 and acts.num_rows == 1
    ep = conform(to_table([make_episode("y")[0]], "episodes"), "episodes")
    assert lake.commit_if_unchanged("episodes", lake.write_files("episodes", ep), version) is None


def test_a_lake_argument_is_a_lake_a_path_or_a_uri(tmp_path: Path) -> None:
    """``as_lake`` opens a path (never creating one) and passes an open lake through; ``lake_location`` names an
    open lake by its location and a path as given."""
    from trajlake.lake.store import as_lake, lake_location

    opened = Lake.init(tmp_path / "lk")
    assert as_lake(opened) is opened
    assert as_lake(tmp_path / "lk").location == opened.location == as_lake(str(tmp_path / "lk")).location
    assert lake_location(opened) == opened.location
    assert lake_location(tmp_path / "lk") == str(tmp_path / "lk") and lake_location("rel/lake") == "rel/lake"
    with pytest.raises(LakeNotFoundError):
        as_lake(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
