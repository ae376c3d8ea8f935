"""Explicit exception types. Every error trajlake raises on bad input is a TrajlakeError subclass."""

from __future__ import annotations

from dataclasses import dataclass


class TrajlakeError(Exception):
    """Base class of all trajlake errors; the CLI prints its message on one line and exits non-zero."""


class LakeNotFoundError(TrajlakeError):
    """The path holds no trajlake lake (run `trajlake init`)."""


class SchemaVersionError(TrajlakeError):
    """Data written with a schema major version this trajlake cannot read."""


class SchemaDefinitionError(TrajlakeError):
    """A table definition in schemas/ is malformed."""


@dataclass(frozen=True)
class Issue:
    """One validation problem, located as precisely as possible."""

    table: str
    episode_id: str | None
    turn_idx: int | None
    field: str
    message: str
    source: str | None = None  # file:line for ingested input

    def __str__(self) -> str:
        where = []
        if self.source:
            where.append(self.source)
        if self.episode_id is not None:
            where.append(f"episode {self.episode_id}")
        if self.turn_idx is not None:
            where.append(f"turn {self.turn_idx}")
        loc = ", ".join(where) if where else self.table
        return f"{loc}: {self.table}.{self.field}: {self.message}"


class ValidationError(TrajlakeError):
    """One or more rows failed validation; nothing of the affected episodes was written."""

    def __init__(self, issues: list[Issue]):
        self.issues = issues
        first = str(issues[0]) if issues else "invalid input"
        more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
        super().__init__(first + more)


class ConflictError(TrajlakeError):
    """An episode id already exists in the lake with different content."""


class IntegrityError(TrajlakeError):
    """The lake's stored data does not match its hashes or schema (see `trajlake verify`)."""


class QueryError(TrajlakeError):
    """A query against the lake failed."""


def one_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (Rust errors from delta-rs append a backtrace when
    ``RUST_BACKTRACE`` is set); the exception's type name when the message is empty."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
