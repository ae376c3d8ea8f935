"""A writer process for the reliability tests: writes episodes and prints `ACK <id>` after each committed flush.

With ``--wait-for-go`` first, it prints ``READY`` once imported and waits for a line on stdin before it opens the
lake, so a test can start the next writer while the current one runs and time its kill from the writer's start,
not from the interpreter's."""

from __future__ import annotations

import sys

from tests.conftest import make_episode
from trajlake import LakeWriter, open_lake


def buffer_then_wait() -> None:
    """Buffer episodes without flushing, then wait for a signal: the writer must flush on SIGTERM."""
    import time

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
    lake = open_lake(lake_path)
    w = LakeWriter(lake, max_turn_rows=10**9, max_age_seconds=10**9, handle_signals=False)
    ids = [f"{prefix}-{i}" for i in range(n)] + [f"shared-{i}" for i in range(shared)]
    for i, ep_id in enumerate(ids):
        ep, turns = make_episode(ep_id, run_id="run-r", n_steps=1 + i % 3)
        res = w.write_batch([ep], turns)
        if res.rejected:
            print("REJECTED", ep_id, res.rejected, flush=True)
            sys.exit(3)
        if (i + 1) % per_flush == 0 or i == len(ids) - 1:
            for e in w.flush():
                print("ACK", e, flush=True)
    w.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
