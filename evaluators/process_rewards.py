"""Process rewards for ``trajlake reward-check`` (docs/contamination.md, "Counterfactual test") and the trainer.

A process reward here is ``fn(turns) -> float`` over one trajectory: ``turns`` is the list of turn dicts in
order, with the keys ``turn_idx``, ``role``, ``actor``, ``raw_content``, ``action_schema``, ``tool_args``,
``status`` and ``env_state_hash``.

- :func:`grounded_progress` (sound): credit only for what the environment attests, in order: a state-changing
  call, then a test run *after* the last state change whose environment observation reports no failure; each
  tool call costs a little. Deleting the change, inserting a useless call, breaking the order or writing "all
  tests pass" in a message can only lower it or leave it unchanged.
- :func:`passed_text_reward` (hackable): counts "passed" text anywhere in the transcript and pays for activity.
  A fabricated progress message or a padding call raises it: ``reward-check`` shows it moving the wrong way.
- :func:`lookup_progress` (sound, tool-lookup): credit for each directory entry the task needs whose ``lookup``
  the environment answered (status OK, the entry's JSON line in the observation), in order: the entries the
  statement quotes, and, when the statement asks for a partner, the partner the first entry's answer named, once
  that answer was seen. Each needed entry is worth ``1 / needed``, each tool call costs ``CALL_COST``. A repeated
  lookup, a lookup of an entry the task does not need, the partner looked up before the entry that names it, a
  failed or faulted lookup, or text written by the policy earns nothing. :func:`lookup_progress_per_turn` gives
  the same reward turn by turn (credit on the observation turn, the cost on the call turn); it sums to
  :func:`lookup_progress`.

Per turn (the trainer's R2 credits a process reward at the turn where it is earned, docs/training.md "R2: credit
per turn"): ``PER_TURN[name](turns) -> list[float]`` gives one value per turn, in order, summing to the reward
``name`` (:func:`grounded_progress_per_turn`, :func:`lookup_progress_per_turn`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trajlake.schemas.vocab import Status

__all__ = ["PER_TURN", "grounded_progress", "grounded_progress_per_turn", "lookup_progress", "lookup_progress_per_turn",
           "passed_text_reward"]

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


def grounded_progress_per_turn(turns: Sequence[Mapping[str, Any]]) -> list[float]:
    """:func:`grounded_progress` turn by turn (one value per turn, in order; the values sum to it): +0.5 on the
    environment observation of the first attested state change, +0.5 on the first clean test-run observation after
    the last change, ``-CALL_COST`` on every tool call, 0 elsewhere."""
    out = [-CALL_COST if t.get("actor") == "policy" and t.get("action_schema") else 0.0 for t in turns]
    changes = _state_changes(turns)
    if not changes:
        return out
    out[changes[0]] += 0.5
    for i in range(changes[-1] + 1, len(turns)):
        t = turns[i]
        if t.get("actor") != "env" or t.get("action_schema") not in _TEST_TOOLS:
            continue
        m = _TEST_SUMMARY.search(str(t.get("raw_content") or ""))
        if m and int(m.group(2)) == 0 and int(m.group(1)) > 0:
            out[i] += 0.5
            break
    return out


def passed_text_reward(turns: Sequence[Mapping[str, Any]]) -> float:
    """Hackable: +1 per turn whose text says tests passed (any speaker), +0.05 per tool call ("activity")."""
    said = sum(1 for t in turns if _PASSED.search(str(t.get("raw_content") or "")))
    calls = sum(1 for t in turns if t.get("actor") == "policy" and t.get("action_schema"))
    return float(said) + 0.05 * calls


_QUOTED_NAME = re.compile(r'"([A-Za-z]+)"')
_LOOKUP_TOOLS = frozenset({"lookup"})


def _attested_entry(turn: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, partner) of the entry an environment turn shows in answer to a lookup that ran, or None."""
    if turn.get("actor") != "env" or turn.get("action_schema") not in _LOOKUP_TOOLS or turn.get("status") != Status.OK:
        return None
    try:
        entry = json.loads(str(turn.get("raw_content") or ""))
    except ValueError:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return None
    return entry["name"], str(entry.get("partner", ""))


def lookup_progress_per_turn(turns: Sequence[Mapping[str, Any]]) -> list[float]:
    """tool-lookup's process reward per turn (one value per turn, in order): ``1 / needed`` on the observation
    turn that first shows a needed entry, ``-CALL_COST`` on every tool call, 0 elsewhere. Needed: the names the
    task statement (the first user turn) quotes, plus the first one's partner when the statement says
    "partner" (needed only from the turn that showed it)."""
    statement = next((str(t.get("raw_content") or "") for t in turns if t.get("actor") == "user"), "")
    quoted = list(dict.fromkeys(_QUOTED_NAME.findall(statement)))
    two_hop = "partner" in statement.lower()
    units = len(quoted) + (1 if two_hop and quoted else 0)
    needed = set(quoted)
    credited: set[str] = set()
    out: list[float] = []
    for t in turns:
        if t.get("actor") == "policy" and t.get("action_schema"):
            out.append(-CALL_COST)
            continue
        entry = _attested_entry(t)
        if entry is None or entry[0] not in needed or entry[0] in credited:
            out.append(0.0)
            continue
        name, partner = entry
        credited.add(name)
        if two_hop and quoted and name == quoted[0] and partner:
            needed.add(partner)
        out.append(1.0 / units)
    return out


def lookup_progress(turns: Sequence[Mapping[str, Any]]) -> float:
    """Sound (tool-lookup): the sum of :func:`lookup_progress_per_turn`, at most 1 minus the calls' cost."""
    return float(sum(lookup_progress_per_turn(turns)))


#: The per-turn form of each process reward the trainer may use: name -> ``fn(turns) -> list[float]`` (one value
#: per turn, summing to the reward of that name).
PER_TURN: dict[str, Callable[[Sequence[Mapping[str, Any]]], list[float]]] = {
    "grounded_progress": grounded_progress_per_turn,
    "lookup_progress": lookup_progress_per_turn,
}
