from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from trajlake.record.hashing import episode_hash, hash_rows, row_bytes
from trajlake.record.validate import conform
from trajlake.record.writer import to_table

TS = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def turn_table(rows: list[dict]) -> pa.Table:
    return conform(to_table(rows, "turns"), "turns")


def base_turn(**kw) -> dict:
    row = {"episode_id": "e1", "run_id": "r1", "turn_idx": 0, "role": "assistant", "actor": "policy",
           "policy_version": "p1", "raw_content": "héllo", "token_ids": pa.array([1, 2, 3], pa.int32()).to_pylist(),
           "loss_mask": [1, 1, 1], "behavior_logprobs": [-0.5, -1.25, -2.0], "started_at": TS, "ended_at": TS,
           "latency_ms": 1.5, "status": "OK", "tokens": 3, "cost_usd": 0.0, "tool_seconds": 0.0,
           "reward_components": {"b": 2.0, "a": 1.0}}
    row.update(kw)
    return row


def test_golden_hash_is_stable() -> None:
    # Changing the canonical encoding breaks every stored hash: this value must never change within schema v1.
    (h,) = hash_rows(turn_table([base_turn()]), "turns")
    assert h == GOLDEN_TURN_HASH


def test_hash_is_the_same_in_another_process() -> None:
    code = ("import datetime as dt; from tests.test_hashing import turn_table, base_turn; "
            "from trajlake.record.hashing import hash_rows; print(hash_rows(turn_table([base_turn()]), 'turns')[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"}, cwd=str(_root()))
    assert out.stdout.strip() == hash_rows(turn_table([base_turn()]), "turns")[0]


def _root():
    from pathlib import Path

    return Path(__file__).resolve().parents[1]


def test_map_order_and_bookkeeping_do_not_matter() -> None:
    a = base_turn(reward_components={"a": 1.0, "b": 2.0})
    b = base_turn(reward_components={"b": 2.0, "a": 1.0}, content_hash="anything",
                  written_at=TS + dt.timedelta(days=3))
    ha, hb = hash_rows(turn_table([a, b]), "turns")
    assert ha == hb


def test_null_columns_are_omitted() -> None:
    t = turn_table([base_turn()])
    smaller = t.drop_columns(["tool_call_id"])  # all-null column absent: same bytes
    assert row_bytes(t, "turns") == row_bytes(smaller, "turns")


def test_timestamp_timezone_is_normalised() -> None:
    plus2 = dt.timezone(dt.timedelta(hours=2))
    a = base_turn()
    b = base_turn(started_at=TS.astimezone(plus2), ended_at=TS.astimezone(plus2))
    assert hash_rows(turn_table([a]), "turns") == hash_rows(turn_table([b]), "turns")


def test_slices_and_chunks_hash_like_whole_tables() -> None:
    rows = [base_turn(turn_idx=i, token_ids=list(range(i + 1)), loss_mask=[1] * (i + 1),
                      behavior_logprobs=[-0.1] * (i + 1)) for i in range(6)]
    whole = hash_rows(turn_table(rows), "turns")
    t = turn_table(rows)
    assert hash_rows(t.slice(2, 3), "turns") == whole[2:5]
    chunked = pa.concat_tables([t.slice(0, 2), t.slice(2)])
    assert hash_rows(chunked, "turns") == whole


def test_episode_hash_depends_on_turn_order() -> None:
    assert episode_hash(b"x", ["a", "b"], []) != episode_hash(b"x", ["b", "a"], [])
    assert episode_hash(b"x", ["a"], ["e"]) != episode_hash(b"x", ["a"], [])


small_text = st.text(max_size=20)
ints = st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), max_size=30)


@settings(max_examples=150, deadline=None)
@given(content=small_text, toks=ints, lp=st.floats(allow_nan=True, width=32), lat=st.floats(allow_nan=False),
       other=small_text, toks2=ints)
def test_hash_equals_iff_content_equals(content: str, toks: list[int], lp: float, lat: float, other: str,
                                        toks2: list[int]) -> None:
    a = base_turn(raw_content=content, token_ids=toks, loss_mask=[0] * len(toks), actor="env", role="tool",
                  behavior_logprobs=[lp] * len(toks), latency_ms=lat)
    b = dict(a)
    b2 = base_turn(raw_content=other, token_ids=toks2, loss_mask=[0] * len(toks2), actor="env", role="tool",
                   behavior_logprobs=[lp] * len(toks2), latency_ms=lat)
    ha, hb, hc = hash_rows(turn_table([a, b, b2]), "turns")
    assert ha == hb
    assert (ha == hc) == (content == other and toks == toks2)


GOLDEN_TURN_HASH = "f1bc305b766c7f02da000facfe3329dd02b6579680f08396dfd86f93997da185"


def test_canonical_bytes_follow_the_documented_encoding() -> None:
    import struct

    from trajlake.record.writer import to_table

    t = conform(to_table([{"run_id": "r", "created_at": TS, "label": "B0", "trajlake_version": "0.1.0",
                           "written_at": TS}], "runs"), "runs")

    def s(x: str) -> bytes:
        return b"S" + struct.pack("<Q", len(x.encode())) + x.encode()

    micros = int((TS - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).total_seconds()) * 1_000_000
    expected = (b"trajlake/1/runs\n" + b"run_id\x00" + s("r") + b"created_at\x00" + b"T" + struct.pack("<q", micros)
                + b"label\x00" + s("B0") + b"trajlake_version\x00" + s("0.1.0"))
    assert row_bytes(t, "runs") == [expected]


def test_fast_hash_equals_hash_of_canonical_bytes_with_null_list_slots() -> None:
    import hashlib

    import numpy as np

    from trajlake.record.hashing import row_bytes_array

    # null list slots that still span child values (as pyarrow builds them from offsets + a mask)
    offsets = pa.array([0, 2, 5, 5, 9], pa.int32())
    lp = pa.ListArray.from_arrays(offsets, pa.array(np.arange(9, dtype=np.float32)), mask=pa.array([False, True, False, True]))
    tok = pa.ListArray.from_arrays(offsets, pa.array(np.arange(9, dtype=np.int32)))
    mask = pa.ListArray.from_arrays(offsets, pa.array([1] * 9, pa.int8()))
    rows = [base_turn(turn_idx=i) for i in range(4)]
    t = turn_table(rows)
    for name, arr in (("token_ids", tok), ("loss_mask", mask), ("behavior_logprobs", lp)):
        t = t.set_column(t.schema.get_field_index(name), name, arr)
    rb = row_bytes_array(t, "turns").to_pylist()
    assert hash_rows(t, "turns") == [hashlib.sha256(b).hexdigest() for b in rb]
    assert hash_rows(t.slice(1, 2), "turns") == hash_rows(t, "turns")[1:3]
