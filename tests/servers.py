"""Starting a test server in a child process: a free loopback port, waiting until it answers, stopping it.
Used by the object-storage emulators (``s3_server.py``, ``azure_server.py``) and the Ray head of
``test_ray_attach.py``. ``LoopbackHTTPServer``: the in-process OpenAI-like servers' (``openai_server.py``,
``proxy_upstream.py``) shared start, address and stop."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

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


class LoopbackHTTPServer:
    """An HTTP server on a free loopback port, served from a daemon thread while the ``with`` block runs; its
    OpenAI-style ``base_url`` ends in ``/v1``. Subclasses build their handler and call :meth:`serve`."""

    httpd: ThreadingHTTPServer
    thread: threading.Thread

    def serve(self, handler: type[BaseHTTPRequestHandler], *, daemon_threads: bool = False) -> None:
        self.httpd = ThreadingHTTPServer((HOST, 0), handler)
        self.httpd.daemon_threads = daemon_threads
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
