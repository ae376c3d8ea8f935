"""The environment contract, Mini SWE, Gymnasium, rollouts and replay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from trajlake.envs import list_tasks, make_env, make_policy, task_view_fn
from trajlake.envs.checker import check_env
from trajlake.envs.core import Budget

from tests.test_cli import run
from trajlake import connect, open_lake, verify
from trajlake.lake.delta_log import DELTA_LOG
from trajlake.rollout.faults import FaultInjector
from trajlake.rollout.runner import RolloutConfig, play_episode, run_rollout
from trajlake.rollout.versions import PolicyVersions

ROOT = Path(__file__).resolve().parents[1]


def act(tool: str, **args) -> str:
    return json.dumps({"tool": tool, "args": args})


@pytest.fixture
def env():
    e = make_env("mini-swe", split="dev")
    yield e
    e.close()


def test_mini_swe_passes_check_env(env) -> None:
    task = env.task_for(0)
    check_env(env, [act("list_files"), act("read_file", path=task["file"]),
                    act("edit", path=task["file"], old="\n", new="\n\n"), act("run_tests", command="pytest -q")])


def test_checker_checks_the_sandbox_kind_and_the_evaluation_documents(env) -> None:
    from trajlake.envs.checker import EnvCheckError, check_evaluation_documents, check_sandbox_kind
    from trajlake.envs.core import EvalDocument

    from tests.counter_env import CounterEnv

    r = env.reset(0)
    assert env.sandbox_kind in ("bwrap", "rlimit")  # decided at reset: this machine's isolation
    check_sandbox_kind(env)
    check_evaluation_documents(env, r.task_id)
    counter = CounterEnv(split="dev")
    counter.reset(0)
    check_sandbox_kind(counter)
    check_evaluation_documents(counter, "counter/1")

    class Unnamed(CounterEnv):
        sandbox_kind = "Bubble Wrap"

    with pytest.raises(EnvCheckError, match="sandbox_kind must be None or a short lowercase name"):
        check_sandbox_kind(Unnamed(split="dev"))

    class Leaky(CounterEnv):
        @classmethod
        def evaluation_documents(cls, task_ids):
            return [EvalDocument("counter/2", "worked_solution", "another task's text")]

    with pytest.raises(EnvCheckError, match="documents of the tasks asked for"):
        check_evaluation_documents(Leaky(split="dev"), "counter/1")


def test_what_the_built_in_environments_share() -> None:
    """envs/tool_env.py, envs/injection.py and envs/taskset.py: actions, attacked variants and task versions."""
    from trajlake.envs import injection, taskset, tool_env
    from trajlake.envs.policy import TaskView

    assert tool_env.parse_action('{"tool": "edit", "args": {"path": "a"}}') == ("edit", {"path": "a"}, None)
    assert tool_env.parse_action("not json")[0] == "<unparsed>"
    assert 'string field "tool"' in str(tool_env.parse_action('{"args": {}}')[2])
    assert tool_env.clip("short") == "short"
    assert tool_env.clip("x" * (tool_env.MAX_OUTPUT_CHARS + 1)).endswith("\n... (output cut)")
    assert tool_env.describe_tools({"submit": {"description": "Finish.", "args": {}}}) == "- submit: Finish. args: {}"

    variant = injection.variant_task_id("fam/1", "giftcard")
    assert variant == "fam/1/inj/giftcard" and injection.base_task_id(variant) == injection.base_task_id("fam/1")
    seen: set = set()
    found = [("delete", {"label": "Home"}), ("delete", {"label": "Home"}), ("delete", {"label": "Office"})]
    assert injection.unseen(found, seen) == [found[0], found[2]] and injection.unseen(found, seen) == []
    records = [{"task_id": "fam/1", "oracle": ["the steps"]}]
    view = injection.with_bundled_solution(TaskView(variant, "v", "s", {}, None), "steps", lambda: records, "oracle")
    assert view.oracle == {"steps": ["the steps"]}
    assert injection.with_bundled_solution(view, "steps", list, "oracle") is view  # a given solution is kept
    with pytest.raises(ValueError, match="plays bundled tasks only; 'other/2' is not one"):
        injection.with_bundled_solution(TaskView("other/2", "v", "s", {}, None), "steps", lambda: records, "oracle")

    record = {"task_id": "t", "statement": "café", "task_version": "old", "created_at": "2026"}
    assert taskset.content_version(record) == taskset.content_version({**record, "task_version": "new"})
    assert taskset.content_version(record) != taskset.content_version({**record, "created_at": "2027"})
    assert taskset.content_version(record, ("task_version", "created_at")) == taskset.content_version(
        {**record, "created_at": "2027"}, ("task_version", "created_at"))
    assert taskset.content_version(record, ensure_ascii=False) != taskset.content_version(record)
    splits = [taskset.split_for_family(f"family-{i}", "salt") for i in range(400)]
    assert set(splits) == {"train", "dev", "hidden"} and 200 < splits.count("train") < 280  # 60/20/20
    assert splits == [taskset.split_for_family(f"family-{i}", "salt") for i in range(400)]  # a pure function


def test_gymnasium_check_env() -> None:
    assert "trajlake/MiniSWE-v0" in gymnasium.registry  # registered by importing trajlake.envs
    genv = gymnasium.make("trajlake/MiniSWE-v0")
    gym_check_env(genv.unwrapped)
    _, info = genv.reset(seed=3)
    assert set(info) == {"task_id", "task_version", "state_hash"}
    _, reward, terminated, _, info = genv.step(genv.action_space.sample())
    assert info["status"] == "MODEL_INVALID_ACTION" and not terminated and reward == 0.0
    genv.close()


@pytest.mark.slow
def test_random_policy_does_not_solve_a_dev_task(env) -> None:
    # the oracle's side (every task solved, terminated by success, sandboxed) is checked on all 80 tasks by
    # test_oracle_policy_solves_every_task, which plays these dev tasks too
    rnd = make_policy("mini-swe", "random", "random-v1")
    task = env.tasks[0]
    rec = play_episode(env, rnd, run_id="t", task_id=task["task_id"], task_version=task["task_version"], seed=0,
                       task_view=task_view_fn(env))
    assert not rec.episode["success"]


def test_budget_truncates_and_grades(tmp_path: Path) -> None:
    e = make_env("mini-swe", split="dev", budget=Budget(max_steps=2))
    try:
        r = e.reset(0)
        e.step(act("list_files"), "k0")
        res = e.step(act("list_files"), "k1")
        assert res.truncated and not res.terminated and res.status == "BUDGET_EXHAUSTED"
        assert res.termination_reason == "budget_steps" and res.reward_components["resolved"] == 0.0
        assert r.task_id
    finally:
        e.close()


def test_gateway_blocks_escapes_inside_the_env(env) -> None:
    env.reset(0)
    res = env.step(act("read_file", path="../../../etc/passwd"), "k")
    assert res.status == "SAFETY_BLOCK" and res.gateway_events[0]["decision"] == "deny"
    res = env.step(act("run_tests", command="pytest; rm -rf /"), "k2")
    assert res.status == "SAFETY_BLOCK" and not res.gateway_events[0]["executed"]
    res = env.step(act("run_tests", command="bash -c ls"), "k3")
    assert res.status == "SAFETY_BLOCK"


def test_submit_is_idempotent_under_retries(env) -> None:
    env.reset(0)
    a = env.step(act("submit"), "same-key")
    assert a.terminated
    env.reset(0)
    b = env.step(act("submit"), "k1")
    assert b.terminated


def test_state_hash_tracks_edits_not_reads(env) -> None:
    r = env.reset(1)
    task = env.task_for(1)
    res = env.step(act("read_file", path=task["file"]), "a")
    assert res.state_hash == r.state_hash
    res = env.step(act("edit", path=task["file"], old="\n", new="\n\n"), "b")
    assert res.state_hash != r.state_hash or "exactly once" in res.observation


def test_faults_are_seeded_and_recorded(env) -> None:
    f = FaultInjector(rate=0.5, seed=7)
    decisions = [f.decide("ep", i) for i in range(200)]
    assert decisions == [FaultInjector(rate=0.5, seed=7).decide("ep", i) for i in range(200)]
    assert 60 < sum(d is not None for d in decisions) < 140
    heuristic = make_policy("mini-swe", "heuristic", "h-v1")
    task = env.tasks[0]
    rec = play_episode(env, heuristic, run_id="t", task_id=task["task_id"], task_version=task["task_version"],
                       seed=0, faults=f, task_view=task_view_fn(env))
    faulted = [t for t in rec.turns if t.get("fault_injected")]
    assert faulted and all(t["status"] == "ENV_TRANSIENT" for t in faulted)
    assert rec.episode["faults_injected"] == len(faulted)


# One dev task per Mini SWE repository: the rollout tests below check the runner's plumbing (resume, faults,
# crashes, engines, lag), which 4 tasks exercise as well as all 14 (each episode runs pytest in the sandbox).
FOUR_DEV_TASKS = ("mini-swe/durations/drop_branch/0", "mini-swe/fractionlib/flip_boolean/0",
                  "mini-swe/rangeset/flip_comparison/0", "mini-swe/textkit/flip_arithmetic/0")
SIX_DEV_TASKS = (*FOUR_DEV_TASKS, "mini-swe/fractionlib/swap_arguments/0", "mini-swe/textkit/wrong_variable/0")


@pytest.mark.slow
def test_rollout_resume_replay_and_cli(tmp_path: Path, capsys) -> None:
    lake = tmp_path / "lake"
    tasks = ",".join(FOUR_DEV_TASKS)
    code, out, err = run(capsys, "--lake", str(lake), "rollout", "--env", "mini-swe", "--policy", "heuristic",
                         "--split", "dev", "--seeds", "0-1", "--workers", "2", "--run-id", "H1", "--fault-rate", "0.2",
                         "--tasks", tasks)
    assert code == 0, err
    assert "8 episode(s) written" in out
    code, out, _ = run(capsys, "--lake", str(lake), "rollout", "--policy", "heuristic", "--split", "dev",
                       "--seeds", "0,1", "--workers", "2", "--run-id", "H1", "--fault-rate", "0.2", "--tasks", tasks)
    assert code == 0 and "0 episode(s) written" in out and "8 already in the lake" in out
    con = connect(lake)
    assert con.execute("select count(*), count(distinct episode_id) from episodes").fetchone() == (8, 8)
    assert con.execute("select count(*) from tasks").fetchone() == (80,)
    assert con.execute("select count(*) from runs").fetchone() == (1,)
    assert con.execute("select count(*) from turns where fault_injected is not null").fetchone()[0] > 0
    assert con.execute("select count(*) from gateway_events").fetchone()[0] > 0
    assert con.execute("select count(*) from episodes where env_image_digest like 'sha256:%'").fetchone() == (8,)
    assert verify(open_lake(lake), strict=True).ok
    # policy turns carry mask 1 and a version; observations mask 0
    assert con.execute("select bool_and(list_sum(loss_mask) = len(loss_mask)) from turns where actor = 'policy'"
                       ).fetchone() == (True,)
    assert con.execute("select max(list_sum(loss_mask)) from turns where actor <> 'policy'").fetchone() == (0,)
    ep = con.execute("select episode_id from episodes where faults_injected > 0 limit 1").fetchone()[0]
    code, out, err = run(capsys, "--lake", str(lake), "replay", "--episode", ep)
    assert code == 0 and "every state hash matches" in out, err
    code, _, err = run(capsys, "--lake", str(lake), "rollout", "--policy", "oracle", "--split", "dev",
                       "--seeds", "0", "--run-id", "H1", "--tasks", tasks)
    assert code == 1 and "another configuration" in err


def test_replay_names_the_first_diverging_turn(tmp_path: Path, capsys, env) -> None:
    from trajlake import LakeWriter

    oracle = make_policy("mini-swe", "oracle", "o")
    task = env.tasks[0]
    rec = play_episode(env, oracle, run_id="R", task_id=task["task_id"], task_version=task["task_version"], seed=0,
                       task_view=task_view_fn(env, oracle=True))
    edit_turn = next(t for t in rec.turns if t["actor"] == "env" and t["action_schema"] == "edit")
    edit_turn["env_state_hash"] = "f" * 64  # as if the environment had behaved differently then
    lake = open_lake(tmp_path / "lake", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_batch([rec.episode], rec.turns, rec.events).raise_if_rejected()
    code, _, err = run(capsys, "--lake", str(lake.root), "replay", "--episode", rec.episode["episode_id"])
    assert code == 2 and f"turn {edit_turn['turn_idx'] - 1}" in err


@pytest.mark.slow
def test_policy_lag_is_bounded(tmp_path: Path) -> None:
    versions = PolicyVersions(tmp_path, "heuristic")
    assert versions.latest_label() == "heuristic-v0" and versions.lag("x") == 0
    for v in ("v1", "v2", "v3"):
        versions.publish(v)
    assert versions.lag("v1") == 2 and versions.lag("v3") == 0 and versions.all() == ["v1", "v2", "v3"]
    lake = tmp_path / "lake"
    open_lake(lake, create=True)
    PolicyVersions(lake, "heuristic").publish("h-1")
    cfg = RolloutConfig(lake=str(lake), run_id="lag", env="mini-swe", policy="heuristic", split="dev", seeds=(0,),
                        max_policy_lag=0, task_ids=FOUR_DEV_TASKS[:2])
    s = run_rollout(cfg)
    assert s.written == 2
    assert connect(lake).execute("select distinct policy_version_start from episodes").fetchall() == [("h-1",)]


@pytest.mark.slow
def test_worker_crash_loses_nothing_and_resume_completes(tmp_path: Path) -> None:
    import signal
    import time

    lake = tmp_path / "lake"
    args = [sys.executable, "-m", "trajlake", "--lake", str(lake), "rollout", "--policy", "heuristic", "--split",
            "dev", "--seeds", "0-1", "--run-id", "crash", "--commit-every", "0", "--tasks", ",".join(SIX_DEV_TASKS)]
    p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        time.sleep(1.0)
        log = lake / "episodes" / DELTA_LOG
        if log.exists() and len(list(log.glob("*.json"))) > 4:
            break
    p.send_signal(signal.SIGKILL)
    p.wait()
    done_before = connect(lake).execute("select count(*) from episodes").fetchone()[0]
    assert 0 < done_before < 12
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    con = connect(lake)
    assert con.execute("select count(*), count(distinct episode_id) from episodes").fetchone() == (12, 12)
    assert verify(open_lake(lake)).ok


@pytest.mark.slow
def test_ray_engine(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    lake = tmp_path / "lake"
    cfg = RolloutConfig(lake=str(lake), run_id="ray", env="mini-swe", policy="oracle", split="dev", seeds=(0,),
                        workers=2, task_ids=FOUR_DEV_TASKS)
    s = run_rollout(cfg, engine="ray")
    assert s.written == 4 and s.successes == 4 and not s.failed_items
    import ray

    ray.shutdown()
    assert connect(lake).execute("select count(distinct episode_id) from episodes").fetchone() == (4,)


@pytest.mark.slow
def test_quickstart_main_job(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """``trajlake quickstart`` as the README runs it (Mini SWE, its default, with 2 workers), on 4 of the 14 dev
    tasks, one per project: the three policies, the oracle check, the paired report and the HTML. Each Mini SWE
    episode is a sandboxed grader run and the quickstart plays each task three times; that the oracle resolves
    every dev task (and every other one) is tests/test_mini_swe_tasks.py::
    test_every_task_fails_mutated_and_resolves_with_oracle."""
    import dataclasses

    from trajlake.rollout import quickstart

    tasks = tuple(t["task_id"] for t in list_tasks("mini-swe", "dev")[::4])  # one of each of its 4 projects
    play = quickstart.run_rollout

    def on_four_tasks(cfg: RolloutConfig) -> object:
        assert (cfg.env, cfg.split, cfg.task_ids, cfg.workers) == ("mini-swe", "dev", (), 2)  # the defaults
        return play(dataclasses.replace(cfg, task_ids=tasks))

    monkeypatch.setattr(quickstart, "run_rollout", on_four_tasks)
    lake = tmp_path / "lake"
    out = tmp_path / "report.html"
    code, text, err = run(capsys, "--lake", str(lake), "quickstart", "--seeds", "0", "--out", str(out),
                          "--resamples", "200")
    assert code == 0, err
    assert "quickstart-oracle: 4 new episode(s)" in text and "4 of the new ones successful" in text
    assert connect(lake).execute("select count(distinct task_id), count(*) from episodes").fetchone() == (4, 12)
    assert "quickstart-heuristic vs quickstart-random" in text or "Comparison" in text
    html = out.read_text()
    assert "<svg" in html and "quickstart-heuristic" in html and "http://" not in html.replace("http://www.w3.org", "")


@pytest.mark.parametrize("env_name", ["mini-swe", "mini-web", "tool-lookup"])
def test_a_wall_clock_budget_truncates_with_reason_timeout(env_name: str) -> None:
    """`budget={"max_seconds": S}`: the first step that ends more than S seconds after reset truncates the episode
    (reason `timeout`, never terminated too); a clock that has not run out changes nothing."""
    from trajlake.envs.core import BudgetTracker

    env = make_env(env_name, split="dev" if env_name != "tool-lookup" else None, budget={"max_seconds": 30})
    try:
        task = env.list_tasks()[0]
        now = [100.0]
        env.reset(0, task_id=task["task_id"])
        env.tracker = BudgetTracker(env.tracker.budget, clock=lambda: now[0])  # a clock the test moves
        action = json.dumps({"tool": next(iter(env.tool_docs)), "args": {}})
        first = env.step(action, "k0")
        assert not first.done, first.observation  # 0 s of 30
        now[0] += 31
        res = env.step(action, "k1")
        assert res.truncated and not res.terminated and res.termination_reason == "timeout"
        assert "The time budget is spent" in res.observation
    finally:
        env.close()


def test_max_seconds_must_be_a_non_negative_number() -> None:
    from trajlake.envs.core import EnvError

    with pytest.raises(EnvError, match="max_seconds must be a non-negative number"):
        make_env("tool-lookup", budget={"max_seconds": -1})


def test_mini_swe_give_up_ends_the_episode_unsolved_without_grading(env) -> None:
    """`give_up`: terminated (the task's own semantics), reason gave_up, resolved 0, and the hidden tests do not
    run (the episode's tool time is the call's, not a grader's)."""
    env.reset(0, task_id=env.tasks[0]["task_id"])
    assert "give_up" in env.reset(0, task_id=env.tasks[0]["task_id"]).observation  # the intro lists it
    res = env.step(json.dumps({"tool": "give_up", "args": {}}), "k0")
    assert res.terminated and not res.truncated and res.termination_reason == "gave_up"
    assert res.reward_components == {"resolved": 0.0, "partial": 0.0} and env.grade_result is None
    assert res.status == "OK" and "gave up" in res.observation
