"""Many writers on one lake: N writer processes commit small batches to the same lake as fast as they can, on a
local folder and on S3 (moto's server on loopback), and we count what the Delta log took.

Each writer process runs the real write path (``LakeWriter.write_batch`` + ``flush``: turns, then episodes, each a
Delta transaction) in a loop for ``--seconds``, all starting at the same instant. Per table transaction it records
the version it read (the commit path's refreshed snapshot) and the first file it added; afterwards the Delta log
says which version each transaction got. From that:

- commits/s: table versions created per second (per table, all writers together);
- conflicts: versions another writer took between a transaction's read and its commit, i.e. the races delta-rs
  lost and resolved by rebasing onto the winner and trying the next version (its own retry loop);
- retries: transactions delta-rs gave up on (CommitFailedError) that trajlake's ``Lake.commit`` retried;
- the commit interval a fleet needs: with C table commits/s sustained, N workers committing every I seconds
  produce N / I commits/s, so I >= N / (u * C) keeps the log at utilisation u (0.5 here: headroom for compaction
  and bursts).

    python bench/bench_many_writers.py                       # 16 writers, local and S3, 20 s each
    python bench/bench_many_writers.py --writers 4 --seconds 10 --mode local
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def worker(lake_uri: str, prefix: str, start_at: float, seconds: float, per_commit: int, out: str) -> None:
    """One writer process: commit ``per_commit`` episodes per flush from ``start_at`` for ``seconds``."""
    import deltalake
    from deltalake.exceptions import CommitFailedError

    from tests.conftest import make_episode
    from trajlake import LakeWriter, open_lake

    records: list[dict[str, Any]] = []
    failed = [0]
    original = deltalake.DeltaTable.create_write_transaction

    def counted(self: deltalake.DeltaTable, actions: Any, *args: Any, **kwargs: Any) -> Any:
        read = self.version()
        first = next((a.path for a in actions if hasattr(a, "size")), None)
        try:
            result = original(self, actions, *args, **kwargs)
        except CommitFailedError:
            failed[0] += 1
            raise
        records.append({"table": self.metadata().name, "read": read, "path": first})
        return result

    deltalake.DeltaTable.create_write_transaction = counted  # type: ignore[method-assign]
    lake = open_lake(lake_uri)
    w = LakeWriter(lake, max_turn_rows=10**9, max_age_seconds=10**9, handle_signals=False)
    while time.time() < start_at:
        time.sleep(0.005)
    flush_seconds: list[float] = []
    i = 0
    while time.time() < start_at + seconds:
        eps, turns = [], []
        for _ in range(per_commit):
            ep, tu = make_episode(f"{prefix}-{i}", run_id="fleet", n_steps=2)
            eps.append(ep)
            turns += tu
            i += 1
        w.write_batch(eps, turns, check_existing=False)
        t0 = time.perf_counter()
        w.flush()
        flush_seconds.append(time.perf_counter() - t0)
    w.close()
    Path(out).write_text(json.dumps({"records": records, "failed": failed[0], "flushes": flush_seconds,
                                     "episodes": i}))


def log_versions(lake_uri: str, table: str) -> dict[str, int]:
    """first added path -> the version whose log entry adds it."""
    from trajlake import open_lake

    lake = open_lake(lake_uri)
    st = lake.storage
    out: dict[str, int] = {}
    for name in st.listdir(table, "_delta_log"):
        if not name.endswith(".json") or not name[:20].isdigit():
            continue
        version = int(name[:20])
        for line in st.read_bytes(table, "_delta_log", name).decode().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                out.setdefault(action["add"]["path"], version)
    return out


def run_mode(mode: str, lake_uri: str, env: dict[str, str], writers: int, seconds: float, per_commit: int,
             tmp: Path) -> dict[str, Any]:
    from trajlake import Lake

    Lake.init(lake_uri)
    start_at = time.time() + 4.0 + 0.6 * writers  # every process imported and waiting before the start
    outs = [tmp / f"{mode}-{k}.json" for k in range(writers)]
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", lake_uri, f"{mode}{k}", str(start_at),
                               str(seconds), str(per_commit), str(outs[k])], cwd=REPO, env=env)
             for k in range(writers)]
    for p in procs:
        if p.wait(timeout=seconds + 600) != 0:
            raise SystemExit(f"{mode}: a writer failed")
    results = [json.loads(o.read_text()) for o in outs]
    from trajlake import connect

    row = connect(lake_uri).execute("select count(*), count(distinct episode_id) from episodes").fetchone()
    written = sum(r["episodes"] for r in results)
    if row != (written, written):  # every flushed episode exactly once, or the figures mean nothing
        raise SystemExit(f"{mode}: the lake holds {row} (count, distinct) episodes, the writers flushed {written}")
    flushes = [s for r in results for s in r["flushes"]]
    stats: dict[str, Any] = {"mode": mode, "writers": writers, "seconds": seconds,
                             "episodes": sum(r["episodes"] for r in results), "flushes": len(flushes),
                             "flush_p50_s": statistics.median(flushes),
                             "flush_p99_s": sorted(flushes)[int(0.99 * (len(flushes) - 1))],
                             "retries": sum(r["failed"] for r in results), "tables": {}}
    for table in ("turns", "episodes"):
        where = log_versions(lake_uri, table)
        recs = [x for r in results for x in r["records"] if x["table"] == table and x["path"] in where]
        conflicts = [where[x["path"]] - x["read"] - 1 for x in recs]
        stats["tables"][table] = {"commits": len(recs), "commits_per_s": len(recs) / seconds,
                                  "conflicts": sum(conflicts),
                                  "commits_with_conflict": sum(1 for c in conflicts if c > 0),
                                  "max_conflicts_one_commit": max(conflicts, default=0)}
    return stats


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        lake_uri, prefix, start_at, seconds, per_commit, out = sys.argv[2:8]
        worker(lake_uri, prefix, float(start_at), float(seconds), int(per_commit), out)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--episodes-per-commit", type=int, default=4)
    ap.add_argument("--mode", default="local,s3", help="local, s3 or both (comma-separated)")
    ap.add_argument("--fleet", default="16,100,1000,10000", help="fleet sizes for the commit-interval table")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-many-writers-"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    all_stats = []
    for mode in args.mode.split(","):
        if mode == "local":
            all_stats.append(run_mode("local", str(tmp / "lake"), env, args.writers, args.seconds,
                                      args.episodes_per_commit, tmp))
        elif mode == "s3":
            from tests.s3_server import start_moto

            with start_moto() as server:
                server.client().create_bucket(Bucket="fleet")  # type: ignore[attr-defined]
                s3_env = {**env, **server.env()}
                os.environ.update(server.env())
                all_stats.append(run_mode("s3", "s3://fleet/lake", s3_env, args.writers, args.seconds,
                                          args.episodes_per_commit, tmp))
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    fleet = [int(n) for n in args.fleet.split(",")]
    for s in all_stats:
        print(json.dumps(s))
        c = s["tables"]["episodes"]["commits_per_s"]
        t = s["tables"]["turns"]
        print(f"\n{s['mode']}: {s['writers']} writers x {s['seconds']:g} s, {s['episodes']} episodes in "
              f"{s['flushes']} flushes (flush p50 {s['flush_p50_s'] * 1000:.0f} ms, p99 {s['flush_p99_s'] * 1000:.0f} ms)")
        for table, ts in s["tables"].items():
            print(f"  {table}: {ts['commits']} commits = {ts['commits_per_s']:.1f}/s; conflicts {ts['conflicts']} "
                  f"({ts['commits_with_conflict']} commits lost at least one race, at most "
                  f"{ts['max_conflicts_one_commit']} in one); trajlake-level retries {s['retries']}")
        rate = min(c, t["commits_per_s"])
        print(f"  commit interval at utilisation 0.5 of {rate:.1f} commits/s: "
              + ", ".join(f"N={n}: >= {n / (0.5 * rate):.1f} s" for n in fleet))


if __name__ == "__main__":
    main()
