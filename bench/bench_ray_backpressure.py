"""Ray rollouts whose writer is slower than their players: the bounded hand-over queue against none.

A local Ray cluster (2 CPUs, started here) runs ``--engine ray`` with 2 workers on the counter environment
(episodes of a few steps, played in milliseconds) while every Delta commit is delayed (``--slow-commit``
seconds, through the test suite's worker setup hook), so the writers fall behind. With ``max_pending_episodes``
= 3 a worker hands over every 3 episodes and its player then waits for the previous commit; without a cap
(``--commit-every 30``, as a default run) it holds every episode it played until the interval ends. Reported per
surviving worker: episodes played, the most unacknowledged episodes it held, forced hand-overs, peak RSS.

    python bench/bench_ray_backpressure.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--slow-commit", type=float, default=0.4)
    args = ap.parse_args()
    import ray
    from trajlake.envs import registry

    from tests.counter_env import CounterEnv
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    env_vars = {"PYTHONPATH": str(REPO), "RAYTEST_SLOW_COMMIT_S": str(args.slow_commit)}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env_vars, "worker_process_setup_hook": "tests.ray_hooks.setup"})
    registry.register("counter-ray", CounterEnv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    try:
        for label, cap in (("max_pending_episodes=3", 3), ("no cap (commit every 30 s)", 10**9)):
            cfg = RolloutConfig(lake=str(tmp / f"lake-{cap}"), run_id="bp", env="counter-ray", policy="oracle",
                                split="dev", seeds=tuple(range(args.seeds)), workers=2, engine="ray",
                                commit_every_s=30.0, max_pending_episodes=cap)
            t0 = time.perf_counter()
            s = run_rollout(cfg)
            wall = time.perf_counter() - t0
            print(f"{label}: {s.written} episodes written in {wall:.1f} s; per worker: "
                  + "; ".join(f"played {w['played']:.0f}, held at most {w['max_held_episodes']:.0f}, "
                              f"forced hand-overs {w['cap_handovers']:.0f}, peak RSS {w['peak_rss_mb']:.0f} MB"
                              for w in s.worker_stats))
    finally:
        ray.shutdown()
        os.environ.pop("RAYTEST_SLOW_COMMIT_S", None)


if __name__ == "__main__":
    main()
