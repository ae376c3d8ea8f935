from __future__ import annotations

import datetime as dt

import pytest

from tests.conftest import make_episode
from trajlake import Lake, LakeWriter, ValidationError, connect
from trajlake.record.validate import conform
from trajlake.record.writer import to_table


def write(lake: Lake, eps, turns, events=None):
    with LakeWriter(lake, handle_signals=False) as w:
        return w.write_batch(eps, turns, events)


def one_issue(lake: Lake, ep, turns, field: str, turn_idx: int | None = None):
    res = write(lake, [ep], turns)
    assert ep["episode_id"] in res.rejected, "episode should have been rejected"
    issues = res.rejected[ep["episode_id"]]
    matching = [i for i in issues if i.field == field and (turn_idx is None or i.turn_idx == turn_idx)]
    assert matching, f"no issue on {field}: {[str(i) for i in issues]}"
    text = str(matching[0])
    assert ep["episode_id"] in text and field in text
    if turn_idx is not None:
        assert f"turn {turn_idx}" in text
    return matching[0]


def test_valid_episode_lands(lake: Lake) -> None:
    ep, turns = make_episode()
    res = write(lake, [ep], turns)
    assert res.accepted == ["ep-1"] and not res.rejected
    assert connect(lake).execute("select count(*) from turns").fetchone() == (5,)


def test_mask_length_mismatch(lake: Lake) -> None:
    ep, turns = make_episode()
    turns[1]["loss_mask"] = [1]
    one_issue(lake, ep, turns, "loss_mask", 1)


def test_logprob_length_mismatch(lake: Lake) -> None:
    ep, turns = make_episode()
    turns[1]["behavior_logprobs"] = [-0.1, -0.2, -0.3]
    one_issue(lake, ep, turns, "behavior_logprobs", 1)


def test_tool_turn_with_mask_one(lake: Lake) -> None:
    ep, turns = make_episode()
    turns[2]["loss_mask"] = [0, 1, 0]
    ep["n_policy_tokens"] += 1
    one_issue(lake, ep, turns, "loss_mask", 2)


def test_mask_values_must_be_binary(lake: Lake) -> None:
    ep, turns = make_episode()
    turns[1]["loss_mask"] = [1, 2]
    one_issue(lake, ep, turns, "loss_mask", 1)


def test_policy_tokens_need_policy_version(lake: Lake) -> None:
    ep, turns = make_episode()
    turns[1]["policy_version"] = None
    one_issue(lake, ep, turns, "policy_version", 1)


def test_terminated_and_truncated(lake: Lake) -> None:
    ep, turns = make_episode(truncated=True)
    one_issue(lake, ep, turns, "terminated")
    ep, turns = make_episode(episode_id="ep-2", terminated=False)
    one_issue(lake, ep, turns, "terminated")
    ep, turns = make_episode(episode_id="ep-3", terminated=False, truncated=True, termination_reason="success")
    one_issue(lake, ep, turns, "termination_reason")


def test_closed_enums(lake: Lake) -> None:
    ep, turns = make_episode(termination_reason="crashed")
    issue = one_issue(lake, ep, turns, "termination_reason")
    assert "'crashed'" in issue.message
    ep, turns = make_episode(episode_id="ep-2", error_class="OOPS")
    one_issue(lake, ep, turns, "error_class")
    ep, turns = make_episode(episode_id="ep-3")
    turns[0]["role"] = "robot"
    one_issue(lake, ep, turns, "role", 0)


def test_timestamp_order(lake: Lake) -> None:
    ep, turns = make_episode()
    ep["ended_at"] = ep["started_at"] - dt.timedelta(seconds=1)
    one_issue(lake, ep, turns, "ended_at")
    ep, turns = make_episode(episode_id="ep-2")
    turns[3]["started_at"] = turns[1]["started_at"] - dt.timedelta(milliseconds=1)
    one_issue(lake, ep, turns, "started_at", 3)


def test_naive_timestamps_rejected() -> None:
    ep, _ = make_episode()
    ep["started_at"] = dt.datetime(2026, 1, 1)
    with pytest.raises(ValidationError, match="UTC"):
        to_table([ep], "episodes")


def test_required_ids(lake: Lake) -> None:
    ep, turns = make_episode(task_id="")
    one_issue(lake, ep, turns, "task_id")
    ep, turns = make_episode(episode_id="ep-2", env_id=None)
    one_issue(lake, ep, turns, "env_id")


def test_turn_counts_and_contiguity(lake: Lake) -> None:
    ep, turns = make_episode(n_turns=7)
    one_issue(lake, ep, turns, "n_turns")
    ep, turns = make_episode(episode_id="ep-2")
    turns[2]["turn_idx"] = 9
    one_issue(lake, ep, turns, "turn_idx")
    ep, turns = make_episode(episode_id="ep-3", n_policy_tokens=99)
    one_issue(lake, ep, turns, "n_policy_tokens")


def test_unknown_and_missing_columns_are_structural() -> None:
    ep, _ = make_episode()
    ep["surprise"] = 1
    with pytest.raises(ValidationError, match="surprise"):
        to_table([ep], "episodes")
    ep, _ = make_episode()
    t = to_table([ep], "episodes").drop_columns(["task_id"])
    with pytest.raises(ValidationError, match="task_id"):
        conform(t, "episodes")


def test_invalid_rejected_valid_land_in_same_batch(lake: Lake) -> None:
    good, gt = make_episode("good")
    bad, bt = make_episode("bad")
    bt[1]["loss_mask"] = [1, 1, 1]
    res = write(lake, [good, bad], gt + bt)
    assert res.accepted == ["good"]
    assert list(res.rejected) == ["bad"]
    con = connect(lake)
    assert con.execute("select list(distinct episode_id) from turns").fetchone() == (["good"],)
    assert con.execute("select count(*) from _turns_all where episode_id = 'bad'").fetchone() == (0,)


def test_recorder_api_validates_on_finish(lake: Lake) -> None:
    with LakeWriter(lake, handle_signals=False) as w:
        ep = w.start_episode(run_id="r", task_id="t", task_version="v", env_id="e", env_version="1",
                             policy_version="p")
        ep.add_turn("assistant", "x", token_ids=[1, 2], loss_mask=[1])
        with pytest.raises(ValidationError, match="loss_mask"):
            ep.finish(terminated=True, truncated=False, termination_reason="success", success=True)


def test_numpy_token_arrays_convert_like_lists() -> None:
    # The rollout recorder passes token ids, masks and log-probs as numpy arrays (no Python int per token).
    import numpy as np

    _, turns = make_episode(n_steps=3)
    turns[2]["token_ids"], turns[2]["loss_mask"] = [], []
    turns[3]["behavior_logprobs"] = None
    as_arrays = [{**t, **{k: np.asarray(t[k], dtype=dt_) for k, dt_ in
                          (("token_ids", np.int64), ("loss_mask", np.int8), ("behavior_logprobs", np.float64))
                          if t.get(k) is not None}} for t in turns]
    assert to_table(as_arrays, "turns").equals(to_table(turns, "turns"))
    mixed = [as_arrays[0], *turns[1:]]  # arrays in some rows, lists in others
    assert to_table(mixed, "turns").equals(to_table(turns, "turns"))
    for bad, why in ((np.array([1.5]), "truncated"), (np.array([2**40]), "not in range")):
        with pytest.raises(ValidationError, match=why) as e:
            to_table([{**as_arrays[0], "token_ids": bad}], "turns")
        assert "turns.token_ids" in str(e.value) and "ep-1" in str(e.value) and "turn 0" in str(e.value)
    with pytest.raises(ValidationError, match="row 2: cannot convert") as e:
        to_table([*turns[:2], {**turns[2], "tokens": "many"}], "turns")
    assert "turn 2" in str(e.value) and "turns.tokens" in str(e.value)
