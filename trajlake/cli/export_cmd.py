"""``trajlake export hf``: export lake tables as a Hugging Face Hub dataset folder (and optionally push it).

``--layout trajectories`` (the default) writes the lake's tables as they are; ``--layout sft`` a conversational
dataset for TRL's ``SFTTrainer`` and ``--layout rl`` verl's prompt Parquet layout (:mod:`trajlake.io.hf_layouts`).

Wire it into the CLI with ``register(app)`` (``trajlake/cli/__init__.py``). The command reads the lake named by
``--lake`` (before or after the command); bad input raises :class:`trajlake.errors.TrajlakeError`, which
``trajlake.cli.main`` prints as one line with exit status 1. The logic is in :mod:`trajlake.io.hf`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trajlake.cli.options import AsOfOpt, LakeOpt, MemoryOpt, lake_path
from trajlake.io.hf import DEFAULT_MAX_SHARD_BYTES, DEFAULT_SHARD_ROWS, LAYOUTS, ExportSummary, export_hf

__all__ = ["hf_command", "register", "summary_lines"]

_MB = 1024 * 1024


def summary_lines(s: ExportSummary) -> list[str]:
    """Human-readable lines describing an export (what the command prints)."""
    lines = []
    for t, te in s.tables.items():
        parts = ", ".join(f"{sp.split} {sp.rows} ({len(sp.files)} shard{'s' if len(sp.files) != 1 else ''})"
                          for sp in te.splits)
        hidden = f"; {te.excluded_hidden} hidden row(s) left out" if te.excluded_hidden else ""
        other = "".join(f"; {n} left out: {why}" for why, n in te.left_out if n)
        lines.append(f"{t}: {te.rows} row(s): {parts}{hidden}{other}")
    layout = "" if s.layout == "trajectories" else f" --layout {s.layout}"
    lines.append(f"wrote {s.out} ({s.card.name} + data/); reproduce with{layout} --as-of {s.as_of}")
    lines += [f"note: {n}" for n in s.notes]
    if s.include_hidden:
        lines.append("warning: the export includes the hidden split (--include-hidden)")
    if s.pushed_to:
        lines.append(f"pushed to {s.pushed_to}" + (f" ({s.commit_url})" if s.commit_url else ""))
    return lines


def hf_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Output folder (created; must be empty unless --overwrite).",
                                      show_default=False)],
    push: Annotated[str | None, typer.Option(
        "--push", metavar="REPO_ID", help="Also upload the folder to this Hub dataset repo (token in $HF_TOKEN).")
    ] = None,
    tables: Annotated[str | None, typer.Option(
        help="Comma-separated tables to export (default: episodes,turns,tasks,runs,gateway_events).")] = None,
    as_of: AsOfOpt = None,
    license_name: Annotated[str, typer.Option("--license", help="License id for the card (e.g. apache-2.0, "
                                                                "cc-by-4.0, other).")] = "other",
    include_hidden: Annotated[bool, typer.Option(
        "--include-hidden", help="Also export rows of the hidden split (held-out tasks: contamination risk).")
    ] = False,
    shard_rows: Annotated[int, typer.Option(help="Most rows per Parquet shard.")] = DEFAULT_SHARD_ROWS,
    shard_mb: Annotated[float, typer.Option(help="Approximate largest shard size in MiB (compressed).")
                        ] = DEFAULT_MAX_SHARD_BYTES / _MB,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="Export into a non-empty folder, replacing its README.md and data/ (other files are "
        "kept). Crash-safe: a killed export leaves the old export or the new one, never a mix.")] = False,
    private: Annotated[bool, typer.Option(
        "--private/--public", help="Visibility of the Hub repo when --push creates it.")] = True,
    memory_limit: MemoryOpt = None,
    layout: Annotated[str, typer.Option(
        help=f"What to write: {', '.join(LAYOUTS)} (trajectories: the lake's tables; sft: one conversation per "
             "episode for TRL's SFTTrainer; rl: one verl prompt per task, train/test files).")] = "trajectories",
    success_only: Annotated[bool | None, typer.Option(
        "--success-only/--all-episodes", help="--layout sft: only successful episodes (the default), or all.",
        show_default=False)] = None,
    runs: Annotated[str | None, typer.Option(
        help="--layout sft: only episodes of these runs (comma-separated run ids).")] = None,
    system_prompt: Annotated[bool | None, typer.Option(
        "--system-prompt/--no-system-prompt", help="--layout sft/rl: add a system message listing the "
        "environment's tools (the default; drop it when the chat template renders the tools column).",
        show_default=False)] = None,
    lake: LakeOpt = None,
) -> None:
    """Export lake tables as a Hugging Face dataset (Parquet shards, one config per table, and a card).

    Splits come from the lake (turns and gateway events take their episode's); rows of the hidden split are
    left out unless --include-hidden. The card records the table versions read (reuse them with --as-of).
    --layout sft / rl write training datasets instead (docs/export.md)."""
    s = export_hf(lake_path(ctx, lake), out, tables=tables, as_of=as_of, license=license_name,
                  include_hidden=include_hidden, shard_rows=shard_rows, max_shard_bytes=max(1, int(shard_mb * _MB)),
                  push=push, overwrite=overwrite, private=private, memory_limit=memory_limit, layout=layout,
                  success_only=success_only, runs=runs, system_prompt=system_prompt)
    for line in summary_lines(s):
        typer.echo(line)


def register(app: typer.Typer) -> None:
    """Add the ``export`` command group (with ``hf``) to ``app``."""
    export_app = typer.Typer(name="export", help="Export lake tables to other formats and hubs.",
                             no_args_is_help=True, add_completion=False)
    export_app.command("hf")(hf_command)
    app.add_typer(export_app, name="export")
