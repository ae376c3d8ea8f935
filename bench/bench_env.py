"""Environment-side overheads (issue: environments) and rollout throughput.

    python bench/bench_env.py [--steps 2000] [--episodes-split dev]

1. Gateway overhead per step: median time of ``env.step`` for a read_file call minus the median time of the bare
   tool handler on the same file (the "bare environment step"), i.e. parsing, argument validation, path
   normalisation, state hashes before/after and the audit event. Target: median overhead < 1 ms.
2. Recorder overhead per step: validating, hashing and committing recorded episodes as ``trajlake rollout``
   does (one ``LakeWriter.write_batch`` per finished episode, a commit every 5 s of rollout time, paced by the
   episodes' own play time), divided by the number of environment steps they contain; and with a commit after
   every episode for comparison. The episodes are played first, so tool run time is excluded. Target: < 1 ms.
3. Rollout throughput (episodes/s) of the heuristic policy on the split with 1 and 2 worker processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from trajlake.envs import make_env, make_policy, task_view_fn

from trajlake import LakeWriter, open_lake
from trajlake.rollout.runner import EpisodeRecord, RolloutConfig, play_episode, run_rollout, write_records

COMMIT_EVERY_S = float(next(f.default for f in dataclasses.fields(RolloutConfig) if f.name == "commit_every_s"))


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--split", default="dev")
    ap.add_argument("--random-episodes", type=int, default=60,
                    help="random-policy episodes recorded for the recorder measurement")
    ap.add_argument("--heuristic-episodes", type=int, default=42,
                    help="heuristic-policy episodes (the split's tasks, seed after seed)")
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

    # Recorder overhead: play episodes first (their play time gives the rollout's pace), then time recording them
    # as `trajlake rollout` does: one write_batch per finished episode, a commit every COMMIT_EVERY_S seconds of
    # rollout time. One warm-up commit first: the first commit of a process pays for imports and opening tables.
    view = task_view_fn(env)
    tmp = Path(tempfile.mkdtemp())
    for policy_name, n_eps in (("random", a.random_episodes), ("heuristic", a.heuristic_episodes)):
        policy = make_policy("mini-swe", policy_name, f"{policy_name}-v1")
        tasks = [env.tasks[i % len(env.tasks)] for i in range(n_eps + 1)]
        t_play = time.perf_counter()
        recs = [play_episode(env, policy, run_id=f"bench-{policy_name}", task_id=t["task_id"],
                             task_version=t["task_version"], seed=i // len(env.tasks), task_view=view)
                for i, t in enumerate(tasks)]
        play_s = time.perf_counter() - t_play
        warm, recs = recs[0], recs[1:]
        steps = [sum(1 for t in r.turns if t["actor"] == "policy") for r in recs]
        play = [(r.episode["ended_at"] - r.episode["started_at"]).total_seconds() for r in recs]
        for commit_every in (COMMIT_EVERY_S, 5.0, 0.0):
            # what a rollout worker does: hand the episodes finished since the last commit to the writer in one
            # batch once `commit_every` seconds of rollout time have passed, and commit them
            lake = open_lake(tmp / f"lake-{policy_name}-{commit_every}", create=True)
            with LakeWriter(lake, max_age_seconds=1e9, handle_signals=False) as w:
                write_records(w, [warm], wait=True)
                spent = 0.0
                commits = 0
                pending: list[EpisodeRecord] = []
                since_commit = 0.0
                for r, p in zip(recs, play, strict=True):
                    pending.append(r)
                    since_commit += p
                    if since_commit >= commit_every:
                        t0 = time.perf_counter()
                        write_records(w, pending, wait=True)
                        spent += time.perf_counter() - t0
                        commits += 1
                        pending, since_commit = [], 0.0
                t0 = time.perf_counter()
                write_records(w, pending, wait=True)
                spent += time.perf_counter() - t0
                commits += bool(pending)
            label = (f"a commit every {commit_every:g} s of rollout time"
                     + (" (`trajlake rollout` default)" if commit_every == COMMIT_EVERY_S else "")
                     if commit_every else "a commit after every episode (`--commit-every 0`)")
            print(f"| recorder per step, {policy_name} policy, {label}: {len(recs)} episodes / {sum(steps)} steps "
                  f"({sum(steps) / play_s:.0f} steps/s played, {commits} commits) | "
                  f"{spent / sum(steps) * 1e6:.0f} µs | {'< 1000 µs' if commit_every == COMMIT_EVERY_S else '-'} |")
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
