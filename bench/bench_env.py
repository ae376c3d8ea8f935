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
4. A language-model policy's step beside those overheads: Mini SWE episodes played by ``hf:<model>`` (the tiny
   model ``trajlake.policies.tiny`` builds, or ``--model DIR``, any local Hugging Face causal LM), each policy
   step split into the model's generation (``HFPolicy.generate``), the environment step (``env.step``: gateway,
   tool, state hash, audit event) and the rest of the LM policy's turn (rendering, tokenizing, parsing the tool
   call); then the recorder's time per step for those episodes at the rollout default commit interval. Prints
   the gateway + environment overhead of part 1 and the recorder's time as shares of the whole step.
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
from typing import Any

from trajlake.envs import make_env, make_policy, task_view_fn
from trajlake.envs.core import StepResult

from trajlake import LakeWriter, open_lake
from trajlake.rollout.runner import EpisodeRecord, RolloutConfig, play_episode, run_rollout, write_records

try:  # part 4 needs the lm extra (torch, transformers)
    from trajlake.policies.hf import HFPolicy
    from trajlake.policies.lm import Generation
    from trajlake.policies.settings import LMSettings
    from trajlake.policies.tiny import build_tiny_model
except ImportError:  # pragma: no cover - reported by --lm-episodes
    HFPolicy = None  # type: ignore[assignment,misc]

COMMIT_EVERY_S = float(next(f.default for f in dataclasses.fields(RolloutConfig) if f.name == "commit_every_s"))


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def record_per_step(lake_dir: Path, recs: list[EpisodeRecord], play: list[float], commit_every: float
                    ) -> tuple[float, int]:
    """Record ``recs`` as a rollout worker does (a batch handed to the writer and committed once the episodes'
    own play time since the last commit reaches ``commit_every``); return (seconds spent in the writer per
    policy step, commits). The first episode is a warm-up commit, excluded."""
    warm, recs = recs[0], recs[1:]
    steps = sum(1 for r in recs for t in r.turns if t["actor"] == "policy")
    lake = open_lake(lake_dir, create=True)
    spent, commits = 0.0, 0
    with LakeWriter(lake, max_age_seconds=1e9, handle_signals=False) as w:
        write_records(w, [warm], wait=True)
        pending: list[EpisodeRecord] = []
        since_commit = 0.0
        for r, p in zip(recs, play[1:], strict=True):
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
    return spent / max(1, steps), commits


def share(part: float, whole: float) -> str:
    """``part`` as a percentage of ``whole`` with two significant digits (small shares stay readable)."""
    return f"{100 * part / whole:.2g} %"


def lm_step(split: str, episodes: int, model_dir: Path | None, max_new_tokens: int, overhead_us: float) -> None:
    """Part 4 (see the module docstring)."""
    if HFPolicy is None:
        print("| LM policy step | skipped: needs `pip install 'trajlake[lm]'` | - |")
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-env-lm-"))
    try:
        model = model_dir or build_tiny_model(tmp / "tiny")
        what = f"`{model_dir}`" if model_dir else "the tiny model (2-layer Llama, hidden 64)"
        policy = HFPolicy("lm-v1", str(model), LMSettings(max_new_tokens=max_new_tokens))
        model_s: list[float] = []
        generate = policy.generate

        def timed_generate(ids: list[int], n: int) -> Generation:
            t = time.perf_counter()
            g = generate(ids, n)
            model_s.append(time.perf_counter() - t)
            return g

        policy.generate = timed_generate  # type: ignore[method-assign,assignment]
        env = make_env("mini-swe", split=split)
        env_step_s: list[float] = []
        env_step = env.step

        def timed_step(action: str, idempotency_key: str | None = None, **kw: Any) -> StepResult:
            t = time.perf_counter()
            res = env_step(action, idempotency_key, **kw)
            env_step_s.append(time.perf_counter() - t)
            return res

        env.step = timed_step
        view = task_view_fn(env)
        tasks = [env.tasks[i % len(env.tasks)] for i in range(episodes + 1)]
        recs, play = [], []
        for i, t in enumerate(tasks):
            t0 = time.perf_counter()
            recs.append(play_episode(env, policy, run_id="bench-lm", task_id=t["task_id"],
                                     task_version=t["task_version"], seed=i // len(env.tasks), task_view=view))
            play.append(time.perf_counter() - t0)
            if i == 0:  # the warm-up episode (first model call, first sandbox) is left out of the step figures
                model_s.clear()
                env_step_s.clear()
        env.close()
        steps = sum(1 for r in recs[1:] for t in r.turns if t["actor"] == "policy")
        step_s = sum(play[1:]) / steps
        gen_s = sum(model_s) / steps
        env_s = sum(env_step_s) / steps
        rest_s = step_s - gen_s - env_s  # the LM policy's own turn: rendering, tokenizing, parsing, turn rows
        rec_s, commits = record_per_step(tmp / "lake", recs, play, COMMIT_EVERY_S)
        tokens = sum(int(t.get("tokens") or 0) for r in recs[1:] for t in r.turns if t["actor"] == "policy")
        print(f"| LM policy step, {what}, up to {max_new_tokens} new tokens ({tokens / steps:.0f} generated on "
              f"average): {episodes} Mini SWE {split} episodes / {steps} policy steps, whole step (model + "
              f"environment + the policy's own turn) | {step_s * 1e3:.1f} ms | - |")
        print(f"| of which the model's generation | {gen_s * 1e3:.1f} ms ({gen_s / step_s:.1%}) | - |")
        print(f"| of which `env.step` (gateway, tool run, state hash, audit event) | {env_s * 1e3:.2f} ms "
              f"({env_s / step_s:.1%}) | - |")
        print(f"| of which the LM policy's own turn (render, tokenize, parse, turn rows) | {rest_s * 1e3:.2f} ms "
              f"({rest_s / step_s:.1%}) | - |")
        print(f"| gateway + environment overhead per step (part 1's median) as a share of this step | "
              f"{overhead_us:.0f} µs = {share(overhead_us / 1e6, step_s)} | - |")
        print(f"| recorder per step for these episodes, a commit every {COMMIT_EVERY_S:g} s of rollout time "
              f"({commits} commits), as a share of the step | {rec_s * 1e6:.0f} µs = "
              f"{share(rec_s, step_s)} | - |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--split", default="dev")
    ap.add_argument("--random-episodes", type=int, default=60,
                    help="random-policy episodes recorded for the recorder measurement")
    ap.add_argument("--heuristic-episodes", type=int, default=42,
                    help="heuristic-policy episodes (the split's tasks, seed after seed)")
    ap.add_argument("--lm-episodes", type=int, default=8, help="LM policy episodes for part 4 (0 skips it)")
    ap.add_argument("--model", type=Path, default=None,
                    help="a local Hugging Face model folder for part 4 (default: a tiny model built here)")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="part 4: the LM policy's max_new_tokens")
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
        steps = sum(1 for r in recs[1:] for t in r.turns if t["actor"] == "policy")
        play = [(r.episode["ended_at"] - r.episode["started_at"]).total_seconds() for r in recs]
        for commit_every in (COMMIT_EVERY_S, 5.0, 0.0):
            per_step, commits = record_per_step(tmp / f"lake-{policy_name}-{commit_every}", recs, play, commit_every)
            label = (f"a commit every {commit_every:g} s of rollout time"
                     + (" (`trajlake rollout` default)" if commit_every == COMMIT_EVERY_S else "")
                     if commit_every else "a commit after every episode (`--commit-every 0`)")
            print(f"| recorder per step, {policy_name} policy, {label}: {len(recs) - 1} episodes / {steps} steps "
                  f"({steps / play_s:.0f} steps/s played, {commits} commits) | "
                  f"{per_step * 1e6:.0f} µs | {'< 1000 µs' if commit_every == COMMIT_EVERY_S else '-'} |")
    env.close()
    for workers in (1, 2):
        d = tmp / f"lake{workers}"
        t0 = time.perf_counter()
        s = run_rollout(RolloutConfig(lake=str(d), run_id=f"w{workers}", env="mini-swe", policy="heuristic",
                                      split=a.split, seeds=(0,), workers=workers))
        dt = time.perf_counter() - t0
        print(f"| rollout throughput, heuristic, {workers} worker(s), {s.written} episodes | "
              f"{s.written / dt:.2f} episodes/s | - |")
    if a.lm_episodes:
        lm_step(a.split, a.lm_episodes, a.model, a.max_new_tokens, f - b)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
