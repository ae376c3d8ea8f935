"""Names in a Delta table's log: the one place that spells a log entry's or a checkpoint's file name.

A table's versions are the entries ``<table>/_delta_log/<version, 20 digits>.json``; a checkpoint is
``<version>.checkpoint[.<part>.<parts>].parquet`` beside them. The commit path stats the next entry, ``verify``
checks the chain of entries and the commit records (``store.COMMIT_RECORDS``, named after the entries).
``LogEntryActions`` is what one entry does, read from its JSON lines (``parse_log_entry``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import unquote

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


INTENT_KEY = "trajlake.intent"
"""The key trajlake adds to every commit's ``commitInfo``: the name of the commit intent it wrote just before
(``store.COMMIT_INTENTS``), so an entry whose writer died before recording it can be told from a forged one."""


@dataclass(frozen=True)
class LogEntryActions:
    """What one Delta log entry does: its operation, the files it adds and removes (None: unreadable), and the
    commit intent it names (``INTENT_KEY``), if any."""

    operation: str | None
    adds: int
    removes: int
    error: str | None = None
    intent: str | None = None
    add_paths: frozenset[str] = frozenset()
    """Data-file paths the entry adds, percent-decoded (the log stores partition values encoded)."""
    remove_paths: frozenset[str] = frozenset()

    def describe(self) -> str:
        if self.error is not None:
            return f"cannot be read ({self.error})"
        hides = f", hiding the rows of {self.removes} committed file(s)" if self.removes else ""
        op = f"is a {self.operation} that " if self.operation else ""
        return f"{op}adds {self.adds} and removes {self.removes} file(s){hides}"


def parse_log_entry(data: bytes) -> LogEntryActions:
    """Read a log entry's JSON lines into ``LogEntryActions`` (an unreadable one has ``error`` set)."""
    try:
        actions = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return LogEntryActions(None, 0, 0, str(e))

    def paths(kind: str) -> list[str]:
        return [unquote(str(a[kind].get("path"))) for a in actions
                if isinstance(a, dict) and isinstance(a.get(kind), dict)]

    adds, removes = paths("add"), paths("remove")
    infos = [a["commitInfo"] for a in actions if isinstance(a, dict) and isinstance(a.get("commitInfo"), dict)]
    ops = [i.get("operation") for i in infos if i.get("operation")]
    intents = [i.get(INTENT_KEY) for i in infos if isinstance(i.get(INTENT_KEY), str)]
    return LogEntryActions(str(ops[0]) if ops else None, len(adds), len(removes), None,
                           intents[0] if intents else None, frozenset(adds), frozenset(removes))


__all__ = ["DELTA_LOG", "INTENT_KEY", "LogEntryActions", "checkpoint_version", "log_entry_name", "log_entry_version",
           "parse_log_entry", "version_name"]
