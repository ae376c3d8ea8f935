"""``trajlake proxy``: an OpenAI-compatible endpoint that records an unmodified agent into the lake
(``trajlake.proxy``; docs/proxy.md).

Wire it into the CLI with ``register(app)`` (``trajlake/cli/__init__.py``)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from trajlake.cli.options import LakeOpt, lake_path
from trajlake.errors import TrajlakeError

__all__ = ["proxy_command", "register"]


def proxy_command(
    ctx: typer.Context,
    upstream: Annotated[str, typer.Option(
        help="The model server's base URL, as an OpenAI client's base_url (e.g. http://127.0.0.1:8000/v1).")],
    run_id: Annotated[str, typer.Option(help="The run the recorded episodes belong to.")],
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8300,
    policy_version: Annotated[str | None, typer.Option(
        help="Policy version recorded on every policy turn (default: proxy:UPSTREAM).")] = None,
    idle_timeout: Annotated[float, typer.Option(
        help="Seconds without a call after which an episode ends truncated (reason timeout).")] = 900.0,
    env_id: Annotated[str, typer.Option(
        help="Environment id of episodes whose outcome names none.")] = "proxy",
    api_key_env: Annotated[str | None, typer.Option(
        help="Environment variable holding the key to send upstream instead of the agent's own.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the upstream's reply.")] = 600.0,
    lake: LakeOpt = None,
) -> None:
    """Serve an OpenAI-compatible API that forwards every call to --upstream and records it into the lake, token
    in, token out: one episode per agent session (X-Trajlake-Session header or the `user` field), ended by POST
    /trajlake/outcome or the idle timeout."""
    from trajlake.proxy import serve

    if not 0 <= port <= 65535:
        raise TrajlakeError(f"--port {port}: not a TCP port")
    if idle_timeout <= 0 or timeout <= 0:
        raise TrajlakeError("--idle-timeout and --timeout must be positive")
    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise TrajlakeError(f"--api-key-env {api_key_env}: the variable is not set")
    serve(lake_path(ctx, lake), upstream=upstream, run_id=run_id, policy_version=policy_version, host=host,
          port=port, idle_timeout_s=idle_timeout, env_id=env_id, api_key=api_key, timeout_s=timeout)


def register(app: typer.Typer) -> None:
    """Add the ``proxy`` command to ``app`` (idempotent)."""
    if "proxy" not in {c.name for c in app.registered_commands}:
        app.command("proxy")(proxy_command)
