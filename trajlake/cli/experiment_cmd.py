"""``trajlake experiment run`` and ``trajlake experiment report``: the §8 matrix as one command
(docs/experiment.md).

Wire it into the CLI with ``register(app)`` (``trajlake/cli/__init__.py``)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["experiment_app", "register", "report_command", "run_command"]

experiment_app = typer.Typer(name="experiment", no_args_is_help=True, add_completion=False,
                             help="Train and evaluate the arms B0-R3 for N seeds, test the preregistered "
                                  "hypotheses H1-H4 and write the bundle.")


def _log(line: str) -> None:
    typer.echo(line, err=True)  # progress on stderr: stdout keeps the result lines


def _need_train() -> None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        from trajlake.errors import TrajlakeError

        raise TrajlakeError("trajlake experiment needs torch and transformers: pip install 'trajlake[train]'") from e


@experiment_app.command("run")
def run_command(
    config: Annotated[Path, typer.Option("--config", help="The experiment config (TOML): arms, seeds, evaluation, "
                                         "hypotheses (configs/experiment-*.toml).")],
    out: Annotated[Path, typer.Option("--out", help="The experiment folder: its lake, checkpoints, state and "
                                      "bundle. Run the same command again to resume a stopped experiment.")],
) -> None:
    """Run (or resume) every arm for every training seed, then write the bundle into --out."""
    _need_train()
    from trajlake.experiment import run_experiment

    command = shlex.join(["trajlake", "experiment", *sys.argv[sys.argv.index("experiment") + 1:]]) \
        if "experiment" in sys.argv else None
    folder = run_experiment(config, out, log=_log, command=command)
    typer.echo(f"experiment bundle: {folder} (report.md, summary.json)")


@experiment_app.command("report")
def report_command(
    folder: Annotated[Path, typer.Argument(help="An experiment folder written by `trajlake experiment run`.")],
) -> None:
    """Write the bundle again from the folder's lake and state (what has finished so far)."""
    _need_train()
    from trajlake.experiment import report_experiment

    summary = report_experiment(folder, log=_log)
    for h, verdict in summary["verdicts"].items():
        typer.echo(f"{h}: {verdict}")
    typer.echo(f"experiment bundle: {folder.resolve()} (report.md, summary.json)")


def register(app: typer.Typer) -> None:
    """Add the ``experiment`` group to ``app`` (idempotent)."""
    if "experiment" not in {g.name or (g.typer_instance.info.name if g.typer_instance else None)
                            for g in app.registered_groups}:
        app.add_typer(experiment_app, name="experiment")
