"""The environment registry: register/make, entry-point discovery, and a third-party environment played,
replayed and evaluated by the CLI without touching trajlake's code."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from trajlake.envs import list_tasks, make_policy, policy_names, registry
from trajlake.envs.core import Env

from tests.conftest import run_cli
from trajlake.errors import TrajlakeError


@pytest.fixture
def counter_plugin(tmp_path: Path) -> Iterator[None]:
    """Install the counter environment as a package's entry point (a dist-info folder on sys.path)."""
    site = tmp_path / "site"
    dist = site / "counter_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: counter-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[trajlake.envs]\ncounter = tests.counter_env:CounterEnv\n")
    sys.path.insert(0, str(site))
    registry.unregister("counter")
    try:
        yield
    finally:
        sys.path.remove(str(site))
        registry.unregister("counter")
        registry.discover(force=True)


def test_make_resolves_registered_environments_and_refuses_unknown_ones() -> None:
    env = registry.make("mini-swe", split="dev")
    try:
        assert isinstance(env, Env) and env.env_id == "mini-swe" and len(env.list_tasks()) == 14
    finally:
        env.close()
    assert "mini-swe" in registry.names()
    with pytest.raises(registry.UnknownEnvironmentError, match=r"unknown environment 'nope'.*mini-swe"):
        registry.make("nope")
    with pytest.raises(TrajlakeError, match="already registered"):
        registry.register("mini-swe", "somewhere.else:Env")


def test_runtime_registration_with_defaults() -> None:
    from tests.counter_env import CounterEnv

    registry.register("counter-train", CounterEnv, split="train")
    try:
        assert [t["task_id"] for t in list_tasks("counter-train", split="train")] == ["counter/2", "counter/4"]
        env = registry.make("counter-train")
        assert {t["split"] for t in env.list_tasks()} == {"train"}
        assert policy_names("counter-train") == ["lazy", "oracle"]
        assert make_policy("counter-train", "oracle", "v0").needs_oracle
        with pytest.raises(TrajlakeError, match="unknown policy 'heuristic' for environment 'counter-train'"):
            make_policy("counter-train", "heuristic", "v0")
    finally:
        registry.unregister("counter-train")


def test_gymnasium_ids_come_from_the_registry() -> None:
    gymnasium = pytest.importorskip("gymnasium")
    from tests.counter_env import CounterEnv

    registry.register("counter-gym", CounterEnv, gym_id="trajlake-test/Counter-v0", gym_kwargs={"split": "dev"})
    try:
        g = gymnasium.make("trajlake-test/Counter-v0")
        obs, info = g.reset(seed=0)
        assert obs.startswith("Bring the counter") and info["task_id"] == "counter/1"
        g.close()
    finally:
        registry.unregister("counter-gym")


def test_a_plugin_environment_is_rolled_out_replayed_and_evaluated_by_the_cli(
        counter_plugin: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake = str(tmp_path / "lake")
    rc, out, err = run_cli(capsys, "rollout", "--lake", lake, "--env", "counter", "--policy", "oracle",
                           "--split", "dev", "--seeds", "0-1", "--run-id", "c-oracle", "--commit-every", "0")
    assert rc == 0, err
    assert "check counter: oracle: ok" in err and "4 episode(s) written (4 successful)" in out
    rc, out, err = run_cli(capsys, "--lake", lake, "rollout", "--env", "counter", "--policy", "lazy",
                           "--split", "dev", "--seeds", "0-1", "--run-id", "c-lazy", "--commit-every", "0")
    assert rc == 0, err

    rc, out, err = run_cli(capsys, "sql", "--lake", lake, "select episode_id from episodes where run_id = "
                           "'c-oracle' order by 1 limit 1", "--format", "json")
    assert rc == 0, err
    episode = json.loads(out)[0]["episode_id"]
    rc, out, err = run_cli(capsys, "replay", "--lake", lake, "--episode", episode)
    assert rc == 0 and "every state hash matches" in out, err

    rc, out, err = run_cli(capsys, "eval", "--lake", lake, "--baseline", "c-lazy", "--candidate", "c-oracle",
                           "--format", "json", "--resamples", "200")
    assert rc == 0, err
    report = json.loads(out)
    runs = {r["run_id"]: r for r in report["runs"]} if isinstance(report["runs"], list) else report["runs"]
    assert runs["c-oracle"]["metrics"]["success"]["estimate"] == 1.0
    # the lazy policy submits at 0 and the dev targets are 1 and 3: it never succeeds
    assert runs["c-lazy"]["metrics"]["success"]["estimate"] == 0.0


def test_a_plugin_environment_s_evaluation_documents_are_scanned_for_contamination(
        counter_plugin: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The contamination scan asks the environment of each task for its documents through the contract
    (``Env.evaluation_documents``): an entry-point environment's are scanned like Mini SWE's."""
    from tests.counter_env import TASKS, CounterEnv, worked_solution
    from trajlake import LakeWriter, open_lake

    lake = tmp_path / "lake"
    with LakeWriter(open_lake(lake, create=True)) as w:
        w.write_tasks([CounterEnv().task_row(t) for t in TASKS])
    leaked = next(t for t in TASKS if t["split"] == "dev")
    corpus = tmp_path / "sft.txt"
    corpus.write_text(f"an unrelated line\n{worked_solution(leaked)}\n", encoding="utf-8")
    rc, out, err = run_cli(capsys, "contamination", "--lake", str(lake), "--eval-split", "dev", "--corpus",
                           str(corpus), "--checks", "exact_ngram", "--format", "json")
    assert rc == 0, err
    report = json.loads(out)
    tasks = {t["task_id"]: t for t in report["tasks"]}
    assert all(t["documents"] == ["statement", "worked_solution"] for t in tasks.values())
    assert report["flagged_tasks"] == [leaked["task_id"]]
    assert tasks[leaked["task_id"]]["exact_ngram"]["documents"] == {"worked_solution": 1.0}


def test_an_unknown_environment_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(capsys, "rollout", "--lake", str(tmp_path / "l"), "--env", "nope", "--policy", "oracle")
    assert rc == 1 and err.count("\n") == 1 and "unknown environment 'nope'" in err
    assert not (tmp_path / "l").exists()
