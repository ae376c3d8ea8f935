"""Options every command shares, defined once, the lake each command reads from Typer's context, and how a
command module adds its commands to the app.

``--lake`` is accepted before the command (``trajlake --lake L eval``) and after it (``trajlake eval --lake
L``); both mean the same. The value after the command wins when both are given.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trajlake.cli.output import Format
from trajlake.lake.storage import is_uri

if TYPE_CHECKING:
    from trajlake.lake.store import Lake

LAKE_HELP = ("Lake directory or object-store URI s3://bucket/prefix or az://container/prefix (default: "
             "$TRAJLAKE_LAKE or ./lake).")


@dataclass
class CliContext:
    """What the top-level callback puts in ``ctx.obj`` for the commands."""

    lake: str | Path | None = None
    """``--lake`` given before the command, if any."""


# A string, not a Path: a Path would fold the ``//`` of ``s3://bucket/prefix``.
LakeOpt = Annotated[str | None, typer.Option("--lake", help=LAKE_HELP, show_default=False)]
AsOfOpt = Annotated[str | None, typer.Option(
    "--as-of", help="Pin table versions: 'episodes=3,turns=5,...' (as printed by `trajlake info` and every "
    "report) or an ISO-8601 timestamp.")]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output format: table, json or csv.")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Write to this file instead of standard output.")]
MemoryOpt = Annotated[str | None, typer.Option(help="DuckDB memory limit, e.g. 4GB (default: half of the "
                                                      "machine's memory).")]
AllowUnisolatedOpt = Annotated[bool, typer.Option(
    "--allow-unisolated", help="Run agent code without bubblewrap isolation (rlimit fallback: it can read the "
                               "hidden tests and reach the network) when bubblewrap is missing. See docs/security.md.")]


def lake_path(ctx: typer.Context | None, lake: str | Path | None = None, *,
              fallback: str | Path | None = None) -> Path | str:
    """The lake a command works on: its own ``--lake``, else the one before the command, else
    ``$TRAJLAKE_LAKE``, else ``fallback`` (a ``--config`` file's ``lake``), else ``./lake``. A local lake is a
    Path; a lake on object storage its URI string."""
    if lake is None:
        obj = ctx.find_object(CliContext) if ctx is not None else None
        lake = (obj.lake if obj is not None and obj.lake is not None else
                (os.environ.get("TRAJLAKE_LAKE") or fallback or "lake"))
    if is_uri(str(lake)):
        return str(lake)
    return Path(lake)


def open_lake_of(ctx: typer.Context, lake: str | None) -> Lake:
    """The existing lake a command reads (``lake_path``), opened."""
    from trajlake.lake.store import Lake

    return Lake.open(lake_path(ctx, lake))


def add_commands(app: typer.Typer, *commands: Callable[..., Any]) -> None:
    """Add each function as the command of its name to ``app``, in order, skipping names it already has."""
    names = {c.name for c in app.registered_commands}
    for command in commands:
        if command.__name__ not in names:
            app.command(command.__name__)(command)


def click_exceptions() -> tuple[type[Exception], ...]:
    """Usage errors come from click, or from the copy of click that newer Typer versions carry."""
    out: list[type[Exception]] = []
    for module in ("click.exceptions", "typer._click.exceptions"):
        with contextlib.suppress(ImportError, AttributeError):
            out.append(importlib.import_module(module).ClickException)
    return tuple(out)


__all__ = ["LAKE_HELP", "AllowUnisolatedOpt", "AsOfOpt", "CliContext", "FormatOpt", "LakeOpt", "MemoryOpt", "OutOpt",
           "add_commands", "click_exceptions", "lake_path", "open_lake_of"]
