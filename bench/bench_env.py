"""Environment-side overheads (issue: environments) and rollout throughput.

    python bench/bench_env.py [--steps 2000] [--episodes-split dev]

1. Gateway overhead per step: median time of ``env.step`` for a read_file call minus the median time of the bare
   tool handler on the same file (the "bare environment step"), i.e. parsing, argument validation, path
   normalisation, state hashes before/after and the audit event. Target: median overhead < 1 ms.
2. Recorder overhead per step: validating, hashing and committing recorded episodes (LakeWriter.write_batch +
   flush), divided by the number of environment steps they contain.
3. Rollout throughput (episodes/s) of the heuristic policy on the split with 1 and 2 worker processes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from trajlake.envs import make_env, make_policy, task_view_fn

from trajlake import LakeWriter, open_lake
from trajlake.rollout.runner import RolloutConfig, play_episode, run_rollout


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--split", default="dev")
    a = ap.parse_args()
    env = make_env("mini-swe", split=a.split)
    env.reset(0)
    task = env.task_for(0)
    path = task["file"]
    action = json.dumps({"tool": "read_file", "args": {"path": path}})
    bare, full = [], []
    for i in range(a.steps):
        t = time.perf_counter()
        env._read_file({"path": path})
        bare.append(time.perf_counter() - t)
        t = time.perf_counter()
        res = env.step(action, f"k{i}")
        full.append(time.perf_counter() - t)
        if res.done:
            env.reset(0)
    # budgets would end the episode: the env was reset when needed, which is excluded (not in either sample)
    b, f = median_us(bare), median_us(full)
    print("| measure | value | target |")
    print("| --- | --- | --- |")
    print(f"| bare read_file handler, median | {b:.0f} µs | - |")
    print(f"| env.step(read_file) through the gateway, median | {f:.0f} µs | - |")
    print(f"| gateway + env overhead per step, median | {f - b:.0f} µs ({f / b:.2f}x the bare step) | < 1000 µs |")

    # recorder overhead: record heuristic episodes, then time writing them
    heuristic = make_policy("mini-swe", "heuristic", "h-v1")
    view = task_view_fn(env)
    recs = [play_episode(env, heuristic, run_id="bench", task_id=t["task_id"], task_version=t["task_version"],
                         seed=0, task_view=view) for t in env.tasks]
    steps = sum(sum(1 for t in r.turns if t["actor"] == "policy") for r in recs)
    tmp = Path(tempfile.mkdtemp())
    lake = open_lake(tmp / "lake", create=True)
    t0 = time.perf_counter()
    with LakeWriter(lake, handle_signals=False) as w:
        for r in recs:
            w.write_batch([r.episode], r.turns, r.events, check_existing=False).raise_if_rejected()
    rec_s = time.perf_counter() - t0
    print(f"| recorder per step, buffered (validate + hash + one commit), {len(recs)} episodes / {steps} steps | "
          f"{rec_s / steps * 1e6:.0f} µs | < 1000 µs |")
    lake2 = open_lake(tmp / "lake2", create=True)
    t0 = time.perf_counter()
    with LakeWriter(lake2, handle_signals=False) as w:
        for r in recs:
            w.write_batch([r.episode], r.turns, r.events, check_existing=False).raise_if_rejected()
            w.flush()
    rec_s = time.perf_counter() - t0
    print(f"| recorder per step, committing every episode (`--commit-every 0`) | "
          f"{rec_s / steps * 1e6:.0f} µs | - |")
    rnd = make_policy("mini-swe", "random", "r-v1")
    long_recs = [play_episode(env, rnd, run_id="bench-r", task_id=t["task_id"], task_version=t["task_version"],
                              seed=0, task_view=view) for t in env.tasks[:6]]
    long_steps = sum(sum(1 for t in r.turns if t["actor"] == "policy") for r in long_recs)
    lake3 = open_lake(tmp / "lake3", create=True)
    t0 = time.perf_counter()
    with LakeWriter(lake3, handle_signals=False) as w:
        for r in long_recs:
            w.write_batch([r.episode], r.turns, r.events, check_existing=False).raise_if_rejected()
            w.flush()
    rec_s = time.perf_counter() - t0
    print(f"| recorder per step, committing every episode, random policy ({len(long_recs)} episodes / "
          f"{long_steps} steps) | {rec_s / long_steps * 1e6:.0f} µs | - |")
    lake4 = open_lake(tmp / "lake4", create=True)
    t0 = time.perf_counter()
    with LakeWriter(lake4, max_age_seconds=5.0, handle_signals=False) as w:
        for r in long_recs:
            w.write_batch([r.episode], r.turns, r.events, check_existing=False).raise_if_rejected()
    rec_s = time.perf_counter() - t0
    print(f"| recorder per step, commits every 5 s (`trajlake rollout` default), random policy | "
          f"{rec_s / long_steps * 1e6:.0f} µs | < 1000 µs |")
    env.close()
    for workers in (1, 2):
        d = tmp / f"lake{workers}"
        t0 = time.perf_counter()
        s = run_rollout(RolloutConfig(lake=str(d), run_id=f"w{workers}", env="mini-swe", policy="heuristic",
                                      split=a.split, seeds=(0,), workers=workers))
        dt = time.perf_counter() - t0
        print(f"| rollout throughput, heuristic, {workers} worker(s), {s.written} episodes | "
              f"{s.written / dt:.2f} episodes/s | - |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
