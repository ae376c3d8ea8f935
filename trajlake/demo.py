"""Synthetic but realistic episodes for ``trajlake demo``, tests and benchmarks.

Three runs (B0, B1, R1) of a tool-using coding agent over template-family task splits: system and user prompts,
assistant actions with token ids and behaviour log-probs (loss mask 1), tool observations (mask 0), injected
transient faults and recoveries, gateway decisions, budgets, costs and latencies. Deterministic given the seed;
episode ids are stable, so running the demo twice is a no-op.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from trajlake.record.episode import CostModel, build_episode, price_turns
from trajlake.record.writer import LakeWriter
from trajlake.schemas.vocab import ErrorClass, Split, Status

VOCAB = 32_000
TOOLS = ("read_file", "search", "edit", "run_tests", "submit")
#: Demo prices: USD per million input / output tokens, and the default tool-second price.
DEMO_COSTS = CostModel(price_in=0.5, price_out=1.5)
_T0 = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)


@dataclass(frozen=True)
class DemoRun:
    run_id: str
    label: str
    policy_version: str
    skill: float  # success log-odds offset


RUNS = (DemoRun("demo-B0", "B0", "sft-0", -0.6), DemoRun("demo-B1", "B1", "sft-1", 0.0),
        DemoRun("demo-R1", "R1", "rl-3", 0.7))


def demo_tasks(n_tasks: int = 40) -> list[dict[str, Any]]:
    out = []
    for i in range(n_tasks):
        fam = f"lib{i % 5}/mut{(i // 5) % 4}"
        split = (Split.TRAIN, Split.TRAIN, Split.DEV, Split.HIDDEN)[(i // 5) % 4]
        out.append({
            "task_id": f"demo/task-{i:03d}", "task_version": f"v{1 + i % 2}", "env_id": "demo-swe",
            "split": split, "family": fam, "difficulty": ("easy", "medium", "hard")[i % 3],
            "created_at": _T0, "statement": f"Function f{i} in lib{i % 5} returns a wrong value for edge inputs.",
            "provenance": {"generator": "trajlake.demo", "source": f"lib{i % 5}", "commit": "demo",
                           "mutator": f"mut{(i // 5) % 4}", "seed": i, "diff_hash": None},
            "has_oracle": True, "budget": {"max_steps": 12, "max_tokens": 20_000, "max_cost": 0.05},
        })
    return out


def _tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(3, VOCAB, size=n, dtype=np.int32).tolist()


def generate_episode(rng: np.random.Generator, run: DemoRun, task: dict[str, Any], seed: int,
                     start: dt.datetime, policy_turn_tokens: int = 120, obs_tokens: int = 250
                     ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """One synthetic episode: (episode row, turn rows, gateway event rows)."""
    ep_id = f"{run.run_id}/{task['task_id']}/s{seed}"
    difficulty = {"easy": 1.0, "medium": 0.0, "hard": -1.0}[task["difficulty"]]
    p_success = 1 / (1 + np.exp(-(run.skill + difficulty)))
    will_succeed = rng.random() < p_success
    max_steps = task["budget"]["max_steps"]
    n_steps = int(rng.integers(2, 6)) if will_succeed else int(rng.integers(3, max_steps + 3))
    t = start
    turns: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []

    def add(role: str, actor: str, n_tok: int, text: str, lat_ms: float, **kw: Any) -> None:
        nonlocal t
        begin = t
        t = t + dt.timedelta(milliseconds=lat_ms)
        toks = _tokens(rng, max(1, n_tok))
        is_pol = actor == "policy"
        row = {"episode_id": ep_id, "run_id": run.run_id, "turn_idx": len(turns), "role": role, "actor": actor,
               "policy_version": run.policy_version if is_pol else None, "raw_content": text,
               "token_ids": toks, "loss_mask": [1 if is_pol else 0] * len(toks),
               "behavior_logprobs": (-rng.exponential(0.4, len(toks))).astype(np.float32).tolist() if is_pol else None,
               "tokenizer_id": "demo-bpe-32k", "started_at": begin, "ended_at": t, "latency_ms": lat_ms,
               "status": Status.OK, "tokens": len(toks), "cost_usd": None, "tool_seconds": 0.0}
        row.update(kw)
        turns.append(row)

    add("system", "system", 180, "You are a coding agent. Use the tools to fix the bug.", 1.0)
    add("user", "user", 60, task["statement"], 1.0)
    faults = 0
    truncated = False
    error_class = None
    steps = 0
    for step in range(n_steps):
        if step >= max_steps:
            truncated = True
            error_class = ErrorClass.BUDGET_EXHAUSTED
            break
        steps += 1
        last = step == n_steps - 1
        tool = "submit" if last else TOOLS[int(rng.integers(0, 4))]
        args = json.dumps({"path": f"src/mod{int(rng.integers(0, 4))}.py"} if tool != "submit" else {})
        key = f"{ep_id}#{step}"
        add("assistant", "policy", int(rng.integers(policy_turn_tokens // 2, policy_turn_tokens * 3 // 2)),
            f"I will call {tool}.", float(rng.lognormal(6.5, 0.5)), action_schema=tool,
            tool_call_id=f"call-{step}", tool_args=args, idempotency_key=key)
        denied = tool == "edit" and rng.random() < 0.05
        events.append({"episode_id": ep_id, "run_id": run.run_id, "turn_idx": len(turns) - 1, "event_idx": 0,
                       "tool": tool, "capability": "write" if tool == "edit" else ("exec" if tool == "run_tests" else "read"),
                       "args_hash": hashlib.sha256(args.encode()).hexdigest(), "decision": "deny" if denied else "allow",
                       "reason": "path outside workspace" if denied else "granted", "executed": not denied,
                       "side_effect_class": "write" if tool == "edit" else "read", "idempotency_key": key,
                       "taint": ["tool_output"] if step else [], "state_hash_before": f"s{step}",
                       "state_hash_after": f"s{step + (0 if denied else 1)}", "at": t})
        if tool == "submit":
            break
        fault = rng.random() < 0.08
        status = Status.ENV_TRANSIENT if fault else (Status.SAFETY_BLOCK if denied else Status.OK)
        faults += int(fault)
        tool_s = float(rng.lognormal(-1.0, 0.8))
        add("tool", "env", int(rng.integers(obs_tokens // 2, obs_tokens * 3 // 2)),
            "error: temporarily unavailable" if fault else f"output of {tool}", tool_s * 1000,
            status=status, tool_seconds=tool_s, tool_call_id=f"call-{step}",
            observation_hash=f"{int(rng.integers(0, 1 << 62)):016x}", env_state_hash=f"s{step + 1}",
            fault_injected="transient" if fault else None)
    success = will_succeed and not truncated
    if truncated:
        reason = "budget_steps"
    elif success:
        reason = "success"
    else:
        reason = "submitted" if rng.random() < 0.8 else "gave_up"
        error_class = ErrorClass.MODEL_BAD_PLAN if rng.random() < 0.7 else ErrorClass.MODEL_INVALID_ACTION
    comps = {"resolved": 1.0 if success else 0.0, "partial": 1.0 if success else float(rng.choice([0.0, 0.5]))}
    price_turns(turns, DEMO_COSTS)
    ep = build_episode({
        "episode_id": ep_id, "run_id": run.run_id, "task_id": task["task_id"], "task_version": task["task_version"],
        "split": task["split"], "env_id": "demo-swe", "env_version": "1.0", "env_image_digest": "sha256:demo",
        "env_seed": seed, "attempt": 0, "policy_version_start": run.policy_version,
        "policy_version_end": run.policy_version, "started_at": start, "ended_at": t,
        "terminated": not truncated, "truncated": truncated, "termination_reason": reason,
        "error_class": error_class, "success": bool(success), "reward_total": comps["resolved"] + 0.1 * comps["partial"],
        "reward_components": comps, "wall_seconds": (t - start).total_seconds(), "injection_attempted": False,
        "final_state_hash": f"s{steps}", "sandbox": "none", "verification_source": "synthetic",
    }, turns)
    assert ep["faults_injected"] == faults
    return ep, turns, events


def generate(seeds: int = 3, n_tasks: int = 40, seed: int = 0, runs: tuple[DemoRun, ...] = RUNS,
             policy_turn_tokens: int = 120, obs_tokens: int = 250
             ) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]]:
    """Yield (episode, turns, events) for every run x task x seed.

    Each episode has its own random stream (from seed, run, task and episode seed), so an episode's content
    does not depend on how many others are generated: re-running with more seeds or tasks only adds."""
    tasks = demo_tasks(n_tasks)
    for r_i, run in enumerate(runs):
        for k, task in enumerate(tasks):
            for s in range(seeds):
                rng = np.random.default_rng([seed, r_i, k, s])
                start = _T0 + dt.timedelta(days=r_i, minutes=10 * (k * seeds + s))
                yield generate_episode(rng, run, task, s, start, policy_turn_tokens, obs_tokens)


def write_demo(writer: LakeWriter, seeds: int = 3, n_tasks: int = 40, seed: int = 0) -> int:
    """Write the demo runs, tasks and episodes; returns the number of episodes newly written."""
    writer.write_tasks(demo_tasks(n_tasks))
    writer.write_runs([{"run_id": r.run_id, "created_at": _T0, "label": r.label,
                        "config": json.dumps({"policy": r.policy_version, "generator": "trajlake.demo"}),
                        "policy_name": "demo-agent", "policy_version": r.policy_version,
                        "policy_checkpoint_hash": f"sha256:{r.policy_version}", "code_version": "demo"}
                       for r in RUNS])
    written = 0
    eps: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for ep, tu, ev in generate(seeds, n_tasks, seed):
        eps.append(ep)
        turns += tu
        events += ev
        if len(eps) >= 100:
            res = writer.write_batch(eps, turns, events)
            res.raise_if_rejected()
            written += len(res.accepted)
            eps, turns, events = [], [], []
    if eps:
        res = writer.write_batch(eps, turns, events)
        res.raise_if_rejected()
        written += len(res.accepted)
    writer.flush()
    return written
