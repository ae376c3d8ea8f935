"""The test-server helpers (tests/servers.py): waiting for a child's port, and giving up when it dies."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.servers import HOST, free_port, port_answers, wait_until_up


def test_wait_until_up_returns_once_the_port_answers_and_names_a_child_that_died() -> None:
    port = free_port()
    probe = port_answers(port)
    with pytest.raises(OSError):
        probe()  # nothing listens yet
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with socket.socket() as listener:
            listener.bind((HOST, port))
            listener.listen()
            wait_until_up(child, probe, "the listener", timeout_s=10)
    finally:
        child.kill()
        child.wait(timeout=10)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    with pytest.raises(RuntimeError, match="the dead server did not start"):
        wait_until_up(dead, port_answers(free_port()), "the dead server", timeout_s=30)
