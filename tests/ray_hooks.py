"""Ray worker-process setup hook for tests/test_ray_scale.py (``runtime_env={"worker_process_setup_hook": ...}``):
it runs in every Ray worker process before the actor is built, so the test can register its environment there,
make the writer slower than the players, and kill one worker mid-run. Settings come from environment variables
the test passes in the runtime env; none of this is in trajlake's code."""

from __future__ import annotations

import os
import time
from typing import Any


def setup() -> None:
    from trajlake.envs import registry

    from tests.counter_env import CounterEnv
    from trajlake.lake.store import Lake
    from trajlake.rollout import runner

    registry.register("counter-ray", CounterEnv)
    slow = float(os.environ.get("RAYTEST_SLOW_COMMIT_S", "0"))
    if slow > 0:
        commit = Lake.commit

        def slow_commit(self: Lake, *args: Any, **kwargs: Any) -> int:
            time.sleep(slow)  # a writer slower than its player (a far object store, a loaded log)
            return commit(self, *args, **kwargs)

        Lake.commit = slow_commit  # type: ignore[method-assign]
    marker = os.environ.get("RAYTEST_DIE_MARKER")
    die_after = int(os.environ.get("RAYTEST_DIE_AFTER", "0"))
    if marker and die_after:
        run = runner._Worker.run
        count = [0]

        def run_then_die(self: runner._Worker, item: runner.WorkItem) -> tuple[str, bool]:
            count[0] += 1
            if count[0] == die_after:
                try:  # only the first worker to get here dies, once per test
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    pass
                else:
                    os._exit(1)  # killed mid-run: its pending and in-flight episodes are lost
            return run(self, item)

        runner._Worker.run = run_then_die  # type: ignore[method-assign]
