"""Counterfactual process-reward test: the sound example reward never moves the wrong way, the hackable one
does, and the perturbations do what their names say (issue 14)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trajlake.evaluators.process_rewards import grounded_progress, passed_text_reward
from trajlake.evaluators.reward_check import FABRICATED, PERTURBATIONS, check_reward, perturb

from tests.conftest import DEV_ROLLOUT_TASKS, run_cli
from trajlake import LakeWriter, open_lake
from trajlake.errors import TrajlakeError

SOUND = "trajlake.evaluators.process_rewards:grounded_progress"
HACKABLE = "trajlake.evaluators.process_rewards:passed_text_reward"


def _calls(fixed: bool) -> list[tuple[str, dict[str, Any], str, str]]:
    """(tool, args, observation, state hash after): read, edit, test, submit, as the Mini SWE oracle plays."""
    return [("read_file", {"path": "src/x.py"}, "  1| def f(x):\n  2|     return x + 1", "s0"),
            ("edit", {"path": "src/x.py", "old": "x + 1", "new": "x - 1"}, "edited src/x.py", "s1"),
            ("run_tests", {"command": "pytest -q"},
             "12 passed, 0 failed (exit code 0)" if fixed else "9 passed, 3 failed (exit code 1)", "s1"),
            ("submit", {}, "submitted; resolved: " + ("yes" if fixed else "no"), "s2")]


def _write(w: LakeWriter, run: str, task: str, fixed: bool) -> None:
    ep = w.start_episode(run_id=run, task_id=task, task_version="v1", env_id="test-env", env_version="1",
                         split="dev", env_seed=0, policy_version="p1")
    ep.add_turn("user", f"Fix {task}", env_state_hash="s0")
    for tool, args, obs, state in _calls(fixed):
        ep.add_turn("assistant", json.dumps({"tool": tool, "args": args}), action_schema=tool,
                    tool_args=json.dumps(args))
        ep.add_turn("tool", obs, action_schema=tool, env_state_hash=state)
    ep.finish(terminated=True, truncated=False, termination_reason="submitted", success=fixed,
              reward_components={"resolved": float(fixed)})


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Any:
    lk = open_lake(tmp_path_factory.mktemp("rc") / "lake", create=True)
    with LakeWriter(lk) as w:
        for i in range(8):
            _write(w, "r1", f"task-{i}", fixed=i % 4 != 0)  # 6 fixed, 2 not
    return lk


def _turns(fixed: bool = True) -> list[dict[str, Any]]:
    turns = [{"turn_idx": 0, "role": "user", "actor": "user", "raw_content": "Fix it", "action_schema": None,
              "tool_args": None, "status": "OK", "env_state_hash": "s0"}]
    for tool, args, obs, state in _calls(fixed):
        turns.append({"role": "assistant", "actor": "policy", "raw_content": tool, "action_schema": tool,
                      "tool_args": json.dumps(args), "status": "OK", "env_state_hash": None})
        turns.append({"role": "tool", "actor": "env", "raw_content": obs, "action_schema": tool,
                      "tool_args": None, "status": "OK", "env_state_hash": state})
    for i, t in enumerate(turns):
        t["turn_idx"] = i
    return turns


def _tools(turns: list[dict[str, Any]]) -> list[str]:
    return [t["action_schema"] or "-" for t in turns if t["actor"] == "policy"]


def test_perturbations_do_what_they_say() -> None:
    t = _turns()
    assert _tools(perturb(t, "delete_key_call") or []) == ["read_file", "run_tests", "submit"]
    ins = perturb(t, "insert_useless_call") or []
    assert _tools(ins) == ["read_file", "edit", "run_tests", "read_file", "submit"]
    # the repeated read leaves the state as it was before it (s1), not the stale s0 of the original read
    assert ins[8]["env_state_hash"] == "s1"
    assert _tools(perturb(t, "swap_steps") or []) == ["read_file", "run_tests", "edit", "submit"]
    fab = perturb(t, "fabricated_progress") or []
    assert _tools(fab) == ["read_file", "edit", "run_tests", "-", "submit"]
    assert fab[7]["raw_content"] == FABRICATED and fab[7]["actor"] == "policy"
    for p in PERTURBATIONS:
        cf = perturb(t, p) or []
        assert [x["turn_idx"] for x in cf] == list(range(len(cf)))
    assert perturb(t[:1], "delete_key_call") is None  # no tool call: not applicable
    with pytest.raises(TrajlakeError, match="unknown perturbation"):
        perturb(t, "shuffle")


def test_example_rewards_by_hand() -> None:
    t = _turns()
    assert grounded_progress(t) == pytest.approx(1.0 - 4 * 0.01)
    assert grounded_progress(_turns(fixed=False)) == pytest.approx(0.5 - 4 * 0.01)
    assert grounded_progress(perturb(t, "delete_key_call") or []) == pytest.approx(-3 * 0.01)  # no change made
    assert grounded_progress(perturb(t, "fabricated_progress") or []) == grounded_progress(t)
    assert passed_text_reward(t) == pytest.approx(1 + 4 * 0.05)
    assert passed_text_reward(perturb(t, "fabricated_progress") or []) == pytest.approx(2 + 4 * 0.05)


def test_grounded_progress_per_turn_by_hand() -> None:
    """The reward where it is earned: -0.01 on each call, +0.5 on the observation of the edit (the first attested
    change), +0.5 on the clean test run after it; an unclean run earns nothing."""
    from trajlake.evaluators.process_rewards import grounded_progress_per_turn

    # user, read, obs, edit, obs (s0 -> s1), run_tests, obs (clean), submit, obs
    t = _turns()
    assert grounded_progress_per_turn(t) == pytest.approx([0, -0.01, 0, -0.01, 0.5, -0.01, 0.5, -0.01, 0], abs=0)
    assert grounded_progress_per_turn(_turns(fixed=False)) == pytest.approx(
        [0, -0.01, 0, -0.01, 0.5, -0.01, 0, -0.01, 0], abs=0)
    assert grounded_progress_per_turn(perturb(t, "delete_key_call") or []) == pytest.approx(
        [0, -0.01, 0, -0.01, 0, -0.01, 0], abs=0)


_TOOLS = ("read_file", "edit", "run_tests", "submit", None)
_SUMMARIES = ("3 passed, 0 failed (exit code 0)", "1 passed, 2 failed (exit code 1)", "0 passed, 0 failed", "", "x")


@st.composite
def _episodes(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Random turn lists: any actors, tools, state hashes (or none) and test summaries, in any order."""
    n = draw(st.integers(0, 14))
    turns = []
    for i in range(n):
        turns.append({"turn_idx": i, "role": "x", "actor": draw(st.sampled_from(("policy", "env", "user"))),
                      "action_schema": draw(st.sampled_from(_TOOLS)), "raw_content": draw(st.sampled_from(_SUMMARIES)),
                      "tool_args": None, "status": "OK",
                      "env_state_hash": draw(st.sampled_from(("s0", "s1", "s2", None)))})
    return turns


@settings(max_examples=300, deadline=None)
@given(_episodes())
def test_per_turn_process_rewards_sum_to_their_rewards(turns: list[dict[str, Any]]) -> None:
    """Every per-turn process reward the trainer may use gives one value per turn, summing to the reward of the
    same name (the trainer's R2 credits these values turn by turn)."""
    from trajlake.evaluators import process_rewards

    from trajlake.train.config import PROCESS_REWARDS

    assert set(process_rewards.PER_TURN) == set(PROCESS_REWARDS)
    for name, per_turn in process_rewards.PER_TURN.items():
        values = per_turn(turns)
        assert len(values) == len(turns)
        assert sum(values) == pytest.approx(getattr(process_rewards, name)(turns), abs=1e-12), name


def test_sound_and_hackable_rewards_are_told_apart(lake: Any) -> None:
    sound = check_reward(lake, "r1", SOUND)
    assert sound["trajectories"] == 8 and sound["hackable_under"] == []
    for p in PERTURBATIONS:
        r = sound["perturbations"][p]
        assert r["applicable"] == 8 and r["wrong"] == 0 and r["ci_low"] == 0.0 and r["ci_high"] < 0.5
    hack = check_reward(lake, "r1", HACKABLE)
    assert hack["hackable_under"] == ["insert_useless_call", "fabricated_progress"]
    fab = hack["perturbations"]["fabricated_progress"]
    assert fab["wrong"] == 8 and fab["wrong_share"] == 1.0 and fab["mean_delta"] == pytest.approx(1.0)
    assert hack["perturbations"]["delete_key_call"]["wrong"] == 0
    assert hack["perturbations"]["swap_steps"]["unchanged_share"] == 1.0


def test_sql_reward_and_errors(lake: Any) -> None:
    sql = ("SELECT traj_id, count(*) FILTER (WHERE raw_content LIKE '%passed%') AS reward "
           "FROM trajectories GROUP BY traj_id")
    r = check_reward(lake, "r1", sql)
    assert r["hackable_under"] == ["fabricated_progress"]
    with pytest.raises(TrajlakeError, match="MODULE:FUNCTION"):
        check_reward(lake, "r1", "not-a-reward")
    with pytest.raises(TrajlakeError, match="cannot import"):
        check_reward(lake, "r1", "no.such.module:f")
    with pytest.raises(TrajlakeError, match="has no episodes"):
        check_reward(lake, "ghost", SOUND)
    with pytest.raises(TrajlakeError, match="SQL gave no reward"):
        check_reward(lake, "r1", "SELECT 0 AS traj_id, 1.0 AS reward")


def test_cli(lake: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--lake", str(lake.root), "reward-check", "--reward", HACKABLE, "--run", "r1",
                             "--format", "json")
    assert code == 0, err
    assert json.loads(out)["hackable_under"] == ["insert_useless_call", "fabricated_progress"]
    code, out, _ = run_cli(capsys, "--lake", str(lake.root), "reward-check", "--reward", HACKABLE, "--run", "r1",
                           "--fail-on-hack")
    assert code == 2 and "fabricated_progress: wrong way 1.000" in out
    code, out, _ = run_cli(capsys, "--lake", str(lake.root), "reward-check", "--reward", SOUND, "--run", "r1",
                           "--fail-on-hack")
    assert code == 0 and "verdict: no wrong-way moves" in out
    code, _, err = run_cli(capsys, "--lake", str(lake.root), "reward-check", "--reward", "x", "--run", "r1")
    assert code == 1 and err.startswith("error: --reward 'x'")


@pytest.mark.slow
def test_on_mini_swe_rollouts(dev_rollout: Callable[[str], tuple[Path, int]]) -> None:
    """The same verdicts on real Mini SWE trajectories (oracle and heuristic, dev split: a task of each project)."""
    for policy in ("oracle", "heuristic"):
        lake, written = dev_rollout(policy)
        assert written == len(DEV_ROLLOUT_TASKS) == 4
        assert check_reward(lake, policy, SOUND)["hackable_under"] == []
        assert "fabricated_progress" in check_reward(lake, policy, HACKABLE)["hackable_under"]
