"""``trajlake rollout --engine ray`` attaches to an existing Ray cluster: ``$RAY_ADDRESS`` or ``--ray-address``
naming a head started with ``ray start --head`` (by the test, in its own temp dir, stopped by its process id).
The CLI runs in a fresh process, as a user's would; its actors must run on that cluster's node."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import free_port, port_answers, wait_until_up
from trajlake import connect, open_lake, verify

REPO = Path(__file__).resolve().parents[1]
TASKS = ("mini-swe/durations/drop_guard/0", "mini-swe/rangeset/drop_guard/0")
NO_AUTH = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


@dataclass(frozen=True)
class RayHead:
    address: str
    port: int
    node_id: str


def _ray_line(stdout: str) -> tuple[int, int, str] | None:
    """(GCS port, workers, node ids) of the rollout's "ray cluster HOST:PORT: ..." line. The host is the
    node's IP as Ray resolved 127.0.0.1, so the port identifies the cluster."""
    m = re.search(r"^ray cluster \S+:(\d+): (\d+) worker\(s\) finished on node\(s\) (\S+)$", stdout, re.M)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def _head_node_id(address: str) -> str:
    """The node id of the cluster's only node, asked from the cluster itself by another driver process."""
    code = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
            "print(' '.join(n['NodeID'] for n in ray.nodes() if n['Alive']))")
    out = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True, timeout=180,
                         env={**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **NO_AUTH})
    assert out.returncode == 0, out.stderr[-2000:]
    (node,) = out.stdout.split()
    return node


@pytest.fixture
def ray_head() -> Iterator[RayHead]:
    """A Ray head with 2 CPUs started with ``ray start --head --block`` in a child process. Its own short temp
    dir keeps it out of /tmp/ray, so no other ``ray.init()`` on this machine attaches to it by accident; it is
    stopped by signalling that child (it takes its raylet, GCS and workers down), not by ``ray stop``, which
    would stop every Ray cluster of this user on the machine."""
    pytest.importorskip("ray")
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="rayh")  # short: Ray's socket paths must fit in 107 bytes
    # Without RAY_AUTH_MODE, `ray start` turns token auth on when ~/.ray/auth_token exists (any earlier local
    # ray.init writes one), and a driver given an explicit address then lacks the token: keep auth off here.
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **NO_AUTH}
    # sys.executable's ray CLI: the cluster's workers then run this interpreter, with this trajlake
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                             "--port", str(port), "--num-cpus", "2", "--include-dashboard=false",
                             "--temp-dir", temp_dir, "--disable-usage-stats"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=temp_dir)
    try:
        wait_until_up(head, port_answers(port), "ray start --head", timeout_s=120, poll_s=0.2)
        address = f"127.0.0.1:{port}"
        yield RayHead(address, port, _head_node_id(address))
    finally:
        head.terminate()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(timeout=30)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _rollout(lake: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trajlake", "rollout", "--lake", str(lake), "--env", "mini-swe", "--policy",
         "oracle", "--split", "train", "--seeds", "0,1", "--tasks", ",".join(TASKS), "--run-id", "attached", "--engine", "ray",
         "--workers", "2", "--commit-every", "0", "--no-preflight", *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
def test_rollout_engine_ray_attaches_to_ray_address(ray_head: RayHead, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    env = {**os.environ, **NO_AUTH, "RAY_ADDRESS": ray_head.address, "PYTHONPATH": str(REPO),
           "TRAJLAKE_ALLOW_UNISOLATED": "1"}
    res = _rollout(lake, env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "run attached: 4 episode(s) written (4 successful), 0 already in the lake, 0 failed, of 4 planned" \
        in res.stdout, res.stdout
    # the driver was a client of that cluster (not a new local one) and both actors ran on the head's node
    assert _ray_line(res.stdout) == (ray_head.port, 2, ray_head.node_id), res.stdout
    con = connect(lake)
    assert con.execute("select count(*), count(distinct episode_id), sum(success::int) from episodes "
                       "where run_id = 'attached'").fetchone() == (4, 4, 4)
    config = con.execute("select config from runs where run_id = 'attached'").fetchone()[0]
    assert '"engine": "ray"' in config and ray_head.address not in config  # where it ran is not recorded
    # --ray-address says the same without the variable; the resumed run plays nothing twice
    env.pop("RAY_ADDRESS")
    res = _rollout(lake, env, "--ray-address", ray_head.address)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "0 episode(s) written (0 successful), 4 already in the lake" in res.stdout, res.stdout
    assert _ray_line(res.stdout) == (ray_head.port, 2, ray_head.node_id), res.stdout
    assert connect(lake).execute("select count(*) from episodes").fetchone() == (4,)
    rep = verify(open_lake(lake))
    assert rep.ok, rep.problems


def test_ray_address_needs_engine_ray(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import run_cli

    code, _, err = run_cli(capsys, "rollout", "--lake", str(tmp_path / "lake"), "--ray-address", "127.0.0.1:1",
                           "--no-preflight")
    assert code == 1 and err.strip() == "error: --ray-address needs --engine ray"
