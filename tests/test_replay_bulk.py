"""`trajlake replay --run ID` and `--from DIR`: every episode of a run, or of an exported bundle, replayed in one
command; exit 0 only if every state hash of every episode matches."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli

TASKS = "tool-lookup/code/p0/0,tool-lookup/two_hop/p0/0,tool-lookup/pair/p0/0"


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake with two runs of the tool-lookup oracle: 3 episodes of run `a`, 1 of run `b`."""
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    lake = tmp_path_factory.mktemp("replay") / "lake"
    for run_id, tasks in (("a", tuple(TASKS.split(","))), ("b", tuple(TASKS.split(","))[:1])):
        s = run_rollout(RolloutConfig(lake=str(lake), run_id=run_id, env="tool-lookup", policy="oracle",
                                      split="train", seeds=(0,), task_ids=tasks))
        assert s.written == len(tasks)
    return lake


def test_replay_run_replays_every_episode_of_that_run(played: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--lake", str(played), "replay", "--run", "a", "--format", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 3 and {r["result"] for r in rows} == {"matched"} and all(r["steps"] > 0 for r in rows)
    assert "replayed 3 episode(s): 3 matched, 0 drifted" in err
    code, _, err = run_cli(capsys, "--lake", str(played), "replay", "--run", "b")
    assert code == 0 and "every state hash matches" in err + _ and "replayed 1 episode(s)" in err


def test_replay_from_an_exported_bundle_and_a_drifted_episode_fails(played: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "bundle"
    code, _, err = run_cli(capsys, "--lake", str(played), "export", "hf", "--out", str(out_dir), "--tables",
                           "episodes,turns")
    assert code == 0, err
    code, out, err = run_cli(capsys, "replay", "--from", str(out_dir), "--format", "csv")
    assert code == 0, err
    assert out.splitlines()[0].startswith("episode_id,result") and len(out.splitlines()) == 1 + 4
    # an environment that now answers differently (here: a recorded hash changed) is a drifted episode
    shard = next((out_dir / "data" / "turns").glob("*.parquet"))
    t = pq.read_table(shard)
    victim = t["episode_id"][0].as_py()
    rows = t.to_pylist()
    last = max(i for i, r in enumerate(rows) if r["episode_id"] == victim and r["actor"] == "env")
    rows[last]["env_state_hash"] = "0" * 64
    pq.write_table(t.from_pylist(rows, schema=t.schema), shard)
    code, out, err = run_cli(capsys, "replay", "--from", str(out_dir), "--format", "json")
    assert code == 1
    result = {r["episode_id"]: r for r in json.loads(out)}
    assert result[victim]["result"] == "drifted" and result[victim]["where"].startswith("turn ")
    assert sum(r["result"] == "matched" for r in result.values()) == 3
    assert "4 episode(s): 3 matched, 1 drifted" in err
    assert pc.sum(pc.equal(t["episode_id"], victim)).as_py() > 0


@pytest.mark.parametrize(("args", "message"), [
    ([], "exactly one of --episode ID, --run ID, --from DIR"),
    (["--run", "a", "--episode", "x"], "exactly one of"),
    (["--run", "nope"], "run 'nope': no episodes to replay"),
    (["--episode", "x", "--format", "json"], "--format applies to --run, --from and --suite"),
])
def test_replay_options_are_checked(played: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                    message: str) -> None:
    code, _, err = run_cli(capsys, "--lake", str(played), "replay", *args)
    assert code != 0 and message in err and len(err.strip().splitlines()) == 1, err


def test_replay_from_a_folder_that_is_not_a_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "replay", "--from", str(tmp_path))
    assert code != 0 and "no episodes shards" in err and "trajectories layout" in err, err


def test_a_pinned_replay_suite_replays_and_reports_drift(played: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`--run ID --pin-suite NAME` pins the episodes (ids and lake versions, in the lake) once they all match;
    `--suite NAME` replays exactly them against the current environment code, whatever was committed since,
    and exits 1 when the environment now answers differently."""
    import shutil

    lake = tmp_path / "lake"
    shutil.copytree(played, lake)
    code, _, err = run_cli(capsys, "--lake", str(lake), "replay", "--run", "a", "--pin-suite", "smoke")
    assert code == 0 and "pinned replay suite smoke: 3 episode(s)" in err, err
    code, _, err = run_cli(capsys, "--lake", str(lake), "replay", "--run", "a", "--pin-suite", "smoke")
    assert code != 0 and "exists already" in err
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    run_rollout(RolloutConfig(lake=str(lake), run_id="later", env="tool-lookup", policy="oracle", split="train",
                              seeds=(1,), task_ids=tuple(TASKS.split(","))[:1]))  # committed after the pin
    code, out, err = run_cli(capsys, "--lake", str(lake), "replay", "--suite", "smoke", "--format", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 3 and {r["result"] for r in rows} == {"matched"}
    assert {r["env_version"] for r in rows} == {r["env_version_now"] for r in rows}
    # the environment's code changes how one tool answers: the suite says which episodes drifted, and where
    from trajlake.envs.tool_lookup.env import ToolLookupEnv

    original = ToolLookupEnv.state_hash
    monkeypatch.setattr(ToolLookupEnv, "state_hash", lambda self: "changed" + original(self)[7:])
    code, out, err = run_cli(capsys, "--lake", str(lake), "replay", "--suite", "smoke", "--format", "json")
    assert code == 1 and {r["result"] for r in json.loads(out)} == {"drifted"}
    assert "3 matched" not in err and "3 drifted" in err


@pytest.mark.parametrize(("args", "message"), [
    (["--suite", "nope"], "replay suite 'nope' is not in the lake"),
    (["--suite", "../x"], "use letters, digits"),
    (["--episode", "x", "--pin-suite", "s"], "--pin-suite pins the episodes of --run ID"),
])
def test_replay_suite_options_are_checked(played: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                          message: str) -> None:
    code, _, err = run_cli(capsys, "--lake", str(played), "replay", *args)
    assert code != 0 and message in err and len(err.strip().splitlines()) == 1, err


def test_diagnose_replays_the_suite_it_is_given(played: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    lake = tmp_path / "lake"
    shutil.copytree(played, lake)
    assert run_cli(capsys, "--lake", str(lake), "replay", "--run", "a", "--pin-suite", "s")[0] == 0
    code, out, err = run_cli(capsys, "--lake", str(lake), "diagnose", "--baseline", "a", "--candidate", "b",
                             "--suite", "s", "-f", "json", "--resamples", "50")
    assert code == 0, err
    assert json.loads(out)["diagnosis"] == "no_drop"  # the oracle never drops; the suite replayed without error
    code, _, err = run_cli(capsys, "--lake", str(lake), "diagnose", "--baseline", "a", "--candidate", "b",
                           "--suite", "missing")
    assert code != 0 and "replay suite 'missing' is not in the lake" in err
