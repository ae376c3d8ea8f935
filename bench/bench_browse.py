"""Benchmark ``trajlake browse`` on a large lake: generate N demo episodes (tiny token lists, big write
batches), then time :func:`trajlake.evaluators.browse.build_browser` and report the page size.

    python bench/bench_browse.py --episodes 100000 --lake /tmp/browse-lake --out /tmp/browse.html

An existing lake at --lake with at least --episodes episodes is reused (pass --fresh to rebuild it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from trajlake.evaluators.browse import build_browser

from trajlake import LakeWriter, connect, open_lake
from trajlake.demo import _T0, RUNS, demo_tasks, generate_episode


def generate(lake_path: Path, n_episodes: int, batch: int = 5000) -> float:
    """Write ``n_episodes`` demo episodes over 200 tasks and the three demo runs; returns seconds taken."""
    t0 = time.perf_counter()
    lk = open_lake(lake_path, create=True)
    tasks = demo_tasks(200)
    with LakeWriter(lk) as w:
        w.write_tasks(tasks)
        w.write_runs([{"run_id": r.run_id, "created_at": _T0, "label": r.label, "policy_name": "demo-agent",
                       "policy_version": r.policy_version} for r in RUNS])
        eps: list[dict[str, Any]] = []
        turns: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        for i in range(n_episodes):
            run = RUNS[i % len(RUNS)]
            task = tasks[(i // len(RUNS)) % len(tasks)]
            seed = i // (len(RUNS) * len(tasks))
            rng = np.random.default_rng([7, i])
            ep, tu, ev = generate_episode(rng, run, task, seed, _T0 + dt.timedelta(seconds=30 * i),
                                          policy_turn_tokens=4, obs_tokens=4)
            eps.append(ep)
            turns += tu
            events += ev
            if len(eps) >= batch:
                w.write_batch(eps, turns, events, check_existing=False).raise_if_rejected()
                w.flush()
                eps, turns, events = [], [], []
                print(f"  {i + 1} episodes written ({time.perf_counter() - t0:.0f} s)", flush=True)
        if eps:
            w.write_batch(eps, turns, events, check_existing=False).raise_if_rejected()
        w.flush()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--episodes", type=int, default=100_000)
    ap.add_argument("--lake", type=Path, default=Path("/tmp/trajlake-browse-bench"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/trajlake-browse-bench.html"))
    ap.add_argument("--max-episodes", type=int, default=500)
    ap.add_argument("--max-chars", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()

    have = 0
    if args.lake.exists() and not args.fresh:
        con = connect(args.lake)
        row = con.execute("SELECT count(*) FROM episodes").fetchone()
        con.close()
        have = int(row[0]) if row else 0
    if have < args.episodes:
        shutil.rmtree(args.lake, ignore_errors=True)
        gen_s = generate(args.lake, args.episodes)
        print(f"generated {args.episodes} episodes in {gen_s:.1f} s")
    con = connect(args.lake)
    counts = con.execute("SELECT (SELECT count(*) FROM episodes), (SELECT count(*) FROM turns), "
                         "(SELECT count(*) FROM episodes WHERE NOT success)").fetchone()
    con.close()
    assert counts is not None
    print(f"lake: {counts[0]} episodes, {counts[1]} turns, {counts[2]} failing")
    times = []
    for _ in range(args.repeat):
        s = build_browser(args.lake, args.out, max_episodes=args.max_episodes, max_chars=args.max_chars)
        times.append(s.seconds)
    print(f"build_browser: best {min(times):.2f} s, median {sorted(times)[len(times) // 2]:.2f} s over "
          f"{args.repeat}; showing {s.n_shown} of {s.n_failing} failing episodes, {s.n_turns} turns, "
          f"{s.n_gateway_events} gateway events; HTML {s.html_bytes / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
