from __future__ import annotations

import datetime as dt
import itertools
import subprocess
import sys
from unittest import mock

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from trajlake.lake import hashing
from trajlake.lake.hashing import episode_hash, hash_rows, row_bytes
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
            "from trajlake.lake.hashing import hash_rows; print(hash_rows(turn_table([base_turn()]), 'turns')[0])")
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

    from trajlake.lake.hashing import row_bytes_array

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


# -- the documented canonical encoding (docs/hashing.md), built by hand, against the bulk implementation --------
def _doc_encode(v, t: pa.DataType) -> bytes:
    """docs/hashing.md's ``encode``, written from the text, value by value (independent of trajlake's code)."""
    import math
    import struct

    if v is None:
        return b"N"
    if pa.types.is_boolean(t):
        return b"B" + (b"\x01" if v else b"\x00")
    if pa.types.is_integer(t):
        return b"I" + struct.pack("<q", v)
    if pa.types.is_floating(t):
        return b"F" + (bytes.fromhex("000000000000f87f") if math.isnan(v) else struct.pack("<d", v))
    if pa.types.is_timestamp(t):
        d = v - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return b"T" + struct.pack("<q", (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds)
    if pa.types.is_string(t):
        b = v.encode()
        return b"S" + struct.pack("<Q", len(b)) + b
    if pa.types.is_map(t):
        items = sorted(v.items()) if isinstance(v, dict) else sorted(v, key=lambda kv: kv[0])
        return b"M" + struct.pack("<Q", len(items)) + b"".join(
            _doc_encode(k, t.key_type) + _doc_encode(x, t.item_type) for k, x in items)
    if pa.types.is_struct(t):
        return b"R" + struct.pack("<Q", t.num_fields) + b"".join(
            _doc_encode(v.get(t.field(i).name), t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t):
        n = struct.pack("<Q", len(v))
        if pa.types.is_int32(t.value_type):
            return b"Li" + n + b"".join(struct.pack("<i", x) for x in v)
        if pa.types.is_int8(t.value_type):
            return b"Lb" + n + b"".join(struct.pack("<b", x) for x in v)
        if pa.types.is_float32(t.value_type):
            return b"Lf" + n + b"".join(bytes.fromhex("0000c07f") if math.isnan(x) else struct.pack("<f", x)
                                        for x in v)
        return b"Ls" + n + b"".join(_doc_encode(x, t.value_type) for x in v)
    raise TypeError(t)


def _doc_row_hash(row: dict, table: str) -> str:
    import hashlib

    from trajlake.schema import table_def

    out = b"trajlake/1/" + table.encode() + b"\n"
    for c in table_def(table).columns:
        if c.name in ("content_hash", "written_at", "schema_version", "writer_version"):
            continue
        if row.get(c.name) is not None:
            out += c.name.encode() + b"\x00" + _doc_encode(row[c.name], c.arrow_type)
    return hashlib.sha256(out).hexdigest()


_opt = st.one_of  # readability below
_f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
_ts = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1),
                   timezones=st.just(dt.UTC))
_turn_row = st.fixed_dictionaries({
    "turn_idx": st.integers(0, 2**31 - 1),
    "raw_content": _opt(st.none(), st.text(max_size=40)),
    "token_ids": _opt(st.none(), st.lists(st.integers(-(2**31), 2**31 - 1), max_size=60)),
    "loss_mask": _opt(st.none(), st.lists(st.integers(-128, 127), max_size=60)),
    "behavior_logprobs": _opt(st.none(), st.lists(_f32, max_size=60)),
    "latency_ms": st.floats(allow_nan=True, allow_infinity=True),
    "started_at": _ts,
    "tool_call_id": _opt(st.none(), st.text(max_size=10)),
    "reward_components": _opt(st.none(), st.dictionaries(st.text(max_size=6), _opt(st.none(), st.floats()),
                                                         max_size=4)),
})


@settings(max_examples=120, deadline=None)
@given(rows=st.lists(_turn_row, min_size=1, max_size=5), cut=st.integers(0, 5))
def test_bulk_hashes_equal_the_documented_encoding_built_by_hand(rows: list[dict], cut: int) -> None:
    full = [base_turn(**r) for r in rows]
    for r in full:
        r["ended_at"] = r["started_at"]
    t = turn_table(full)
    expected = [_doc_row_hash(r, "turns") for r in full]
    assert hash_rows(t, "turns") == expected
    # the same rows arriving as several chunks (as a commit's buffer does) hash the same
    cut = min(cut, t.num_rows)
    assert hash_rows(pa.concat_tables([t.slice(0, cut), t.slice(cut)]), "turns") == expected


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(_turn_row, min_size=1, max_size=6), cuts=st.lists(st.integers(0, 6), max_size=3))
def test_hashing_in_slices_across_chunks_equals_the_documented_encoding(rows: list[dict], cuts: list[int]) -> None:
    # hash_rows prepares the pieces of all rows once and joins them a slice at a time: slices of one row, cut
    # anywhere across the chunks of the buffered batches, must still give each row its documented hash
    full = [base_turn(**r) for r in rows]
    for r in full:
        r["ended_at"] = r["started_at"]
    t = turn_table(full)
    bounds = sorted({0, t.num_rows, *(min(c, t.num_rows) for c in cuts)})
    chunked = pa.concat_tables([t.slice(a, b - a) for a, b in itertools.pairwise(bounds)])
    with mock.patch.object(hashing, "HASH_SLICE_BYTES", 1):
        assert hash_rows(chunked, "turns") == [_doc_row_hash(r, "turns") for r in full]


@settings(max_examples=60, deadline=None)
@given(taint=st.lists(_opt(st.none(), st.text(max_size=8)), max_size=5),
       provenance=st.fixed_dictionaries({"generator": _opt(st.none(), st.text(max_size=5)),
                                         "seed": _opt(st.none(), st.integers(-(2**63), 2**63 - 1))}),
       max_cost=_opt(st.none(), st.floats(allow_nan=True)))
def test_nested_columns_hash_like_the_documented_encoding(taint: list, provenance: dict, max_cost: float | None) -> None:
    from trajlake.record.validate import conform

    ev = {"episode_id": "e", "run_id": "r", "turn_idx": 0, "event_idx": 0, "tool": "t", "capability": "c",
          "args_hash": "h", "decision": "allow", "executed": True, "side_effect_class": "none", "taint": taint,
          "at": TS}
    (h,) = hash_rows(conform(to_table([ev], "gateway_events"), "gateway_events"), "gateway_events")
    assert h == _doc_row_hash(ev, "gateway_events")
    task = {"task_id": "t", "task_version": "v", "env_id": "e", "split": "dev", "family": "f", "created_at": TS,
            "statement": "s", "provenance": provenance, "has_oracle": False,
            "budget": {"max_steps": 3, "max_tokens": None, "max_cost": max_cost}}
    (h,) = hash_rows(conform(to_table([task], "tasks"), "tasks"), "tasks")
    full_prov = {f: provenance.get(f) for f in ("generator", "source", "commit", "mutator", "seed", "diff_hash")}
    assert h == _doc_row_hash({**task, "provenance": full_prov}, "tasks")
