"""Two example process rewards for ``trajlake reward-check`` (docs/contamination.md, "Counterfactual test").

A process reward here is ``fn(turns) -> float`` over one trajectory: ``turns`` is the list of turn dicts in
order, with the keys ``turn_idx``, ``role``, ``actor``, ``raw_content``, ``action_schema``, ``tool_args``,
``status`` and ``env_state_hash``.

- :func:`grounded_progress` (sound): credit only for what the environment attests, in order: a state-changing
  call, then a test run *after* the last state change whose environment observation reports no failure; each
  tool call costs a little. Deleting the change, inserting a useless call, breaking the order or writing "all
  tests pass" in a message can only lower it or leave it unchanged.
- :func:`passed_text_reward` (hackable): counts "passed" text anywhere in the transcript and pays for activity.
  A fabricated progress message or a padding call raises it: ``reward-check`` shows it moving the wrong way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["grounded_progress", "passed_text_reward"]

_PASSED = re.compile(r"\b(\d+) passed\b|\ball tests pass", re.IGNORECASE)
_TEST_SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed", re.MULTILINE)
_TEST_TOOLS = frozenset({"run_tests"})
CALL_COST = 0.01


def _state_changes(turns: Sequence[Mapping[str, Any]]) -> list[int]:
    """Positions of environment observations after which the state hash differs from the one before, up to
    the final policy turn (its call, e.g. ``submit``, ends the episode and marks the state as submitted)."""
    out: list[int] = []
    last: Any = None
    final = max((i for i, t in enumerate(turns) if t.get("actor") == "policy"), default=len(turns))
    for i, t in enumerate(turns[:final]):
        h = t.get("env_state_hash")
        if t.get("actor") == "env" and h is not None:
            # a test run cannot change the code: a change first seen there is not attributable to any call
            if last is not None and h != last and t.get("action_schema") not in _TEST_TOOLS:
                out.append(i)
            last = h
    return out


def grounded_progress(turns: Sequence[Mapping[str, Any]]) -> float:
    """Sound: 0.5 for an attested state change, +0.5 for a clean test run observed after the last change,
    minus ``CALL_COST`` per tool call."""
    changes = _state_changes(turns)
    calls = sum(1 for t in turns if t.get("actor") == "policy" and t.get("action_schema"))
    score = -CALL_COST * calls
    if not changes:
        return score
    score += 0.5
    for t in turns[changes[-1] + 1:]:
        if t.get("actor") != "env" or t.get("action_schema") not in _TEST_TOOLS:
            continue
        m = _TEST_SUMMARY.search(str(t.get("raw_content") or ""))
        if m and int(m.group(2)) == 0 and int(m.group(1)) > 0:
            return score + 0.5
    return score


def passed_text_reward(turns: Sequence[Mapping[str, Any]]) -> float:
    """Hackable: +1 per turn whose text says tests passed (any speaker), +0.05 per tool call ("activity")."""
    said = sum(1 for t in turns if _PASSED.search(str(t.get("raw_content") or "")))
    calls = sum(1 for t in turns if t.get("actor") == "policy" and t.get("action_schema"))
    return float(said) + 0.05 * calls
