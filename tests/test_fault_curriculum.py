"""The fault curriculum: fault kinds recorded per turn, held-out kinds, the rate schedule, per-kind recovery in
eval (hand-counted denominators), and replays of episodes that met faults."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from trajlake.envs import make_env
from trajlake.envs.mini_swe.env import MiniSWEEnv
from trajlake.envs.mini_swe.grading import load_tasks as swe_tasks
from trajlake.envs.mini_swe.policies import POLICIES as SWE_POLICIES
from trajlake.evaluators.data import load
from trajlake.evaluators.metrics import Settings
from trajlake.evaluators.report import evaluate

from tests.conftest import run_cli
from tests.test_eval_sql import episode, read, rows, write
from trajlake import open_lake
from trajlake.errors import TrajlakeError
from trajlake.query import connect
from trajlake.rollout.faults import (
    DEFAULT_FAULT_KINDS,
    FAULT_KINDS,
    FaultInjector,
    fault_rate_at,
    parse_fault_kinds,
)
from trajlake.rollout.replay import load_episode
from trajlake.rollout.runner import RolloutConfig, play_episode, replay_log_from_rows, run_rollout

WEB_TASKS = ("mini-web/compare/higher-rated/2000", "mini-web/inbox/reply-email/14000",
             "mini-web/tickets/triage/12000")


def test_injector_kinds_held_out_and_determinism() -> None:
    f = FaultInjector(rate=1.0, seed=3, kinds=("http_5xx", "slow_response", "truncated_result"),
                      held_out="slow_response")
    drawn = Counter(f.decide("ep", i) for i in range(300))
    assert set(drawn) == {"http_5xx", "truncated_result"}  # the held-out kind is never injected
    assert [f.decide("ep", i) for i in range(50)] == [
        FaultInjector(1.0, 3, ("http_5xx", "slow_response", "truncated_result"), "slow_response").decide("ep", i)
        for i in range(50)]
    # the held-out evaluation run injects only that kind
    assert {FaultInjector(1.0, 3, ("slow_response",)).decide("ep", i) for i in range(50)} == {"slow_response"}
    # the default kinds are the first two, so runs recorded before the others existed replay the same faults
    assert DEFAULT_FAULT_KINDS == ("transient", "timeout") and FaultInjector().kinds == DEFAULT_FAULT_KINDS
    with pytest.raises(TrajlakeError, match="unknown fault kind"):
        parse_fault_kinds("http_5xx,gremlins")
    with pytest.raises(TrajlakeError, match="no fault kind left"):
        FaultInjector(0.5, 0, ("http_5xx",), held_out="http_5xx")
    assert set(FAULT_KINDS) >= {"http_5xx", "slow_response", "stale_element_ids", "truncated_result",
                                "flaky_test_run", "transient", "timeout"}


def test_fault_rate_schedule_is_per_iteration() -> None:
    schedule = (0.0, 0.1, 0.2, 0.4)
    assert [fault_rate_at(i, schedule) for i in range(6)] == [0.0, 0.1, 0.2, 0.4, 0.4, 0.4]
    assert fault_rate_at(5, ()) == 0.0
    with pytest.raises(ValueError):
        fault_rate_at(0, (1.5,))


def test_recovery_rate_per_kind_counts_only_episodes_that_met_that_kind(tmp_path: Path) -> None:
    fail: dict[str, Any] = {"success": False, "error_class": "MODEL_BAD_PLAN"}

    def fault(kind: str) -> Any:
        return read("a.py", status="ENV_TRANSIENT", fault=kind)

    eps = [
        # http_5xx met by 3 episodes, 2 of them solved
        episode("h1", task="t0", steps=[fault("http_5xx"), read("a.py")]),
        episode("h2", task="t1", steps=[fault("http_5xx"), read("a.py")]),
        episode("h3", task="t2", steps=[fault("http_5xx"), read("b.py")], **fail),
        # slow_response met by 2 (one of them also met http_5xx: in both denominators), 0 solved
        episode("s1", task="t3", steps=[fault("slow_response"), read("a.py")], **fail),
        episode("hs", task="t4", steps=[fault("http_5xx"), fault("slow_response")], **fail),
        # truncated_result: the call ran, status OK, still a fault the episode met; solved
        episode("t1", task="t5", steps=[read("a.py", fault="truncated_result"), read("a.py")]),
        # no fault met: in no recovery denominator
        episode("clean", task="t6", steps=[read("a.py")]),
    ]
    lk = open_lake(tmp_path / "lake", create=True)
    write(lk, eps)
    data = load(lk)
    try:
        report = evaluate(data, settings=Settings(resamples=200, seed=1), taxonomy=False)
        r = rows(data)
    finally:
        data.close()
    m = report["runs"]["run-A"]["metrics"]
    assert (m["recovery_rate_http_5xx"]["estimate"], m["recovery_rate_http_5xx"]["n"]) == (pytest.approx(2 / 4), 4)
    assert (m["recovery_rate_slow_response"]["estimate"], m["recovery_rate_slow_response"]["n"]) == (0.0, 2)
    assert (m["recovery_rate_truncated_result"]["estimate"], m["recovery_rate_truncated_result"]["n"]) == (1.0, 1)
    assert m["recovery_rate_flaky_test_run"]["n"] == 0  # no episode met it: no data, not 0
    assert (m["recovery_rate"]["estimate"], m["recovery_rate"]["n"]) == (pytest.approx(3 / 6), 6)
    assert r["hs"]["met_fault_http_5xx"] == r["hs"]["met_fault_slow_response"] == 1
    assert r["clean"]["met_fault_http_5xx"] == 0 and r["clean"]["recovered"] is None


def _replays(env: Any, lake: Path, run_id: str) -> None:
    """Every episode of the run replays hash-identically: steps a fault kept from running are skipped, calls that
    ran under a fault (slow or truncated answers) are played again."""
    con = connect(lake)
    for (ep_id,) in con.execute("select episode_id from episodes where run_id = ?", [run_id]).fetchall():
        ep, turns = load_episode(lake, ep_id)
        log, _ = replay_log_from_rows(ep, turns)
        report = env.replay(log)
        assert report.ok, (ep_id, report)


def test_mini_web_rollout_records_every_kind_and_replays(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    kinds = ("http_5xx", "slow_response", "truncated_result", "stale_element_ids")
    cfg = RolloutConfig(lake=str(lake), run_id="faulty", env="mini-web", policy="oracle", split="train",
                        seeds=(0, 1, 2, 3), commit_every_s=0, task_ids=WEB_TASKS, fault_rate=0.5, fault_seed=5,
                        fault_kinds=kinds, held_out_fault_kind="timeout")
    s = run_rollout(cfg)
    assert not s.failed_items
    con = connect(lake)
    seen = {k for (k,) in con.execute("select distinct fault_injected from turns where fault_injected is not null"
                                      ).fetchall()}
    assert seen <= set(kinds) and {"http_5xx", "stale_element_ids"} <= seen, seen
    stale = con.execute("select raw_content, status from turns where fault_injected = 'stale_element_ids'").fetchall()
    assert all("is stale" in text and "URL:" in text and status == "ENV_TRANSIENT" for text, status in stale)
    cut = con.execute("select raw_content from turns where fault_injected = 'truncated_result'").fetchall()
    assert all(text.endswith("[... the tool's output was cut off here]") for (text,) in cut)
    config = json.loads(con.execute("select config from runs").fetchone()[0])
    assert config["fault_kinds"] == list(kinds) and config["held_out_fault_kind"] == "timeout"
    assert "--fault-kinds http_5xx,slow_response,truncated_result,stale_element_ids" in config["reproduce"]
    env = make_env("mini-web", split="train")
    try:
        _replays(env, lake, "faulty")
    finally:
        env.close()


def test_mini_swe_flaky_test_run(tmp_path: Path) -> None:
    task = next(t for t in swe_tasks() if t["split"] == "dev")
    env = MiniSWEEnv(tasks=[task], workdir=tmp_path)
    try:
        rec = play_episode(env, SWE_POLICIES["oracle"]("o"), run_id="flaky", task_id=task["task_id"],
                           task_version=task["task_version"], seed=0,
                           faults=FaultInjector(1.0, 0, ("flaky_test_run",)))
    finally:
        env.close()
    flaky = [t for t in rec.turns if t.get("fault_injected")]
    # only the test run is flaky (every step drew the kind; it applies to run_tests only)
    assert [t["action_schema"] for t in flaky] == ["run_tests"]
    assert flaky[0]["raw_content"].startswith("FAILED ") and "ConnectionResetError" in flaky[0]["raw_content"]
    assert rec.episode["success"] and rec.episode["faults_injected"] == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--fault-kinds", "gremlins"], "unknown fault kind(s) gremlins"),
    (["--fault-kinds", "flaky_test_run"], "environment 'mini-web' cannot inject fault kind(s) flaky_test_run"),
])
def test_fault_kind_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                        message: str) -> None:
    lake = tmp_path / "lake"
    code, _, err = run_cli(capsys, "rollout", "--lake", str(lake), "--env", "mini-web", "--policy", "oracle",
                           "--fault-rate", "0.2", "--no-preflight", *args)
    assert code != 0 and message in err and len(err.strip().splitlines()) == 1, err
    assert not lake.exists()
