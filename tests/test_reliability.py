"""Crash and concurrency behaviour of the writer (real processes, real kill -9)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trajlake import Lake, compact, connect, verify

ROOT = Path(__file__).resolve().parents[1]


def spawn(lake: Lake, prefix: str, n: int, per_flush: int, shared: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.writer_proc", str(lake.root), prefix, str(n), str(per_flush),
                             str(shared)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def acked(out: str) -> set[str]:
    return {line.split()[1] for line in out.splitlines() if line.startswith("ACK ")}


def spawn_waiting(lake: Lake, prefix: str, n: int, per_flush: int) -> subprocess.Popen[str]:
    """A writer that imports, prints READY and starts writing only when told (``go``)."""
    return subprocess.Popen([sys.executable, "-m", "tests.writer_proc", "--wait-for-go", str(lake.root), prefix,
                             str(n), str(per_flush)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def go(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None and p.stdout is not None
    assert p.stdout.readline().strip() == "READY", p.communicate()[1][-2000:]
    p.stdin.write("go\n")
    p.stdin.flush()


@pytest.mark.slow
def test_kill_9_at_random_moments_loses_no_acknowledged_episode(lake: Lake) -> None:
    rng = random.Random(1234)
    all_acked: set[str] = set()
    trials = 15  # each trial's kill time is random: 15 land before, during and between commits (30 took 90 s)
    # Each writer is killed a random time after it starts writing (not after the interpreter starts: under load
    # the start-up alone took longer than the old sleep). The next writer starts up while this one writes.
    # Every other writer is killed only after its first acknowledged commit (then a random time later), so the kills
    # land between commits whatever the machine's load; the others may die before their first commit.
    nxt = spawn_waiting(lake, "k0", n=400, per_flush=rng.choice([1, 3, 10]))
    trials_with_acks = 0
    try:
        for trial in range(trials):
            p = nxt
            go(p)
            if trial + 1 < trials:
                nxt = spawn_waiting(lake, f"k{trial + 1}", n=400, per_flush=rng.choice([1, 3, 10]))
            first = p.stdout.readline() if trial % 2 and p.stdout is not None else ""
            time.sleep(rng.uniform(0.05, 1.2))
            os.kill(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            mine = acked(first + out)
            trials_with_acks += bool(mine)
            all_acked |= mine
            rep = verify(lake)
            # a writer killed between its commit and its commit record left its commit intent: not a problem
            assert rep.ok, f"trial {trial}: {rep.problems[:3]}"
    finally:
        if nxt.poll() is None:  # a failed trial leaves the next writer waiting: it must not write after the test
            nxt.kill()
            nxt.communicate()
    con = connect(lake)
    present = {r[0] for r in con.execute("select episode_id from episodes").fetchall()}
    assert all_acked <= present, f"lost acknowledged episodes: {sorted(all_acked - present)[:5]}"
    # no partial episode: every visible episode has exactly n_turns turns
    bad = con.execute("""select e.episode_id from episodes e left join turns t using (episode_id)
                         group by e.episode_id, e.n_turns having count(t.turn_idx) != e.n_turns""").fetchall()
    assert bad == []
    assert trials_with_acks >= trials // 2  # the kills did land between commits, not only before the first
    compact(lake, orphan_grace_hours=0.0)
    assert verify(lake, strict=True).ok
    assert {r[0] for r in connect(lake).execute("select episode_id from episodes").fetchall()} == present


@pytest.mark.slow
def test_four_concurrent_writers_exact_counts_no_duplicates(lake: Lake) -> None:
    procs = [spawn(lake, f"w{i}", n=500, per_flush=25, shared=50) for i in range(4)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        outs.append(out)
    con = connect(lake)
    n, distinct = con.execute("select count(*), count(distinct episode_id) from episodes").fetchone()  # type: ignore[misc]
    assert (n, distinct) == (4 * 500 + 50, 4 * 500 + 50)
    dup_turns = con.execute("select count(*) from (select episode_id, turn_idx from turns group by all "
                            "having count(*) > 1)").fetchone()
    assert dup_turns == (0,)
    expected_turns = sum(1 + 2 * (1 + i % 3) for i in range(550)) * 4 - sum(1 + 2 * (1 + i % 3) for i in range(500, 550)) * 3
    assert con.execute("select count(*) from turns").fetchone() == (expected_turns,)
    rep = verify(lake, strict=True)
    assert rep.ok, rep.problems[:3]


def test_sigterm_flushes_the_buffer(lake: Lake) -> None:
    p = subprocess.Popen([sys.executable, "-m", "tests.writer_proc", "--buffer-then-wait", str(lake.root), "7"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "READY"
    assert lake.versions()["episodes"] == 0  # still buffered
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    assert p.returncode == -signal.SIGTERM  # default action after the flush: the process still dies of SIGTERM
    assert connect(lake).execute("select count(*) from episodes").fetchone() == (7,)
    assert verify(lake, strict=True).ok
