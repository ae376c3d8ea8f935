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

Canonical NaN: float64 ``0x7FF8000000000000``, float32 ``0x7FC00000``. ``-0.0`` and ``0.0`` differ.

An episode's content hash covers its own row plus the ordered content hashes of its turns and the row
hashes of its gateway events: ``row_bytes + b"turns\\x00" + hex(turn_0) + ... + b"events\\x00" + hex(ev_0) ...``.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajlake.schema import table_def

EXCLUDED = frozenset({"content_hash", "written_at", "schema_version", "writer_version"})
_NAN64 = struct.pack("<d", math.nan)
_NAN32 = np.array([np.nan], dtype="<f4").tobytes()
_U64 = struct.Struct("<Q")
_SEP = pa.scalar(b"", pa.large_binary())
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


def _fixed(tag: bytes, payload: np.ndarray) -> pa.Array:
    """Per-row ``tag + payload[i]`` where ``payload`` is an (n, width) uint8 matrix; as large_binary."""
    n = payload.shape[0]
    mat = np.empty((n, len(tag) + payload.shape[1]), dtype=np.uint8)
    mat[:, : len(tag)] = np.frombuffer(tag, dtype=np.uint8)
    mat[:, len(tag):] = payload
    width = mat.shape[1]
    arr = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, pa.py_buffer(mat)])
    return arr.cast(pa.large_binary())


def _le_bytes(values: np.ndarray, dtype: str) -> np.ndarray:
    a = np.ascontiguousarray(values.astype(dtype, copy=False))
    return a.view(np.uint8).reshape(len(a), np.dtype(dtype).itemsize)


def _raw_lists(arr: pa.ListArray, dtype: str) -> tuple[pa.Array, np.ndarray]:
    """The raw little-endian bytes of each list (as large_binary, zero-copy where possible) and their lengths."""
    offsets = np.asarray(arr.offsets.to_numpy(), dtype=np.int64)
    base = int(offsets[0])
    offsets = offsets - base
    values = arr.values.slice(base, int(offsets[-1]))  # child values, also under null list slots
    flat = np.asarray(values.to_numpy(zero_copy_only=False))
    if values.null_count:
        flat = np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False))
    flat = flat.astype(dtype, copy=False)
    if dtype == "<f4":
        nan = np.isnan(flat)
        if nan.any():
            flat = flat.copy()
            flat[nan] = np.frombuffer(_NAN32, dtype="<f4")[0]
    width = np.dtype(dtype).itemsize
    raw = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(arr), [None, pa.py_buffer(offsets * width), pa.py_buffer(np.ascontiguousarray(flat))])
    return raw, np.diff(offsets)


def _encode_column(col: pa.ChunkedArray | pa.Array, t: pa.DataType) -> pa.Array:
    """Vectorised ``encode(value)`` of every row as large_binary (null where the value is null)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(arr)
    if pa.types.is_list(t) and (pa.types.is_int32(t.value_type) or pa.types.is_int8(t.value_type)
                                or pa.types.is_float32(t.value_type)):
        dtype, tag = ("<f4", b"Lf") if pa.types.is_float32(t.value_type) else (
            ("<i4", b"Li") if pa.types.is_int32(t.value_type) else ("i1", b"Lb"))
        raw, lengths = _raw_lists(arr, dtype)
        out = pc.binary_join_element_wise(_fixed(tag, _le_bytes(lengths, "<u8")), raw, _SEP)
    elif pa.types.is_timestamp(t):
        ints = np.asarray(arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False))
        out = _fixed(b"T", _le_bytes(ints, "<i8"))
    elif pa.types.is_boolean(t):
        b = np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.uint8).reshape(n, 1)
        out = _fixed(b"B", b)
    elif pa.types.is_integer(t):
        ints = np.asarray(arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False))
        out = _fixed(b"I", _le_bytes(ints, "<i8"))
    elif pa.types.is_floating(t):
        fl = np.array(arr.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False), dtype="<f8")
        fl[np.isnan(fl)] = np.frombuffer(_NAN64, dtype="<f8")[0]
        out = _fixed(b"F", _le_bytes(fl, "<f8"))
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        data = arr.cast(pa.large_binary())
        lengths = np.asarray(pc.binary_length(data).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        out = pc.binary_join_element_wise(_fixed(b"S", _le_bytes(lengths, "<u8")), data.fill_null(_SEP), _SEP)
    else:  # nested columns (maps, structs, lists of strings) are small: encode value by value
        out = pa.array([None if v is None else _enc_value(v, t) for v in arr.to_pylist()], pa.large_binary())
    if arr.null_count:
        out = pc.if_else(arr.is_valid(), out, pa.scalar(None, pa.large_binary()))
    return out


def row_bytes_array(table: pa.Table, table_name: str) -> pa.Array:
    """Canonical byte encoding of every row of ``table`` (a table of schema ``table_name``), as large_binary."""
    if table.num_rows == 0:
        return pa.array([], pa.large_binary())
    td = table_def(table_name)
    prefix = pa.scalar(b"trajlake/1/" + table_name.encode() + b"\n", pa.large_binary())
    parts: list[pa.Array | pa.Scalar] = [pa.array([b""] * table.num_rows, pa.large_binary()), prefix]
    for c in td.columns:
        if c.name in EXCLUDED or c.name not in table.column_names:
            continue
        name = pa.scalar(c.name.encode() + b"\x00", pa.large_binary())
        # name + value; null when the value is null, and then dropped entirely by the outer join
        parts.append(pc.binary_join_element_wise(name, _encode_column(table.column(c.name), c.arrow_type), _SEP,
                                                 null_handling="emit_null"))
    return pc.binary_join_element_wise(*parts, _SEP, null_handling="replace", null_replacement=b"")


def row_bytes(table: pa.Table, table_name: str) -> list[bytes]:
    """Canonical byte encoding of every row, as Python bytes."""
    return [b if isinstance(b, bytes) else b"" for b in row_bytes_array(table, table_name).to_pylist()]


def hash_rows(table: pa.Table, table_name: str) -> list[str]:
    """sha256 hex digest of each row's canonical encoding (equal to hashing ``row_bytes_array``).

    The big numeric list columns (token ids, masks, log-probs) are fed to sha256 straight from their Arrow
    buffers; only the small columns are joined into per-row byte strings. That avoids copying the token data."""
    if table.num_rows == 0:
        return []
    td = table_def(table_name)
    n = table.num_rows
    # (buffer, per-row offsets, per-row validity or None): concatenated per row, in order
    segments: list[tuple[memoryview, list[int], list[bool] | None]] = []
    small: list[pa.Array | pa.Scalar] = [pa.array([b""] * n, pa.large_binary()),
                                         pa.scalar(b"trajlake/1/" + table_name.encode() + b"\n", pa.large_binary())]

    def close_small() -> None:
        joined = pc.binary_join_element_wise(*small, _SEP, null_handling="replace", null_replacement=b"")
        segments.append((*_view(joined), None))
        small.clear()
        small.append(pa.array([b""] * n, pa.large_binary()))

    for c in td.columns:
        if c.name in EXCLUDED or c.name not in table.column_names:
            continue
        t = c.arrow_type
        name = pa.scalar(c.name.encode() + b"\x00", pa.large_binary())
        col = table.column(c.name)
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if pa.types.is_list(t) and (pa.types.is_int32(t.value_type) or pa.types.is_int8(t.value_type)
                                    or pa.types.is_float32(t.value_type)):
            dtype, tag = ("<f4", b"Lf") if pa.types.is_float32(t.value_type) else (
                ("<i4", b"Li") if pa.types.is_int32(t.value_type) else ("i1", b"Lb"))
            raw, lengths = _raw_lists(arr, dtype)
            header = _fixed(tag, _le_bytes(lengths, "<u8"))
            if arr.null_count:
                header = pc.if_else(arr.is_valid(), header, pa.scalar(None, pa.large_binary()))
            small.append(pc.binary_join_element_wise(name, header, _SEP, null_handling="emit_null"))
            close_small()
            # a null list contributes nothing (its slot may still span child values, so skip it explicitly)
            valid = arr.is_valid().to_pylist() if arr.null_count else None
            segments.append((*_view(raw), valid))
        else:
            small.append(pc.binary_join_element_wise(name, _encode_column(arr, t), _SEP, null_handling="emit_null"))
    close_small()
    sha = hashlib.sha256
    out: list[str] = []
    (mv0, off0, _), rest = segments[0], segments[1:]
    if not rest:
        return [sha(mv0[off0[i]:off0[i + 1]]).hexdigest() for i in range(n)]
    for i in range(n):
        h = sha(mv0[off0[i]:off0[i + 1]])
        for mv, off, valid in rest:
            a, b = off[i], off[i + 1]
            if b > a and (valid is None or valid[i]):
                h.update(mv[a:b])
        out.append(h.hexdigest())
    return out


def _view(arr: pa.Array) -> tuple[memoryview, list[int]]:
    """The data buffer and per-row offsets of a large_binary array."""
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]
    data = bufs[2]
    return (memoryview(data) if data is not None else memoryview(b"")), offsets.tolist()

def episode_hash(episode_row: bytes, turn_hashes: Sequence[str], event_hashes: Sequence[str]) -> str:
    """Content hash of an episode from its canonical row bytes and its turns' and events' hashes (in order)."""
    return episode_hash_joined(episode_row, "".join(turn_hashes), "".join(event_hashes))


def episode_hash_joined(episode_row: bytes, turn_hashes: str, event_hashes: str) -> str:
    """``episode_hash`` with the ordered hex hashes already concatenated."""
    h = hashlib.sha256(episode_row)
    h.update(b"turns\x00")
    h.update(turn_hashes.encode())
    h.update(b"events\x00")
    h.update(event_hashes.encode())
    return h.hexdigest()
