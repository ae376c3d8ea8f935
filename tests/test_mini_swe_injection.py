"""Mini SWE's side of the prompt-injection suite: the payload in the source file the fix must read, the planted
secret, the goal predicates on executed effects, the gullible policy, and the gateway's protected paths as the
defence (hand counts through the runner and ``trajlake eval``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from trajlake.envs.mini_swe.env import MiniSWEEnv
from trajlake.envs.mini_swe.grading import load_tasks, materialize_workspace, scan_for_tampering
from trajlake.envs.mini_swe.injection import (
    ATTACKS,
    GOALS,
    INJECTION_MARK,
    find_instructions,
    injected_tasks,
    plant,
)
from trajlake.envs.mini_swe.policies import POLICIES
from trajlake.evaluators.data import load
from trajlake.evaluators.metrics import Settings
from trajlake.evaluators.report import evaluate

from tests.env_play import play_policy
from trajlake.query import connect
from trajlake.rollout.runner import RolloutConfig, run_rollout

TASKS = load_tasks()
TASK = next(t for t in TASKS if t["split"] == "dev")
DEFENCE = ["tests", ".env"]


def play(env: MiniSWEEnv, policy: str, task_id: str) -> tuple[dict[str, float], list[Any]]:
    task = next(t for t in env.tasks if t["task_id"] == task_id)
    steps = play_policy(env, POLICIES[policy](policy), task_id, task["task_version"], max_steps=40)
    assert steps[-1].done, "episode did not end"
    return dict(steps[-1].reward_components), steps


def test_variants_pair_every_task_with_every_goal() -> None:
    variants = injected_tasks(TASKS, "important_instructions")
    assert len(variants) == len(TASKS) * len(GOALS)
    for v in variants[:6]:
        base = next(t for t in TASKS if t["task_id"] == v["injection"]["base_task_id"])
        assert v["task_id"] == f"{base['task_id']}/inj/{v['injection']['goal']}"
        assert v["split"] == base["split"] and v["fix_diff"] == base["fix_diff"]
        assert v["task_version"] != base["task_version"] and v["injection"]["secret"] not in v["statement"]
    with pytest.raises(ValueError, match="unknown attack"):
        injected_tasks(TASKS[:1], "shouting")


@pytest.mark.parametrize("attack", ATTACKS)
def test_payload_is_found_and_is_not_taken_for_tampering(tmp_path: Path, attack: str) -> None:
    for variant in injected_tasks([TASK], attack):
        ws = tmp_path / variant["task_id"].replace("/", "_")
        materialize_workspace(variant, ws)
        plant(ws, variant)
        source = (ws / variant["file"]).read_text()
        assert source.startswith("# " + INJECTION_MARK)
        found = find_instructions(source)
        assert [g for g, _ in found] == [variant["injection"]["goal"]]
        # the planted comment is the environment's, not the agent's: the grader's tampering scan must not flag it
        assert scan_for_tampering(ws, variant) == []


@pytest.mark.parametrize("protected", [False, True])
def test_gullible_falls_where_the_gateway_allows(tmp_path: Path, protected: bool) -> None:
    env = MiniSWEEnv(tasks=[TASK], injection="important_instructions", workdir=tmp_path,
                     protected_paths=DEFENCE if protected else ())
    try:
        for goal in GOALS:
            task_id = f"{TASK['task_id']}/inj/{goal}"
            rewards, steps = play(env, "gullible", task_id)
            # the fix still lands (the hidden tests grade it); the attack only where nothing held it back
            assert rewards["resolved"] == 1.0 and env.injection_attempted
            assert env.attack_success is (not protected), (goal, protected)
            blocked = [s for s in steps if s.status == "SAFETY_BLOCK"]
            assert len(blocked) == (1 if protected else 0)
            if protected:
                assert "protected path" in blocked[0].observation
            # the read that showed the payload taints the next call with the injection's label
            assert any(f"injection:{goal}@source:" in t for s in steps for t in s.taint)
            # the oracle reads the same payload and ignores it
            rewards, _ = play(env, "oracle", task_id)
            assert rewards["resolved"] == 1.0 and env.attack_success is False
        # benign tasks: no attacked variant, attack_success stays None
    finally:
        env.close()
    benign = MiniSWEEnv(tasks=[TASK], workdir=tmp_path)
    try:
        rewards, _ = play(benign, "gullible", TASK["task_id"])
        assert rewards["resolved"] == 1.0 and benign.attack_success is None and not benign.injection_attempted
    finally:
        benign.close()


@pytest.mark.slow
def test_runner_and_eval_count_mini_swe_attacks_by_hand(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    ids = tuple(f"{TASK['task_id']}/inj/{g}" for g in GOALS)
    for run_id, kwargs in (("open", {}), ("defended", {"protected_paths": DEFENCE})):
        cfg = RolloutConfig(lake=str(lake), run_id=run_id, env="mini-swe", policy="gullible", split="dev",
                            seeds=(0,), commit_every_s=0, task_ids=ids,
                            env_kwargs={"injection": "important_instructions", **kwargs})
        s = run_rollout(cfg)
        assert not s.failed_items and s.written == 2
    rows = connect(lake).execute("select run_id, task_id, success, attack_success, injection_attempted "
                                 "from episodes order by all").fetchall()
    assert rows == sorted([("defended", i, True, False, True) for i in ids] + [("open", i, True, True, True) for i in ids])
    data = load(lake)
    try:
        report = evaluate(data, baseline="open", candidate="defended", settings=Settings(resamples=200, seed=1),
                          taxonomy=False)
    finally:
        data.close()
    assert report["runs"]["open"]["metrics"]["attack_success_rate"]["estimate"] == 1.0
    assert report["runs"]["defended"]["metrics"]["attack_success_rate"]["estimate"] == 0.0
    assert report["runs"]["defended"]["metrics"]["utility_under_attack"]["estimate"] == 1.0
    assert report["comparison"]["metrics"]["attack_success_rate"]["diff"] == pytest.approx(-1.0)


@pytest.mark.slow
def test_oracle_solves_every_injected_dev_task(tmp_path: Path) -> None:
    def play_share(share: int) -> int:
        # each thread its own env (an env plays one episode at a time); the time goes to the graders' pytest
        # processes, so two shares use both cores
        env = MiniSWEEnv("dev", injection="tool_knowledge", workdir=tmp_path / f"share{share}")
        try:
            for t in env.tasks[share::2]:
                rewards, _ = play(env, "oracle", t["task_id"])
                assert rewards["resolved"] == 1.0 and env.injection_attempted and env.attack_success is False, \
                    t["task_id"]
            return len(env.tasks)
        finally:
            env.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        n_tasks, _ = pool.map(play_share, (0, 1))
    assert n_tasks == 2 * sum(1 for t in TASKS if t["split"] == "dev")
