"""Language-model policy recording overhead and rollout scaling (issue 11).

    python bench/bench_lm_policy.py [--turns 200] [--context 2048] [--episodes 4] [--batch-episodes 8]

1. Recording overhead per LM policy turn at a ~2k-token context: the time ``play_episode`` spends per turn outside
   the model (rendering and tokenizing the observation, keeping the context pieces, trimming, parsing the tool
   call, building the PolicyOutput and the turn rows, moving the rendered tokens onto the observation turn),
   measured with an instant environment and a model stub that returns a fixed reply, beside the tiny model's own
   time per turn (``HFPolicy.generate`` on the same context). Target: < 1 ms per turn.
2. Rollout throughput of ``--policy hf:<tiny model>`` on Mini SWE with 1 and 2 worker processes (one torch thread
   per worker), wall time including worker start-up. Target: 2 workers >= 1.6x one.
3. With ``--batch-episodes N`` (issue 28): one worker playing N episodes at once, their turns decoded in shared
   forward passes (``--policy-arg batch_episodes=N``), against the same worker playing them one at a time: the
   same Mini SWE dev episodes (2N of them: dev tasks x seeds 0, 1, ...), one torch thread in both arms, both in
   this process, one after the other. Prints ``batched/unbatched episodes/s``; target >= 4x at N = 8.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from trajlake.envs.core import Env, ResetResult, Snapshot, StepResult
from trajlake.envs.policy import TaskView

from trajlake.policies.hf import HFPolicy
from trajlake.policies.lm import Generation
from trajlake.policies.settings import LMSettings
from trajlake.policies.tiny import build_tiny_model
from trajlake.rollout.runner import RolloutConfig, play_episode, run_rollout

OBSERVATION = ("1 passed, 2 failed (exit code 1)\nFAILED tests/test_durations.py::test_parse_units\n"
               "FAILED tests/test_durations.py::test_aliases\n") * 6


class InstantEnv(Env):
    """An environment that answers every action at once with a fixed ~200-token observation."""

    env_id = "bench"
    env_version = "1"

    def __init__(self, steps: int, intro: str):
        self.steps, self.intro, self.n = steps, intro, 0

    @property
    def image_digest(self) -> str:
        return "bench"

    def reset(self, seed: int, task_version: str | None = None, *, task_id: str | None = None) -> ResetResult:
        self.n = 0
        return ResetResult("e", self.intro, "h0", task_id or "t", task_version or "v", seed)

    def step(self, action: str, idempotency_key: str | None = None, *, tokens: int = 0,
             cost_usd: float = 0.0) -> StepResult:
        self.n += 1
        done = self.n >= self.steps
        return StepResult(OBSERVATION, {"resolved": 0.0} if done else {}, False, done, "OK", 0.0, f"h{self.n}",
                          termination_reason="budget_steps" if done else None, tool="run_tests")

    def snapshot(self) -> Snapshot:
        raise NotImplementedError

    def restore(self, snapshot: Snapshot) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def overhead(model_dir: Path, turns: int, context: int) -> dict[str, float]:
    from trajlake.envs.mini_swe.env import TOOL_DOCS

    max_new = 16
    settings = LMSettings(max_new_tokens=max_new, max_context=context + max_new)
    policy = HFPolicy("v1", str(model_dir), settings)
    assert policy.renderer is not None
    call = '<tool_call>{"name": "run_tests", "arguments": {"command": "pytest -q"}}</tool_call>'
    reply = [*policy.renderer.encode(call), policy.renderer.eos_id]
    text = policy.renderer.decode(reply[:-1])
    # An intro of ~context/2 tokens; the observations then fill the window until drop_oldest trims it.
    intro = "Bug report: `parse_duration` fails.\n" + "src/durations.py\n" * (context // 40)
    model_generate = policy.generate
    model_times: list[float] = []
    contexts: list[int] = []

    def stub(ids: list[int], n: int) -> Generation:
        contexts.append(len(ids))
        return Generation(list(reply), [-0.1] * len(reply), text, len(ids), len(reply), ended_with_eos=True)

    policy.generate = stub  # type: ignore[method-assign]
    env = InstantEnv(turns, intro)
    view = TaskView("t", "v", "stmt", TOOL_DOCS)
    play_episode(env, policy, run_id="warm", task_id="t", task_version="v", seed=0, task_view=lambda *_: view)
    t0, c0 = time.perf_counter(), time.thread_time()
    rec = play_episode(env, policy, run_id="bench", task_id="t", task_version="v", seed=0,
                       task_view=lambda *_: view)
    elapsed, cpu = time.perf_counter() - t0, time.thread_time() - c0
    n_policy = sum(1 for t in rec.turns if t["actor"] == "policy")
    # The model's own time per turn on the same contexts (a sample of turns).
    policy.reset(view, 0)
    ids = policy.renderer.initial(policy.system, intro)
    ids = (ids * (context // max(1, len(ids)) + 1))[:context]
    for _ in range(10):
        t = time.perf_counter()
        model_generate(ids, max_new)
        model_times.append(time.perf_counter() - t)
    return {"turns": n_policy, "mean_context": statistics.mean(contexts[-n_policy:]),
            "overhead_ms": elapsed / n_policy * 1e3, "overhead_cpu_ms": cpu / n_policy * 1e3, "model_ms": statistics.median(model_times) * 1e3}


def scaling(model_dir: Path, episodes: int) -> dict[int, tuple[float, float]]:
    """Per worker count: (episodes/s over the whole run including worker start-up, episodes/s between the first
    and the last finished episode, i.e. once the workers are up)."""
    from trajlake.envs import list_tasks

    tasks = tuple(t["task_id"] for t in list_tasks("mini-swe", "dev")[:episodes])
    out = {}
    for workers in (1, 2):
        lake = tempfile.mkdtemp(prefix="bench-lm-lake-")
        try:
            cfg = RolloutConfig(lake=lake, run_id=f"w{workers}", env="mini-swe", policy=f"hf:{model_dir}",
                                split="dev", seeds=(0,), workers=workers, task_ids=tasks,
                                policy_args={"max_new_tokens": "16", "threads": "1"}, commit_every_s=0.0)
            done_at: list[float] = []
            t = time.perf_counter()
            s = run_rollout(cfg, progress=lambda n, total, stamps=done_at: stamps.append(time.perf_counter()))
            dt = time.perf_counter() - t
            assert s.written == len(tasks) and not s.failed_items, s.failed_items
            steady = (len(done_at) - 1) / (done_at[-1] - done_at[0]) if len(done_at) > 1 else float("nan")
            out[workers] = (len(tasks) / dt, steady)
        finally:
            shutil.rmtree(lake, ignore_errors=True)
    return out


def batching(model_dir: Path, batch: int, episodes: int, max_steps: int | None = None, trim_headroom: int = 0
             ) -> dict[int, tuple[float, float]]:
    """(episodes per wall second, episodes per CPU second of this process) of one in-process worker playing
    ``episodes`` Mini SWE dev episodes one at a time (key 1) and ``batch`` at a time (key ``batch``), whole run (the
    model loaded in both); ``max_steps``: a budget of that many steps instead of the tasks' own. On a shared machine
    the CPU seconds (all threads of the process) say what the work costs whatever else runs. ``trim_headroom``:
    the policy argument of that name in both arms (a trim frees that many tokens more, so the next turns extend
    the cached context)."""
    from trajlake.envs import list_tasks

    dev = [t["task_id"] for t in list_tasks("mini-swe", "dev")]
    n_seeds = -(-episodes // len(dev))
    tasks = tuple(dev[:-(-episodes // n_seeds)])
    out = {}
    for n in (1, batch):
        lake = tempfile.mkdtemp(prefix="bench-lm-lake-")
        try:
            cfg = RolloutConfig(lake=lake, run_id=f"b{n}", env="mini-swe", policy=f"hf:{model_dir}", split="dev",
                                seeds=tuple(range(n_seeds)), workers=1, task_ids=tasks,
                                env_kwargs={"budget": {"max_steps": max_steps}} if max_steps else {},
                                policy_args={"max_new_tokens": "16", "threads": "1", "batch_episodes": str(n),
                                             "trim_headroom": str(trim_headroom)})
            t, c = time.perf_counter(), time.process_time()
            s = run_rollout(cfg)
            dt, dc = time.perf_counter() - t, time.process_time() - c
            assert s.written == len(tasks) * n_seeds and not s.failed_items, s.failed_items
            out[n] = (s.written / dt, s.written / dc)
        finally:
            shutil.rmtree(lake, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--episodes", type=int, default=4, help="Mini SWE dev tasks per worker setting")
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--batch-episodes", type=int, default=0,
                    help="N: also compare one worker playing N episodes at once (batched decoding) with one at a time")
    ap.add_argument("--batch-max-steps", type=int, default=0,
                    help="with --batch-episodes: the same comparison again with a budget of this many steps (short "
                         "episodes whose contexts stay within the window, so that no turn is trimmed)")
    ap.add_argument("--trim-headroom", type=int, default=0,
                    help="with --batch-episodes: the same comparison again with --policy-arg trim_headroom=T in both "
                         "arms (a trim frees T tokens more, so the turns after it extend the cached context)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-lm-"))
    try:
        model = build_tiny_model(tmp / "tiny")
        o = overhead(model, a.turns, a.context)
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(f"recording overhead per LM policy turn: {o['overhead_ms']:.3f} ms wall, {o['overhead_cpu_ms']:.3f} ms "
              f"CPU (thread time) over {o['turns']} turns at a mean "
              f"context of {o['mean_context']:.0f} tokens; the tiny model's own time per turn "
              f"(16 new tokens, {a.context}-token context): {o['model_ms']:.1f} ms "
              f"(overhead = {o['overhead_ms'] / o['model_ms']:.1%} of it); target < 1 ms")
        if not a.skip_scaling:
            s = scaling(model, a.episodes)
            for i, what in enumerate(("whole run, worker start-up included", "after the first finished episode")):
                print(f"rollout throughput, hf tiny model, {a.episodes} Mini SWE dev episodes, {what}: 1 worker "
                      f"{s[1][i]:.3f} episodes/s, 2 workers {s[2][i]:.3f} episodes/s ({s[2][i] / s[1][i]:.2f}x); "
                      f"target >= 1.6x")
            print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        if a.batch_episodes > 1:
            n = a.batch_episodes
            b = batching(model, n, 2 * n)
            print(f"rollout throughput, hf tiny model, {2 * n} Mini SWE dev episodes, 1 worker, 1 torch thread, whole "
                  f"run: one at a time {b[1][0]:.3f} episodes/s ({b[1][1]:.3f} per CPU second), {n} at a time "
                  f"{b[n][0]:.3f} episodes/s ({b[n][1]:.3f} per CPU second)")
            print(f"batched/unbatched episodes/s: {b[n][0] / b[1][0]:.2f}x (N = {n}); target >= 4x")
            print(f"batched/unbatched episodes per CPU second: {b[n][1] / b[1][1]:.2f}x")
            print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
            if a.batch_max_steps:
                b = batching(model, n, 2 * n, a.batch_max_steps)
                print(f"same with a budget of {a.batch_max_steps} steps: one at a time {b[1][0]:.3f} episodes/s, {n} "
                      f"at a time {b[n][0]:.3f} episodes/s: {b[n][0] / b[1][0]:.2f}x; per CPU second "
                      f"{b[n][1] / b[1][1]:.2f}x")
                print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
            if a.trim_headroom:
                b = batching(model, n, 2 * n, trim_headroom=a.trim_headroom)
                print(f"same with trim_headroom={a.trim_headroom}: one at a time {b[1][0]:.3f} episodes/s, {n} at a "
                      f"time {b[n][0]:.3f} episodes/s: {b[n][0] / b[1][0]:.2f}x; per CPU second "
                      f"{b[n][1] / b[1][1]:.2f}x")
                print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
