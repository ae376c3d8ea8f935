"""``trajlake best-of``: baseline B2, the best attempt of each group of a group rollout at a matched budget.

Wire it into the CLI with ``register(app)`` (``trajlake/cli/__init__.py``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from trajlake.cli.config_file import given, options_from
from trajlake.cli.options import LakeOpt
from trajlake.errors import TrajlakeError

__all__ = ["BestOfOptions", "best_of_command", "register"]

_BUDGETS = ("budget_tokens", "budget_cost", "match")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BestOfOptions:
    """``trajlake best-of``'s options after merging the ``[select]`` table of ``--config FILE``."""

    run: str | None
    out_run: str | None
    budget_tokens: float | None
    budget_cost: float | None
    match: str | None
    lake: str
    """The lake, resolved (``options.lake_path``; the file's ``lake`` comes after ``$TRAJLAKE_LAKE``)."""


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
        help="TOML file: its select table gives run, out_run, budget_tokens, budget_cost, match or lake; options "
             "given on the command line win.")] = None,
    lake: LakeOpt = None,
) -> None:
    """Choose one attempt per group by visible tests, then the model's own log-probs (never hidden tests), within
    the budget, and write the choices as a new run for `trajlake eval`."""
    from trajlake.policies.best_of import select_best

    # The options arrive through ctx.params merged with --config FILE, not through the parameters above.
    options, _ = options_from(ctx, BestOfOptions, config, table="select", top_level=False)
    if any(given(ctx, name) for name in _BUDGETS):  # one budget: the command line's replaces the file's
        options = dataclasses.replace(options, **{name: ctx.params[name] for name in _BUDGETS})
    if not options.run or not options.out_run:
        raise TrajlakeError("best-of needs --run (the group rollout) and --out-run")
    report = select_best(options.lake, options.run, options.out_run, budget_tokens=options.budget_tokens,
                         match_run=options.match, budget_cost=options.budget_cost)
    typer.echo(report.summary())


def register(app: typer.Typer) -> None:
    """Add the ``best-of`` command to ``app`` (idempotent)."""
    if "best-of" not in {c.name for c in app.registered_commands}:
        app.command("best-of")(best_of_command)
