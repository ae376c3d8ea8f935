"""``trajlake best-of``: baseline B2, the best attempt of each group of a group rollout at a matched budget.

Wire it into the CLI with ``register(app)`` (``trajlake/cli/__init__.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from trajlake.cli.options import LakeOpt, lake_path
from trajlake.errors import TrajlakeError

__all__ = ["best_of_command", "register"]


def best_of_command(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Option("--run", help="The group rollout (played with --attempts N).")] = None,
    out_run: Annotated[str | None, typer.Option(help="The new run holding the chosen attempts.")] = None,
    budget_tokens: Annotated[float | None, typer.Option(
        help="Tokens (in + out) per task and seed that the considered attempts may spend.")] = None,
    budget_cost: Annotated[float | None, typer.Option(
        help="USD per task and seed that the considered attempts may spend.")] = None,
    match: Annotated[str | None, typer.Option(
        help="Match the budget to this run's mean tokens per episode on the same tasks.")] = None,
    config: Annotated[Path | None, typer.Option(
        help="TOML file: its [select] table gives run, out_run, budget_tokens, budget_cost or match.")] = None,
    lake: LakeOpt = None,
) -> None:
    """Choose one attempt per group by visible tests, then the model's own log-probs (never hidden tests), within
    the budget, and write the choices as a new run for `trajlake eval`."""
    from trajlake.policies.best_of import select_best

    sel: dict[str, Any] = {}
    if config is not None:
        import tomllib

        try:
            sel = tomllib.loads(config.read_text(encoding="utf-8")).get("select", {})
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise TrajlakeError(f"--config {config}: {e}") from e
    run = run or sel.get("run")
    out_run = out_run or sel.get("out_run")
    if budget_tokens is None and match is None and budget_cost is None:
        budget_tokens, match, budget_cost = sel.get("budget_tokens"), sel.get("match"), sel.get("budget_cost")
    if not run or not out_run:
        raise TrajlakeError("best-of needs --run (the group rollout) and --out-run")
    report = select_best(str(lake_path(ctx, lake)), run, out_run, budget_tokens=budget_tokens, match_run=match,
                         budget_cost=budget_cost)
    typer.echo(report.summary())


def register(app: typer.Typer) -> None:
    """Add the ``best-of`` command to ``app`` (idempotent)."""
    if "best-of" not in {c.name for c in app.registered_commands}:
        app.command("best-of")(best_of_command)
