"""Starting a test server in a child process: a free loopback port, waiting until it answers, stopping it.
Used by the object-storage emulators (``s3_server.py``, ``azure_server.py``) and the Ray head of
``test_ray_attach.py``."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def port_answers(port: int) -> Callable[[], None]:
    """A probe for ``wait_until_up``: connect to ``port`` on loopback (OSError while nothing listens)."""
    def probe() -> None:
        socket.create_connection((HOST, port), timeout=1).close()

    return probe


def wait_until_up(proc: subprocess.Popen[bytes], probe: Callable[[], None], what: str, *, timeout_s: float = 60,
                  poll_s: float = 0.1) -> None:
    """Call ``probe`` until it stops raising OSError; RuntimeError naming ``what`` when ``proc`` exits first or
    ``timeout_s`` pass."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            probe()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(poll_s)
