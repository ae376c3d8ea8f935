"""The one episode builder: aggregate columns against hand-computed rows, and every writer agreeing with it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DEV_ROLLOUT_TASKS
from trajlake import LakeWriter, connect, open_lake
from trajlake.demo import generate
from trajlake.record.episode import CostModel, build_episode, context_tokens, group_id_for, price_turns

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _turn(actor: str, tokens: int, **kw: Any) -> dict[str, Any]:
    return {"actor": actor, "tokens": tokens, "tool_seconds": 0.0, "cost_usd": None, **kw}


def test_tokens_cost_and_group_by_hand() -> None:
    # system 10, user 20, policy 5 (full history), tool 100 (1.5 s), policy 7 given a trimmed context of 40
    turns = [_turn("system", 10), _turn("user", 20), _turn("policy", 5, loss_mask=[1] * 5, policy_version="p1"),
             _turn("env", 100, tool_seconds=1.5, fault_injected="timeout"),
             _turn("policy", 7, prompt_tokens=40, loss_mask=[1] * 7, policy_version="p2")]
    assert context_tokens(turns) == [0, 10, 30, 35, 40]
    price_turns(turns, CostModel(price_in=2.0, price_out=10.0, price_tool_second=0.01))
    # policy turn 2: 30 in, 5 out; policy turn 4: 40 in, 7 out; tool: 1.5 s
    assert turns[2]["cost_usd"] == pytest.approx((30 * 2 + 5 * 10) / 1e6)
    assert turns[4]["cost_usd"] == pytest.approx((40 * 2 + 7 * 10) / 1e6)
    assert turns[3]["cost_usd"] == pytest.approx(0.015)
    assert turns[0]["cost_usd"] is None  # system text is nobody's call
    ep = build_episode({"task_id": "t", "task_version": "v", "env_seed": None, "env_version": "3",
                        "policy_version_start": None, "policy_version_end": None}, turns)
    assert ep["tokens_in"] == 30 + 40 and ep["tokens_out"] == 12 and ep["n_policy_tokens"] == 12
    assert ep["n_turns"] == 5 and ep["tool_seconds"] == 1.5 and ep["faults_injected"] == 1
    assert ep["cost_usd"] == pytest.approx((30 * 2 + 5 * 10 + 40 * 2 + 7 * 10) / 1e6 + 0.015)
    assert ep["group_id"] == "t:v:unseeded:3" and "None" not in ep["group_id"]
    assert (ep["policy_version_start"], ep["policy_version_end"]) == ("p1", "p2")


def test_reported_usage_wins_and_no_cost_data_is_null() -> None:
    turns = [_turn("user", 20), _turn("policy", 5)]
    ep = build_episode({"task_id": "t", "task_version": "v", "env_seed": 4, "env_version": "1"}, turns,
                       reported_tokens_in=61, reported_tokens_out=17)
    assert (ep["tokens_in"], ep["tokens_out"]) == (61, 17)
    assert ep["cost_usd"] is None  # no turn has cost data: unknown, not free
    assert ep["group_id"] == group_id_for("t", "v", 4, "1") == "t:v:4:1"


def test_cost_model_rejects_negative_prices() -> None:
    with pytest.raises(ValueError, match="price_in"):
        CostModel(price_in=-1.0)


def _expected_tokens_in(turns: list[dict[str, Any]]) -> int:
    """The schema's definition, written out again by hand: per policy turn, its prompt_tokens or the tokens of
    every earlier turn."""
    total, history = 0, 0
    for t in sorted(turns, key=lambda r: r["turn_idx"]):
        if t["actor"] == "policy":
            total += t["prompt_tokens"] if t.get("prompt_tokens") is not None else history
        history += t["tokens"]
    return total


def _check_lake_agrees(lake: Any, run_id: str | None = None) -> int:
    con = connect(lake)
    where, params = ("where run_id = ?", [run_id]) if run_id is not None else ("", [])
    eps = {r[0]: (r[1], r[2], r[3]) for r in con.execute(
        f"select episode_id, tokens_in, tokens_out, tool_seconds from episodes {where}", params).fetchall()}
    rel = con.execute(f"select episode_id, turn_idx, actor, tokens, prompt_tokens, tool_seconds from turns {where}",
                      params)
    cols = [d[0] for d in rel.description]
    by_ep: dict[str, list[dict[str, Any]]] = {}
    for row in rel.fetchall():
        t = dict(zip(cols, row, strict=True))
        by_ep.setdefault(t["episode_id"], []).append(t)
    for ep_id, (tin, tout, tsec) in eps.items():
        turns = by_ep[ep_id]
        assert tin == _expected_tokens_in(turns), ep_id
        assert tout == sum(t["tokens"] for t in turns if t["actor"] == "policy"), ep_id
        assert tsec == pytest.approx(sum(t["tool_seconds"] for t in turns)), ep_id
    return len(eps)


def test_recorder_and_demo_follow_the_definition(tmp_path: Any) -> None:
    lake = open_lake(tmp_path / "lake", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        rec = w.start_episode(run_id="r", task_id="t", task_version="v", env_id="e", env_version="1",
                              policy_version="p1")
        rec.add_turn("user", "fix it", token_ids=[1, 2, 3])
        rec.add_turn("assistant", "run", token_ids=[4, 5], behavior_logprobs=[-0.1, -0.2])
        rec.add_turn("tool", "ok", token_ids=[6, 7, 8, 9], tool_seconds=0.25)
        rec.add_turn("assistant", "submit", token_ids=[10], prompt_tokens=8)
        rec.finish(terminated=True, truncated=False, termination_reason="submitted", success=None)
        for ep, turns, events in generate(seeds=1, n_tasks=3):
            w.write_batch([ep], turns, events).raise_if_rejected()
    assert _check_lake_agrees(lake) == 1 + 3 * 3
    row = connect(lake).execute("select tokens_in, tokens_out, success, cost_usd, group_id from episodes "
                                "where run_id = 'r'").fetchone()
    assert row == (3 + 8, 3, None, None, "t:v:unseeded:1")


def test_one_clock_and_one_recorder_for_every_writer() -> None:
    import trajlake
    import trajlake.record.recorder as recorder
    import trajlake.record.writer as writer
    import trajlake.rollout.runner as runner
    from trajlake.record.episode import utcnow

    # the rollout runner, the writer and the recorder stamp rows with the one clock (no second definition)
    assert runner.utcnow is utcnow and writer.utcnow is utcnow and recorder.utcnow is utcnow
    before = dt.datetime.now(dt.UTC)
    assert utcnow().tzinfo is dt.UTC and before <= utcnow() <= dt.datetime.now(dt.UTC)
    # the recorder lives beside the episode builder; the old import paths still name it
    assert writer.EpisodeRecorder is trajlake.EpisodeRecorder is recorder.EpisodeRecorder
    assert trajlake.new_episode_id is recorder.new_episode_id


@pytest.mark.slow
def test_the_runner_follows_the_definition(dev_rollout: Callable[[str], tuple[Path, int]]) -> None:
    lake, written = dev_rollout("heuristic")  # the runner's heuristic run on the dev tasks (shared, read only)
    assert written == len(DEV_ROLLOUT_TASKS) == 4  # a task of each of the dev split's projects
    assert _check_lake_agrees(lake, "heuristic") == 4
    con = connect(lake)
    # sandboxed test runs take real time, and the tool price turns it into cost
    assert con.execute("select min(tool_seconds) > 0, min(cost_usd) > 0 from episodes where run_id = 'heuristic'"
                       ).fetchone() == (True, True)
    assert con.execute("select count(*) from turns where action_schema = 'run_tests' and actor = 'env' "
                       "and tool_seconds <= 0 and run_id = 'heuristic'").fetchone() == (0,)


def test_the_runner_follows_the_definition_on_a_small_environment(tmp_path: Any) -> None:
    from trajlake.envs import registry

    from tests.counter_env import CounterEnv
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    registry.register("counter-builder", CounterEnv)
    try:
        cfg = RolloutConfig(lake=str(tmp_path / "lake"), run_id="c", env="counter-builder", policy="oracle",
                            split="dev", seeds=(0, 1), commit_every_s=0,
                            cost_model=CostModel(price_in=1.0, price_out=2.0, price_tool_second=0.0))
        assert run_rollout(cfg).written == 4
    finally:
        registry.unregister("counter-builder")
    assert _check_lake_agrees(cfg.lake) == 4
    rows = connect(cfg.lake).execute("select tokens_in, tokens_out, cost_usd from episodes").fetchall()
    for tin, tout, cost in rows:
        assert cost == pytest.approx((tin * 1.0 + tout * 2.0) / 1e6)


def test_importers_follow_the_definition(tmp_path: Any) -> None:
    """Without usage in the source the importers derive tokens_in/out like every writer; with the policy's own
    usage they keep it (what the API billed)."""
    import json

    from trajlake.io.ingest import ingest_file

    lines = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add 2 and 3"},
                           {"role": "assistant", "content": "5"}, {"role": "user", "content": "and 4?"},
                           {"role": "assistant", "content": "9"}]},
             {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
              "usage": {"prompt_tokens": 61, "completion_tokens": 17}}]
    src = tmp_path / "chat.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    lake = open_lake(tmp_path / "lake", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        s = ingest_file(w, src, "openai-chat")
    assert s.episodes_written == 2
    con = connect(lake)
    rows = con.execute("select tokens_in, tokens_out, cost_usd, success from episodes order by tokens_in").fetchall()
    reported = [r for r in rows if r[0] == 61]
    assert reported and reported[0][1] == 17 and reported[0][2] is None and reported[0][3] is None
    # the derived one: check it against the turns with the definition written out by hand
    derived_id = con.execute("select episode_id from episodes where tokens_in <> 61").fetchone()
    assert derived_id is not None
    rel = con.execute("select turn_idx, actor, tokens, prompt_tokens from turns where episode_id = ?",
                      [derived_id[0]])
    cols = [d[0] for d in rel.description]
    turns = [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]
    tin, tout = con.execute("select tokens_in, tokens_out from episodes where episode_id = ?",
                            [derived_id[0]]).fetchone()  # type: ignore[misc]
    assert tin == _expected_tokens_in(turns) and tout == sum(t["tokens"] for t in turns if t["actor"] == "policy")
