"""Token-level values no policy can produce: a negative token id, a behaviour log-probability that is NaN,
infinite or above 0, and, where the turn's tokenizer id says its vocabulary (``vocab_suffix``), an id at or above
the vocabulary size or a policy turn whose ids are too few to encode its text. The recorder refuses them
(``trajlake.record.validate``) and ``verify`` reports them in committed files (written before the check, or by
hand)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

LOGPROB_MAX = 1e-4
"""The largest behaviour log-probability accepted: 0 (probability 1), plus float rounding of a log-softmax."""
NEGATIVE_TOKEN = "a token id is negative"
ID_OUTSIDE_VOCAB = "a token id is at or above the vocabulary size its tokenizer id states (vocab:N)"
TOO_FEW_IDS = ("the turn's text is longer than its token ids can encode (more bytes than ids x (the tokenizer's "
               "longest token + 1)): the ids are not the text's")
IMPOSSIBLE_LOGPROB = (f"a log-probability is NaN, infinite or above 0 (more than {LOGPROB_MAX:g}): no distribution "
                      f"gives it")


_LIMITS = re.compile(r"\|vocab:(\d+)\|maxbytes:(\d+)(?:\||$)")


def vocab_suffix(vocab_size: int, max_token_bytes: int) -> str:
    """The part of a tokenizer id that states its vocabulary size and the UTF-8 bytes of its longest token decoded
    alone (``|vocab:N|maxbytes:L``), so the recorder and ``verify`` can check ids against it from the turn row."""
    return f"|vocab:{int(vocab_size)}|maxbytes:{int(max_token_bytes)}"


def tokenizer_limits(tokenizer_id: str | None) -> tuple[int, int] | None:
    """(vocabulary size, longest token's bytes) stated by a tokenizer id (``vocab_suffix``); None if it states none."""
    m = _LIMITS.search(tokenizer_id or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def max_token_bytes(decoded_tokens: Iterable[str]) -> int:
    """The UTF-8 bytes of the longest of a tokenizer's tokens, each decoded alone (special and added tokens
    included): decoding n ids yields at most n x (this + 1) bytes (+1: a decoder may join tokens with a space)."""
    return max((len(t.encode("utf-8", "surrogatepass")) for t in decoded_tokens), default=0)


def one_array(a: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One contiguous array (a table slice's columns are single chunks: no copy then)."""
    if isinstance(a, pa.ChunkedArray):
        return a.chunk(0) if a.num_chunks == 1 else a.combine_chunks()
    return a


def rows_where(values: pa.ChunkedArray | pa.Array, bad: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Per row of a list array, whether any element satisfies ``bad`` (vectorised over the flat values; a null
    list or element is never bad here: nulls are the schema's business)."""
    values = one_array(values)
    n = len(values)
    out = np.zeros(n, dtype=bool)
    if n == 0 or values.null_count == n:
        return out
    offsets = np.asarray(values.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    flat = values.values.slice(lo, hi - lo)
    if len(flat) == 0:
        return out
    v = np.asarray((flat.fill_null(0) if flat.null_count else flat).to_numpy(zero_copy_only=False))
    hit = np.asarray(bad(v), dtype=bool)
    if not hit.any():
        return out
    owner = np.searchsorted(offsets - lo, np.flatnonzero(hit), side="right") - 1
    out[np.unique(owner)] = True
    if values.null_count:
        out &= np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return out


def _row_limits(turns: pa.Table) -> tuple[np.ndarray, np.ndarray] | None:
    """Per row, the vocabulary size and longest-token bytes its tokenizer id states (-1 where it states none);
    None when no row states any."""
    if "tokenizer_id" not in turns.column_names or turns.num_rows == 0:
        return None
    ids = one_array(turns["tokenizer_id"])
    distinct = [t for t in pc.unique(ids).to_pylist() if tokenizer_limits(t) is not None]
    if not distinct:
        return None
    vocab = np.full(turns.num_rows, -1, dtype=np.int64)
    longest = np.full(turns.num_rows, -1, dtype=np.int64)
    for t in distinct:
        size, nbytes = tokenizer_limits(t)  # type: ignore[misc]
        rows = np.asarray(pc.fill_null(pc.equal(ids, t), False).to_numpy(zero_copy_only=False), dtype=bool)
        vocab[rows], longest[rows] = size, nbytes
    return vocab, longest


def _ids_outside_vocab(token_ids: pa.ChunkedArray | pa.Array, vocab: np.ndarray) -> np.ndarray:
    values = one_array(token_ids)
    lengths = np.asarray(pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False),
                         dtype=np.int64)
    limit = np.repeat(np.where(vocab < 0, np.iinfo(np.int64).max, vocab), lengths)
    return rows_where(values, lambda v: v.astype(np.int64) >= limit)


def _too_few_ids(turns: pa.Table, longest: np.ndarray) -> np.ndarray:
    n_ids = np.asarray(pc.fill_null(pc.list_value_length(one_array(turns["token_ids"])), -1).to_numpy(
        zero_copy_only=False), dtype=np.int64)
    text_bytes = np.asarray(pc.fill_null(pc.binary_length(one_array(turns["raw_content"])), 0).to_numpy(
        zero_copy_only=False), dtype=np.int64)
    policy = np.asarray(pc.fill_null(pc.equal(one_array(turns["actor"]), "policy"), False).to_numpy(
        zero_copy_only=False), dtype=bool)
    return policy & (longest >= 0) & (n_ids >= 0) & (text_bytes > n_ids * (longest + 1))


def impossible_token_values(turns: pa.Table) -> list[tuple[np.ndarray, str, str]]:
    """(rows, field, message) for each kind of impossible value in ``turns`` (rows: a boolean mask)."""
    out = []
    if "token_ids" in turns.column_names:
        out.append((rows_where(turns["token_ids"], lambda v: v < 0), "token_ids", NEGATIVE_TOKEN))
        limits = _row_limits(turns)
        if limits is not None:
            out.append((_ids_outside_vocab(turns["token_ids"], limits[0]), "token_ids", ID_OUTSIDE_VOCAB))
            if {"raw_content", "actor"} <= set(turns.column_names):
                out.append((_too_few_ids(turns, limits[1]), "token_ids", TOO_FEW_IDS))
    if "behavior_logprobs" in turns.column_names:
        out.append((rows_where(turns["behavior_logprobs"], lambda v: ~(v <= LOGPROB_MAX)), "behavior_logprobs",
                    IMPOSSIBLE_LOGPROB))
    return out
