"""Token-level values no policy can produce: a negative token id, or a behaviour log-probability that is NaN,
infinite or above 0. The recorder refuses them (``trajlake.record.validate``) and ``verify`` reports them in
committed files (written before the check, or by hand)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

LOGPROB_MAX = 1e-4
"""The largest behaviour log-probability accepted: 0 (probability 1), plus float rounding of a log-softmax."""
NEGATIVE_TOKEN = "a token id is negative"
IMPOSSIBLE_LOGPROB = (f"a log-probability is NaN, infinite or above 0 (more than {LOGPROB_MAX:g}): no distribution "
                      f"gives it")


def _one(a: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(a, pa.ChunkedArray):
        return a.chunk(0) if a.num_chunks == 1 else a.combine_chunks()
    return a


def rows_where(values: pa.ChunkedArray | pa.Array, bad: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Per row of a list array, whether any element satisfies ``bad`` (vectorised over the flat values; a null
    list or element is never bad here: nulls are the schema's business)."""
    values = _one(values)
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


def impossible_token_values(turns: pa.Table) -> list[tuple[np.ndarray, str, str]]:
    """(rows, field, message) for each kind of impossible value in ``turns`` (rows: a boolean mask)."""
    out = []
    if "token_ids" in turns.column_names:
        out.append((rows_where(turns["token_ids"], lambda v: v < 0), "token_ids", NEGATIVE_TOKEN))
    if "behavior_logprobs" in turns.column_names:
        out.append((rows_where(turns["behavior_logprobs"], lambda v: ~(v <= LOGPROB_MAX)), "behavior_logprobs",
                    IMPOSSIBLE_LOGPROB))
    return out
