"""``--policy-arg trim_headroom``: a trim under ``drop_oldest`` frees that many tokens more than the next reply
needs, so the following turns extend the kept context (what a batched policy's key/value cache can reuse)
instead of trimming again on every turn. A model-free LM policy with fixed-length pieces makes every length
countable by hand."""

from __future__ import annotations

from typing import Any

import pytest
from trajlake.envs.policy import TaskView

from trajlake.errors import TrajlakeError
from trajlake.policies.lm import Generation, LMPolicy
from trajlake.policies.settings import LMSettings

PROMPT, OBS, REPLY = 100, 20, 10
"""Tokens of the task prompt, of each later observation and of each reply."""


class FixedRenderer:
    """Pieces of fixed lengths; each token id says which turn it came from (so contexts can be compared)."""

    tokenizer_id = "fixed"

    def initial(self, system: str, observation: str) -> list[int]:
        return [0] * PROMPT

    def observation(self, observation: str, after_eos: bool) -> list[int]:
        return [int(observation)] * OBS


class Fixed(LMPolicy):
    def __init__(self, settings: LMSettings):
        super().__init__("v1", settings, FixedRenderer(), None)  # type: ignore[arg-type]
        self.contexts: list[list[int]] = []

    def generate(self, context_ids: list[int], max_new_tokens: int) -> Generation:
        self.contexts.append(list(context_ids))
        ids = [-len(self.contexts)] * REPLY
        return Generation(ids, [-0.5] * REPLY, "not a call", len(context_ids), REPLY, ended_with_eos=True)


def _play(settings: LMSettings, turns: int = 30) -> tuple[Fixed, list[Any]]:
    policy = Fixed(settings)
    policy.reset(TaskView("t", "v", "statement", {}), 0)
    outs = [policy.act(str(i + 1)) for i in range(turns)]
    return policy, outs


def test_headroom_trims_deeper_and_the_next_turns_extend_the_context() -> None:
    window, new = 300, 10
    budget = window - new  # the context may hold 290 tokens
    plain, plain_outs = _play(LMSettings(max_new_tokens=new, max_context=window))
    room, room_outs = _play(LMSettings(max_new_tokens=new, max_context=window, trim_headroom=90))

    def extends(policy: Fixed) -> list[bool]:
        c = policy.contexts
        return [c[i][:len(c[i - 1])] == c[i - 1] for i in range(1, len(c))]

    for policy in (plain, room):
        assert all(len(c) <= budget for c in policy.contexts)
    # Without headroom: the context grows by one pair (30 tokens) a turn to 100 + 6 x 30 = 280; from turn 7 on each
    # turn drops the oldest pair to fit its new one, so no context extends the previous one.
    assert [len(c) for c in plain.contexts[:9]] == [100, 130, 160, 190, 220, 250, 280, 280, 280]
    assert extends(plain)[:6] == [True] * 6 and not any(extends(plain)[6:])
    # With 90 tokens of headroom a trim keeps at most 290 - 90 = 200 tokens: the prompt and three pairs (190), and
    # the next three turns extend the context to 280 before the next trim.
    lengths = [len(c) for c in room.contexts]
    assert lengths[:16] == [100, 130, 160, 190, 220, 250, 280, 190, 220, 250, 280, 190, 220, 250, 280, 190]
    trims = [i for i, ok in enumerate(extends(room), start=1) if not ok]
    assert trims == [7, 11, 15, 19, 23, 27]
    assert all(len(room.contexts[i]) <= budget - 90 for i in trims)
    # what is recorded: each turn names what was dropped, and the hash changes only at a trim
    hashes = [o.context_dropped_hash for o in room_outs]
    assert hashes[:7] == [None] * 7 and all(h is not None for h in hashes[7:])
    assert [i for i in range(8, 30) if hashes[i] != hashes[i - 1]] == trims[1:]
    assert [o.context_dropped_hash is not None for o in plain_outs] == [False] * 7 + [True] * 23


def test_headroom_zero_is_the_plain_strategy_and_a_window_too_small_still_fails() -> None:
    a, _ = _play(LMSettings(max_new_tokens=10, max_context=300))
    b, _ = _play(LMSettings(max_new_tokens=10, max_context=300, trim_headroom=0))
    assert a.contexts == b.contexts
    # headroom larger than the window: a trim drops every pair it may (the newest reply and observation stay)
    c, _ = _play(LMSettings(max_new_tokens=10, max_context=300, trim_headroom=10_000), turns=12)
    assert [len(x) for x in c.contexts[6:10]] == [280, 130, 160, 190]


def test_trim_headroom_setting_is_checked() -> None:
    assert LMSettings.from_args({"trim_headroom": "512"}).trim_headroom == 512
    assert LMSettings().trim_headroom == 0
    with pytest.raises(TrajlakeError, match="trim_headroom must be >= 0"):
        LMSettings.from_args({"trim_headroom": "-1"})
