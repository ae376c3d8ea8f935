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
import itertools
import math
import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajlake.schema import table_def

EXCLUDED = frozenset({"content_hash", "written_at", "schema_version", "writer_version"})
_NAN64 = struct.pack("<d", math.nan)
_NAN32 = np.array([np.nan], dtype="<f4").tobytes()
_EMPTY = pa.scalar(b"", pa.large_binary())
_NULL = pa.scalar(None, pa.large_binary())
_N = pa.scalar(b"N", pa.large_binary())
# The row encodings are scratch memory that lives for one slice of rows: the system allocator gives it back at
# once, where pyarrow's default pool (mimalloc) keeps tens of MB of it (measured by bench/bench_lake.py).
SCRATCH_POOL = pa.system_memory_pool()
# Rows are encoded and hashed this many in-memory bytes at a time: the encoding copies what it covers (the
# token lists most of all), so a large table costs a bounded working set instead of a second copy of itself.
HASH_SLICE_BYTES = 8 * 1024 * 1024


# -- bulk byte-string building ----------------------------------------------------------------------------------
def _arr(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks(memory_pool=SCRATCH_POOL)
    return col


def _validity(arr: pa.Array | pa.ChunkedArray) -> pa.Buffer | None:
    """A validity bitmap (offset 0) for ``arr``'s rows, or None when it has no nulls."""
    if not arr.null_count:
        return None
    if isinstance(arr, pa.ChunkedArray):
        return _validity_of(np.asarray(arr.is_valid().to_numpy(), dtype=bool))
    valid = arr.is_valid()
    if valid.offset:
        valid = pa.concat_arrays([valid])
    return valid.buffers()[1]


def _fixed(tag: bytes, payload: np.ndarray, validity: pa.Buffer | None = None) -> pa.Array:
    """Per-row ``tag + payload[i]`` (``payload``: an (n, width) uint8 matrix) as large_binary, null where
    ``validity`` says so."""
    n = payload.shape[0]
    mat = np.empty((n, len(tag) + payload.shape[1]), dtype=np.uint8)
    mat[:, : len(tag)] = np.frombuffer(tag, dtype=np.uint8)
    mat[:, len(tag):] = payload
    offsets = np.arange(n + 1, dtype=np.int64) * mat.shape[1]
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(mat)])


def _le_bytes(values: np.ndarray, dtype: str) -> np.ndarray:
    a = np.ascontiguousarray(values.astype(dtype, copy=False))
    return a.view(np.uint8).reshape(len(a), np.dtype(dtype).itemsize)


def _binary_parts(arr: pa.Array) -> tuple[np.ndarray, pa.Buffer | None]:
    """The int64 offsets (one per row, plus one) and the data buffer of a large_binary array."""
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]
    return offsets, bufs[2]


def _concat_groups(parts: pa.Array, bounds: np.ndarray) -> pa.Array:
    """Group ``g`` = the concatenation of ``parts[bounds[g]:bounds[g + 1]]`` (large_binary without nulls), as a
    large_binary array sharing ``parts``' data buffer: consecutive values are already contiguous bytes."""
    offsets, data = _binary_parts(parts)
    out = np.ascontiguousarray(offsets[bounds])
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(bounds) - 1,
                                            [None, pa.py_buffer(out), data if data is not None else pa.py_buffer(b"")])


def _join(*parts: pa.Array | pa.Scalar, skip_nulls: bool = False) -> pa.Array:
    """Row-wise concatenation; a null part makes the row null, or (``skip_nulls``) contributes nothing."""
    if skip_nulls:
        return pc.binary_join_element_wise(*parts, _EMPTY, null_handling="replace", null_replacement=b"",
                                           memory_pool=SCRATCH_POOL)
    return pc.binary_join_element_wise(*parts, _EMPTY, null_handling="emit_null", memory_pool=SCRATCH_POOL)


def _live_children(arr: pa.ListArray | pa.MapArray) -> tuple[np.ndarray, np.ndarray]:
    """For a list or map array: the child positions of its non-null slots (in row order) and the per-row counts
    (0 for a null slot, whose offsets may still span child values)."""
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    counts = np.diff(offsets)
    if arr.null_count:
        counts = np.where(np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool), counts, 0)
    total = int(counts.sum())
    starts = np.repeat(offsets[:-1], counts)
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return starts + within, counts


_NUMERIC_LISTS = {pa.int32(): ("<i4", b"Li"), pa.int8(): ("i1", b"Lb"), pa.float32(): ("<f4", b"Lf")}


def _numeric_list_parts(col: pa.ListArray | pa.ChunkedArray, t: pa.DataType) -> list[pa.Array | pa.ChunkedArray]:
    """``Lx + count`` and the raw little-endian values of each list, both null on a null slot. The values are
    read in place from the child buffers, chunk by chunk (no copy unless a cast or a NaN needs one); the header
    is one array over all chunks, so that it merges with its neighbours (``_merge_fixed``)."""
    dtype, tag = _NUMERIC_LISTS[t.value_type]
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    counts, raws, valid = [], [], []
    for ch in chunks:
        offsets = np.asarray(ch.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
        base = int(offsets[0])
        values = ch.values.slice(base, int(offsets[-1]) - base)  # child values, also under null list slots
        flat = np.asarray((values.fill_null(0) if values.null_count else values).to_numpy(zero_copy_only=False))
        flat = np.ascontiguousarray(flat.astype(dtype, copy=False))
        if dtype == "<f4" and flat.shape[0] and np.isnan(flat.min()):  # min propagates NaN: one pass
            flat = flat.copy()
            flat[np.isnan(flat)] = np.frombuffer(_NAN32, dtype="<f4")[0]
        counts.append(np.diff(offsets))
        raws.append(pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(ch), [
            _validity(ch), pa.py_buffer((offsets - base) * np.dtype(dtype).itemsize), pa.py_buffer(flat)]))
        valid.append(np.asarray(ch.is_valid().to_numpy(zero_copy_only=False), dtype=bool) if ch.null_count
                     else np.ones(len(ch), dtype=bool))
    validity = _validity_of(np.concatenate(valid)) if col.null_count else None
    header = _fixed(tag, _le_bytes(np.concatenate(counts), "<u8"), validity)
    return [header, raws[0] if len(raws) == 1 else pa.chunked_array(raws, pa.large_binary())]


def _validity_of(valid: np.ndarray) -> pa.Buffer:
    """A validity bitmap (Arrow's bit order) from a bool array."""
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _encode_parts(arr: pa.Array | pa.ChunkedArray, t: pa.DataType) -> list[pa.Array | pa.ChunkedArray]:
    """Pieces whose row-wise concatenation is ``encode(value)``; every piece is null where the value is.
    Strings, numbers and numeric lists may come chunked (their values are then not gathered); other types
    must be one array."""
    n = len(arr)
    if pa.types.is_list(t) and t.value_type in _NUMERIC_LISTS:
        return _numeric_list_parts(arr, t)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        data = arr.cast(pa.large_binary())
        lengths = np.asarray(pc.binary_length(data).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        return [_fixed(b"S", _le_bytes(lengths, "<u8"), _validity(arr)), data]
    if pa.types.is_boolean(t):
        b = np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.uint8).reshape(n, 1)
        return [_fixed(b"B", b, _validity(arr))]
    if pa.types.is_integer(t) or pa.types.is_timestamp(t):  # timestamps: int64 microseconds (schema unit us)
        ints = np.asarray(arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False))
        return [_fixed(b"T" if pa.types.is_timestamp(t) else b"I", _le_bytes(ints, "<i8"), _validity(arr))]
    if pa.types.is_floating(t):
        fl = np.array(arr.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False), dtype="<f8")
        fl[np.isnan(fl)] = np.frombuffer(_NAN64, dtype="<f8")[0]
        return [_fixed(b"F", _le_bytes(fl, "<f8"), _validity(arr))]
    if pa.types.is_map(t):  # entries sorted by key, stably like Python's sorted (UTF-8 byte order = code points)
        idx, counts = _live_children(arr)
        entries = arr.values.take(pa.array(idx))
        keys, items = entries.field(0), entries.field(1)
        row = np.repeat(np.arange(n, dtype=np.int64), counts)
        order = pc.sort_indices(pa.table({"r": row, "k": keys}), sort_keys=[("r", "ascending"), ("k", "ascending")])
        body = _join(_encode_nested(keys, t.key_type), _encode_nested(items, t.item_type)).take(order)
        tag = b"M"
    elif pa.types.is_list(t):  # other lists (of strings): item by item
        idx, counts = _live_children(arr)
        body = _encode_nested(arr.values.take(pa.array(idx)), t.value_type)
        tag = b"Ls"
    elif pa.types.is_struct(t):
        header = _fixed(b"R", _le_bytes(np.full(n, t.num_fields, dtype=np.int64), "<u8"), _validity(arr))
        return [header, *(_encode_nested(child, t.field(i).type) for i, child in enumerate(arr.flatten()))]
    else:
        raise TypeError(f"cannot hash values of type {t}")
    validity = _validity(arr)
    grouped = _concat_groups(body, np.r_[0, np.cumsum(counts)])
    if validity is not None:
        grouped = pc.if_else(arr.is_valid(), grouped, _NULL)
    return [_fixed(tag, _le_bytes(counts, "<u8"), validity), grouped]


def _encode(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """``encode(value)`` of every element as large_binary, null where the element is null."""
    parts = _encode_parts(arr, t)
    return parts[0] if len(parts) == 1 else _join(*parts)


def _encode_nested(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """``encode`` for values inside a list, map or struct: a null there is ``N``."""
    out = _encode(arr, t)
    return out.fill_null(_N) if out.null_count else out


def _name_part(arr: pa.Array | pa.ChunkedArray, name: bytes) -> pa.Array | pa.Scalar:
    """The column's ``name + NUL`` per row, null where the value is null (then the whole column is skipped)."""
    validity = _validity(arr)
    if validity is None:
        return pa.scalar(name, pa.large_binary())
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(arr), [
        validity, pa.py_buffer(np.arange(len(arr) + 1, dtype=np.int64) * len(name)), pa.py_buffer(name * len(arr))])


_CHUNKED_OK = (pa.types.is_string, pa.types.is_large_string, pa.types.is_boolean, pa.types.is_integer,
               pa.types.is_timestamp, pa.types.is_floating)


def _row_parts(table: pa.Table, table_name: str) -> list[pa.Array | pa.ChunkedArray | pa.Scalar]:
    """Pieces (each null where its column is) whose row-wise concatenation is every row's canonical bytes.

    Per column the name and the value's pieces, all null (and so skipped) where the value is null. Strings and
    the big numeric lists are read in place from their Arrow buffers, chunk by chunk; only the bytes before
    them (names, tags, lengths, fixed-width values) are built, once for all rows, as few wide parts."""
    parts: list[pa.Array | pa.ChunkedArray | pa.Scalar] = [
        pa.scalar(b"trajlake/1/" + table_name.encode() + b"\n", pa.large_binary())]
    for c in table_def(table_name).columns:
        if c.name in EXCLUDED or c.name not in table.column_names:
            continue
        col = table.column(c.name)
        if col.null_count == len(col):
            continue  # omitted entirely
        name = c.name.encode() + b"\x00"
        t = c.arrow_type
        chunked_ok = (pa.types.is_list(t) and t.value_type in _NUMERIC_LISTS) or any(f(t) for f in _CHUNKED_OK)
        arr = col if chunked_ok else _arr(col)
        parts += [_name_part(arr, name), *_encode_parts(arr, t)]
    if len(parts) == 1:
        parts.append(pa.array([b""] * table.num_rows, pa.large_binary()))
    return _merge_fixed(parts, table.num_rows)


def row_bytes_array(table: pa.Table, table_name: str) -> pa.Array | pa.ChunkedArray:
    """Canonical byte encoding of every row of ``table`` (a table of schema ``table_name``), as large_binary
    (chunked like the table's big columns): one row-wise concatenation of ``_row_parts``."""
    if table.num_rows == 0:
        return pa.array([], pa.large_binary())
    return _join(*_row_parts(table, table_name), skip_nulls=True)


def _fixed_view(part: pa.Array | pa.ChunkedArray | pa.Scalar, n: int) -> np.ndarray | None:
    """An (n, width) uint8 view of a part whose every row has the same width (a scalar, a name or a
    fixed-width value), else None."""
    if isinstance(part, pa.Scalar):
        b = part.as_py()
        return np.broadcast_to(np.frombuffer(b, dtype=np.uint8), (n, len(b)))
    if isinstance(part, pa.ChunkedArray) or len(part) != n or n == 0:
        return None
    offsets, data = _binary_parts(part)
    width = int(offsets[1] - offsets[0])
    if data is None or int(offsets[-1] - offsets[0]) != n * width or (np.diff(offsets) != width).any():
        return None
    return np.frombuffer(data, dtype=np.uint8)[int(offsets[0]): int(offsets[-1])].reshape(n, width)


def _merge_fixed(parts: list[pa.Array | pa.ChunkedArray | pa.Scalar], n: int
                 ) -> list[pa.Array | pa.ChunkedArray | pa.Scalar]:
    """Neighbouring fixed-width parts with the same nulls (the table's prefix, column names, tags, lengths and
    fixed-width values) as one part: the row-wise join costs per part and row, so fewer, wider parts are
    cheaper (the bytes are the same)."""
    out: list[pa.Array | pa.ChunkedArray | pa.Scalar] = []
    run: list[np.ndarray] = []
    run_valid: pa.Buffer | None = None

    def close() -> None:
        if run:
            out.append(_fixed(b"", run[0] if len(run) == 1 else np.hstack(run), run_valid))
            run.clear()

    for part in parts:
        view = _fixed_view(part, n)
        if view is None:
            close()
            out.append(part)
            continue
        valid = None if isinstance(part, pa.Scalar) else _validity(part)
        same = (valid is None and run_valid is None) or (
            valid is not None and run_valid is not None and valid.equals(run_valid))
        if run and not same:
            close()
        run_valid = valid
        run.append(view)
    close()
    return out


def row_bytes(table: pa.Table, table_name: str) -> list[bytes]:
    """Canonical byte encoding of every row, as Python bytes."""
    return [b if isinstance(b, bytes) else b"" for b in row_bytes_array(table, table_name).to_pylist()]


def sha256_each(data: pa.Array | pa.ChunkedArray) -> list[str]:
    """sha256 hex digest of every value of a large_binary array without nulls, read straight from its buffer.

    One digest per row is inherent; each is one call into OpenSSL over a slice of the Arrow buffer (no Python
    object per value, no copy). Values are fed in pieces under 2 KiB, below which hashlib keeps the GIL: a
    release and re-acquire per row made the hashing thread queue behind the appending thread at every row."""
    if isinstance(data, pa.ChunkedArray):
        return [h for chunk in data.chunks for h in sha256_each(chunk)]
    offsets, data_buf = _binary_parts(data)
    view = memoryview(data_buf) if data_buf is not None else memoryview(b"")
    sha = hashlib.sha256
    bounds = offsets.tolist()
    if len(bounds) < 2 or int(np.diff(offsets).max()) < _GIL_FREE_BYTES:
        return [sha(view[a:b]).hexdigest() for a, b in itertools.pairwise(bounds)]
    out = []
    step = _GIL_FREE_BYTES - 1
    for a, b in itertools.pairwise(bounds):
        if b - a <= step:
            out.append(sha(view[a:b]).hexdigest())
            continue
        h = sha(view[a:a + step])
        c = a + step
        while c < b:
            h.update(view[c:min(b, c + step)])
            c += step
        out.append(h.hexdigest())
    return out


_GIL_FREE_BYTES = 2048  # hashlib releases the GIL for updates of this many bytes or more


def _slices(table: pa.Table, max_bytes: int) -> list[tuple[int, int]]:
    n = table.num_rows
    per_row = max(1, table.nbytes // max(1, n))
    step = max(1, max_bytes // per_row)
    return [(a, min(step, n - a)) for a in range(0, n, step)]


def hash_rows(table: pa.Table, table_name: str) -> list[str]:
    """sha256 hex digest of each row's canonical encoding (``row_bytes_array``), a slice of rows at a time.

    The pieces are prepared once for all rows (they copy only the small columns); each slice joins its share
    of them (copying a slice of rows) and hashes it, so the bytes hashed are still warm in the cache."""
    if table.num_rows == 0:
        return []
    parts = _row_parts(table, table_name)
    out: list[str] = []
    for start, length in _slices(table, HASH_SLICE_BYTES):
        out += sha256_each(_join(*(p if isinstance(p, pa.Scalar) else p.slice(start, length) for p in parts),
                                 skip_nulls=True))
    return out


def hash_rows_array(table: pa.Table, table_name: str) -> pa.Array:
    """``hash_rows`` as an Arrow string array."""
    return pa.array(hash_rows(table, table_name), pa.string())


def concat_hashes(keys: pa.Table, sort_keys: Sequence[str], hashes: str = "hash") -> tuple[pa.Array, pa.Array]:
    """Per episode, the concatenation of its rows' hex hashes in ``sort_keys`` order (episode_id first).

    Returns (episode ids, concatenated hashes as large_binary), both in episode-id order: a sort and new
    offsets into the sorted hashes' buffer, no loop per episode."""
    if keys.num_rows == 0:
        return pa.array([], pa.string()), pa.array([], pa.large_binary())
    order = pc.sort_indices(keys, sort_keys=[(k, "ascending") for k in sort_keys])
    eps = _arr(keys["episode_id"]).take(order)
    hexes = _arr(keys[hashes]).take(order).cast(pa.large_binary())
    n = len(eps)
    change = np.ones(n, dtype=bool)
    if n > 1:
        change[1:] = np.asarray(pc.not_equal(eps.slice(1), eps.slice(0, n - 1)).to_numpy(zero_copy_only=False))
    starts = np.flatnonzero(change)
    return eps.take(pa.array(starts)), _concat_groups(hexes, np.r_[starts, n])


def episode_hashes(episodes: pa.Table, turn_keys: pa.Table, event_keys: pa.Table) -> list[str]:
    """Content hashes of ``episodes`` rows from their turns' and events' hashes.

    ``turn_keys``: episode_id, turn_idx, hash (hex); ``event_keys``: episode_id, turn_idx, event_idx, hash."""
    if episodes.num_rows == 0:
        return []
    ids = episodes["episode_id"]
    joined: list[pa.Array | pa.Scalar] = [row_bytes_array(episodes, "episodes")]
    for tag, keys, order in ((b"turns\x00", turn_keys, ["episode_id", "turn_idx"]),
                             (b"events\x00", event_keys, ["episode_id", "turn_idx", "event_idx"])):
        owners, concat = concat_hashes(keys, order)
        at = _arr(pc.index_in(ids, value_set=owners))
        joined += [pa.scalar(tag, pa.large_binary()), concat.take(at).fill_null(_EMPTY)]
    return sha256_each(_join(*joined))


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
