"""Lake write/size/query/memory benchmark (issues: the lake; 16, the writer for a fleet).

    python bench/bench_lake.py [--rows 200000] [--tokens 400] [--append-rows 400] [--repeat 3] [--out bench/out]

1. Writes ROWS realistic turn rows (TOKENS tokens each, with loss masks and float32 behaviour log-probs on policy
   turns) through the batch writer (`LakeWriter.write_batch`, default settings) in APPEND-ROWS appends, and
   `pyarrow.parquet.write_table` of the same rows (the limit), alternating the two REPEAT times in this process
   (the machine is shared: each repeat's ratio compares neighbours in time); once, JSONL lines (what most teams
   do now).
2. Runs the aggregate query (per policy_version: count, mean tokens, masked tokens, P50/P99 latency) through
   `trajlake.connect` and through DuckDB `read_parquet` on one plain Parquet file of the same rows.
3. Measures the writer's peak RSS in a fresh child process per configuration (data generated on the fly; VmHWM
   of the child's own address space, so a parent's pages never count): default settings at ROWS and ROWS/2
   rows, then buffers of 64 MiB and the default with rows of 100, 400 and 2,000 tokens. Printed against the
   configured buffer: the whole process and the writer's share (peak minus the RSS after imports and opening).
4. With ``--commits N`` (alone: ``--commits 2000 --skip-write``): the CPU of one commit as the lake grows. A writer
   flushes after every 1-episode append (a commit per flush, the worst case for per-commit costs) N times; the
   CPU per flush of the first and the last 100 flushes, then of 100 flushes after ``compact``.
   ``--commits-delta-defaults`` runs it with delta-rs's own post-commit hooks (expired-log clean-up after every
   commit) for comparison.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trajlake import LakeWriter, connect, open_lake
from trajlake.record.writer import DEFAULT_BUFFER_BYTES

TURNS_PER_EPISODE = 20
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def make_batch(rng: np.random.Generator, first_episode: int, n_episodes: int, tokens: int
               ) -> tuple[pa.Table, pa.Table]:
    """n_episodes episodes x 20 turns (system, user, then policy/tool alternating), vectorised with numpy."""
    n = n_episodes * TURNS_PER_EPISODE
    ep_idx = np.repeat(np.arange(first_episode, first_episode + n_episodes), TURNS_PER_EPISODE)
    turn_idx = np.tile(np.arange(TURNS_PER_EPISODE, dtype=np.int32), n_episodes)
    is_policy = (turn_idx >= 2) & (turn_idx % 2 == 0)
    role = np.where(turn_idx == 0, "system", np.where(turn_idx == 1, "user", np.where(is_policy, "assistant", "tool")))
    actor = np.where(turn_idx == 0, "system", np.where(turn_idx == 1, "user", np.where(is_policy, "policy", "env")))
    lens = rng.integers(tokens // 2, tokens * 3 // 2 + 1, size=n).astype(np.int64)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    tok = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(3, 32000, total, dtype=np.int32)))
    mask_vals = np.repeat(is_policy.astype(np.int8), lens)
    mask = pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask_vals, pa.int8()))
    lp_vals = (-rng.exponential(0.4, total)).astype(np.float32)
    lp = pa.ListArray.from_arrays(pa.array(offsets), pa.array(lp_vals, pa.float32()),
                                  mask=pa.array(~is_policy))
    ep_ids = np.array([f"bench-{i:09d}" for i in range(first_episode, first_episode + n_episodes)])
    policy_version = np.array(["p0", "p1", "p2", "p3"])[(ep_idx // 250) % 4]
    lat = rng.lognormal(6.0, 0.7, n)
    start_us = (ep_idx.astype(np.int64) * 3_600_000_000) + turn_idx.astype(np.int64) * 60_000_000
    ts0 = int(T0.timestamp() * 1e6)
    starts = pa.array(ts0 + start_us, pa.timestamp("us", tz="UTC"))
    ends = pa.array(ts0 + start_us + (lat * 1000).astype(np.int64), pa.timestamp("us", tz="UTC"))
    turns = pa.table({
        "episode_id": np.repeat(ep_ids, TURNS_PER_EPISODE), "run_id": pa.array(["bench-run"] * n),
        "turn_idx": pa.array(turn_idx), "role": role, "actor": actor,
        "policy_version": pa.array(np.where(is_policy, policy_version, None)),
        "raw_content": pa.array(np.where(is_policy, "I will run the tests now.", "output of the tool ...")),
        "token_ids": tok, "loss_mask": mask, "behavior_logprobs": lp, "tokenizer_id": pa.array(["bpe-32k"] * n),
        "started_at": starts, "ended_at": ends, "latency_ms": lat, "status": pa.array(["OK"] * n),
        "tokens": pa.array(lens.astype(np.int32)), "cost_usd": lens * 1e-6, "tool_seconds": np.where(is_policy, 0.0, lat / 1000),
    })
    pol_tokens = np.add.reduceat(np.where(is_policy, lens, 0), np.arange(0, n, TURNS_PER_EPISODE))
    episodes = pa.table({
        "episode_id": ep_ids, "run_id": ["bench-run"] * n_episodes, "task_id": [f"task-{i % 500}" for i in range(n_episodes)],
        "task_version": ["v1"] * n_episodes, "split": ["train"] * n_episodes, "env_id": ["bench"] * n_episodes,
        "env_version": ["1"] * n_episodes, "group_id": [f"g{i % 500}" for i in range(n_episodes)],
        "attempt": pa.array([0] * n_episodes, pa.int32()),
        "policy_version_start": policy_version[::TURNS_PER_EPISODE], "policy_version_end": policy_version[::TURNS_PER_EPISODE],
        "started_at": starts.take(pa.array(np.arange(0, n, TURNS_PER_EPISODE))),
        "ended_at": ends.take(pa.array(np.arange(TURNS_PER_EPISODE - 1, n, TURNS_PER_EPISODE))),
        "n_turns": pa.array([TURNS_PER_EPISODE] * n_episodes, pa.int32()), "n_policy_tokens": pol_tokens,
        "terminated": [True] * n_episodes, "truncated": [False] * n_episodes,
        "termination_reason": ["submitted"] * n_episodes, "success": rng.random(n_episodes) < 0.4,
        "reward_total": rng.random(n_episodes), "reward_components": pa.array([[("resolved", 1.0)]] * n_episodes,
                                                                             pa.map_(pa.string(), pa.float64())),
        "tokens_in": pol_tokens, "tokens_out": pol_tokens, "cost_usd": rng.random(n_episodes),
        "tool_seconds": rng.random(n_episodes), "wall_seconds": rng.random(n_episodes) * 100,
        "faults_injected": pa.array([0] * n_episodes, pa.int32()), "injection_attempted": [False] * n_episodes,
    })
    return episodes, turns


QUERY = """
SELECT policy_version, count(*) AS n, avg(tokens) AS mean_tokens, sum(list_sum(loss_mask)) AS masked_tokens,
       quantile_cont(latency_ms, 0.5) AS p50_ms, quantile_cont(latency_ms, 0.99) AS p99_ms
FROM {src} GROUP BY policy_version ORDER BY policy_version NULLS FIRST
"""


def best_of(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def child_memory(rows: int, tokens: int, append_rows: int, out: Path, buffer_bytes: int | None = None,
                 eager: bool | None = None) -> tuple[float, float, float, float]:
    """(peak RSS, RSS after imports and opening the lake, code pages mapped since) in MB of a fresh process
    writing ``rows`` turn rows generated on the fly. VmHWM belongs to the child's own address space
    (``ru_maxrss`` would include the pages of the parent it was forked from). The third figure is the growth of
    the file-backed RSS (RssFile): the shared libraries' code the first commit pages in (Parquet encoder, zstd,
    delta-rs's commit path); it stays mapped, and the page cache shares it between all writer processes of a
    machine, so it is an import cost rather than memory the writer holds. The fourth figure is the CPU seconds
    of the writing (the process's, less generating the data). ``eager`` is the writer's
    ``release_memory_eagerly`` (None: its default)."""
    # with a buffer given, the row-count trigger is lifted so that the byte budget is what binds
    settings = "" if buffer_bytes is None else f", max_buffer_bytes={buffer_bytes}, max_turn_rows=10**9"
    settings += f", release_memory_eagerly={eager}"
    code = f"""
import numpy as np, sys, time
sys.path.insert(0, {str(Path(__file__).parent)!r})
from bench_lake import make_batch
from trajlake import LakeWriter, open_lake
def status(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":")) / 1024
def hwm():
    return status("VmHWM")
lake = open_lake({str(out)!r}, create=True)
rng = np.random.default_rng(1)
eps_per_append = max(1, {append_rows} // 20)
base = hwm()
file_base = status("RssFile")
cpu, gen = time.process_time(), 0.0
with LakeWriter(lake, handle_signals=False{settings}) as w:
    for k in range(0, {rows} // 20, eps_per_append):
        t = time.process_time()
        ep, tu = make_batch(rng, k, eps_per_append, {tokens})
        gen += time.process_time() - t
        r = w.write_batch(ep, tu)
        assert not r.rejected, r.rejected
print(hwm(), base, status("RssFile") - file_base, time.process_time() - cpu - gen)
"""
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    shutil.rmtree(out, ignore_errors=True)
    peak, base, code, writer_cpu = r.stdout.strip().splitlines()[-1].split()
    return float(peak), float(base), float(code), float(writer_cpu)


def commit_growth(out: Path, commits: int, delta_defaults: bool) -> None:
    """CPU per flush (1 episode of 20 turns x 50 tokens, flushed alone) at the start, after COMMITS commits, and
    after ``compact``: what grows with the lake is the per-commit work, not the rows."""
    import deltalake

    from trajlake.lake import store
    from trajlake.lake.maintenance import compact

    if delta_defaults:
        store._post_commit_hooks = lambda d: deltalake.PostCommitHookProperties()  # type: ignore[assignment]
    shutil.rmtree(out, ignore_errors=True)
    lake = open_lake(out, create=True)
    rng = np.random.default_rng(2)
    batches = [make_batch(rng, k, 1, 50) for k in range(100)]

    def flushes(w: LakeWriter, first: int, n: int) -> float:
        cpu = time.process_time()
        for k in range(first, first + n):
            ep, tu = batches[k % 100]
            ep = ep.set_column(0, "episode_id", pa.array([f"c-{k:09d}"]))
            tu = tu.set_column(0, "episode_id", pa.array([f"c-{k:09d}"] * tu.num_rows))
            w.write_batch(ep, tu)
            w.flush()
        return (time.process_time() - cpu) / n * 1000

    with LakeWriter(lake, handle_signals=False) as w:
        first = flushes(w, 0, 100)
        flushes(w, 100, commits - 200)
        last = flushes(w, commits - 100, 100)
    files = len(lake.files("episodes")) + len(lake.files("turns"))
    compact(lake, vacuum=False)
    with LakeWriter(lake, handle_signals=False) as w:
        after = flushes(w, commits, 100)
    print(f"\n| commits (tiny flushes{', delta-rs default hooks' if delta_defaults else ''}) | CPU per flush, "
          f"first 100 (ms) | last 100 (ms) | last / first | after compact (ms) | after / first |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| {commits} ({files} live files in episodes + turns before compact) | {first:.1f} | {last:.1f} | "
          f"{last / first:.2f}x | {after:.1f} | {after / first:.2f}x |")


def write_lake(out: Path, episodes: pa.Table, turns: pa.Table, eps_per_append: int) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of writing the rows through the batch writer."""
    shutil.rmtree(out, ignore_errors=True)
    lake = open_lake(out, create=True)
    cpu = time.process_time()
    t = time.perf_counter()
    with LakeWriter(lake, handle_signals=False) as w:
        for k in range(0, episodes.num_rows, eps_per_append):
            r = w.write_batch(episodes.slice(k, eps_per_append),
                              turns.slice(k * TURNS_PER_EPISODE, eps_per_append * TURNS_PER_EPISODE))
            assert not r.rejected, next(iter(r.rejected.values()))[0]
    return time.perf_counter() - t, time.process_time() - cpu


def write_plain(out: Path, episodes: pa.Table, turns: pa.Table) -> tuple[float, float]:
    cpu = time.process_time()
    t = time.perf_counter()
    pq.write_table(turns, out / "plain.parquet", compression="zstd")
    pq.write_table(episodes, out / "plain_episodes.parquet", compression="zstd")
    return time.perf_counter() - t, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--append-rows", type=int, default=400)
    ap.add_argument("--out", type=Path, default=Path("bench/out"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-jsonl", action="store_true", help="skip the JSONL comparison (slow at millions of rows)")
    ap.add_argument("--skip-configs", action="store_true",
                    help="memory: only default settings at ROWS and ROWS/2, not the buffer x row-size table")
    ap.add_argument("--commits", type=int, default=0, help="also measure the CPU per commit over this many commits")
    ap.add_argument("--commits-delta-defaults", action="store_true",
                    help="--commits with delta-rs's default post-commit hooks (the comparison)")
    ap.add_argument("--skip-write", action="store_true", help="only the --commits measurement")
    a = ap.parse_args()
    out = a.out
    if a.commits:
        assert a.commits >= 300, "--commits: at least 300"
        commit_growth(out / "commits", a.commits, a.commits_delta_defaults)
        if a.skip_write:
            return
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng = np.random.default_rng(0)
    n_eps = a.rows // TURNS_PER_EPISODE
    episodes, turns = make_batch(rng, 0, n_eps, a.tokens)
    eps_per_append = a.append_rows // TURNS_PER_EPISODE
    print(f"rows={turns.num_rows} tokens/row~{a.tokens} episodes={n_eps} appends of {a.append_rows} rows; "
          f"in-memory {turns.nbytes / 1e6:.0f} MB")

    # 1. trajlake batch writer and pyarrow write_table of the same rows (the limit), alternating
    # (CPU seconds too: on a shared machine they move less than wall time; trajlake spreads its work over
    # threads, validation on the caller's, hashing and Parquet encoding on two commit threads)
    ratios, lake_times, plain_times, cpu_ratios = [], [], [], []
    for i in range(a.repeat):
        t_lake, cpu_lake = write_lake(out / "lake", episodes, turns, eps_per_append)
        t_pq, cpu_pq = write_plain(out, episodes, turns)
        lake_times.append(t_lake)
        plain_times.append(t_pq)
        ratios.append(t_pq / t_lake)
        cpu_ratios.append(cpu_lake / cpu_pq)
        print(f"repeat {i + 1}: trajlake {turns.num_rows / t_lake:,.0f} rows/s ({cpu_lake:.1f} CPU-s), write_table "
              f"{turns.num_rows / t_pq:,.0f} rows/s ({cpu_pq:.1f} CPU-s): {t_pq / t_lake:.2f}x", flush=True)
    t_lake, t_pq = statistics.median(lake_times), statistics.median(plain_times)
    lake = open_lake(out / "lake")
    # 1c. JSONL lines
    t_jsonl = jsonl_bytes = 0.0
    if not a.skip_jsonl:
        t = time.perf_counter()
        with open(out / "turns.jsonl", "w") as fh:
            for batch in turns.to_batches(max_chunksize=2000):
                for row in batch.to_pylist():
                    row["started_at"] = row["started_at"].isoformat()
                    row["ended_at"] = row["ended_at"].isoformat()
                    fh.write(json.dumps(row) + "\n")
        t_jsonl = time.perf_counter() - t
        jsonl_bytes = (out / "turns.jsonl").stat().st_size
        (out / "turns.jsonl").unlink()
    lake_bytes = dir_bytes(out / "lake" / "turns") + dir_bytes(out / "lake" / "episodes")
    plain_bytes = (out / "plain.parquet").stat().st_size + (out / "plain_episodes.parquet").stat().st_size

    # 2. aggregate query
    con = connect(lake)
    q_lake = QUERY.format(src="turns")
    plain = duckdb.connect()
    q_plain = QUERY.format(src=f"read_parquet('{out / 'plain.parquet'}')")
    assert con.execute(q_lake).fetchall() == plain.execute(q_plain).fetchall(), "query results differ"
    tq_lake = best_of(lambda: con.execute(q_lake).fetchall())
    tq_plain = best_of(lambda: plain.execute(q_plain).fetchall())

    rate = turns.num_rows / t_lake
    print("\n| measure | trajlake | baseline | ratio | target |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| append rate (rows/s, median of {a.repeat}), vs pyarrow write_table | {rate:,.0f} | "
          f"{turns.num_rows / t_pq:,.0f} | {statistics.median(ratios):.2f}x (per repeat: "
          f"{', '.join(f'{r:.2f}' for r in ratios)}) | >= 0.9x |")
    # the load-independent figure: on a busy machine wall-time ratios swing with the share of the second core
    # the writer's threads get, CPU seconds much less
    print(f"| CPU seconds for the same rows (trajlake / write_table, median of {a.repeat}) | - | - | "
          f"{statistics.median(cpu_ratios):.2f}x (per repeat: {', '.join(f'{r:.2f}' for r in cpu_ratios)}) | "
          f"~1.15x (so the rate holds on one core) |")
    if not a.skip_jsonl:
        print(f"| append rate (rows/s), vs JSONL lines | {rate:,.0f} | {turns.num_rows / t_jsonl:,.0f} | "
              f"{t_jsonl / t_lake:.2f}x | - |")
        print(f"| on-disk size (MB), vs JSONL | {lake_bytes / 1e6:.1f} | {jsonl_bytes / 1e6:.1f} | "
              f"{lake_bytes / jsonl_bytes:.3f}x | <= 0.25x |")
    print(f"| on-disk size (MB), vs plain Parquet | {lake_bytes / 1e6:.1f} | {plain_bytes / 1e6:.1f} | "
          f"{lake_bytes / plain_bytes:.2f}x | - |")
    print(f"| aggregate query (s), vs DuckDB read_parquet | {tq_lake:.3f} | {tq_plain:.3f} | "
          f"{tq_lake / tq_plain:.2f}x | <= 1.3x |")
    if not a.skip_memory:
        half, _, _, _ = child_memory(a.rows // 2, a.tokens, a.append_rows, out / "mem")
        full, _, _, _ = child_memory(a.rows, a.tokens, a.append_rows, out / "mem")
        print(f"| writer peak RSS (MB), default settings, {a.rows} rows vs {a.rows // 2} rows | {full:.0f} | "
              f"{half:.0f} | {full / half:.2f}x | <= 512 MB; ~1x (no growth with the lake) |")
    if not a.skip_memory and not a.skip_configs:
        mib = 2**20
        print("\n| buffer (max_buffer_bytes; max_turn_rows lifted) | release_memory_eagerly | tokens/row | rows | peak "
              "RSS (MB) | after imports (MB) | writer's share (MB) | share / buffer | of the share, code paged in by "
              "the first commit (MB) | share without it / buffer | writer CPU-s per 100k rows |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        configs: list[tuple[int, bool | None, int, int]] = []
        for buffer in (64 * mib, DEFAULT_BUFFER_BYTES):
            for tokens in (100, 400, 2000):
                # enough rows for two buffers of this row size (~9.4 bytes per token in memory), at least 20,000
                configs.append((buffer, None, tokens, max(20_000, int(2 * buffer / (tokens * 9.4 + 300)) // 400 * 400)))
        # many commits of a small buffer (17 of 64 MiB), with and without releasing memory eagerly: what the
        # allocator keeps grows with the commits
        configs += [(64 * mib, True, 2000, 60_000), (64 * mib, False, 2000, 60_000)]
        for buffer, eager, tokens, rows in configs:
            peak, base, code, cpu = child_memory(rows, tokens, a.append_rows, out / "mem", buffer, eager)
            shown = {None: "default", True: "on", False: "off"}[eager]
            print(f"| {buffer // mib} MiB | {shown} | {tokens} | {rows} | {peak:.0f} | {base:.0f} | {peak - base:.0f} | "
                  f"{(peak - base) / (buffer / 1e6):.2f}x | {code:.0f} | "
                  f"{(peak - base - code) / (buffer / 1e6):.2f}x | {cpu / rows * 1e5:.2f} |", flush=True)
    print(f"\nversions: {lake.versions()}; python {sys.version.split()[0]}, duckdb {duckdb.__version__}, "
          f"pyarrow {pa.__version__}, {os.cpu_count()} cpus")


if __name__ == "__main__":
    main()
