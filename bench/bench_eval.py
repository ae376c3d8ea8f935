"""Evaluation benchmark (issue 4): ``trajlake eval --baseline A --candidate B --format json`` against the bare SQL
aggregates of the same metrics on the same files, both through DuckDB over the lake's views with a memory limit.

    python bench/bench_eval.py [--episodes 1000000] [--tasks 2000] [--batch 50000] [--per-process 250000]
                               [--out bench/out/eval] [--memory-limit 4GB] [--resamples 2000] [--repeat 2]
                               [--skip-generate] [--generate-only] [--skip-profile]

1. Generates a lake of two runs (A, B) over the same tasks x seeds, EPISODES episodes in all with 20 turns each
   (system, user, then 9 policy actions each answered by a tool turn) and one gateway event per episode, written
   with ``LakeWriter.write_batch`` in big vectorised batches with 2-token token lists (one commit per batch,
   PER_PROCESS episodes per writer process). Actions repeat (loops), transient faults are injected and sometimes
   retried, runs differ in skill, so every metric has data.
2. Times, each in a fresh process (so peak RSS is the process's own), REPEAT times in alternating order: the bare SQL (per-run point estimates of
   the metric vector: the per-episode query ``evaluators/episode_metrics.sql`` aggregated with avg / ratios /
   quantile_disc, and the tool-call latency quantiles), and the CLI ``trajlake eval`` with the comparison, the
   breakdown, the taxonomy and every task-cluster bootstrap. Reports the best of REPEAT runs, their ratio and
   peak RSS, and a phase breakdown of the eval (SQL / statistics) from an instrumented run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from trajlake import LakeWriter, open_lake

STEPS = 9
TURNS = 2 + 2 * STEPS
TOOLS = ("read_file", "search", "edit", "run_tests", "submit")
PATHS = 4
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
RUNS = (("bench-A", 0.3), ("bench-B", 0.0))  # (run id, skill): B is the weaker candidate
ERRORS = ("MODEL_BAD_PLAN", "MODEL_INVALID_ACTION", "ENV_TRANSIENT", "BUDGET_EXHAUSTED")
ERROR_P = (0.6, 0.2, 0.1, 0.1)


def _strings(choices: list[str], idx: np.ndarray, present: np.ndarray | None = None) -> pa.Array:
    """``choices[idx]`` as an Arrow string array without building Python strings per row (null where not
    ``present``)."""
    mask = None if present is None else ~np.asarray(present, dtype=bool)
    return pa.array(choices, pa.string()).take(pa.array(idx.astype(np.int32), mask=mask))


def make_batch(rng: np.random.Generator, run: str, skill: float, first: int, n: int, n_tasks: int
               ) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Episodes ``first .. first + n - 1`` of ``run``: (episodes, turns, gateway events), vectorised."""
    e = np.arange(first, first + n)
    task = e % n_tasks
    seed = e // n_tasks
    difficulty = ((task * 2654435761) % 1000) / 1000.0 * 3.0 - 1.5  # fixed per task
    p_success = 1.0 / (1.0 + np.exp(-(skill + difficulty)))
    success = rng.random(n) < p_success
    # actions: tool and path per step; after a transient fault, half the time the same call is retried
    tool = rng.integers(0, 4, size=(n, STEPS))
    path = rng.integers(0, PATHS, size=(n, STEPS))
    fault = rng.random((n, STEPS)) < 0.03
    for s in range(1, STEPS):
        retry = fault[:, s - 1] & (rng.random(n) < 0.5)
        tool[retry, s] = tool[retry, s - 1]
        path[retry, s] = path[retry, s - 1]
    tool[:, -1] = 4  # submit
    fault[:, -1] = False
    is_edit = tool == 2
    state = np.cumsum(is_edit & ~fault, axis=1)  # edits that ran change the state
    denied = is_edit & (rng.random((n, STEPS)) < 0.01)
    obs_status = np.where(fault, 1, np.where(denied, 2, 0))  # OK, ENV_TRANSIENT, SAFETY_BLOCK
    pol_lat = rng.lognormal(6.5, 0.5, (n, STEPS))
    tool_lat = rng.lognormal(5.5, 0.9, (n, STEPS))
    # turn layout: 0 system, 1 user, then (policy, tool) per step
    n_t = n * TURNS
    ep_of = np.repeat(np.arange(n), TURNS)
    turn_idx = np.tile(np.arange(TURNS, dtype=np.int32), n)
    step_of = np.maximum(turn_idx - 2, 0) // 2
    is_pol = (turn_idx >= 2) & (turn_idx % 2 == 0)
    is_tool = (turn_idx >= 2) & (turn_idx % 2 == 1)
    kind = np.where(turn_idx == 0, 0, np.where(turn_idx == 1, 1, np.where(is_pol, 2, 3)))
    tk = tool[ep_of, step_of]
    pk = path[ep_of, step_of]
    lat = np.where(is_pol, pol_lat[ep_of, step_of], np.where(is_tool, tool_lat[ep_of, step_of], 1.0))
    lat_us = (lat * 1000).astype(np.int64)
    start_us = np.zeros(n_t, dtype=np.int64)
    per_ep = lat_us.reshape(n, TURNS) + 1000
    start_us.reshape(n, TURNS)[:, 1:] = np.cumsum(per_ep, axis=1)[:, :-1]
    ep_base = (e.astype(np.int64) * 3_600_000_000) + int(T0.timestamp() * 1e6)
    starts = ep_base[ep_of] + start_us
    ends = starts + lat_us
    ids = [f"{run}-{i:09d}" for i in e.tolist()]
    ep_ids = pa.array(ids, pa.string())
    offsets = pa.array(np.arange(0, 2 * n_t + 1, 2, dtype=np.int32))
    tokens = pa.ListArray.from_arrays(offsets, pa.array(rng.integers(3, 32000, 2 * n_t, dtype=np.int32)))
    mask = pa.ListArray.from_arrays(offsets, pa.array(np.repeat(is_pol.astype(np.int8), 2)))
    lp = pa.ListArray.from_arrays(offsets, pa.array(np.full(2 * n_t, -0.3, dtype=np.float32)), mask=pa.array(~is_pol))
    args_choices = [json.dumps({"path": f"src/mod{p}.py"}) for p in range(PATHS)] + ["{}"]
    args_idx = np.where(tk == 4, PATHS, pk)
    status = np.where(is_tool, obs_status[ep_of, step_of], 0)
    ts = pa.timestamp("us", tz="UTC")
    turns = pa.table({
        "episode_id": ep_ids.take(pa.array(ep_of.astype(np.int32))),
        "run_id": _strings([run], np.zeros(n_t, dtype=np.int32)),
        "turn_idx": pa.array(turn_idx),
        "role": _strings(["system", "user", "assistant", "tool"], kind),
        "actor": _strings(["system", "user", "policy", "env"], kind),
        "policy_version": _strings(["p1"], np.zeros(n_t, dtype=np.int32), is_pol),
        "raw_content": _strings(["You are a coding agent.", "Fix the failing function.", "calling a tool",
                                 "ok", "error: temporarily unavailable", "denied"],
                                np.where(kind < 3, kind, 3 + status)),
        "token_ids": tokens, "loss_mask": mask, "behavior_logprobs": lp,
        "tokenizer_id": _strings(["bpe-32k"], np.zeros(n_t, dtype=np.int32)),
        "action_schema": _strings(list(TOOLS), tk, is_pol),
        "tool_call_id": _strings([f"c{k}" for k in range(STEPS)], step_of, is_pol | is_tool),
        "tool_args": _strings(args_choices, args_idx, is_pol),
        "env_state_hash": _strings([f"s{k}" for k in range(STEPS + 1)], state[ep_of, step_of], is_tool),
        "started_at": pa.array(starts, ts), "ended_at": pa.array(ends, ts), "latency_ms": lat,
        "status": _strings(["OK", "ENV_TRANSIENT", "SAFETY_BLOCK"], status),
        "tokens": pa.array(np.full(n_t, 2, dtype=np.int32)),
        "cost_usd": np.where(is_pol, 3e-6, 1e-6),
        "tool_seconds": np.where(is_tool, lat / 1000.0, 0.0),
        "fault_injected": _strings(["transient"], np.zeros(n_t, dtype=np.int32), is_tool & (status == 1)),
    })
    err = rng.choice(len(ERRORS), size=n, p=ERROR_P)
    error_class = _strings(list(ERRORS), err, ~success)
    reason = np.where(success, "success", np.where(err == 2, "env_failure", np.where(err == 3, "budget_steps",
                                                                                    "submitted")))
    truncated = ~success & ((err == 2) | (err == 3))
    wall = (per_ep.sum(axis=1) / 1e6).astype(np.float64)
    episodes = pa.table({
        "episode_id": ep_ids, "run_id": _strings([run], np.zeros(n, dtype=np.int32)),
        "task_id": pa.array([f"task-{k:05d}" for k in task.tolist()], pa.string()),
        "task_version": _strings(["v1"], np.zeros(n, dtype=np.int32)),
        "split": _strings(["train", "dev", "hidden"], task % 3),
        "env_id": _strings(["bench-env"], np.zeros(n, dtype=np.int32)),
        "env_version": _strings(["1"], np.zeros(n, dtype=np.int32)),
        "env_image_digest": _strings(["sha256:bench"], np.zeros(n, dtype=np.int32)),
        "env_seed": pa.array(seed.astype(np.int64)),
        "group_id": pa.array([f"g{t}:{s}" for t, s in zip(task.tolist(), seed.tolist(), strict=True)]),
        "attempt": pa.array(np.zeros(n, dtype=np.int32)),
        "policy_version_start": _strings(["p1"], np.zeros(n, dtype=np.int32)),
        "policy_version_end": _strings(["p1"], np.zeros(n, dtype=np.int32)),
        "started_at": pa.array(ep_base, ts), "ended_at": pa.array(ep_base + start_us.reshape(n, TURNS)[:, -1]
                                                                  + lat_us.reshape(n, TURNS)[:, -1], ts),
        "n_turns": pa.array(np.full(n, TURNS, dtype=np.int32)),
        "n_policy_tokens": pa.array(np.full(n, 2 * STEPS, dtype=np.int64)),
        "terminated": pa.array(~truncated), "truncated": pa.array(truncated),
        "termination_reason": pa.array(reason.tolist(), pa.string()),
        "error_class": error_class, "success": pa.array(success),
        "reward_total": success.astype(np.float64),
        "reward_components": pa.array([[("resolved", float(s))] for s in success.tolist()],
                                      pa.map_(pa.string(), pa.float64())),
        "tokens_in": pa.array(np.full(n, 2 * (TURNS - STEPS), dtype=np.int64)),
        "tokens_out": pa.array(np.full(n, 2 * STEPS, dtype=np.int64)),
        "cost_usd": np.full(n, STEPS * 4e-6 + 2e-6), "tool_seconds": tool_lat.sum(axis=1) / 1000.0,
        "wall_seconds": wall, "faults_injected": pa.array(fault.sum(axis=1).astype(np.int32)),
        "injection_attempted": pa.array(np.zeros(n, dtype=bool)),
    })
    first_denied = denied[:, 0]
    events = pa.table({
        "episode_id": ep_ids, "run_id": _strings([run], np.zeros(n, dtype=np.int32)),
        "turn_idx": pa.array(np.full(n, 2, dtype=np.int32)), "event_idx": pa.array(np.zeros(n, dtype=np.int32)),
        "tool": _strings(list(TOOLS), tool[:, 0]),
        "capability": _strings(["read", "read", "write", "exec", "read"], tool[:, 0]),
        "args_hash": _strings([f"h{p}" for p in range(PATHS)], path[:, 0]),
        "decision": _strings(["allow", "deny"], first_denied.astype(np.int32)),
        "reason": _strings(["granted", "path outside workspace"], first_denied.astype(np.int32)),
        "executed": pa.array(~first_denied),
        "side_effect_class": _strings(["read", "read", "write", "read", "read"], tool[:, 0]),
        "taint": pa.array([[]] * n, pa.list_(pa.string())),
        "state_hash_before": _strings(["s0"], np.zeros(n, dtype=np.int32)),
        "state_hash_after": _strings(["s0", "s1"], (is_edit[:, 0] & ~first_denied).astype(np.int32)),
        "at": pa.array(ep_base, ts),
    })
    return episodes, turns, events


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write_chunk(lake_path: str, run_index: int, first: int, count: int, batch: int, n_tasks: int) -> None:
    """Write episodes ``first .. first + count - 1`` of run ``RUNS[run_index]`` (one commit per batch)."""
    run, skill = RUNS[run_index]
    lake = open_lake(lake_path)
    t0 = time.perf_counter()
    with LakeWriter(lake, max_turn_rows=batch * TURNS, max_buffer_bytes=2 << 30, max_age_seconds=3600,
                    handle_signals=False) as w:
        for start in range(first, first + count, batch):
            rng = np.random.default_rng([run_index, start])  # the data do not depend on the chunking
            ep, tu, ev = make_batch(rng, run, skill, start, min(batch, first + count - start), n_tasks)
            w.write_batch(ep, tu, ev).raise_if_rejected()
            print(f"  {run}: episodes up to {start + ep.num_rows:,} buffered "
                  f"({time.perf_counter() - t0:.0f} s, RSS {_rss_mib():,.0f} MiB)", flush=True)


def generate(out: Path, episodes: int, n_tasks: int, batch: int, per_process: int) -> dict[str, float]:
    """Write the two runs, ``per_process`` episodes per child process (each child's memory is its own, so a
    writer that grows over many commits cannot take the machine down); returns seconds and peak RSS."""
    shutil.rmtree(out, ignore_errors=True)
    lake = open_lake(out, create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_runs([{"run_id": r, "created_at": T0, "label": r[-1], "policy_name": "bench-agent",
                       "policy_version": "p1"} for r, _ in RUNS])
    per_run = episodes // len(RUNS)
    t0 = time.perf_counter()
    peak = 0
    for r_i, (run, _) in enumerate(RUNS):
        for first in range(0, per_run, per_process):
            code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_eval; "
                    f"bench_eval.write_chunk({str(out)!r}, {r_i}, {first}, {min(per_process, per_run - first)}, "
                    f"{batch}, {n_tasks})")
            _, rss, text = _child(code)
            peak = max(peak, rss)
            print(text.rstrip() + f"\n  {run}: {first + min(per_process, per_run - first):,} / {per_run:,} "
                  f"committed ({time.perf_counter() - t0:.0f} s, child peak RSS {rss / 1024:,.0f} MiB)",
                  flush=True)
    return {"seconds": time.perf_counter() - t0, "peak_rss_kib": float(peak)}


BARE_SQL = """
WITH m AS ({episode_metrics})
SELECT run_id, count(*) AS episodes, avg(success) AS success, avg(budgeted_success) AS budgeted_success,
       avg(steps) AS steps, avg(tokens_in) AS tokens_in, avg(tokens_out) AS tokens_out,
       avg(tool_seconds) AS tool_seconds, avg(wall_seconds) AS wall_seconds, avg(cost_usd) AS cost_usd,
       sum(cost_usd) / sum(success) AS cost_per_success, avg(recovered) AS recovery_rate,
       sum(duplicate_actions) / sum(actions) AS duplicate_rate, sum(retries) / sum(actions) AS retry_rate,
       quantile_disc(wall_seconds, [0.5, 0.99]) AS episode_latency, avg(gateway_denials) AS gateway_denials,
       avg(executed_violations) AS executed_violations, avg(violated) AS violation_rate,
       avg(injection_obeyed) AS injection_obedience_rate, avg(model_failure) AS model_failure_rate,
       avg(env_failure) AS env_failure_rate, avg(error_model_invalid_action), avg(error_model_bad_plan),
       avg(error_env_transient), avg(error_env_bug), avg(error_safety_block), avg(error_budget_exhausted),
       avg(termination_success), avg(termination_submitted), avg(termination_gave_up),
       avg(termination_budget_steps), avg(termination_budget_tokens), avg(termination_budget_cost),
       avg(termination_timeout), avg(termination_safety_stop), avg(termination_env_failure),
       avg(version_switched) AS version_switch_rate
FROM m GROUP BY run_id ORDER BY run_id
"""

TOOL_SQL = """
SELECT run_id, quantile_disc(latency_ms, [0.5, 0.99]) AS tool_latency, count(*) AS calls
FROM turns WHERE run_id IN {runs} AND (role = 'tool' OR (tool_call_id IS NOT NULL AND actor <> 'policy'))
GROUP BY run_id ORDER BY run_id
"""


# Every child reports its own peak RSS (VmHWM of its address space) when it exits: the kernel's ru_maxrss of a
# child would include the RSS of this (large, after generating) process at the time of the fork.
_PEAK = textwrap.dedent("""
    import atexit, sys
    def _peak():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                sys.stderr.write("PEAK_RSS_KIB " + line.split()[1] + "\\n")
    atexit.register(_peak)
""")


def _child(code: str, *args: str) -> tuple[float, int, str]:
    """Run ``code`` in a fresh Python; returns (wall seconds, peak RSS in KiB of that process, stdout)."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _PEAK + code, *args], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"child failed ({r.returncode}): {r.stderr[-2000:]}")
    peaks = [int(x.split()[1]) for x in r.stderr.splitlines() if x.startswith("PEAK_RSS_KIB ")]
    return wall, peaks[-1] if peaks else -1, r.stdout


BARE_CHILD = textwrap.dedent("""
    import sys, trajlake
    from trajlake.evaluators import sql
    from bench_eval import BARE_SQL, TOOL_SQL
    lake, mem = sys.argv[1], sys.argv[2]
    runs = sql.quote_list(["bench-A", "bench-B"])
    con = trajlake.connect(lake, memory_limit=mem)
    q = BARE_SQL.format(episode_metrics=sql.render("episode_metrics", {"runs": runs}))
    rows = con.execute(q).fetchall()
    tool = con.execute(TOOL_SQL.format(runs=runs)).fetchall()
    print(len(rows), rows[0][:3], tool)
""")

EVAL_CHILD = textwrap.dedent("""
    import sys
    from trajlake.cli import app, main
    from trajlake.cli.eval_cmd import register
    register(app)
    sys.argv = ["trajlake", *sys.argv[1:]]
    main()
""")

PROFILE_CHILD = textwrap.dedent("""
    import sys, time, json
    from trajlake.evaluators.data import load
    from trajlake.evaluators.metrics import Settings
    from trajlake.evaluators import report as R
    lake, mem, resamples = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t = time.perf_counter(); times = {}
    data = load(lake, ["bench-A", "bench-B"], memory_limit=mem)
    times["sql: episode metrics + tool latency (load)"] = time.perf_counter() - t
    s = Settings(resamples=resamples)
    t = time.perf_counter()
    rep = R.evaluate(data, baseline="bench-A", candidate="bench-B", settings=s, taxonomy=False, breakdown=False)
    times["pairs.sql + statistics (runs + comparison)"] = time.perf_counter() - t
    t = time.perf_counter()
    R.evaluate(data, settings=s, taxonomy=False, breakdown=True)
    times["statistics incl. breakdown (runs + slices)"] = time.perf_counter() - t
    t = time.perf_counter(); R._taxonomy(data); times["sql: taxonomy"] = time.perf_counter() - t
    t = time.perf_counter(); R.to_json(rep); times["json"] = time.perf_counter() - t
    print(json.dumps(times))
""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=1_000_000)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=50_000, help="episodes per write_batch call")
    ap.add_argument("--per-process", type=int, default=250_000, help="episodes written per child process")
    ap.add_argument("--out", type=Path, default=Path("bench/out/eval"))
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip-generate", action="store_true", help="reuse the lake in --out/lake")
    ap.add_argument("--skip-profile", action="store_true")
    ap.add_argument("--generate-only", action="store_true")
    a = ap.parse_args()
    lake = a.out / "lake"
    a.out.mkdir(parents=True, exist_ok=True)
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())} at start")
    if not a.skip_generate:
        print(f"generating {a.episodes:,} episodes x {TURNS} turns into {lake}")
        g = generate(lake, a.episodes, a.tasks, a.batch, a.per_process)
        print(f"  wrote {a.episodes:,} episodes / {a.episodes * TURNS:,} turns in {g['seconds']:.0f} s: "
              f"{a.episodes * TURNS / g['seconds']:,.0f} turns/s; writer peak RSS "
              f"{g['peak_rss_kib'] / 1024:,.0f} MiB")
    size = sum(f.stat().st_size for f in lake.rglob("*") if f.is_file() and "_trajlake" not in f.parts)
    print(f"lake: {size / 2**20:,.0f} MiB of tables on disk")
    if a.generate_only:
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    os.environ.update(env)
    report = a.out / "report.json"
    eval_args = ("--lake", str(lake), "eval", "--baseline", "bench-A", "--candidate", "bench-B", "--format",
                 "json", "--out", str(report), "--memory-limit", a.memory_limit, "--resamples", str(a.resamples))
    _child(BARE_CHILD, str(lake), a.memory_limit)  # warm the page cache
    bare: list[tuple[float, int]] = []
    ev: list[tuple[float, int]] = []
    for r in range(a.repeat):
        # alternate the order (bare, eval, eval, bare, ...) so a machine that speeds up or slows down during the
        # benchmark does not favour either side; each repeat gives one eval/bare ratio
        order = ("bare", "eval") if r % 2 == 0 else ("eval", "bare")
        for which in order:
            if which == "bare":
                w, rss, _out = _child(BARE_CHILD, str(lake), a.memory_limit)
                bare.append((w, rss))
            else:
                w, rss, _out = _child(EVAL_CHILD, *eval_args)
                ev.append((w, rss))
    b, e = min(bare), min(ev)
    ratios = sorted(x[0] / y[0] for x, y in zip(ev, bare, strict=True))
    rep = json.loads(report.read_text())
    c = rep["comparison"]
    print(f"\n{a.episodes:,} episodes / {a.episodes * TURNS:,} turns, memory_limit {a.memory_limit}, "
          f"{a.resamples} resamples, {a.repeat} repeats (each run a fresh process)")
    print(f"  bare SQL aggregates      {b[0]:7.1f} s   peak RSS {b[1] / 1024:7,.0f} MiB   (runs: "
          + ", ".join(f"{x[0]:.1f}" for x in bare) + ")")
    print(f"  trajlake eval (json)     {e[0]:7.1f} s   peak RSS {e[1] / 1024:7,.0f} MiB   (runs: "
          + ", ".join(f"{x[0]:.1f}" for x in ev) + ")")
    print(f"  ratio eval / bare        {e[0] / b[0]:7.2f}x best/best, {statistics.median(ratios):.2f}x median of the "
          f"per-repeat ratios ({', '.join(f'{x:.2f}' for x in ratios)}); target <= 1.2x (issue 28); load average "
          f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    s = c["metrics"]["success"]
    print(f"  comparison: {c['n_pairs']:,} pairs over {c['n_tasks']:,} tasks; success diff {s['diff']:+.4f} "
          f"[{s['ci_low']:+.4f}, {s['ci_high']:+.4f}], p_holm {s['p_holm']:.2g}; "
          f"{len(c['metrics'])} metrics, {len(rep['breakdown'])} breakdown slices")
    if not a.skip_profile:
        _, rss, out = _child(PROFILE_CHILD, str(lake), a.memory_limit, str(a.resamples))
        print("  eval phases (instrumented run): " + ", ".join(
            f"{k} {v:.1f} s" for k, v in json.loads(out.strip().splitlines()[-1]).items()))


if __name__ == "__main__":
    main()
