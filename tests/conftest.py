"""Shared fixtures: small lakes built on the fly (nothing is downloaded)."""

from __future__ import annotations

import datetime as dt
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.azure_server import az_lake_uri, azurite  # noqa: F401  (fixtures: a loopback Azure blob store)
from tests.s3_server import s3_lake_uri, s3_server  # noqa: F401  (fixtures: a loopback S3 server)
from trajlake import Lake, LakeWriter, open_lake
from trajlake.demo import write_demo

# Mini SWE refuses to run agent code without bubblewrap unless the caller opts in; the suite opts in so it
# runs on machines without bubblewrap (tests/test_security.py checks the refusal with this unset).
os.environ.setdefault("TRAJLAKE_ALLOW_UNISOLATED", "1")

# One math thread per test process (an explicit OMP_NUM_THREADS / MKL_NUM_THREADS wins). CI runs 2 xdist workers
# on 2 cores, and torch's default is a thread per core in every worker: 4 spinning OpenMP threads on 2 cores made
# each torch test several times slower (tests/test_train_data.py::test_tiny_hf_policy_episodes_exact_and_trimmed,
# two side by side: 40 s each with the default, 13-15 s with one thread). Set before any test imports torch
# (trajlake's import does not), and inherited by the processes the tests start.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
if "torch" in sys.modules:  # a plugin imported it first: its thread pool is already sized
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module, loaded once per process and registered in ``sys.modules`` (its dataclasses
    look their module up there)."""
    module_name = f"bench_script_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, Path(__file__).resolve().parent.parent / "bench"
                                                  / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def make_episode(episode_id: str = "ep-1", run_id: str = "run-1", n_steps: int = 2, **overrides: Any
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A small valid episode as (episode row, turn rows) for the batch API."""
    turns: list[dict[str, Any]] = []
    t = T0
    specs = [("system", "system", [1, 2, 3])]
    for s in range(n_steps):
        specs.append(("assistant", "policy", [10 + s, 11 + s]))
        specs.append(("tool", "env", [20 + s, 21 + s, 22 + s]))
    for i, (role, actor, toks) in enumerate(specs):
        pol = actor == "policy"
        turns.append({
            "episode_id": episode_id, "turn_idx": i, "role": role, "actor": actor,
            "policy_version": "p1" if pol else None, "raw_content": f"{role} text {i}",
            "token_ids": toks, "loss_mask": [1 if pol else 0] * len(toks),
            "behavior_logprobs": [-0.5] * len(toks) if pol else None,
            "started_at": t + dt.timedelta(seconds=i), "ended_at": t + dt.timedelta(seconds=i, milliseconds=500),
            "latency_ms": 500.0, "status": "OK", "tokens": len(toks), "cost_usd": 0.001, "tool_seconds": 0.0,
        })
    ep = {
        "episode_id": episode_id, "run_id": run_id, "task_id": "task-1", "task_version": "v1", "split": "dev",
        "env_id": "test-env", "env_version": "1", "env_seed": 0, "group_id": "task-1:v1:0:1", "attempt": 0,
        "policy_version_start": "p1", "policy_version_end": "p1", "started_at": T0,
        "ended_at": T0 + dt.timedelta(seconds=len(specs) + 1), "n_turns": len(turns),
        "n_policy_tokens": 2 * n_steps, "terminated": True, "truncated": False, "termination_reason": "success",
        "error_class": None, "success": True, "reward_total": 1.0, "reward_components": {"resolved": 1.0},
        "tokens_in": 10, "tokens_out": 4, "cost_usd": 0.005, "tool_seconds": 0.0, "wall_seconds": 6.0,
        "faults_injected": 0, "injection_attempted": False,
    }
    ep.update(overrides)
    return ep, turns


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``trajlake ARGS...`` in this process; returns (exit code, stdout, stderr)."""
    from trajlake.cli import main

    old = sys.argv
    sys.argv = ["trajlake", *args]
    try:
        main()
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return open_lake(tmp_path / "lake", create=True)


@pytest.fixture(scope="session")
def demo_lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    lk = open_lake(tmp_path_factory.mktemp("demo") / "lake", create=True)
    with LakeWriter(lk) as w:
        write_demo(w, seeds=2, n_tasks=12)
    return lk


#: The Mini SWE dev tasks :func:`dev_rollout` plays: one of each of the split's 4 projects (of its 14 tasks; each
#: episode is a sandboxed grader run, and the tests that read them check per-episode properties).
DEV_ROLLOUT_TASKS = ("mini-swe/durations/drop_branch/0", "mini-swe/fractionlib/flip_comparison/0",
                     "mini-swe/rangeset/flip_comparison/0", "mini-swe/textkit/wrong_variable/0")


@pytest.fixture(scope="session")
def dev_rollout(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, int]]:
    """``dev_rollout(policy)``: the policy played by the runner on Mini SWE's dev tasks ``DEV_ROLLOUT_TASKS``
    (seed 0) as run ``policy`` of one shared lake, played once per session (several tests only read these
    episodes); returns (lake, the number of episodes that run wrote)."""
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    lake = tmp_path_factory.mktemp("dev-rollouts") / "lake"
    written: dict[str, int] = {}

    def played(policy: str) -> tuple[Path, int]:
        if policy not in written:
            written[policy] = run_rollout(RolloutConfig(lake=str(lake), run_id=policy, env="mini-swe", policy=policy,
                                                        split="dev", seeds=(0,), commit_every_s=0,
                                                        task_ids=DEV_ROLLOUT_TASKS)).written
        return lake, written[policy]

    return played
