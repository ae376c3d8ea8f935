"""Many writers on one lake: N writer processes commit small batches to the same lake as fast as they can, on a
local folder and on S3 (moto's server on loopback), and we count what the Delta log took.

Each writer process runs the real write path (``LakeWriter.write_batch`` + ``flush``: turns, then episodes, each a
Delta transaction) in a loop for ``--seconds``, all starting at the same instant. Per table transaction it records
the version it read (the commit path's refreshed snapshot) and the first file it added; afterwards the Delta log
says which version each transaction got. From that:

- commits/s: table versions created per second (per table, all writers together);
- conflicts: versions another writer took between a transaction's read and its commit, i.e. the races delta-rs
  lost and resolved by rebasing onto the winner and trying the next version (its own retry loop);
- retries: transactions that failed (CommitFailedError) and trajlake retried: turns transactions delta-rs gave up
  on (``Lake.commit``), and episodes transactions that lost their compare-and-swap (``Lake.commit_if_unchanged``:
  the writer re-checks what the winner added for its ids, then tries the next version);
- the commit interval a fleet needs: with C table commits/s sustained, N workers committing every I seconds
  produce N / I commits/s, so I >= N / (u * C) keeps the log at utilisation u (0.5 here: headroom for compaction
  and bursts).

    python bench/bench_many_writers.py                       # 16 writers, local and S3, 20 s each
    python bench/bench_many_writers.py --writers 4 --seconds 10 --mode local
    python bench/bench_many_writers.py --writers 8 --seconds 15 --episodes-commit cas,rebase

``--episodes-commit rebase`` is the baseline of the compare-and-swap: the flush's commit as it was before it (one
check, then the episodes append rebased by delta-rs onto any newer version with no re-check: unsafe for racing
duplicate ids without the local commit lock); ``cas`` (the default) is the writer as it is.
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
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def worker(lake_uri: str, prefix: str, start_at: float, seconds: float, per_commit: int, out: str,
           episodes_commit: str = "cas") -> None:
    """One writer process: commit ``per_commit`` episodes per flush from ``start_at`` for ``seconds``."""
    import deltalake
    from deltalake.exceptions import CommitFailedError

    from tests.conftest import make_episode
    from trajlake import LakeWriter, open_lake

    if episodes_commit == "rebase":
        import trajlake.lake.commit as lake_commit

        lake_commit._commit_checked = _rebase_commit_checked
    records: list[dict[str, Any]] = []
    failed: dict[str, int] = {}
    original = deltalake.DeltaTable.create_write_transaction

    def counted(self: deltalake.DeltaTable, actions: Any, *args: Any, **kwargs: Any) -> Any:
        read = self.version()
        first = next((a.path for a in actions if hasattr(a, "size")), None)
        try:
            result = original(self, actions, *args, **kwargs)
        except CommitFailedError:
            table = self.metadata().name or "?"
            failed[table] = failed.get(table, 0) + 1
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
    cpu0 = time.process_time()
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
    cpu = time.process_time() - cpu0
    w.close()
    Path(out).write_text(json.dumps({"records": records, "failed": failed, "flushes": flush_seconds, "cpu_s": cpu,
                                     "episodes": i, "lost_cas": w.commit_conflicts}))


def _rebase_commit_checked(lake: Any, ep: Any, turn_actions: list[Any], event_actions: list[Any],
                           ep_actions: list[Any], bad: list[str], committed_ids: Any, outcome: Any) -> list[str]:
    """The baseline: the flush's commit as it was before the compare-and-swap (in place of
    ``trajlake.lake.commit._commit_checked``). One check of the ids, then turns, events and episodes, the episodes
    append rebased by delta-rs onto any newer version with no re-check (safe for racing duplicate ids only under
    the local commit lock)."""
    from trajlake.lake.commit import _late, drop_episodes, file_ranges, remove_uncommitted

    existing = committed_ids.lookup(ep["episode_id"].to_pylist(), ep["run_id"].to_pylist(),
                                    files=file_ranges(lake.latest_add_actions("episodes")))
    late = _late(ep, existing, outcome) if existing else []
    if bad or late:
        turn_actions = lake.drop_rows("turns", turn_actions, "episode_id", [*bad, *late])
    if late:
        event_actions = lake.drop_rows("gateway_events", event_actions, "episode_id", late)
        ep = drop_episodes(ep, late)
        remove_uncommitted(lake, [], [], ep_actions)
        ep_actions = lake.write_files("episodes", ep) if ep.num_rows else []
    if ep.num_rows == 0:
        remove_uncommitted(lake, turn_actions, event_actions, ep_actions)
        return []
    lake.commit("turns", list(turn_actions))
    if event_actions:
        lake.commit("gateway_events", list(event_actions))
    lake.commit("episodes", list(ep_actions))
    return list(ep["episode_id"].to_pylist())


def log_versions(lake_uri: str, table: str) -> dict[str, int]:
    """first added path -> the version whose log entry adds it."""
    from trajlake import open_lake
    from trajlake.lake.delta_log import DELTA_LOG, log_entry_version

    lake = open_lake(lake_uri)
    st = lake.storage
    out: dict[str, int] = {}
    for name in st.listdir(table, DELTA_LOG):
        version = log_entry_version(name)
        if version is None:
            continue
        for line in st.read_bytes(table, DELTA_LOG, name).decode().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                out.setdefault(action["add"]["path"], version)
    return out


def run_mode(mode: str, lake_uri: str, env: dict[str, str], writers: int, seconds: float, per_commit: int,
             tmp: Path, episodes_commit: str = "cas") -> dict[str, Any]:
    from trajlake import Lake

    Lake.init(lake_uri)
    start_at = time.time() + 4.0 + 0.6 * writers  # every process imported and waiting before the start
    outs = [tmp / f"{mode}-{uuid.uuid4().hex[:8]}-{k}.json" for k in range(writers)]
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", lake_uri, f"{mode}{k}", str(start_at),
                               str(seconds), str(per_commit), str(outs[k]), episodes_commit], cwd=REPO, env=env)
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
    stats: dict[str, Any] = {"mode": mode, "episodes_commit": episodes_commit, "writers": writers, "seconds": seconds,
                             "episodes": sum(r["episodes"] for r in results), "flushes": len(flushes),
                             "flush_p50_s": statistics.median(flushes),
                             "flush_p99_s": sorted(flushes)[int(0.99 * (len(flushes) - 1))],
                             "lost_cas": sum(r["lost_cas"] for r in results),
                             # the writers' own CPU per flush (write_batch + flush): less swayed by other load
                             "cpu_ms_per_flush": 1000 * sum(r["cpu_s"] for r in results) / max(1, len(flushes)),
                             "tables": {}}
    for table in ("turns", "episodes"):
        where = log_versions(lake_uri, table)
        recs = [x for r in results for x in r["records"] if x["table"] == table and x["path"] in where]
        conflicts = [where[x["path"]] - x["read"] - 1 for x in recs]
        stats["tables"][table] = {"commits": len(recs), "commits_per_s": len(recs) / seconds,
                                  "conflicts": sum(conflicts),
                                  "commits_with_conflict": sum(1 for c in conflicts if c > 0),
                                  "retries": sum(r["failed"].get(table, 0) for r in results),
                                  "max_conflicts_one_commit": max(conflicts, default=0)}
    return stats


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        lake_uri, prefix, start_at, seconds, per_commit, out, episodes_commit = sys.argv[2:9]
        worker(lake_uri, prefix, float(start_at), float(seconds), int(per_commit), out, episodes_commit)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--episodes-per-commit", type=int, default=4)
    ap.add_argument("--mode", default="local,s3", help="local, s3 or both (comma-separated)")
    ap.add_argument("--fleet", default="16,100,1000,10000", help="fleet sizes for the commit-interval table")
    ap.add_argument("--episodes-commit", default="cas",
                    help="cas (the writer as it is), rebase (the baseline before the compare-and-swap), or both")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-many-writers-"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    all_stats = []
    variants = args.episodes_commit.split(",")
    for mode in args.mode.split(","):
        if mode == "local":
            for i, v in enumerate(variants):
                all_stats.append(run_mode("local", str(tmp / f"lake-{i}-{v}"), env, args.writers, args.seconds,
                                          args.episodes_per_commit, tmp, v))
        elif mode == "s3":
            from tests.s3_server import start_moto

            with start_moto() as server:
                s3_env = {**env, **server.env()}
                os.environ.update(server.env())
                for i, v in enumerate(variants):
                    server.client().create_bucket(Bucket=f"fleet-{i}-{v}")  # type: ignore[attr-defined]
                    all_stats.append(run_mode("s3", f"s3://fleet-{i}-{v}/lake", s3_env, args.writers, args.seconds,
                                              args.episodes_per_commit, tmp, v))
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    fleet = [int(n) for n in args.fleet.split(",")]
    for s in all_stats:
        print(json.dumps(s))
        c = s["tables"]["episodes"]["commits_per_s"]
        t = s["tables"]["turns"]
        print(f"\n{s['mode']} ({s['episodes_commit']}): {s['writers']} writers x {s['seconds']:g} s, {s['episodes']} episodes in "
              f"{s['flushes']} flushes (flush p50 {s['flush_p50_s'] * 1000:.0f} ms, p99 {s['flush_p99_s'] * 1000:.0f} ms)")
        for table, ts in s["tables"].items():
            print(f"  {table}: {ts['commits']} commits = {ts['commits_per_s']:.1f}/s; conflicts {ts['conflicts']} "
                  f"({ts['commits_with_conflict']} commits lost at least one race, at most "
                  f"{ts['max_conflicts_one_commit']} in one); trajlake-level retries {ts['retries']}")
        print(f"  episodes compare-and-swap races lost and retried: {s['lost_cas']}; writer CPU per flush "
              f"{s['cpu_ms_per_flush']:.0f} ms")
        rate = min(c, t["commits_per_s"])
        print(f"  commit interval at utilisation 0.5 of {rate:.1f} commits/s: "
              + ", ".join(f"N={n}: >= {n / (0.5 * rate):.1f} s" for n in fleet))


if __name__ == "__main__":
    main()
