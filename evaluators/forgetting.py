"""Forgetting: failing episodes in which context trimming dropped an observation the episode later needed.

``trajlake eval`` asks of every episode of the evaluated runs (``forgetting.sql`` selects those whose context was
trimmed, by ``drop_oldest`` or ``summarize``):

- ``trimmed``: some policy turn's context left earlier turns out (its ``context_dropped_hash`` is set by a
  trimming strategy).
- ``forgot``: the episode failed (graded, ``success`` false) and a policy turn whose context was trimmed
  **re-requested a dropped answer**: it repeats the action (same tool, same arguments after JSON normalisation) of
  an earlier policy turn that is in its dropped range, whose answer (the next observation) had status OK and is
  dropped too, while no turn of its context (the kept turns and, under ``summarize``, the summary) holds that
  answer's text and no kept policy turn made the same call. The information the episode needed again was in a
  span trimming had removed, and only there.

The dropped range of a trimmed turn is resolved from its ``context_dropped_hash`` exactly as the trainer's reader
does (``trajlake.render.exactness.dropped_range``); a hash no range of earlier turns matches (a foreign import)
leaves that turn unchecked and is counted as ``unresolved``.

What it does not catch: a failing action that contradicts a dropped observation without repeating the call that
fetched it (e.g. an answer built from a value trimming removed); a counterfactual replay without trimming would
(see docs/eval.md, "Forgetting").
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
from trajlake.evaluators import sql

from trajlake.render.exactness import dropped_range

__all__ = ["TRIMMING_STRATEGIES", "ForgettingFlag", "ForgettingScan", "check_episode", "scan"]

TRIMMING_STRATEGIES = (None, "drop_oldest", "summarize")
"""``turns.context_strategy`` values that trim (None: lakes from before the column, when trimming was
drop_oldest)."""


@dataclass(frozen=True)
class ForgettingFlag:
    """Why an episode is flagged: ``turn`` re-requested what ``dropped_turn`` had asked, whose answer
    (``answer_turn``) trimming had dropped from ``turn``'s context."""

    episode_id: str
    turn: int
    dropped_turn: int
    answer_turn: int
    action: str

    def describe(self) -> str:
        return (f"turn {self.turn} repeated {self.action} of turn {self.dropped_turn}, whose answer (turn "
                f"{self.answer_turn}) trimming had dropped from its context")


@dataclass
class ForgettingScan:
    """The check over the evaluated runs: per trimmed episode whether it forgot, and why."""

    trimmed: set[str] = field(default_factory=set)
    flags: dict[str, ForgettingFlag] = field(default_factory=dict)
    """episode id -> the first re-request found (failing episodes only)."""
    unresolved: int = 0
    """Trimmed policy turns whose context_dropped_hash matched no range of earlier turns (left unchecked)."""


def _action_key(turn: Mapping[str, Any]) -> str | None:
    tool = turn.get("action_schema")
    if tool is None:
        return None
    args = turn.get("tool_args")
    if args is None:
        return f"{tool} {{}}"
    try:
        return f"{tool} {json.dumps(json.loads(args), sort_keys=True, ensure_ascii=False)}"
    except ValueError:
        return f"{tool} {str(args).strip()}"


def _answer(turns: Sequence[Mapping[str, Any]], i: int) -> int | None:
    """Position of the observation answering policy turn ``i`` (the next turn other than a summary)."""
    for j in range(i + 1, len(turns)):
        actor = turns[j].get("actor")
        if actor == "summarizer":
            continue
        return None if actor == "policy" else j
    return None


def check_episode(turns: Sequence[Mapping[str, Any]], success: bool | None) -> tuple[bool, ForgettingFlag | None, int]:
    """(trimmed, the first re-request of a dropped answer when the episode failed, unresolved hashes) for one
    episode's turns (any order; each with turn_idx, actor, raw_content, action_schema, tool_args, status,
    context_dropped_hash, context_strategy)."""
    ordered = sorted(turns, key=lambda r: int(r["turn_idx"]))
    trimmed = False
    unresolved = 0
    for p, turn in enumerate(ordered):
        h = turn.get("context_dropped_hash")
        if turn.get("actor") != "policy" or not h or turn.get("context_strategy") not in TRIMMING_STRATEGIES:
            continue
        trimmed = True
        if success is not False:
            continue
        try:
            start, stop = dropped_range(ordered, p, h)
        except ValueError:
            unresolved += 1
            continue
        key = _action_key(turn)
        if key is None:
            continue
        summary = [i for i in range(p) if ordered[i].get("actor") == "summarizer"
                   and ordered[i].get("context_dropped_hash") == h][-1:]
        context = [i for i in (*range(start), *range(stop, p)) if ordered[i].get("actor") != "summarizer"] + summary
        context_text = "\n".join(str(ordered[i].get("raw_content") or "") for i in context)
        if any(ordered[i].get("actor") == "policy" and _action_key(ordered[i]) == key for i in context):
            continue  # the same call is in the context: its answer was not lost
        for d in range(start, stop):
            if ordered[d].get("actor") != "policy" or _action_key(ordered[d]) != key:
                continue
            a = _answer(ordered, d)
            if a is None or not start <= a < stop or ordered[a].get("status") != "OK":
                continue
            answer = str(ordered[a].get("raw_content") or "").strip()
            if answer and answer not in context_text:
                return True, ForgettingFlag("", int(turn["turn_idx"]), int(ordered[d]["turn_idx"]),
                                            int(ordered[a]["turn_idx"]), key), unresolved
    return trimmed, None, unresolved


def _episodes(rel: duckdb.DuckDBPyConnection) -> Iterator[tuple[str, bool | None, list[dict[str, Any]]]]:
    cols = [d[0] for d in rel.description]
    current: str | None = None
    success: bool | None = None
    rows: list[dict[str, Any]] = []
    while batch := rel.fetchmany(4096):
        for values in batch:
            row = dict(zip(cols, values, strict=True))
            if row["episode_id"] != current:
                if current is not None:
                    yield current, success, rows
                current, success, rows = row["episode_id"], row["success"], []
            rows.append(row)
    if current is not None:
        yield current, success, rows


def scan(con: duckdb.DuckDBPyConnection, runs: Sequence[str]) -> ForgettingScan:
    """Check every trimmed episode of ``runs`` (one episode's turns in memory at a time)."""
    out = ForgettingScan()
    rel = con.execute(sql.render("forgetting", {"runs": sql.quote_list(runs)}))
    for eid, success, rows in _episodes(rel):
        trimmed, flag, unresolved = check_episode(rows, success)
        out.unresolved += unresolved
        if trimmed:
            out.trimmed.add(eid)
        if flag is not None:
            out.flags[eid] = ForgettingFlag(eid, flag.turn, flag.dropped_turn, flag.answer_turn, flag.action)
    return out
