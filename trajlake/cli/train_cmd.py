"""``trajlake train --config FILE``: the offline-to-online trainer (docs/training.md).

Wire it into the CLI with ``register(app)`` (``trajlake/cli/__init__.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trajlake.cli.options import LakeOpt, lake_path

__all__ = ["register", "train_command"]


def train_command(
    ctx: typer.Context,
    config: Annotated[Path, typer.Option("--config", help="Training config (TOML, or YAML with PyYAML): the "
                                         "model, and the stages B1/R1/R2/R3 to run in order.")],
    out_dir: Annotated[Path | None, typer.Option("--out-dir", help="Checkpoints and the training log (default: the "
                                                 "config's out_dir).")] = None,
    lake: LakeOpt = None,
) -> None:
    """Train on the lake's episodes stage by stage; each stage saves a Hugging Face checkpoint, registers its
    policy version in `runs` and plays it back into the lake."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        from trajlake.errors import TrajlakeError

        raise TrajlakeError("trajlake train needs torch and transformers: pip install 'trajlake[train]'") from e
    from trajlake.train.config import load_config
    from trajlake.train.loop import train

    cfg = load_config(config)
    if out_dir is not None:
        import dataclasses

        cfg = dataclasses.replace(cfg, out_dir=str(out_dir.resolve()))
    result = train(cfg, lake_path(ctx, lake), log=typer.echo)
    for s in result.stages:
        typer.echo(f"{s.name}: policy version {s.policy_version}, checkpoint {s.checkpoint} ({s.checkpoint_hash[:19]}"
                   f"...), runs {', '.join(s.runs) or '-'}")
    typer.echo(f"training log: {result.log_path}")


def register(app: typer.Typer) -> None:
    """Add the ``train`` command to ``app`` (idempotent)."""
    if "train" not in {c.name for c in app.registered_commands}:
        app.command("train")(train_command)
