"""Names in a Delta table's log: the one place that spells a log entry's or a checkpoint's file name.

A table's versions are the entries ``<table>/_delta_log/<version, 20 digits>.json``; a checkpoint is
``<version>.checkpoint[.<part>.<parts>].parquet`` beside them. The commit path stats the next entry, ``verify``
checks the chain of entries and the commit records (``store.COMMIT_RECORDS``, named after the entries).
"""

from __future__ import annotations

import re

DELTA_LOG = "_delta_log"
"""The log's folder under a table's root."""

_LOG_ENTRY = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet$")


def version_name(version: int) -> str:
    """A version as the log names it: 20 digits, zero-padded (a commit record's name, a log entry's stem)."""
    return f"{version:020d}"


def log_entry_name(version: int) -> str:
    """The file name of ``version``'s commit in ``_delta_log`` (``00000000000000000007.json``)."""
    return f"{version_name(version)}.json"


def log_entry_version(file_name: str) -> int | None:
    """The version a ``_delta_log`` file name is the commit of; None for anything else (checkpoints, temp files)."""
    m = _LOG_ENTRY.match(file_name)
    return int(m.group(1)) if m else None


def checkpoint_version(file_name: str) -> int | None:
    """The version a ``_delta_log`` file name is a checkpoint (or a checkpoint's part) of; None for anything else."""
    m = _CHECKPOINT.match(file_name)
    return int(m.group(1)) if m else None


__all__ = ["DELTA_LOG", "checkpoint_version", "log_entry_name", "log_entry_version", "version_name"]
