"""Handing a writer's freed memory back to the OS (glibc's ``malloc_trim`` and ``mallopt``, pyarrow's pool).

Both allocators keep what a commit frees for reuse: glibc the numpy arrays and buffered batches, pyarrow's pool
(mimalloc) its buffers. A fleet of writers per machine pays that many times, so the writer trims after each
commit and every so many bytes written (``return_free_memory``), and with a small buffer has glibc serve large
blocks from their own pages (``release_large_allocations_eagerly``). Where the C library is not glibc, the trim
releases only pyarrow's pool and the eager setting does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

import pyarrow as pa


@functools.cache
def _glibc_function(name: str) -> Any:
    """The C library's ``name`` (``malloc_trim``, ``mallopt``), or None where the C library is not glibc."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):  # not glibc
        return None


def return_free_memory() -> None:
    """Hand the memory a commit freed back to the OS. Both allocators keep freed memory for reuse (glibc for
    numpy and the buffered batches, mimalloc for pyarrow): measured, ~100 MB more peak RSS per writer, which a
    fleet of writers per machine pays many times. Costs a few ms per commit."""
    pa.default_memory_pool().release_unused()
    trim = _glibc_function("malloc_trim")
    if trim is not None:
        trim(0)


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
EAGER_MMAP_THRESHOLD = 1 << 20


@functools.cache
def release_large_allocations_eagerly() -> bool:
    """Fix glibc's mmap threshold at ``EAGER_MMAP_THRESHOLD`` (once per process; whether it was set). By default
    glibc raises the threshold to the size of each large block freed, up to 32 MiB, after which blocks of a
    buffer's size come from the heap and stay there when freed (``malloc_trim`` returns only whole free pages
    that no live allocation pins)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False  # the user's own setting
    mallopt = _glibc_function("mallopt")
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, EAGER_MMAP_THRESHOLD))


__all__ = ["EAGER_MMAP_THRESHOLD", "release_large_allocations_eagerly", "return_free_memory"]
