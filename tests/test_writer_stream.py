"""The writer's streaming commit (issue 16): bounded memory, row groups released as written, exact ids."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trajlake.lake.store as store
import trajlake.record.writer as writer_mod
from tests.conftest import make_episode
from trajlake import ConflictError, Lake, LakeWriter, connect, verify
from trajlake.record import memory
from trajlake.record.validate import conform
from trajlake.record.writer import to_table


def _batch(*ids: str, run: str = "run-1", n_steps: int = 2):
    eps, turns = [], []
    for e in ids:
        ep, tu = make_episode(e, run, n_steps=n_steps)
        eps.append(ep)
        turns += tu
    return eps, turns


def test_background_commits_report_each_episode_once(lake: Lake) -> None:
    # Regression: `self._bg_committed += self._wait_background()` extended the list with itself on every commit.
    w = LakeWriter(lake, max_turn_rows=1, handle_signals=False)
    ids = [f"e{i}" for i in range(8)]
    for e in ids:
        w.write_batch(*_batch(e))  # each one triggers a background commit
    assert sorted(w.flush()) == ids
    w.close()
    assert connect(lake).execute("select count(*) from episodes").fetchone() == (8,)


def test_commit_streams_row_groups_and_holds_at_most_the_budget(lake: Lake, monkeypatch) -> None:
    monkeypatch.setattr(store, "ROW_GROUP_BYTES", 4096)
    monkeypatch.setattr(writer_mod, "ROW_GROUP_BYTES", 4096)
    eps, turns = _batch("x", n_steps=20)
    one = sum(t.nbytes for t in (conform(to_table(eps, "episodes"), "episodes"), conform(to_table(turns, "turns"),
                                                                                           "turns")))
    budget = 3 * one
    w = LakeWriter(lake, max_buffer_bytes=budget, max_age_seconds=3600, handle_signals=False,
                   release_memory_eagerly=False)  # (the pytest process keeps glibc's defaults)
    released: list[int] = []
    real_release = w._release

    def spy(size: int) -> None:
        released.append(size)
        real_release(size)

    monkeypatch.setattr(w, "_release", spy)
    for i in range(12):
        w.write_batch(*_batch(f"e{i:02d}", n_steps=20))
        assert w._bytes + w._inflight <= budget  # the buffer plus what a commit still holds
    w.close()
    commits = lake.versions()["episodes"]
    assert w._inflight == 0 and commits >= 4
    assert len(released) > commits  # released a row group at a time, not once per commit
    rep = verify(lake, strict=True)
    assert rep.ok, rep.problems
    files = lake.files("turns")
    assert any(pq.ParquetFile(lake.abs_path("turns", f.path)).num_row_groups > 1 for f in files)
    con = connect(lake)
    assert con.execute("select count(*), count(distinct episode_id) from turns").fetchone() == (12 * 41, 12)


def test_late_duplicates_and_conflicts_are_filtered_out_of_written_files(lake: Lake) -> None:
    with LakeWriter(lake, handle_signals=False) as a:
        a.write_batch(*_batch("ep-1"))
    # b does not look the ids up early, so only the commit (under the lock) finds ep-1 already committed
    b = LakeWriter(lake, handle_signals=False)
    b.write_batch(*_batch("ep-1", "ep-2"), check_existing=False)
    assert sorted(b.flush()) == ["ep-2"]
    assert b.late_duplicates == ["ep-1"]
    b.close()
    con = connect(lake)
    assert con.execute("select episode_id, count(*) from turns group by 1 order by 1").fetchall() == [
        ("ep-1", 5), ("ep-2", 5)]  # ep-1's turns were not written twice
    c = LakeWriter(lake, handle_signals=False)
    eps, turns = _batch("ep-1", "ep-3")
    eps[0]["reward_total"] = 0.25
    c.write_batch(eps, turns, check_existing=False)
    with pytest.raises(ConflictError, match="ep-1"):
        c.close()
    con = connect(lake)  # a connection reads the table versions of its opening
    assert con.execute("select episode_id, count(*) from turns group by 1 order by 1").fetchall() == [
        ("ep-1", 5), ("ep-2", 5), ("ep-3", 5)]
    assert con.execute("select reward_total from episodes where episode_id = 'ep-1'").fetchone() == (1.0,)
    rep = verify(lake, strict=True)
    assert rep.ok, rep.problems


def test_sink_splits_partitions_rolls_files_and_records_stats(lake: Lake, monkeypatch) -> None:
    import json

    _, turns = _batch("a1", "a2", run="run-a")
    _, turns_b = _batch("b1", run="run-b")
    t = conform(to_table(turns + turns_b, "turns"), "turns")
    t = t.set_column(t.schema.get_field_index("run_id"), "run_id",
                     pa.array(["run-a"] * len(turns) + ["run-b"] * len(turns_b)))
    monkeypatch.setattr(store, "TARGET_FILE_BYTES", t.nbytes // 4)
    monkeypatch.setattr(store, "ROW_GROUP_BYTES", t.nbytes // 8)
    actions = lake.write_files("turns", t)
    parts = sorted({a.partition_values["run_id"] for a in actions})
    assert parts == ["run-a", "run-b"] and len(actions) > 2  # rolled over into several files
    assert sum(json.loads(a.stats)["numRecords"] for a in actions) == t.num_rows
    for a in actions:
        stats = json.loads(a.stats)
        data = pq.read_table(lake.abs_path("turns", a.path))
        assert stats["numRecords"] == data.num_rows
        assert stats["minValues"]["turn_idx"] == min(data["turn_idx"].to_pylist())
        assert stats["maxValues"]["turn_idx"] == max(data["turn_idx"].to_pylist())
    lake.commit("turns", actions)
    # no episode rows were committed, so the rows are visible only in the raw view, partition column restored
    got = connect(lake).execute("select run_id, count(*) from _turns_all group by 1 order by 1").fetchall()
    assert got == [("run-a", len(turns)), ("run-b", len(turns_b))]


def test_small_buffers_release_memory_eagerly_by_default(lake: Lake, monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(memory, "release_large_allocations_eagerly", lambda: calls.append(1))
    LakeWriter(lake, handle_signals=False).close()  # the default buffer: glibc's defaults
    LakeWriter(lake, max_buffer_bytes=64 << 20, handle_signals=False, release_memory_eagerly=False).close()
    assert calls == []
    LakeWriter(lake, max_buffer_bytes=64 << 20, handle_signals=False).close()
    LakeWriter(lake, handle_signals=False, release_memory_eagerly=True).close()
    assert calls == [1, 1]


@pytest.mark.parametrize("user_setting", [None, "262144"])
def test_eager_release_sets_glibcs_mmap_threshold_unless_the_user_did(user_setting: str | None) -> None:
    # in a child process: the setting is process-wide. A 2 MiB block must come from its own mapping (it shows in
    # /proc/self/maps as a new anonymous mapping) after the setting, even once glibc's dynamic threshold was raised
    import subprocess
    import sys

    code = """
import ctypes, sys
from trajlake.record.memory import release_large_allocations_eagerly
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(8 << 20))  # freeing an mmapped block raises the dynamic threshold to 8 MiB
def mapped(p):
    return any(int(lo, 16) <= p < int(hi, 16) and len(line.split()) == 5
               for line in open("/proc/self/maps") for lo, hi in [line.split()[0].split("-")])
before = mapped(libc.malloc(2 << 20))
print(before, release_large_allocations_eagerly(), mapped(libc.malloc(2 << 20)))
"""
    env = {k: v for k, v in __import__("os").environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    if user_setting:
        env["MALLOC_MMAP_THRESHOLD_"] = user_setting
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    # glibc's defaults: the block comes from the heap until trajlake sets the threshold, then from its own mapping;
    # the user's 256 KiB: its own mapping throughout, and trajlake leaves the setting alone
    assert out.split() == (["False", "True", "True"] if user_setting is None else ["True", "False", "True"])
