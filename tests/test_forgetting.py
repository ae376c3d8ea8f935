"""Forgetting, evaluated: the check of ``trajlake.evaluators.forgetting`` on made-up rows, the ``trimmed_rate`` and
``forgetting_rate`` metrics computed by hand, the report's flagged examples and diagnose's ``trimming`` node."""

from __future__ import annotations

from typing import Any

import pytest
from trajlake.evaluators.data import load
from trajlake.evaluators.diagnose import diagnose
from trajlake.evaluators.forgetting import check_episode
from trajlake.evaluators.metrics import Settings
from trajlake.evaluators.report import evaluate

from tests.test_eval_sql import Episode, episode, read, write
from trajlake import open_lake
from trajlake.render.chat import dropped_hash

# Turn layout of tests.test_eval_sql.episode: 0 system, 1 user, then per step a policy turn (2k + 2) and its
# observation (2k + 3).


def _trim(ep: Episode, at_step: int, drop_steps: int, strategy: str = "drop_oldest", summary: bool = False
          ) -> Episode:
    """Mark the policy turn of step ``at_step`` as trimmed: the first ``drop_steps`` steps (turns 2 ..) were left
    out of its context, named by their hash as a trimming policy names them. ``summary``: a summarizer turn
    carrying the same hash, holding every dropped observation's text, stands before it (inserted, renumbered)."""
    row, turns, events = ep
    start, stop = 2, 2 + 2 * drop_steps
    h = dropped_hash([(int(t["turn_idx"]), t["raw_content"]) for t in turns[start:stop]])
    pol = turns[2 + 2 * at_step]
    pol.update(context_dropped_hash=h, context_strategy=strategy)
    if summary:
        text = "\n".join(str(t["raw_content"]) for t in turns[start:stop])
        at = 2 + 2 * at_step
        turns.insert(at, {**turns[at - 1], "role": "user", "actor": "summarizer", "raw_content": text,
                          "summary_version": "extractive-v1", "context_dropped_hash": h,
                          "context_strategy": "summarize", "action_schema": None, "tool_call_id": None,
                          "observation_hash": None, "fault_injected": None, "env_state_hash": None})
        for i, t in enumerate(turns):
            t["turn_idx"] = i
        for e in events:
            if e["turn_idx"] >= at:
                e["turn_idx"] += 1
        row["n_turns"] = len(turns)
    return row, turns, events


LOOKUP_A = read("a.py", obs="A = 12")
LOOKUP_B = read("b.py", obs="B = 45")


def _eps() -> list[Episode]:
    fail: dict[str, Any] = {"success": False, "error_class": "MODEL_BAD_PLAN"}
    return [
        # forgot: read a, read b, (a's pair dropped) read a again, then failed
        _trim(episode("forgot", task="t1", steps=[LOOKUP_A, LOOKUP_B, LOOKUP_A], **fail), 2, 1),
        # the same but successful: trimmed, never flagged (only failing episodes are)
        _trim(episode("solved", task="t2", steps=[LOOKUP_A, LOOKUP_B, LOOKUP_A]), 2, 1),
        # failing and trimmed, the first read of a.py dropped, but the same call is still in the context (its
        # answer changed since): the call was not lost, so no forgetting
        _trim(episode("kept", task="t3", steps=[LOOKUP_A, read("a.py", obs="A = 13"), LOOKUP_B, LOOKUP_A],
                      **fail), 3, 1),
        # failing, trimmed, but the summary holds the dropped answer: nothing was lost
        _trim(episode("summarised", task="t4", steps=[LOOKUP_A, LOOKUP_B, LOOKUP_A], **fail), 2, 1,
              strategy="summarize", summary=True),
        # failing, the dropped call errored (its answer was no information): not forgetting
        _trim(episode("errored", task="t5", steps=[read("a.py", status="MODEL_INVALID_ACTION", obs="no such file"),
                                                    LOOKUP_B, read("a.py", obs="no such file")], **fail), 2, 1),
        # failing, untrimmed, repeating itself: not trimmed at all
        episode("untrimmed", task="t6", steps=[LOOKUP_A, LOOKUP_B, LOOKUP_A], **fail),
    ]


def test_check_episode_flags_only_a_failing_re_request_of_a_dropped_answer() -> None:
    got = {e[0]["episode_id"]: check_episode(e[1], e[0]["success"]) for e in _eps()}
    assert {k: (v[0], v[1] is not None) for k, v in got.items()} == {
        "forgot": (True, True), "solved": (True, False), "kept": (True, False), "summarised": (True, False),
        "errored": (True, False), "untrimmed": (False, False)}
    flag = got["forgot"][1]
    assert flag is not None and (flag.turn, flag.dropped_turn, flag.answer_turn) == (6, 2, 3)
    assert flag.action == 'read_file {"path": "a.py"}'
    # a hash no range of earlier turns matches is left unchecked and counted
    _, turns, _ = _eps()[0]
    turns[6]["context_dropped_hash"] = "sha256:" + "0" * 64
    assert check_episode(turns, False) == (True, None, 1)
    # B0's single_turn prompt leaves turns out too, but that is no trimming
    _, turns, _ = _eps()[0]
    turns[6]["context_strategy"] = "single_turn"
    assert check_episode(turns, False)[:2] == (False, None)


def test_dropped_range_finds_every_range_by_its_hash() -> None:
    """The running hash of dropped_range equals dropped_hash for every range (unicode, quotes, control characters,
    empty and null contents), and a hash of no range is one clear error."""
    from trajlake.render.exactness import dropped_range

    texts = ["task", 'a "quoted" \\ reply', "é ü 漢字 \u2028", "\x00\x1f tab\t", "", None, "{\"tool\": \"x\"}"]
    turns = [{"turn_idx": i, "raw_content": r} for i, r in enumerate(texts)]
    for start in range(len(texts)):
        for stop in range(start + 1, len(texts)):
            h = dropped_hash([(i, texts[i] or "") for i in range(start, stop)])
            assert dropped_range(turns, len(texts), h) == (start, stop)  # turn_idx makes every range's hash its own
    with pytest.raises(ValueError, match="no range of earlier turns matches"):
        dropped_range(turns, len(texts), "sha256:" + "0" * 64)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Any:
    lk = open_lake(tmp_path_factory.mktemp("forgetting") / "lake", create=True)
    base = [episode(f"b{i}", run="base", task=f"t{i}", steps=[LOOKUP_A, LOOKUP_B]) for i in range(1, 13)]
    cand = []
    for i in range(1, 13):  # 10 of 12 fail by forgetting; 2 succeed untrimmed
        if i <= 10:
            cand.append(_trim(episode(f"c{i}", run="cand", task=f"t{i}", steps=[LOOKUP_A, LOOKUP_B, LOOKUP_A],
                                      success=False, error_class="MODEL_BAD_PLAN"), 2, 1))
        else:
            cand.append(episode(f"c{i}", run="cand", task=f"t{i}", steps=[LOOKUP_A, LOOKUP_B]))
    write(lk, base + cand + _eps(), runs=[{"run_id": r} for r in ("base", "cand", "run-A")])
    return lk


def test_metrics_by_hand(lake: Any) -> None:
    data = load(lake, ["run-A", "base"])
    try:
        rep = evaluate(data, taxonomy=False, breakdown=False, settings=Settings(resamples=200))
    finally:
        data.close()
    m = rep["runs"]["run-A"]["metrics"]
    # trimmed: 5 of the 6 episodes; model failures: forgot, kept, summarised, errored, untrimmed (5), of which
    # one forgot
    assert m["trimmed_rate"]["estimate"] == pytest.approx(5 / 6) and m["trimmed_rate"]["n"] == 6
    assert m["forgetting_rate"]["estimate"] == pytest.approx(1 / 5) and m["forgetting_rate"]["n"] == 5
    f = rep["error_attribution"]["run-A"]["forgetting"]
    assert (f["trimmed_episodes"], f["forgot"]) == (5, 1)
    assert f["examples"] == [{"episode_id": "forgot", "why": 'turn 6 repeated read_file {"path": "a.py"} of turn '
                                                             "2, whose answer (turn 3) trimming had dropped from "
                                                             "its context"}]
    # a run without trimming (and without failures): 0 trimmed, no failure to forget in (no data, not 0)
    b = rep["runs"]["base"]["metrics"]
    assert b["trimmed_rate"]["estimate"] == 0.0 and b["forgetting_rate"]["n"] == 0
    assert rep["error_attribution"]["base"]["forgetting"] == {"trimmed_episodes": 0, "forgot": 0, "examples": []}


def test_diagnose_names_memory_loss(lake: Any) -> None:
    d = diagnose(lake, "base", "cand", settings=Settings(resamples=200))
    assert d["diagnosis"] == "memory_loss"
    node = d["path"][-1]
    assert node["node"] == "trimming" and node["result"] == "yes"
    assert node["tests"][0]["name"] == "forgot" and node["tests"][0]["diff"] == pytest.approx(10 / 12)
    assert "trimmed" in node["evidence"][1]
