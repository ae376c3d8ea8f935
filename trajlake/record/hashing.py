"""Canonical content hashing of rows and episodes (documented in docs/hashing.md).

A row's content hash is ``sha256`` over a byte string that depends only on the row's values and the table's
column names, never on Python, pyarrow or platform details:

    b"trajlake/1/" + table + b"\\n"  then, for every content column in schema order whose value is not null:
    name (UTF-8) + b"\\x00" + encode(value)

Bookkeeping columns (``content_hash``, ``written_at``, ``schema_version``, ``writer_version``) are excluded.
Null columns are omitted entirely, so adding a nullable column in a later minor schema version keeps old
hashes valid. ``encode`` is, by type (integers little-endian, lengths as unsigned 64-bit little-endian):

- bool ``B`` + 1 byte; integer ``I`` + int64; float ``F`` + IEEE-754 float64 (NaN canonicalised);
  timestamp ``T`` + int64 microseconds since the Unix epoch, UTC; string ``S`` + length + UTF-8 bytes;
- ``list<int32>`` ``Li`` + count + int32 each; ``list<int8>`` ``Lb`` + count + int8 each;
  ``list<float32>`` ``Lf`` + count + float32 each (NaN canonicalised); ``list<string>`` ``Ls`` + count +
  encode(item) each;
- ``map<string, float64>`` ``M`` + count + (encode(key) + encode(value)) for entries sorted by key;
- struct ``R`` + count + encode(field) for each field in definition order, ``N`` for a null field.

An episode's content hash covers its own row plus the ordered content hashes of its turns and the row
hashes of its gateway events: ``row_bytes + b"turns\\x00" + hex(turn_0) + ... + b"events\\x00" + hex(ev_0) ...``.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from trajlake.schema import table_def

EXCLUDED = frozenset({"content_hash", "written_at", "schema_version", "writer_version"})
_NAN64 = struct.pack("<d", math.nan)
_NAN32 = np.array([np.nan], dtype="<f4").tobytes()
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


def _enc_float(x: float) -> bytes:
    return b"F" + (_NAN64 if x != x else _F64.pack(x))


def _enc_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return b"S" + _U64.pack(len(b)) + b


def _enc_value(v: Any, t: pa.DataType) -> bytes:
    """Encode one Python value of arrow type ``t`` (slow path for small, nested columns)."""
    if v is None:
        return b"N"
    if pa.types.is_boolean(t):
        return b"B\x01" if v else b"B\x00"
    if pa.types.is_integer(t):
        return b"I" + _I64.pack(int(v))
    if pa.types.is_floating(t):
        return _enc_float(float(v))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _enc_str(v)
    if pa.types.is_timestamp(t):
        return b"T" + _I64.pack(_micros(v))
    if pa.types.is_map(t):
        items = sorted(v, key=lambda kv: kv[0])
        return b"M" + _U64.pack(len(items)) + b"".join(
            _enc_value(k, t.key_type) + _enc_value(x, t.item_type) for k, x in items
        )
    if pa.types.is_struct(t):
        return b"R" + _U64.pack(t.num_fields) + b"".join(
            _enc_value(v.get(t.field(i).name), t.field(i).type) for i in range(t.num_fields)
        )
    if pa.types.is_list(t):
        vt = t.value_type
        if pa.types.is_int32(vt):
            return b"Li" + _U64.pack(len(v)) + np.asarray(v, dtype="<i4").tobytes()
        if pa.types.is_int8(vt):
            return b"Lb" + _U64.pack(len(v)) + np.asarray(v, dtype="i1").tobytes()
        if pa.types.is_float32(vt):
            return b"Lf" + _U64.pack(len(v)) + _f32_bytes(np.asarray(v, dtype="<f4"))
        return b"Ls" + _U64.pack(len(v)) + b"".join(_enc_value(x, vt) for x in v)
    raise TypeError(f"cannot hash values of type {t}")


def _micros(v: Any) -> int:
    import datetime as dt

    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            raise ValueError("naive datetime")
        delta = v - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return int(v)


def _f32_bytes(a: np.ndarray) -> bytes:
    if np.isnan(a).any():
        a = a.copy()
        a[np.isnan(a)] = np.frombuffer(_NAN32, dtype="<f4")[0]
    return a.astype("<f4", copy=False).tobytes()


def _column_encoder(col: pa.ChunkedArray | pa.Array, t: pa.DataType) -> Callable[[int], bytes | None]:
    """Return f(i) -> encoded bytes of row i (None when null), with fast paths for the big columns."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_list(t) and (pa.types.is_int32(t.value_type) or pa.types.is_int8(t.value_type)
                                or pa.types.is_float32(t.value_type)):
        offsets = np.asarray(arr.offsets.to_numpy(), dtype=np.int64)
        vt = t.value_type
        base = int(offsets[0])
        offsets = offsets - base
        # raw child values, addressed by the (rebased) offsets, also under null list slots
        values = arr.values.slice(base, int(offsets[-1]))
        if pa.types.is_float32(vt):
            flat = np.asarray(values.to_numpy(zero_copy_only=False), dtype="<f4")
            if np.isnan(flat).any():
                flat = flat.copy()
                flat[np.isnan(flat)] = np.frombuffer(_NAN32, dtype="<f4")[0]
            tag, width = b"Lf", 4
        elif pa.types.is_int32(vt):
            flat = np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False), dtype="<i4")
            tag, width = b"Li", 4
        else:
            flat = np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False), dtype="i1")
            tag, width = b"Lb", 1
        buf = memoryview(flat.tobytes())

        def enc_list(i: int) -> bytes | None:
            if not valid[i]:
                return None
            a, b = int(offsets[i]), int(offsets[i + 1])
            return tag + _U64.pack(b - a) + bytes(buf[a * width : b * width])

        return enc_list
    if pa.types.is_timestamp(t):
        ints = arr.cast(pa.int64()).to_pylist()
        return lambda i: None if ints[i] is None else b"T" + _I64.pack(ints[i])
    if pa.types.is_string(t):
        strs = arr.to_pylist()
        return lambda i: None if strs[i] is None else _enc_str(strs[i])
    if pa.types.is_floating(t):
        fl = arr.to_pylist()
        return lambda i: None if fl[i] is None else _enc_float(fl[i])
    if pa.types.is_integer(t):
        it = arr.to_pylist()
        return lambda i: None if it[i] is None else b"I" + _I64.pack(it[i])
    py = arr.to_pylist()
    return lambda i: None if py[i] is None else _enc_value(py[i], t)


def row_bytes(table: pa.Table, table_name: str) -> list[bytes]:
    """Canonical byte encoding of every row of ``table`` (a table of schema ``table_name``)."""
    td = table_def(table_name)
    prefix = b"trajlake/1/" + table_name.encode() + b"\n"
    encoders: list[tuple[bytes, Callable[[int], bytes | None]]] = []
    for c in td.columns:
        if c.name in EXCLUDED or c.name not in table.column_names:
            continue
        encoders.append((c.name.encode() + b"\x00", _column_encoder(table.column(c.name), c.arrow_type)))
    out: list[bytes] = []
    for i in range(table.num_rows):
        parts = [prefix]
        for name, enc in encoders:
            p = enc(i)
            if p is not None:
                parts.append(name)
                parts.append(p)
        out.append(b"".join(parts))
    return out


def hash_rows(table: pa.Table, table_name: str) -> list[str]:
    """sha256 hex digest of each row's canonical encoding."""
    return [hashlib.sha256(b).hexdigest() for b in row_bytes(table, table_name)]


def episode_hash(episode_row: bytes, turn_hashes: Sequence[str], event_hashes: Sequence[str]) -> str:
    """Content hash of an episode from its canonical row bytes and its turns' and events' hashes (in order)."""
    h = hashlib.sha256(episode_row)
    h.update(b"turns\x00")
    for t in turn_hashes:
        h.update(t.encode())
    h.update(b"events\x00")
    for e in event_hashes:
        h.update(e.encode())
    return h.hexdigest()
