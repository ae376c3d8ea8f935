"""The trainer's smoke run end to end (issue 12, "Evidence"): ``trajlake train --config configs/smoke.toml`` on an
empty lake runs B1 then R1 on CPU, registers both policy versions in ``runs``, plays them back with pinned versions
and a recorded lag, and the supervised loss goes down. The other trainer tests are in tests/test_train_loop.py (a
module of its own so that --dist loadscope can run this run and those on two workers)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from trajlake.query import connect

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    from typer.testing import CliRunner

    from trajlake.cli import app

    base = tmp_path_factory.mktemp("smoke")
    lake, out = base / "lake", base / "out"
    res = CliRunner().invoke(app, ["train", "--config", str(ROOT / "configs" / "smoke.toml"), "--lake", str(lake),
                                   "--out-dir", str(out)])
    assert res.exit_code == 0, res.output + repr(res.exception)
    return lake, out, res.output


@pytest.mark.slow
def test_smoke_registers_both_versions_with_checkpoint_hashes(smoke: tuple[Path, Path, str]) -> None:
    lake, out, _ = smoke
    con = connect(lake)
    rows = con.execute("select run_id, label, policy_name, policy_version, policy_checkpoint_hash from runs "
                       "where run_id like '%.train' order by run_id").fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [("B1.train", "B1", "smoke", "smoke-B1"),
                                                        ("R1.train", "R1", "smoke", "smoke-R1")]
    from trajlake.policies import checkpoint_hash

    for run_id, stage in (("B1.train", "B1"), ("R1.train", "R1")):
        digest = dict((r[0], r[4]) for r in rows)[run_id]
        assert digest == checkpoint_hash(f"hf:{out / stage}") and digest.startswith("sha256:")
        assert (out / stage / "config.json").is_file() and (out / stage / "tokenizer.json").is_file()
    # R1's updates moved the weights: its checkpoint is another one
    assert dict((r[0], r[4]) for r in rows)["B1.train"] != dict((r[0], r[4]) for r in rows)["R1.train"]
    # every run a stage wrote carries the stage's name as label
    labels = dict(con.execute("select run_id, label from runs").fetchall())
    assert labels["B1-data"] == "B1" and labels["B1"] == "B1"
    assert labels["R1-it1"] == labels["R1-it2"] == labels["R1"] == "R1"


@pytest.mark.slow
def test_smoke_stages_record_their_training_compute(smoke: tuple[Path, Path, str]) -> None:
    lake, out, _ = smoke
    con = connect(lake)
    log = pq.read_table(out / "train_log.parquet").to_pylist()
    for run_id, stage in (("B1.train", "B1"), ("R1.train", "R1")):
        config = json.loads(con.execute("select config from runs where run_id = ?", [run_id]).fetchone()[0])
        c = config["training_compute"]
        trained = sum(r["policy_tokens"] for r in log if r["stage"] == stage)
        assert c["policy_tokens_trained"] == trained == config["tokens"] > 0
        assert c["tokens_through_training"] >= trained  # the context is read, only the policy tokens are trained
        assert c["flops_estimate"] == 6.0 * c["parameters"] * c["tokens_through_training"]
        assert c["device"] == "cpu" and c["gpu_seconds"] == 0.0 and c["wall_seconds"] > 0 and c["cpu_seconds"] > 0


@pytest.mark.slow
def test_smoke_episodes_carry_pinned_versions_and_lag(smoke: tuple[Path, Path, str]) -> None:
    lake, _, _ = smoke
    con = connect(lake)
    by_run = dict(con.execute("select run_id, list(distinct policy_version_start) from episodes group by 1"
                              ).fetchall())
    assert by_run["B1"] == ["smoke-B1"]
    assert by_run["R1-it1"] == ["smoke-B1"]      # R1's first iteration plays B1's checkpoint
    assert by_run["R1-it2"] == ["smoke-R1.1"]    # the second plays the first update
    assert by_run["R1"] == ["smoke-R1"]
    lags = con.execute("select count(*), count(policy_lag), max(policy_lag) from episodes where run_id like 'R1%'"
                       ).fetchone()
    assert lags[0] > 0 and lags[0] == lags[1] and lags[2] == 0  # synchronous loop: played by the latest version
    # every policy turn of an R1 rollout is pinned to its episode's version
    assert con.execute("select count(*) from turns t join episodes e using (episode_id) where t.actor = 'policy' "
                       "and e.run_id like 'R1%' and t.policy_version <> e.policy_version_start").fetchone()[0] == 0
    # the policy's price_out (100 USD per million completion tokens) is the run's price: R1's return charges it
    for cost, tokens_out, tool in con.execute("select cost_usd, tokens_out, tool_seconds from episodes "
                                              "where run_id = 'R1-it1'").fetchall():
        assert cost == pytest.approx(tokens_out * 100 / 1e6 + tool * 0.04 / 3600) and cost > 0.001
    # groups: 2 attempts of each (task, seed)
    assert con.execute("select min(n), max(n) from (select count(*) n from episodes where run_id = 'R1-it1' "
                       "group by group_id)").fetchone() == (2, 2)


@pytest.mark.slow
def test_smoke_sft_loss_goes_down_and_log_has_the_named_columns(smoke: tuple[Path, Path, str]) -> None:
    _, out, output = smoke
    log = pq.read_table(out / "train_log.parquet").to_pylist()
    for col in ("step", "loss", "kl", "ratio_mean", "log_ratio_var", "entropy", "lr", "staleness_max", "staleness_mean"):
        assert col in log[0]
    b1 = [r["loss"] for r in log if r["stage"] == "B1"]
    assert len(b1) == 12
    assert sum(b1[-3:]) / 3 < sum(b1[:3]) / 3 - 1.0, b1  # nats per policy token
    r1 = [r for r in log if r["stage"] == "R1"]
    assert len(r1) == 4 and {r["iteration"] for r in r1} == {1, 2}
    assert all(r["ratio_mean"] is not None and r["kl"] is not None for r in r1)
    # the second iteration also trains on the first's episodes (max_staleness = 1): staleness 1 appears (the
    # first iteration's episodes are one version behind the learner), 0 in the first iteration
    assert max(r["staleness_max"] for r in r1 if r["iteration"] == 2) == 1
    assert max(r["staleness_max"] for r in r1 if r["iteration"] == 1) == 0
    # the deprecated columns lag_max / lag_mean are still written, as copies (docs/names.md)
    assert all(r["lag_max"] == r["staleness_max"] and r["lag_mean"] == r["staleness_mean"] for r in log)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert "B1: policy version smoke-B1" in output


@pytest.mark.slow
def test_a_second_train_into_the_same_lake_is_refused(smoke: tuple[Path, Path, str]) -> None:
    from typer.testing import CliRunner

    from trajlake.cli import app

    lake, out, _ = smoke
    res = CliRunner().invoke(app, ["train", "--config", str(ROOT / "configs" / "smoke.toml"), "--lake", str(lake),
                                   "--out-dir", str(out / "again")])
    assert res.exit_code != 0 and "already holds trained stage(s) B1.train, R1.train" in str(res.exception)
