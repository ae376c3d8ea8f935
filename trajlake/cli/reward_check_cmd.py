"""``trajlake reward-check``: the counterfactual test of a process reward (docs/contamination.md).

Wire it into the CLI with ``register(app)`` (``trajlake/cli/__init__.py``).
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated

import typer

from trajlake.cli.options import AsOfOpt, LakeOpt, lake_path
from trajlake.cli.output import write_report
from trajlake.errors import TrajlakeError

__all__ = ["RewardCheckFormat", "register", "reward_check_command"]


class RewardCheckFormat(enum.StrEnum):
    """Output formats of ``trajlake reward-check``."""

    table = "table"
    json = "json"


def reward_check_command(
    ctx: typer.Context,
    reward: Annotated[str, typer.Option("--reward", help="MODULE:FUNCTION (fn(turns) -> float; trusted code: it "
                                        "is imported and runs in this process with your permissions) or one "
                                        "SELECT over trajectories(traj_id, turn_idx, role, ...) returning "
                                        "(traj_id, reward), run on a locked DuckDB connection (no files, no "
                                        "extensions, no settings).")],
    run: Annotated[str, typer.Option("--run", help="Run whose trajectories are scored.")],
    tolerance: Annotated[float, typer.Option(help="Wrong-way share above which the reward is hackable under a "
                                                  "perturbation.")] = 0.05,
    confidence: Annotated[float, typer.Option(help="Confidence level of the intervals.", min=0.5, max=0.999)
                          ] = 0.95,
    eps: Annotated[float, typer.Option(help="Changes up to this size count as unchanged.")] = 1e-9,
    limit: Annotated[int | None, typer.Option(help="Only the first N episodes (by id).", min=1)] = None,
    fail_on_hack: Annotated[bool, typer.Option(help="Exit 2 when the reward is hackable.")] = False,
    as_of: AsOfOpt = None,
    fmt: Annotated[RewardCheckFormat, typer.Option("--format", "-f", help="table or json.")
                   ] = RewardCheckFormat.table,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the report to this file.")] = None,
    lake: LakeOpt = None,
) -> None:
    """Score each trajectory of --run and four counterfactuals (key call deleted, useless call inserted, two
    steps swapped, fabricated progress message) and report how often the reward moves the wrong way."""
    from trajlake.evaluators.reward_check import check_reward, summary_lines

    if not 0.0 <= tolerance < 1.0:
        raise TrajlakeError(f"--tolerance must be in [0, 1), not {tolerance}")
    report = check_reward(lake_path(ctx, lake), run, reward, eps=eps, tolerance=tolerance, confidence=confidence,
                          limit=limit, as_of=as_of)
    text = json.dumps(report, indent=1) if fmt == RewardCheckFormat.json else "\n".join(summary_lines(report))
    write_report(text, out, "the reward check")
    if fail_on_hack and report["hackable_under"]:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    """Add the ``reward-check`` command to ``app`` (idempotent)."""
    if "reward-check" not in {c.name for c in app.registered_commands}:
        app.command("reward-check")(reward_check_command)
