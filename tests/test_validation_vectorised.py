"""The vectorised batch checks against a plain per-episode reference, on randomly broken batches.

``validate_batch`` checks turns against their episodes with sorts and cumulative sums instead of a Python loop
per row. This file states the same rules as obvious loops and asks hypothesis for batches where they might
disagree: shuffled, missing and repeated turn indices, wrong counts, foreign run ids, turns out of time order or
outside their episode, non-binary masks, turns and events of unknown episodes, events of missing turns.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import make_episode
from trajlake.record.validate import TERMINATED_REASONS, TRUNCATED_REASONS, conform, validate_batch
from trajlake.record.writer import to_table

Key = tuple[str, str | None, int | None, str, str]
REASONS = sorted(TERMINATED_REASONS | TRUNCATED_REASONS)
COVERED_FIELDS = {"termination_reason", "turn_idx", "n_turns", "n_policy_tokens", "run_id", "started_at",
                  "episode_id"}
MASK_VALUES = "values must be 0 or 1"


def reference(eps: list[dict[str, Any]], turns: list[dict[str, Any]], events: list[dict[str, Any]]) -> Counter[Key]:
    out: Counter[Key] = Counter()
    by_id = {e["episode_id"]: e for e in eps}
    for e in eps:
        r, tm, tr = e["termination_reason"], e["terminated"], e["truncated"]
        if r is not None and ((tm and r not in TERMINATED_REASONS) or (tr and not tm and r not in TRUNCATED_REASONS)):
            out["episodes", e["episode_id"], None, "termination_reason",
                "reason does not match terminated/truncated (budgets, timeout and env_failure are truncations)"] += 1
    for t in turns:
        if t["episode_id"] not in by_id:
            out["turns", t["episode_id"], t["turn_idx"], "episode_id", "turn belongs to no episode of this batch"] += 1
        if t["loss_mask"] is not None and any(v not in (0, 1) for v in t["loss_mask"]):
            out["turns", t["episode_id"], t["turn_idx"], "loss_mask", MASK_VALUES] += 1
    for eid, e in by_id.items():
        rows = sorted((t for t in turns if t["episode_id"] == eid), key=lambda t: t["turn_idx"])
        if [t["turn_idx"] for t in rows] != list(range(len(rows))):
            out["turns", eid, None, "turn_idx", f"turn_idx must be 0..{len(rows) - 1} without gaps or repeats"] += 1
        if e["n_turns"] != len(rows):
            out["episodes", eid, None, "n_turns", f"says {e['n_turns']} but the batch has {len(rows)} turns"] += 1
        pol = sum(sum(1 for v in t["loss_mask"] if v == 1) for t in rows if t["loss_mask"] is not None)
        if e["n_policy_tokens"] != pol:
            out["episodes", eid, None, "n_policy_tokens",
                f"says {e['n_policy_tokens']} but the turns' loss masks sum to {pol}"] += 1
        prev = None
        for t in rows:
            if t.get("run_id") is not None and t["run_id"] != e["run_id"]:
                out["turns", eid, t["turn_idx"], "run_id", "differs from the episode's run_id"] += 1
            if prev is not None and t["started_at"] < prev:
                out["turns", eid, t["turn_idx"], "started_at",
                    "turns are not in time order (started before the previous turn)"] += 1
            if t["started_at"] < e["started_at"] or t["ended_at"] > e["ended_at"]:
                out["turns", eid, t["turn_idx"], "started_at",
                    "turn lies outside the episode's started_at..ended_at"] += 1
            prev = t["started_at"]
    for ev in events:
        e = by_id.get(ev["episode_id"])
        if e is None:
            out["gateway_events", ev["episode_id"], ev["turn_idx"], "episode_id",
                "event belongs to no episode of this batch"] += 1
        elif not 0 <= ev["turn_idx"] < e["n_turns"]:
            out["gateway_events", ev["episode_id"], ev["turn_idx"], "turn_idx",
                "refers to a turn the episode does not have"] += 1
    return out


def actual(eps: list[dict[str, Any]], turns: list[dict[str, Any]], events: list[dict[str, Any]]) -> Counter[Key]:
    report = validate_batch(conform(to_table(eps, "episodes"), "episodes"), conform(to_table(turns, "turns"), "turns"),
                            conform(to_table(events or None, "gateway_events"), "gateway_events"))
    out: Counter[Key] = Counter()
    for i in report.all_issues():
        if i.field in COVERED_FIELDS or (i.field == "loss_mask" and i.message == MASK_VALUES):
            out[i.table, i.episode_id, i.turn_idx, i.field, i.message] += 1
    return out


def event(episode_id: str, turn_idx: int, k: int) -> dict[str, Any]:
    return {"episode_id": episode_id, "turn_idx": turn_idx, "event_idx": k, "tool": "read_file",
            "capability": "read", "args_hash": "0" * 64, "decision": "allow", "reason": "ok", "executed": True,
            "side_effect_class": "read", "taint": [], "at": dt.datetime(2026, 3, 1, tzinfo=dt.UTC)}


@st.composite
def broken_batches(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    eps: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for k in range(draw(st.integers(1, 3))):
        ep, ts = make_episode(f"ep-{k}", n_steps=draw(st.integers(1, 3)))
        eps.append(ep)
        turns += ts
    events = [event(e["episode_id"], 1, 0) for e in eps]
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["swap_idx", "set_idx", "n_turns", "n_pol", "run", "swap_time", "early",
                                     "late", "mask2", "mask_null", "ghost_turn", "reason", "ghost_event",
                                     "event_idx", "drop_turn"]))
        t = draw(st.sampled_from(turns)) if turns else None
        e = draw(st.sampled_from(eps))
        if kind == "swap_idx" and t is not None:
            u = draw(st.sampled_from(turns))
            t["turn_idx"], u["turn_idx"] = u["turn_idx"], t["turn_idx"]
        elif kind == "set_idx" and t is not None:
            t["turn_idx"] = draw(st.integers(0, 8))
        elif kind == "n_turns":
            e["n_turns"] += draw(st.sampled_from([-1, 1]))
        elif kind == "n_pol":
            e["n_policy_tokens"] += 1
        elif kind == "run" and t is not None:
            t["run_id"] = draw(st.sampled_from(["run-1", "run-2"]))
        elif kind == "swap_time" and t is not None:
            u = draw(st.sampled_from(turns))
            t["started_at"], u["started_at"] = u["started_at"], t["started_at"]
        elif kind == "early" and t is not None:
            t["started_at"] -= dt.timedelta(hours=1)
        elif kind == "late" and t is not None:
            t["ended_at"] += dt.timedelta(hours=1)
        elif kind in ("mask2", "mask_null") and t is not None and t["loss_mask"]:
            t["loss_mask"] = [*t["loss_mask"][:-1], 2 if kind == "mask2" else None]
        elif kind == "ghost_turn" and t is not None:
            t["episode_id"] = "ghost"
        elif kind == "reason":
            e["terminated"] = draw(st.booleans())
            e["truncated"] = not e["terminated"]
            e["termination_reason"] = draw(st.sampled_from(REASONS))
        elif kind == "ghost_event":
            events.append(event("ghost", 0, len(events)))
        elif kind == "event_idx":
            events.append(event(e["episode_id"], draw(st.integers(-1, 9)), len(events)))
        elif kind == "drop_turn" and t is not None:
            turns.remove(t)
    return eps, draw(st.permutations(turns)), events


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(broken_batches())
def test_vectorised_checks_match_the_reference(batch: tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                            list[dict[str, Any]]]) -> None:
    eps, turns, events = batch
    assert actual(eps, turns, events) == reference(eps, turns, events)


def test_reference_sees_each_kind_of_break() -> None:
    # The comparison above is only as good as its batches: make sure they can break every covered rule.
    ep, turns = make_episode()
    turns[1]["turn_idx"], turns[2]["turn_idx"] = 2, 2
    turns[3]["run_id"] = "other"
    turns[4]["started_at"] = turns[0]["started_at"] - dt.timedelta(hours=1)
    turns[1]["loss_mask"] = [1, 2]
    ep["n_turns"] += 1
    events = [event("ep-1", 40, 0), event("ghost", 0, 1)]
    fields = {k[3] for k in actual([ep], turns, events)}
    assert fields == {"turn_idx", "run_id", "started_at", "loss_mask", "n_turns", "n_policy_tokens", "episode_id"}
    assert actual([ep], turns, events) == reference([ep], turns, events)
