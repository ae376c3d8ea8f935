"""``trajlake init``, ``info``, ``sql``, ``verify`` and ``compact``: create, inspect, query and maintain a lake.

Wire them into the CLI with ``register(app)`` (``trajlake/cli/__init__.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from trajlake.cli.options import AsOfOpt, FormatOpt, LakeOpt, MemoryOpt, add_commands, lake_path, open_lake_of
from trajlake.cli.output import Format, emit
from trajlake.errors import TrajlakeError

if TYPE_CHECKING:
    from trajlake.lake.store import Lake

__all__ = ["compact", "emit_info", "info", "init", "register", "sql", "verify"]


def init(ctx: typer.Context, lake: LakeOpt = None) -> None:
    """Create an empty lake (idempotent)."""
    from trajlake.lake.store import Lake

    lk = Lake.init(lake_path(ctx, lake))
    typer.echo(f"initialised lake at {lk.location}")


def emit_info(lk: Lake, fmt: Format) -> None:
    """The ``trajlake info`` table of ``lk`` (and, as a table, the ``--as-of`` pinning its versions)."""
    from trajlake.query.info import COLUMNS, pins, table_info

    infos = table_info(lk)
    emit(COLUMNS, [i.as_row() for i in infos], fmt, title=f"lake {lk.location}")
    if fmt == Format.table:
        typer.echo(f"pin these versions with: --as-of {pins(infos)}")


def info(ctx: typer.Context, fmt: FormatOpt = Format.table, lake: LakeOpt = None) -> None:
    """Tables with committed row counts, Delta versions, files, size and schema version."""
    emit_info(open_lake_of(ctx, lake), fmt)


def sql(ctx: typer.Context,
        query: Annotated[str, typer.Argument(help="SQL over the views episodes, turns, tasks, runs, "
                                               "gateway_events (DuckDB dialect).")],
        as_of: AsOfOpt = None, fmt: FormatOpt = Format.table, memory_limit: MemoryOpt = None,
        timeout: Annotated[float | None, typer.Option(
            help="Stop the statement after this many seconds (default 300; 0: no limit).")] = None,
        lake: LakeOpt = None) -> None:
    """Run one read-only SQL statement (SELECT, EXPLAIN) against the lake."""
    from trajlake.query import run_query

    limits = {} if timeout is None else {"timeout_s": timeout}
    cols, rows = run_query(open_lake_of(ctx, lake), query, as_of, memory_limit=memory_limit, **limits)
    emit(cols, rows, fmt)


def verify(ctx: typer.Context, as_of: AsOfOpt = None,
           strict: Annotated[bool, typer.Option(help="Treat uncommitted (orphan) turns as a failure.")] = False,
           fmt: FormatOpt = Format.table, lake: LakeOpt = None) -> None:
    """Recompute every hash and check schema versions, keys, episode completeness and orphans.

    Exits 1 and names the file or episode on any problem."""
    from trajlake.lake.maintenance import verify as run_verify

    rep = run_verify(open_lake_of(ctx, lake), as_of, strict=strict)
    rows = [["problem", p] for p in rep.problems] + [["note", n] for n in rep.notes]
    if fmt == Format.table:
        for kind, msg in rows:
            typer.echo(f"{kind}: {msg}", err=kind == "problem")
        counts = ", ".join(f"{k}={v}" for k, v in sorted(rep.counts.items()))
        typer.echo(("OK" if rep.ok else f"FAILED ({len(rep.problems)} problem(s))") + f": checked {counts}")
    else:
        emit(["kind", "message"], rows, fmt)
    if not rep.ok:
        raise typer.Exit(1)


def compact(
    ctx: typer.Context,
    retention_hours: Annotated[float, typer.Option(help="Vacuum keeps removed files this long, so pinned "
                                                       "versions stay readable.")] = 168.0,
    orphan_grace_hours: Annotated[float, typer.Option(help="Uncommitted turns younger than this are left alone "
                                                          "(their writer may still be committing).")] = 1.0,
    vacuum: Annotated[bool, typer.Option(help="Delete files removed longer ago than the retention.")] = True,
    fmt: FormatOpt = Format.table,
    lake: LakeOpt = None,
) -> None:
    """Merge small files, drop old orphans and identical duplicates, checkpoint, vacuum. Safe with writers."""
    from trajlake.lake.maintenance import compact as run_compact

    for name, value in (("--retention-hours", retention_hours), ("--orphan-grace-hours", orphan_grace_hours)):
        if not value >= 0:
            raise TrajlakeError(f"{name} must be a non-negative number of hours, not {value}")
    rep = run_compact(open_lake_of(ctx, lake), retention_hours=retention_hours,
                      orphan_grace_hours=orphan_grace_hours, vacuum=vacuum)
    rows = [[t, rep.files_before.get(t, 0), rep.files_after.get(t, 0), rep.versions.get(t)]
            for t in rep.files_after]
    emit(["table", "files_before", "files_after", "version"], rows, fmt)
    if fmt == Format.table:
        typer.echo(f"orphan rows removed: {rep.orphan_rows_removed}; duplicate rows removed: "
                   f"{rep.duplicate_rows_removed}; files vacuumed: {rep.vacuumed_files}")


def register(app: typer.Typer) -> None:
    """Add ``init``, ``info``, ``sql``, ``verify`` and ``compact`` to ``app`` (idempotent)."""
    add_commands(app, init, info, sql, verify, compact)
