"""A writer process for the reliability tests: writes episodes and prints `ACK <id>` after each committed flush.

With ``--wait-for-go`` first, it prints ``READY`` once imported and waits for a line on stdin before it opens the
lake, so a test can start the next writer while the current one runs and time its kill from the writer's start,
not from the interpreter's."""

from __future__ import annotations

import sys
import time

from tests.conftest import make_episode
from trajlake import LakeWriter, open_lake


def buffer_then_wait() -> None:
    """Buffer episodes without flushing, then wait for a signal: the writer must flush on SIGTERM."""
    lake = open_lake(sys.argv[2])
    w = LakeWriter(lake, max_turn_rows=10**9, max_age_seconds=10**9)  # installs the signal handlers
    for i in range(int(sys.argv[3])):
        ep, turns = make_episode(f"sig-{i}", run_id="run-s")
        w.write_batch([ep], turns)
    print("READY", flush=True)
    time.sleep(60)


def main() -> None:
    if sys.argv[1] == "--buffer-then-wait":
        buffer_then_wait()
        return
    if sys.argv[1] == "--wait-for-go":
        del sys.argv[1]
        print("READY", flush=True)
        sys.stdin.readline()
    lake_path, prefix, n, per_flush = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    shared = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    # optional: start at this epoch second (all writers at once), and the shared ids first (to race on them)
    start_at = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    shared_first = len(sys.argv) > 7 and sys.argv[7] == "shared-first"
    lake = open_lake(lake_path)
    w = LakeWriter(lake, max_turn_rows=10**9, max_age_seconds=10**9, handle_signals=False)
    own = [f"{prefix}-{i}" for i in range(n)]
    common = [f"shared-{i}" for i in range(shared)]
    ids = common + own if shared_first else own + common
    # a shared id has the same content in every writer: its n_steps depends on the id, not on its position
    steps = {e: 1 + i % 3 for i, e in enumerate(own + common)}
    while time.time() < start_at:
        time.sleep(0.002)
    late = 0
    for i, ep_id in enumerate(ids):
        ep, turns = make_episode(ep_id, run_id="run-r", n_steps=steps[ep_id])
        res = w.write_batch([ep], turns)
        if res.rejected:
            print("REJECTED", ep_id, res.rejected, flush=True)
            sys.exit(3)
        for e in res.duplicates:
            print("DUP", e, flush=True)
        if (i + 1) % per_flush == 0 or i == len(ids) - 1:
            for e in w.flush():
                print("ACK", e, flush=True)
            for e in w.late_duplicates[late:]:
                print("DUP", e, flush=True)
            late = len(w.late_duplicates)
            if w.late_conflicts:
                print("CONFLICT", sorted(w.late_conflicts), flush=True)
                sys.exit(4)
    w.close()
    print("LOST_RACES", w.commit_conflicts, flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
