"""``quickstart`` and ``train`` on an ``s3://`` lake (moto's S3 server on loopback): each plays its own episodes
into an empty S3 lake and an empty local lake, and the two must hold the same rows (the trainer's checkpoints and
log too). Split from tests/test_s3_commands.py (the commands that read a shared pair of lakes) so that
``--dist loadscope`` can run the two modules on different workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli
from tests.counter_env import CounterEnv, CounterOracle, LazyPolicy
from tests.train_configs import rollout, tiny_config, write_config
from trajlake import connect


class _QuickCounter(CounterEnv):
    """The counter environment with the three policies quickstart plays (its lazy policy as heuristic and
    random)."""

    @classmethod
    def policies(cls) -> Any:
        return {"oracle": CounterOracle, "heuristic": LazyPolicy, "random": LazyPolicy}


@pytest.mark.slow
def test_quickstart_on_s3(s3_lake_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trajlake.envs import registry

    registry.register("counter-qs", _QuickCounter)
    try:
        targets = {"local": str(tmp_path / "qs-lake"), "s3": s3_lake_uri}
        outs, rows = {}, {}
        for kind, lake in targets.items():
            rc, out, err = run_cli(capsys, "quickstart", "--lake", lake, "--env", "counter-qs", "--seeds", "0-1",
                                   "--workers", "1", "--resamples", "50", "--no-preflight", "--out",
                                   str(tmp_path / f"{kind}.html"))
            assert rc == 0, err
            outs[kind] = out
            rows[kind] = connect(lake).execute(
                "select run_id, count(*), sum(success::int), sum(n_turns) from episodes group by 1 order by 1"
            ).fetchall()
            html = (tmp_path / f"{kind}.html").read_text()
            assert "quickstart-counter-qs-heuristic" in html
        # dev tasks counter/1 and counter/3, seeds 0 and 1. An episode is its first turn and 2 per step: the
        # oracle takes target + 1 steps (2 x 5 + 2 x 9 = 28 turns) and solves all 4; the lazy policy submits at
        # once (3 turns) and solves none.
        assert rows["s3"] == rows["local"] == [("quickstart-counter-qs-heuristic", 4, 0, 12),
                                               ("quickstart-counter-qs-oracle", 4, 4, 28),
                                               ("quickstart-counter-qs-random", 4, 0, 12)], rows
        for out in outs.values():
            assert "oracle: solved 4 of 4 task episode(s)" in out
    finally:
        registry.unregister("counter-qs")


#: The trainer's tasks on S3: two tool-lookup train tasks (short episodes; the storage is what is under test).
TRAIN_TASKS = ("tool-lookup/two_hop/p0/0", "tool-lookup/pair/p0/0")


def _train_config(out: Path, model: Path) -> dict[str, Any]:
    """B1 on the oracle's episodes of two tasks (its checkpoint evaluated on one), then one R1 iteration."""
    lm = {"price_out": "100"}
    return tiny_config("s3t", [
        {"name": "B1", "kind": "sft", "data_policy": "oracle", "steps": 2, "batch_size": 2, "lr": 3e-3,
         "data": rollout(TRAIN_TASKS),
         "eval": rollout(TRAIN_TASKS[1:], max_new_tokens=16, max_steps=2, policy_args=lm)},
        {"name": "R1", "kind": "rl", "algo": "rloo", "iterations": 1, "steps": 1, "batch_size": 2, "lr": 1e-3,
         "rollout": rollout(TRAIN_TASKS[:1], attempts=2, max_new_tokens=16, max_steps=2, policy_args=lm)},
    ], model=model, out=out, env="tool-lookup", seed=0, max_length=1024, lambda_cost=1.0)


@pytest.mark.slow
def test_train_on_s3(s3_lake_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole trainer on an S3 lake -- its data rollout, its reads, RL rollouts, PolicyVersions, the eval run
    -- equals the same config on a local lake. B1 (supervised on oracle episodes read back from the lake) is
    bit-identical, so are the episodes its checkpoint plays (R1's rollouts, B1's eval). R1's update is not: its
    return charges tool time, a measured duration."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from trajlake.policies.tiny import build_tiny_model
    from trajlake.rollout.versions import PolicyVersions

    model = build_tiny_model(tmp_path / "model", max_positions=1024, env="tool-lookup")
    targets = {"local": str(tmp_path / "train-lake"), "s3": s3_lake_uri}
    runs, episodes, tokens, logs, versions = {}, {}, {}, {}, {}
    for kind, lake in targets.items():
        cfg = write_config(tmp_path / f"{kind}.toml", _train_config(tmp_path / f"out-{kind}", model))
        rc, out, err = run_cli(capsys, "train", "--config", str(cfg), "--lake", lake)
        assert rc == 0, out[-2000:] + err[-2000:]
        con = connect(lake)
        runs[kind] = con.execute("select run_id, label, policy_name, policy_version, policy_checkpoint_hash "
                                 "from runs order by 1").fetchall()
        episodes[kind] = con.execute(
            "select episode_id, run_id, policy_version_start, n_turns, tokens_out, success from episodes "
            "order by 1").fetchall()
        tokens[kind] = con.execute("select episode_id, flatten(list(token_ids order by turn_idx)) from turns "
                                   "group by 1 order by 1").fetchall()
        logs[kind] = [{k: v for k, v in r.items() if k != "time"}
                      for r in pq.read_table(tmp_path / f"out-{kind}" / "train_log.parquet").to_pylist()]
        versions[kind] = PolicyVersions(lake, "s3t").all()
    assert versions["s3"] == versions["local"] == ["s3t-base", "s3t-B1", "s3t-R1"]
    assert episodes["s3"] == episodes["local"] and tokens["s3"] == tokens["local"]
    by_run: dict[str, int] = {}
    for _, run, *_ in episodes["s3"]:
        by_run[run] = by_run.get(run, 0) + 1
    assert by_run == {"B1-data": 2, "B1": 1, "R1-it1": 2}
    # the stage rows: B1's checkpoint hash is the same; R1's differs only through the tool-time cost
    local_runs = {r[0]: r for r in runs["local"]}
    s3_runs = {r[0]: r for r in runs["s3"]}
    assert set(s3_runs) == set(local_runs) == {"B1-data", "B1", "B1.train", "R1-it1", "R1.train"}
    for run_id in ("B1-data", "B1", "B1.train", "R1-it1"):
        assert s3_runs[run_id] == local_runs[run_id]
    assert s3_runs["R1.train"][:4] == local_runs["R1.train"][:4] == ("R1.train", "R1", "s3t", "s3t-R1")
    assert s3_runs["B1.train"][4].startswith("sha256:")
    # the training log: B1's steps equal to the bit; R1's step equal but for the measured cost in its return
    b1 = [r for r in logs["s3"] if r["stage"] == "B1"]
    assert len(b1) == 2 and b1 == [r for r in logs["local"] if r["stage"] == "B1"]
    (r1_s3,) = [r for r in logs["s3"] if r["stage"] == "R1"]
    (r1_local,) = [r for r in logs["local"] if r["stage"] == "R1"]
    noisy = ("loss", "grad_norm", "reward_mean", "age_seconds_mean", "age_seconds_max")  # ages: wall-clock timings
    assert {k: v for k, v in r1_s3.items() if k not in noisy} == {k: v for k, v in r1_local.items() if k not in noisy}
    assert r1_s3["policy_tokens"] > 0 and r1_s3["reward_mean"] == pytest.approx(r1_local["reward_mean"], abs=1e-4)
