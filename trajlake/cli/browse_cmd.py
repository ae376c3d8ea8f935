"""``trajlake browse``: write a self-contained HTML page for browsing the failing episodes of the lake.

Wire it into the CLI with ``register(app)`` (``trajlake/cli/__init__.py``). It reads the lake named by ``--lake``
(before or after the command); bad input raises :class:`trajlake.errors.TrajlakeError` subclasses, which
``trajlake.cli.main`` prints as one line with exit status 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trajlake.cli.options import AsOfOpt, LakeOpt, lake_path

__all__ = ["browse_command", "register"]


def browse_command(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")],
    run: Annotated[list[str] | None, typer.Option(
        "--run", help="Only this run (repeatable). Default: every run.")] = None,
    as_of: AsOfOpt = None,
    max_episodes: Annotated[int, typer.Option(
        help="Failing episodes listed (most recent first); turn details are read only for these.", min=1)] = 500,
    max_chars: Annotated[int, typer.Option(
        help="Characters of text and tool arguments kept per turn.", min=1)] = 4000,
    lake: LakeOpt = None,
) -> None:
    """Write a self-contained HTML page listing failing episodes by failure-taxonomy class and error class,
    with filters and a turn-by-turn view (open FILE.html#episode=<id> to show one episode)."""
    from trajlake.evaluators.browse import build_browser

    s = build_browser(lake_path(ctx, lake), out, runs=run, as_of=as_of, max_episodes=max_episodes,
                      max_chars=max_chars)
    typer.echo(f"wrote {s.out}: showing {s.n_shown} of {s.n_failing} failing episodes, {s.n_turns} turns, "
               f"{s.html_bytes / 1e6:.2f} MB in {s.seconds:.1f} s (as of {s.as_of})", err=True)


def register(app: typer.Typer) -> None:
    """Add the ``browse`` command to ``app`` (idempotent)."""
    if "browse" not in {c.name for c in app.registered_commands}:
        app.command("browse")(browse_command)
