"""Property test: whatever valid episode goes in comes back out, through DuckDB and Polars, bit for bit."""

from __future__ import annotations

import datetime as dt
import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trajlake import Lake, LakeWriter, connect, open_lake, scan

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
_counter = itertools.count()

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40)
f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
token = st.integers(min_value=0, max_value=2**31 - 1)  # a negative id comes from no tokenizer: refused
logprob = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False, width=32)  # what a distribution gives


@st.composite
def episodes(draw):
    ep_id = f"rt-{next(_counter)}-" + draw(st.text(alphabet="abcxyz019-_/", max_size=8))
    n = draw(st.integers(min_value=0, max_value=6))
    turns = []
    t = T0
    for i in range(n):
        actor = draw(st.sampled_from(["policy", "env", "user", "system"]))
        role = {"policy": "assistant", "env": "tool", "user": "user", "system": "system"}[actor]
        toks = draw(st.one_of(st.none(), st.lists(token, max_size=12)))
        mask = None if toks is None else (draw(st.lists(st.sampled_from([0, 1]), min_size=len(toks),
                                                        max_size=len(toks))) if actor == "policy" else [0] * len(toks))
        lps = None if toks is None or actor != "policy" else draw(st.lists(logprob, min_size=len(toks), max_size=len(toks)))
        dur = dt.timedelta(microseconds=draw(st.integers(min_value=0, max_value=5_000_000)))
        turns.append({
            "episode_id": ep_id, "turn_idx": i, "role": role, "actor": actor,
            "policy_version": "pv" if actor == "policy" else None, "raw_content": draw(st.one_of(st.none(), texts)),
            "token_ids": toks, "loss_mask": mask, "behavior_logprobs": lps, "started_at": t, "ended_at": t + dur,
            "latency_ms": dur.total_seconds() * 1000, "status": draw(st.sampled_from(["OK", "ENV_TRANSIENT"])),
            "tokens": len(toks or []), "cost_usd": draw(st.floats(min_value=0, max_value=1)), "tool_seconds": 0.0,
            "tool_args": draw(st.one_of(st.none(), texts)),
            "reward_components": draw(st.one_of(st.none(), st.dictionaries(texts, st.floats(allow_nan=False),
                                                                           max_size=3))),
        })
        t = t + dur
    truncated = draw(st.booleans())
    ep = {
        "episode_id": ep_id, "run_id": draw(st.sampled_from(["run a", "r/1", "ü-run"])), "task_id": "t",
        "task_version": "v", "split": draw(st.sampled_from(["train", "dev", "hidden"])), "env_id": "e",
        "env_version": "1", "env_seed": draw(st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1))),
        "group_id": "g", "attempt": draw(st.integers(min_value=0, max_value=10)), "started_at": T0, "ended_at": t,
        "n_turns": n, "n_policy_tokens": sum(sum(x["loss_mask"] or []) for x in turns),
        "terminated": not truncated, "truncated": truncated,
        "termination_reason": "budget_steps" if truncated else "success", "success": not truncated,
        "error_class": "BUDGET_EXHAUSTED" if truncated else None,
        "reward_total": draw(st.floats(allow_nan=False, allow_infinity=False)),
        "reward_components": draw(st.dictionaries(texts, st.floats(allow_nan=False), max_size=4)),
        "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0, "tool_seconds": 0.0,
        "wall_seconds": (t - T0).total_seconds(), "faults_injected": 0, "injection_attempted": draw(st.booleans()),
    }
    return ep, turns


@pytest.fixture(scope="module")
def rt_lake(tmp_path_factory) -> Lake:
    return open_lake(tmp_path_factory.mktemp("rt") / "lake", create=True)


def _same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=episodes())
def test_roundtrip(rt_lake: Lake, case) -> None:
    ep, turns = case
    with LakeWriter(rt_lake, handle_signals=False) as w:
        res = w.write_batch([ep], turns)
    assert res.accepted == [ep["episode_id"]], res.rejected
    con = connect(rt_lake)
    row = con.execute("select * from episodes where episode_id = ?", [ep["episode_id"]]).to_arrow_table().to_pylist()[0]
    for k, v in ep.items():
        got = row[k]
        if k == "reward_components":
            assert dict(got) == v
        elif isinstance(v, float):
            assert _same_float(got, v), k
        else:
            assert got == v, k
    assert row["content_hash"] and row["schema_version"] == "1.1"
    back = con.execute("select * from turns where episode_id = ? order by turn_idx", [ep["episode_id"]]
                       ).to_arrow_table().to_pylist()
    assert len(back) == len(turns)
    for got, want in zip(back, turns, strict=True):
        for k, v in want.items():
            if k == "behavior_logprobs" and v is not None:
                assert got[k] == v, k  # float32 in, float32 out (exactly representable)
            elif k == "reward_components" and v is not None:
                assert dict(got[k]) == v
            else:
                assert got[k] == v, k
    pl_turns = scan(rt_lake, "turns").filter(episode_id=ep["episode_id"]).sort("turn_idx").collect()
    assert pl_turns["token_ids"].to_list() == [t["token_ids"] for t in turns]
    assert pl_turns["raw_content"].to_list() == [t["raw_content"] for t in turns]
