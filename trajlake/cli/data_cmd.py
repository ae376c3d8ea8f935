"""``trajlake ingest``, ``schema`` and ``demo``: episodes into the lake (imported or synthetic) and the schema they
must fit.

Wire them into the CLI with ``register(app)`` (``trajlake/cli/__init__.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trajlake.cli.lake_cmd import emit_info
from trajlake.cli.options import FormatOpt, LakeOpt, add_commands, lake_path, open_lake_of
from trajlake.cli.output import Format, emit
from trajlake.errors import TrajlakeError

__all__ = ["demo", "ingest", "register", "schema"]


def ingest(
    ctx: typer.Context,
    files: Annotated[list[Path], typer.Argument(help="Input files.", exists=False)],
    input_format: Annotated[str, typer.Option("--format", help="Input format: trajlake-jsonl, openai-chat, "
                                                              "swe-agent, inspect or openhands.")] = "trajlake-jsonl",
    run_id: Annotated[str | None, typer.Option(help="Run id of imported episodes (default: derived from the "
                                                    "file).")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="A local tokenizer.json, or a folder holding one (a model "
                                                        "folder): fill token ids and loss masks of imported "
                                                        "text.")] = None,
    skip_invalid: Annotated[bool, typer.Option(help="Write the valid episodes of a file that has invalid "
                                                    "ones (still exits 1).")] = False,
    lake: LakeOpt = None,
) -> None:
    """Import episodes. The whole file is validated first; by default any invalid episode means nothing of
    that file is written. Re-importing the same file is a no-op."""
    from trajlake.io.ingest import check_options, ingest_file
    from trajlake.record.writer import LakeWriter

    check_options(input_format, run_id=run_id, tokenizer=tokenizer)
    failed = False
    with LakeWriter(open_lake_of(ctx, lake)) as w:
        for f in files:
            s = ingest_file(w, f, input_format, run_id=run_id, tokenizer=tokenizer, skip_invalid=skip_invalid)
            typer.echo(f"{f}: {s.episodes_written} episode(s) written, {s.duplicates} already present, "
                       f"{len({i.episode_id for i in s.rejected})} rejected; {s.tasks_written} task(s), "
                       f"{s.runs_written} run(s)")
            for issue in s.rejected[:20]:
                typer.echo(f"  rejected: {issue}", err=True)
            failed = failed or bool(s.rejected)
    if failed:
        raise typer.Exit(1)


def schema(
    table: Annotated[str | None, typer.Option(help="Only this table.")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, json, csv or markdown.")] = "table",
) -> None:
    """Print the tables and columns of schema v1 (from schemas/*.json)."""
    from trajlake.schema import TABLES, schema_markdown, table_def

    if fmt == "markdown":
        typer.echo(schema_markdown(), nl=False)
        return
    try:
        f = Format(fmt)
    except ValueError as e:
        raise TrajlakeError(f"--format must be table, json, csv or markdown, not {fmt!r}") from e
    if table is not None and table not in TABLES:
        raise TrajlakeError(f"--table: unknown table {table!r}; tables are {', '.join(TABLES)}")
    names = [table] if table else list(TABLES)
    rows = []
    for n in names:
        td = table_def(n)
        for c in td.columns:
            rows.append([n, c.name, c.type_str(), c.nullable, list(c.enum) if c.enum else None, c.description])
    emit(["table", "column", "type", "nullable", "enum", "description"], rows, f)


def demo(
    ctx: typer.Context,
    seeds: Annotated[int, typer.Option(help="Seeds per task.", min=1)] = 3,
    tasks: Annotated[int, typer.Option(help="Number of synthetic tasks.", min=1)] = 40,
    fmt: FormatOpt = Format.table,
    lake: LakeOpt = None,
) -> None:
    """Write realistic synthetic episodes (3 runs x tasks x seeds) into the lake and print `trajlake info`."""
    from trajlake.demo import write_demo
    from trajlake.lake.store import Lake
    from trajlake.record.writer import LakeWriter

    lk = Lake.init(lake_path(ctx, lake))
    with LakeWriter(lk) as w:
        n = write_demo(w, seeds=seeds, n_tasks=tasks)
    if fmt == Format.table:
        typer.echo(f"demo: {n} new episode(s) written to {lk.location}")
    emit_info(lk, fmt)


def register(app: typer.Typer) -> None:
    """Add ``ingest``, ``schema`` and ``demo`` to ``app`` (idempotent)."""
    add_commands(app, ingest, schema, demo)
