"""Concurrent writers without a shared lock (object storage, or writers on different machines): the episodes
commit is a compare-and-swap on the Delta log, so two writers racing with one episode id commit it once, and
concurrent ``PolicyVersions.publish`` calls lose no label."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import trajlake.lake.commit as lake_commit
from tests.conftest import make_episode
from tests.s3_server import S3Server
from trajlake import ConflictError, Lake, LakeWriter, TrajlakeError, connect, open_lake, verify
from trajlake.rollout.versions import PolicyVersions

REPO = Path(__file__).resolve().parents[1]


def _event(episode_id: str, turn_idx: int, k: int) -> dict[str, Any]:
    return {"episode_id": episode_id, "turn_idx": turn_idx, "event_idx": k, "tool": "read_file",
            "capability": "read", "args_hash": "0" * 64, "decision": "allow", "reason": "ok", "executed": True,
            "side_effect_class": "read", "taint": [], "at": dt.datetime(2026, 3, 1, tzinfo=dt.UTC)}


def _batch(*ids: str, **overrides: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    eps, turns, events = [], [], []
    for e in ids:
        ep, tu = make_episode(e, "run-1", n_steps=2, **overrides)
        eps.append(ep)
        turns += tu
        events += [_event(e, 1, 0), _event(e, 3, 0)]
    return eps, turns, events


@contextlib.contextmanager
def _no_commit_lock() -> Iterator[None]:
    yield


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def any_lake(request: pytest.FixtureRequest, tmp_path: Path) -> Lake:
    if request.param == "local":
        return open_lake(tmp_path / "lake", create=True)
    uri = request.getfixturevalue("s3_lake_uri")
    return Lake.init(uri)


def _race_before_episodes_commit(monkeypatch: pytest.MonkeyPatch, loser: LakeWriter, intruder: Any,
                                 lose_the_put: bool = False) -> list[int]:
    """Make ``intruder()`` run once between ``loser``'s duplicate check and its episodes commit (the window a
    writer on another machine can commit in); returns the loser's commit_if_unchanged results, in order.
    ``lose_the_put``: the loser's first try does not refresh the table (as if the intruder committed between
    its refresh and its put), so it is the conditional put of the log entry that fails."""
    original = loser.lake.commit_if_unchanged
    results: list[int] = []

    def hooked(name: str, actions: Any, read_version: int, refresh: bool = True) -> int | None:
        if name == "episodes" and not results:
            intruder()
            refresh = refresh and not lose_the_put
        got = original(name, actions, read_version, refresh)
        results.append(-1 if got is None else got)
        return got

    monkeypatch.setattr(loser.lake, "commit_if_unchanged", hooked)
    return results


@pytest.mark.parametrize("lose_the_put", [False, True], ids=["table-moved", "put-lost"])
def test_lost_episodes_race_drops_late_duplicates_and_retracts_their_turns(
        any_lake: Lake, monkeypatch: pytest.MonkeyPatch, lose_the_put: bool) -> None:
    # Writers on different machines share no file lock: take it away, so only the compare-and-swap protects.
    monkeypatch.setattr(lake_commit, "_commit_lock", lambda lake: _no_commit_lock())
    lake = any_lake
    other = Lake.open(lake.location)  # a second process's view of the same lake

    def intruder() -> None:
        with LakeWriter(other, handle_signals=False) as a:
            eps, turns, events = _batch("ep-1")
            conflicting, t3, e3 = _batch("ep-3", reward_total=0.0)
            a.write_batch(eps + conflicting, turns + t3, events + e3)

    b = LakeWriter(lake, handle_signals=False)
    # b does not look ids up early: only the commit path can find ep-1 and ep-3 committed by the intruder
    assert b.write_batch(*_batch("ep-1", "ep-2", "ep-3"), check_existing=False).accepted == ["ep-1", "ep-2", "ep-3"]
    results = _race_before_episodes_commit(monkeypatch, b, intruder, lose_the_put)
    assert b.flush() == ["ep-2"]
    with pytest.raises(ConflictError, match=r"ep-3: episodes\.content_hash: episode id was committed concurrently"):
        b.close()  # as on a local lake where the lock serialised the two
    assert results[0] == -1 and results[-1] > 0  # the first try lost the race, a later one committed
    assert b.commit_conflicts == len(results) - 1 >= 1
    assert b.late_duplicates == ["ep-1"]
    assert list(b.late_conflicts) == ["ep-3"]
    con = connect(Lake.open(lake.location))
    assert con.execute("select episode_id, reward_total from episodes order by 1").fetchall() == [
        ("ep-1", 1.0), ("ep-2", 1.0), ("ep-3", 0.0)]  # ep-3 is the intruder's
    # b's turns and events of ep-1 and ep-3 were committed before its episodes commit lost: retracted since
    assert con.execute("select episode_id, count(*) from turns group by 1 order by 1").fetchall() == [
        ("ep-1", 5), ("ep-2", 5), ("ep-3", 5)]
    assert con.execute("select episode_id, count(*) from gateway_events group by 1 order by 1").fetchall() == [
        ("ep-1", 2), ("ep-2", 2), ("ep-3", 2)]
    rep = verify(Lake.open(lake.location), strict=True)  # strict: no orphan turns or events left either
    assert rep.ok, rep.problems


def test_lost_race_with_only_duplicates_commits_nothing_and_leaves_no_turns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lake_commit, "_commit_lock", lambda lake: _no_commit_lock())
    lake = open_lake(tmp_path / "lake", create=True)
    other = Lake.open(lake.location)

    def intruder() -> None:
        with LakeWriter(other, handle_signals=False) as a:
            a.write_batch(*_batch("ep-1", "ep-2"))

    b = LakeWriter(lake, handle_signals=False)
    b.write_batch(*_batch("ep-1", "ep-2"), check_existing=False)
    results = _race_before_episodes_commit(monkeypatch, b, intruder)
    assert b.flush() == []
    b.close()
    assert results == [-1] and sorted(b.late_duplicates) == ["ep-1", "ep-2"] and b.commit_conflicts == 1
    con = connect(Lake.open(lake.location))
    assert con.execute("select count(*) from turns").fetchone() == (10,)
    assert con.execute("select count(*) from gateway_events").fetchone() == (4,)
    rep = verify(Lake.open(lake.location), strict=True)
    assert rep.ok, rep.problems


def test_lost_race_on_runs_skips_the_row_another_writer_added(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lake_commit, "_commit_lock", lambda lake: _no_commit_lock())
    lake = open_lake(tmp_path / "lake", create=True)
    other = Lake.open(lake.location)
    run = {"run_id": "r1", "created_at": dt.datetime(2026, 3, 1, tzinfo=dt.UTC), "label": "r1",
           "policy_name": "p", "policy_version": "1"}

    def intruder() -> None:
        with LakeWriter(other, handle_signals=False) as a:
            assert a.write_runs([run]) == 1

    b = LakeWriter(lake, handle_signals=False)
    results: list[int] = []
    original = b.lake.commit_if_unchanged

    def first_for_runs(name: str, actions: Any, read_version: int, refresh: bool = True) -> int | None:
        if name == "runs" and not results:
            intruder()
            results.append(0)
        return original(name, actions, read_version, refresh)

    monkeypatch.setattr(b.lake, "commit_if_unchanged", first_for_runs)
    assert b.write_runs([run]) == 0  # lost the race; the retry finds the identical row and adds nothing
    b.close()
    assert results == [0]
    assert connect(Lake.open(lake.location)).execute("select count(*) from runs").fetchone() == (1,)
    assert verify(Lake.open(lake.location)).ok


@pytest.mark.slow
def test_s3_four_writer_processes_with_overlapping_ids_commit_each_once(s3_lake_uri: str,
                                                                         s3_server: S3Server) -> None:
    Lake.init(s3_lake_uri)
    env = {**os.environ, **s3_server.env(), "PYTHONPATH": str(REPO)}
    start_at = time.time() + 6.0  # every process imported and waiting: the shared ids race for real
    procs = [subprocess.Popen([sys.executable, "-m", "tests.writer_proc", s3_lake_uri, f"w{k}", "4", "2", "6",
                               str(start_at), "shared-first"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(4)]
    acks: Counter[str] = Counter()
    dups: Counter[str] = Counter()
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, out[-1000:] + err[-2000:]
        mine_acked = {line.split()[1] for line in out.splitlines() if line.startswith("ACK ")}
        mine_dups = {line.split()[1] for line in out.splitlines() if line.startswith("DUP ")}
        assert not mine_acked & mine_dups
        acks.update(mine_acked)
        dups.update(mine_dups)
        print(out.replace("\n", " | "))  # shown with -s: where the duplicates were found and the races lost
    shared = [f"shared-{i}" for i in range(6)]
    own = [f"w{k}-{i}" for k in range(4) for i in range(4)]
    # each shared id: committed by exactly one writer, reported as a duplicate to the three others
    assert {e: acks[e] for e in shared} == dict.fromkeys(shared, 1)
    assert {e: dups[e] for e in shared} == dict.fromkeys(shared, 3)
    assert {e: acks[e] for e in own} == dict.fromkeys(own, 1) and not set(dups) - set(shared)
    lake = open_lake(s3_lake_uri)
    con = connect(lake)
    assert con.execute("select count(*), count(distinct episode_id) from episodes").fetchone() == (22, 22)
    assert {r[0] for r in con.execute("select episode_id from episodes").fetchall()} == set(acks)
    # n_steps = 1 + i % 3 over each writer's 4 own ids then the 6 shared ones: 3+5+7+3 per writer,
    # 5+7+3+5+7+3 for the shared ids once
    assert con.execute("select count(*) from turns").fetchone() == (4 * 18 + 30,)
    rep = verify(lake, strict=True)  # no second copy of an episode, its turns or its events; no orphans
    assert rep.ok, rep.problems


def _publisher(uri: str, name: str, labels: list[str], start_at: float) -> None:
    while time.time() < start_at:
        time.sleep(0.002)
    versions = PolicyVersions(uri, name)
    for label in labels:
        versions.publish(label)


@pytest.mark.slow
def test_s3_concurrent_publishers_lose_no_label(s3_lake_uri: str, s3_server: S3Server) -> None:
    Lake.init(s3_lake_uri)
    env = {**os.environ, **s3_server.env(), "PYTHONPATH": str(REPO)}
    start_at = time.time() + 5.0
    labels = {k: [f"p{k}-v{i}" for i in range(4)] for k in range(3)}
    code = ("import sys, json; from tests.test_concurrent_writers import _publisher; "
            "_publisher(sys.argv[1], 'shared-policy', json.loads(sys.argv[2]), float(sys.argv[3]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, s3_lake_uri, json.dumps(labels[k]), str(start_at)],
                              cwd=REPO, env=env, stderr=subprocess.PIPE, text=True) for k in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    got = PolicyVersions(s3_lake_uri, "shared-policy").all()
    assert sorted(got) == sorted(label for ls in labels.values() for label in ls)  # none lost, none twice
    for ls in labels.values():  # each publisher's labels in the order it published them
        assert [v for v in got if v in ls] == ls


@pytest.mark.slow
def test_s3_policy_versions_read_the_old_single_object_first(s3_lake_uri: str) -> None:
    lake = Lake.init(s3_lake_uri)
    # a lake published by an earlier trajlake: one object with the whole list
    lake.storage.write_bytes(json.dumps({"policy": "pol", "versions": ["a", "b"]}).encode(),
                             "_trajlake", "policies", "pol.json")
    versions = PolicyVersions(s3_lake_uri, "pol")
    assert versions.all() == ["a", "b"] and versions.latest_label() == "b"
    versions.publish("b")  # already published: a no-op
    versions.publish("c/with slash")
    versions.publish("d")
    assert versions.all() == ["a", "b", "c/with slash", "d"]
    assert versions.latest_label() == "d" and versions.lag("a") == 3 and versions.lag("zz") == 4
    # the old object is never rewritten: an older reader still sees what it saw
    assert json.loads(lake.storage.read_bytes("_trajlake", "policies", "pol.json"))["versions"] == ["a", "b"]
    assert PolicyVersions(s3_lake_uri, "other").latest_label() == "other-v0"


def test_duplicate_committed_while_turns_commit_is_caught_by_the_first_commit_try(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The other writer commits ep-1 after b's first check, while b commits its turns: b's first episodes commit
    # try sees the table moved (no put), re-checks, and commits without ep-1.
    monkeypatch.setattr(lake_commit, "_commit_lock", lambda lake: _no_commit_lock())
    lake = open_lake(tmp_path / "lake", create=True)
    other = Lake.open(lake.location)
    b = LakeWriter(lake, handle_signals=False)
    original = b.lake.commit
    tried: list[str] = []

    def commit(name: str, actions: Any, *args: Any, **kwargs: Any) -> int:
        if name == "turns" and not tried:
            tried.append(name)
            with LakeWriter(other, handle_signals=False) as a:
                a.write_batch(*_batch("ep-1"))
        return original(name, actions, *args, **kwargs)

    monkeypatch.setattr(b.lake, "commit", commit)
    b.write_batch(*_batch("ep-1", "ep-2"), check_existing=False)
    assert b.flush() == ["ep-2"]
    b.close()
    assert tried == ["turns"] and b.late_duplicates == ["ep-1"] and b.commit_conflicts == 1
    con = connect(Lake.open(lake.location))
    assert con.execute("select episode_id, count(*) from turns group by 1 order by 1").fetchall() == [
        ("ep-1", 5), ("ep-2", 5)]
    rep = verify(Lake.open(lake.location), strict=True)
    assert rep.ok, rep.problems


def test_a_commit_that_gives_up_still_reports_the_duplicates_it_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every episodes put is lost (another writer commits ep-1 at the first): the protocol drops and retracts ep-1,
    # gives up after its tries, and the writer still learns what it found before the failure.
    monkeypatch.setattr(lake_commit, "_commit_lock", lambda lake: _no_commit_lock())
    monkeypatch.setattr(lake_commit, "_CAS_ATTEMPTS", 2)
    lake = open_lake(tmp_path / "lake", create=True)
    other = Lake.open(lake.location)
    b = LakeWriter(lake, handle_signals=False)
    original = b.lake.commit_if_unchanged
    lost: list[int] = []

    def never_for_episodes(name: str, actions: Any, read_version: int, refresh: bool = True) -> int | None:
        if name != "episodes":
            return original(name, actions, read_version, refresh)
        if not lost:
            with LakeWriter(other, handle_signals=False) as a:
                a.write_batch(*_batch("ep-1"))
        lost.append(read_version)
        return None

    monkeypatch.setattr(b.lake, "commit_if_unchanged", never_for_episodes)
    b.write_batch(*_batch("ep-1", "ep-2"), check_existing=False)
    with pytest.raises(TrajlakeError, match=r"episodes: could not commit after 2 attempts .* 1 episode\(s\)"):
        b.flush()
    assert len(lost) == 2 and b.commit_conflicts == 2 and b.late_duplicates == ["ep-1"] and b.committed == 0
    b.close()
    con = connect(Lake.open(lake.location))
    assert con.execute("select episode_id from episodes").fetchall() == [("ep-1",)]
    # ep-1's turns once (b's copy retracted); ep-2's turns are orphans that compact removes
    assert con.execute("select episode_id, count(*) from _turns_all group by 1 order by 1").fetchall() == [
        ("ep-1", 5), ("ep-2", 5)]
    assert verify(Lake.open(lake.location)).ok
