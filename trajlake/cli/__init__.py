"""The ``trajlake`` command line (Typer): thin commands over library functions.

This module holds the app, its callback (``--lake`` before the command), the registration of every command and
``main``, where every error becomes one clear line and a non-zero exit. The commands live one file per group:
``lake_cmd`` (init, info, sql, verify, compact), ``data_cmd`` (ingest, schema, demo), ``rollout_cmd`` (rollout,
replay, quickstart, doctor), ``eval_cmd`` (eval, diagnose), ``export_cmd``, ``browse_cmd``, ``contamination_cmd``,
``reward_check_cmd``, ``best_of_cmd``, ``train_cmd``, ``experiment_cmd`` and ``proxy_cmd``. Every command finds its lake with ``options.lake_path``
(``--lake`` before or after the command), shares its options from ``trajlake.cli.options``, reads a ``--config``
file through ``trajlake.cli.config_file`` and prints through ``trajlake.cli.output``.
"""

from __future__ import annotations

import sys

import typer

from trajlake.cli.options import CliContext, LakeOpt, click_exceptions
from trajlake.errors import TrajlakeError, ValidationError, one_line

app = typer.Typer(
    name="trajlake",
    help="trajlake: a trajectory data lake and evaluation toolkit for agentic, multi-turn RL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _main(ctx: typer.Context, lake: LakeOpt = None) -> None:
    ctx.obj = CliContext(lake=lake)


def _register_commands() -> None:
    """Every command group, in the order ``trajlake --help`` lists them."""
    from trajlake.cli import (
        best_of_cmd,
        browse_cmd,
        contamination_cmd,
        data_cmd,
        eval_cmd,
        experiment_cmd,
        export_cmd,
        lake_cmd,
        proxy_cmd,
        reward_check_cmd,
        rollout_cmd,
        train_cmd,
    )

    for group in (lake_cmd, data_cmd, rollout_cmd, eval_cmd, export_cmd, browse_cmd, contamination_cmd,
                  reward_check_cmd, best_of_cmd, train_cmd, experiment_cmd, proxy_cmd):
        group.register(app)


_register_commands()


def main() -> None:
    """Console entry point: one clear error line and a non-zero exit instead of a traceback."""
    try:
        # Without standalone mode click returns typer.Exit codes instead of raising them.
        rc = app(standalone_mode=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except ValidationError as e:
        typer.echo(f"error: {e.issues[0] if e.issues else e}", err=True)
        for issue in e.issues[1:20]:
            typer.echo(f"error: {issue}", err=True)
        if len(e.issues) > 20:
            typer.echo(f"error: ... and {len(e.issues) - 20} more", err=True)
        sys.exit(1)
    except TrajlakeError as e:
        typer.echo(f"error: {one_line(e)}", err=True)
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except Exception as e:  # click usage errors and anything unexpected: still one line
        if isinstance(e, click_exceptions()):
            e.show()  # type: ignore[attr-defined]
            sys.exit(e.exit_code)  # type: ignore[attr-defined]
        typer.echo(f"error: {type(e).__name__}: {one_line(e)}", err=True)
        sys.exit(1)


__all__ = ["app", "main"]
