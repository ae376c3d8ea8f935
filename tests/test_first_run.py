"""A new user's first run: it works, or it stops loudly before writing anything (issue: 0 of 28 successes for the
oracle on a machine without pytest, reported with exit code 0)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from trajlake.envs import registry
from trajlake.envs.policy import Policy, PolicyOutput, TaskView

from tests.conftest import run_cli
from tests.counter_env import CounterEnv, CounterOracle


@pytest.fixture(scope="module")
def python_without_pytest(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An interpreter that cannot import pytest: what a plain `pip install .` used to leave the grader."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    assert subprocess.run([py, "-c", "import pytest"], capture_output=True).returncode != 0
    return py


def test_rollout_stops_before_writing_when_the_grader_cannot_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        python_without_pytest: str) -> None:
    monkeypatch.setattr(sys, "executable", python_without_pytest)
    lake = tmp_path / "lake"
    rc, _out, err = run_cli(capsys, "rollout", "--lake", str(lake), "--policy", "oracle", "--seeds", "0")
    assert rc == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "pytest" in lines[0] and "pip install pytest" in lines[0], err
    assert "nothing was written" in lines[0]
    assert not lake.exists()


def test_doctor_reports_what_is_there_and_fails_on_a_missing_requirement(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, python_without_pytest: str) -> None:
    rc, out, err = run_cli(capsys, "doctor", "--format", "json", "--no-oracle")
    assert rc == 0, err
    rows = {(r["component"], r["check"]): r for r in json.loads(out)}
    assert rows[("mini-swe", "sandbox")]["status"] == "ok"
    assert rows[("mini-swe", "pytest")]["status"] == "ok"
    assert rows[("lake", "duckdb delta extension")]["status"] == "ok"
    assert ("browser", "chromium") in rows and ("train", "torch") in rows
    monkeypatch.setattr(sys, "executable", python_without_pytest)
    rc, out, err = run_cli(capsys, "doctor", "--no-oracle")
    assert rc == 1 and "MISSING" in out and "required check(s) failed" in err


class _WrongOracle(CounterOracle):
    """An oracle whose known solution is wrong: the environment (its task data) is broken."""

    def reset(self, task: TaskView, seed: int) -> None:
        super().reset(task, seed)
        self.left += 1


class _BrokenCounter(CounterEnv):
    @classmethod
    def policies(cls) -> Mapping[str, Any]:
        return {"oracle": _WrongOracle, "heuristic": _Lazy, "random": _Lazy}


class _Lazy(Policy):
    def reset(self, task: TaskView, seed: int) -> None:
        pass

    def act(self, observation: str) -> PolicyOutput:
        return self.scripted_output('{"tool": "submit", "args": {}}')


@pytest.fixture
def broken_env() -> Iterator[str]:
    registry.register("counter-broken", _BrokenCounter)
    try:
        yield "counter-broken"
    finally:
        registry.unregister("counter-broken")


def test_quickstart_exits_non_zero_when_the_oracle_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         broken_env: str) -> None:
    rc, _out, err = run_cli(capsys, "quickstart", "--lake", str(tmp_path / "lake"), "--env", broken_env,
                           "--seeds", "0", "--workers", "1", "--no-preflight", "--out", str(tmp_path / "r.html"))
    assert rc == 1 and "the oracle solved 0 of the 2 tasks it played" in err
    assert not (tmp_path / "r.html").exists()
    # the preflight catches it before anything is played
    rc, _out, err = run_cli(capsys, "quickstart", "--lake", str(tmp_path / "lake2"), "--env", broken_env,
                           "--seeds", "0", "--workers", "1", "--out", str(tmp_path / "r.html"))
    assert rc == 1 and "oracle" in err and "not graded as solved" in err
    assert not (tmp_path / "lake2").exists()


def test_lake_option_before_and_after_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake = str(tmp_path / "lake")
    assert run_cli(capsys, "demo", "--lake", lake, "--tasks", "3", "--seeds", "1")[0] == 0
    rc1, out1, _ = run_cli(capsys, "--lake", lake, "info", "--format", "json")
    rc2, out2, _ = run_cli(capsys, "info", "--lake", lake, "--format", "json")
    assert rc1 == rc2 == 0 and out1 == out2 and json.loads(out1)[0]["rows"] == 9
    rc, out, _ = run_cli(capsys, "eval", "--lake", lake, "--format", "json", "--resamples", "50")
    assert rc == 0 and json.loads(out)["runs"]
    # the value after the command wins
    rc, out, err = run_cli(capsys, "--lake", str(tmp_path / "nowhere"), "info", "--lake", lake)
    assert rc == 0, err


@pytest.mark.parametrize(("args", "message"), [
    (["--seeds", "0-99999999999"], "more than 1,000,000 seeds"),
    (["--seeds=-3"], "not a non-negative seed"),
    (["--seeds", "4-2"], "ends before it starts"),
    (["--workers", "0"], "--workers"),
    (["--price-in", "-1"], "--price-in"),
])
def test_rollout_options_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                     message: str) -> None:
    rc, _out, err = run_cli(capsys, "rollout", "--lake", str(tmp_path / "l"), "--policy", "oracle", *args)
    assert rc != 0 and message in err, err
    assert not (tmp_path / "l").exists()


def test_a_run_records_what_plays_it_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """runs holds the commit, the seeds, the prices and a command that plays the same episodes again."""
    import shlex

    registry.register("counter-prov", CounterEnv)
    try:
        lake = tmp_path / "a"
        rc, out, err = run_cli(capsys, "rollout", "--lake", str(lake), "--env", "counter-prov", "--policy",
                               "oracle", "--seeds", "0-2", "--price-in", "3", "--run-id", "p", "--no-preflight")
        assert rc == 0, err
        rc, out, _ = run_cli(capsys, "sql", "--lake", str(lake), "select code_version, config from runs",
                             "--format", "json")
        row = json.loads(out)[0]
        assert row["code_version"].startswith(("git:", "pkg:"))
        config = json.loads(row["config"])
        assert config["seeds"] == "0-2" and config["cost_model"]["price_in"] == 3.0
        argv = shlex.split(config["reproduce"])
        assert argv[:2] == ["trajlake", "rollout"]
        argv[argv.index("--lake") + 1] = str(tmp_path / "b")
        rc, out, err = run_cli(capsys, *argv[1:], "--no-preflight")
        assert rc == 0, err
        q = "select episode_id, final_state_hash, success, tokens_in, cost_usd from episodes order by 1"
        a = run_cli(capsys, "sql", "--lake", str(lake), q, "--format", "json")[1]
        b = run_cli(capsys, "sql", "--lake", str(tmp_path / "b"), q, "--format", "json")[1]
        assert json.loads(a) == json.loads(b) and len(json.loads(a)) == 2 * 3
    finally:
        registry.unregister("counter-prov")


def test_data_cutoff_reaches_the_contamination_time_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    registry.register("counter-cutoff", CounterEnv)
    try:
        lake = str(tmp_path / "lake")
        rc, _, err = run_cli(capsys, "rollout", "--lake", lake, "--env", "counter-cutoff", "--policy", "oracle",
                             "--split", "dev", "--run-id", "ev", "--data-cutoff", "2026-06-30", "--no-preflight")
        assert rc == 0, err
        rc, out, err = run_cli(capsys, "contamination", "--lake", lake, "--eval-split", "dev", "--format", "json")
        assert rc == 0, err
        report = json.loads(out)
        # the counter tasks were created on 2026-01-01, before the policy's data cutoff
        assert sorted(report["flagged_tasks"]) == ["counter/1", "counter/3"]
        rc, _, err = run_cli(capsys, "rollout", "--lake", lake, "--env", "counter-cutoff", "--policy", "oracle",
                             "--data-cutoff", "last summer", "--no-preflight")
        assert rc == 1 and "--data-cutoff 'last summer' is not an ISO-8601 date" in err
    finally:
        registry.unregister("counter-cutoff")


def test_the_report_states_each_runs_isolation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 9: the report says plainly which isolation the episodes had (the sandbox column)."""
    from tests.conftest import make_episode
    from trajlake import LakeWriter, open_lake

    lake = open_lake(tmp_path / "lake", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        for i, sandbox in enumerate(["bwrap", "bwrap", "rlimit", None]):
            ep, turns = make_episode(f"e{i}", run_id="r", sandbox=sandbox, task_id=f"t{i}", group_id=f"g{i}")
            for t in turns:
                t["episode_id"] = f"e{i}"
            w.write_batch([ep], turns).raise_if_rejected()
    rc, out, err = run_cli(capsys, "eval", "--lake", str(lake.root), "--format", "json", "--resamples", "50")
    assert rc == 0, err
    assert json.loads(out)["runs"]["r"]["isolation"] == {"bwrap": 2, "none recorded": 1, "rlimit": 1}
    rc, out, _ = run_cli(capsys, "eval", "--lake", str(lake.root), "--resamples", "50")
    assert "isolation" in out and "rlimit (1)" in out


@pytest.mark.parametrize("env_name", ["mini-web", "mini-swe"])
def test_a_step_budget_env_arg_is_a_run_setting_not_a_broken_environment(
        env_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `--env-arg budget={"max_steps": 4}` made Mini Web's pre-flight oracle run out of steps, and the
    rollout refused to start ("not graded as solved (budget_steps)"); Mini SWE's oracle happened to fit."""
    from trajlake.lake.store import Lake
    from trajlake.query import connect

    env = registry.make(env_name, split="dev")
    try:
        ids = [t["task_id"] for t in env.list_tasks()[:2]]
    finally:
        env.close()
    lake = tmp_path / "lake"
    rc, _out, err = run_cli(capsys, "--lake", str(lake), "rollout", "--env", env_name, "--policy", "oracle",
                            "--split", "dev", "--tasks", ",".join(ids), "--env-arg", 'budget={"max_steps": 4}',
                            "--run-id", "b4")
    assert rc == 0, err
    rows = connect(Lake(lake)).execute("select n_turns, termination_reason from episodes").fetchall()
    assert len(rows) == 2 and all(n <= 2 * 4 + 1 for n, _ in rows), rows
