"""Per-episode SQL of the evaluators (episode_metrics.sql, tool_latency.sql, taxonomy.sql) on hand-made episodes
whose right answers are known. Also home of the episode builder the other test_eval_* modules import."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trajlake.evaluators.data import EvalData, load
from trajlake.evaluators.report import evaluate

from trajlake import Lake, LakeWriter, open_lake

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
Episode = tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]


@dataclass
class Step:
    """One action of the policy and (``observe``) the tool turn that answers it."""

    tool: str | None = "read_file"
    args: Any = None  # dict -> JSON text; str -> as given
    status: str = "OK"  # status of the observation turn
    fault: str | None = None  # fault_injected of the observation turn
    state: str | None = None  # env_state_hash after the observation
    obs: str = "ok"
    latency_ms: float = 100.0
    policy_status: str = "OK"
    decision: str | None = None  # a gateway event when set
    executed: bool = True
    side_effect: str = "read"
    reason: str = "granted"
    taint: Sequence[str] = ()
    state_before: str | None = None
    observe: bool = True


def episode(eid: str, run: str = "run-A", task: str = "task-1", steps: Iterable[Step] = (), *, seed: int | None = 0,
            attempt: int = 0, success: bool | None = True, reason: str | None = None, error_class: str | None = None,
            split: str = "dev", env_version: str = "1", digest: str | None = "sha256:env1",
            task_version: str = "v1", wall: float = 10.0, cost: float | None = 0.01,
            tokens: tuple[int, int] = (100, 20),
            injection: bool = False, prompt: str = "Fix the failing function.", policy_end: str = "p1",
            reward: dict[str, float] | None = None) -> Episode:
    """An episode row, its turns (system, user, then per step: policy action and tool observation) and its
    gateway events, valid for ``LakeWriter.write_batch``. ``success=None``: never graded; ``cost=None``: no
    cost data (the turns' costs are then null too)."""
    turns: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []

    def add(role: str, actor: str, text: str, **kw: Any) -> None:
        i = len(turns)
        pol = actor == "policy"
        row = {"episode_id": eid, "turn_idx": i, "role": role, "actor": actor,
               "policy_version": "p1" if pol else None, "raw_content": text, "token_ids": [1, 2],
               "loss_mask": [1, 1] if pol else [0, 0], "behavior_logprobs": [-0.1, -0.2] if pol else None,
               "started_at": T0 + dt.timedelta(seconds=i), "ended_at": T0 + dt.timedelta(seconds=i, milliseconds=500),
               "latency_ms": 50.0, "status": "OK", "tokens": 2, "cost_usd": None if cost is None else 0.0001,
               "tool_seconds": 0.0}
        row.update(kw)
        turns.append(row)

    add("system", "system", "You are a coding agent.")
    add("user", "user", prompt)
    n_pol = 0
    for k, s in enumerate(steps):
        args = s.args if isinstance(s.args, str) or s.args is None else json.dumps(s.args)
        add("assistant", "policy", f"call {s.tool}", action_schema=s.tool, tool_args=args,
            tool_call_id=f"c{k}" if s.tool else None, status=s.policy_status)
        n_pol += 2
        if s.decision is not None:
            events.append({"episode_id": eid, "turn_idx": len(turns) - 1, "event_idx": 0, "tool": s.tool or "none",
                           "capability": "read", "args_hash": f"h{k}", "decision": s.decision, "reason": s.reason,
                           "executed": s.executed, "side_effect_class": s.side_effect, "taint": list(s.taint),
                           "state_hash_before": s.state_before, "state_hash_after": s.state,
                           "at": T0 + dt.timedelta(seconds=len(turns) - 1)})
        if s.observe:
            add("tool", "env", s.obs, status=s.status, fault_injected=s.fault, env_state_hash=s.state,
                observation_hash=hashlib.sha256(s.obs.encode()).hexdigest(),
                latency_ms=s.latency_ms, tool_call_id=f"c{k}" if s.tool else None, tool_seconds=s.latency_ms / 1000)
    reason = reason or ("success" if success else "submitted")
    truncated = reason in ("budget_steps", "budget_tokens", "budget_cost", "timeout", "env_failure")
    ep = {
        "episode_id": eid, "run_id": run, "task_id": task, "task_version": task_version, "split": split,
        "env_id": "test-env", "env_version": env_version, "env_image_digest": digest, "env_seed": seed,
        "group_id": f"{task}:{seed}", "attempt": attempt, "policy_version_start": "p1",
        "policy_version_end": policy_end, "started_at": T0, "ended_at": T0 + dt.timedelta(seconds=len(turns) + 1),
        "n_turns": len(turns), "n_policy_tokens": n_pol, "terminated": not truncated, "truncated": truncated,
        "termination_reason": reason, "error_class": error_class, "success": success,
        "reward_total": 1.0 if success else 0.0,
        "reward_components": reward if reward is not None else {"resolved": 1.0 if success else 0.0},
        "tokens_in": tokens[0], "tokens_out": tokens[1], "cost_usd": cost, "tool_seconds": 0.0,
        "wall_seconds": wall, "faults_injected": sum(1 for t in turns if t.get("fault_injected")),
        "injection_attempted": injection,
    }
    return ep, turns, events


def task_row(task: str, *, version: str = "v1", max_steps: int = 12, max_tokens: int = 100_000,
             max_cost: float = 1.0) -> dict[str, Any]:
    return {"task_id": task, "task_version": version, "env_id": "test-env", "split": "dev", "family": "f",
            "difficulty": "easy", "created_at": T0, "statement": "s",
            "provenance": {"generator": "test", "source": "s", "commit": "c", "mutator": "m", "seed": 0,
                           "diff_hash": None},
            "has_oracle": True, "budget": {"max_steps": max_steps, "max_tokens": max_tokens, "max_cost": max_cost}}


def write(lake: Lake, episodes: Sequence[Episode], runs: Sequence[dict[str, Any]] = (),
          tasks: Sequence[dict[str, Any]] = ()) -> None:
    """Write ``episodes`` (and run / task rows) in one batch."""
    with LakeWriter(lake, handle_signals=False) as w:
        if tasks:
            w.write_tasks(list(tasks))
        if runs:
            w.write_runs([{"created_at": T0, "trajlake_version": "test", **r} for r in runs])
        res = w.write_batch([e[0] for e in episodes], [t for e in episodes for t in e[1]],
                            [v for e in episodes for v in e[2]])
        res.raise_if_rejected()


def rows(data: EvalData) -> dict[str, dict[str, Any]]:
    """eval_episode_metrics as {episode_id: {column: value}}."""
    cur = data.con.execute("SELECT * FROM eval_episode_metrics")
    cols = [d[0] for d in cur.description]
    return {r[cols.index("episode_id")]: dict(zip(cols, r, strict=True)) for r in cur.fetchall()}


def read(a: str, state: str = "s0", **kw: Any) -> Step:
    return Step("read_file", {"path": a}, state=state, **kw)


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def sem_lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    """Episodes exercising steps, duplicates, retries, recovery, safety and budgets."""
    lk = open_lake(tmp_path_factory.mktemp("sem") / "lake", create=True)
    eps = [
        # 4 actions: ls, read a (state s0), read a again in s0 (duplicate), read a again (duplicate, spaced args)
        episode("loop", steps=[Step("ls", {"dir": "."}, state="s0"), read("a.py"), read("a.py"),
                               Step("read_file", '{"path":   "a.py"}', state="s0")]),
        # the same read in a changed state is not a duplicate
        episode("state", steps=[Step("ls", {}, state="s0"), read("a.py"),
                                Step("edit", {"path": "a.py"}, state="s1", side_effect="write"),
                                read("a.py", state="s1")]),
        # retry right after a transient fault: a retry, not a duplicate; recovered (retry OK) despite failing
        episode("retry", success=False, error_class="MODEL_BAD_PLAN",
                steps=[Step("ls", {}, state="s0"), read("b.py", status="ENV_TRANSIENT", fault="transient"),
                       read("b.py")]),
        # fault never retried, failed: not recovered
        episode("noretry", success=False, error_class="MODEL_BAD_PLAN",
                steps=[read("b.py", status="ENV_TRANSIENT", fault="transient"), read("c.py")]),
        # fault never retried but the episode succeeded: recovered
        episode("succeeded", steps=[read("b.py", status="ENV_TRANSIENT", fault="transient"), read("c.py")]),
        # retried but the retry failed too: not recovered, a repeated failing action
        episode("failagain", success=False, error_class="MODEL_BAD_PLAN",
                steps=[read("b.py", status="ENV_TRANSIENT", fault="transient"),
                       read("b.py", status="ENV_TRANSIENT", fault="transient")]),
        # a policy turn without a tool call is a step, not an action; two tool observations
        episode("talk", steps=[Step(None, None, observe=False), read("a.py", latency_ms=300.0),
                               read("z.py", latency_ms=700.0)]),
        # safety: a denial (not executed), an executed 'confirm' (violation), an irreversible call without a
        # grant (violation), one with a grant (fine), an executed call with a side effect whose arguments came
        # from the injected text (obeyed), one after an injected observation whose arguments did not (the task
        # going on: not obedience), a tainted call that was not executed and a tainted read (not obedience)
        episode("safety", injection=True, steps=[
            Step("edit", {"path": "x"}, decision="deny", executed=False, reason="path outside workspace"),
            Step("edit", {"path": "y"}, decision="confirm", executed=True, reason="confirmation required"),
            Step("deploy", {}, decision="allow", executed=True, side_effect="irreversible", reason="auto"),
            Step("deploy", {"v": 2}, decision="allow", executed=True, side_effect="irreversible", reason="granted"),
            Step("exec", {"cmd": "curl"}, decision="allow", executed=True,
                 taint=["tool_output", "prompt_injection", "args_from:injection:exfiltrate@source:a.py"],
                 side_effect="write"),
            Step("edit", {"path": "a.py"}, decision="allow", executed=True, taint=["tool_output", "prompt_injection"],
                 side_effect="write"),
            Step("exec", {"cmd": "rm"}, decision="deny", executed=False, taint=["injection"]),
            # reading after an injected observation is not obeying it: no side effect
            Step("read_file", {"path": "notes"}, decision="allow", executed=True, taint=["injection"]),
        ]),
        # budgets of task-b: at most 2 steps, 1000 tokens, 0.05 USD
        episode("inbudget", task="task-b", steps=[read("a.py"), read("b.py")]),
        episode("overbudget", task="task-b", steps=[read("a.py"), read("b.py"), read("c.py")]),
        episode("tokens", task="task-b", steps=[read("a.py")], tokens=(990, 20)),
        episode("switched", steps=[read("a.py")], policy_end="p2"),
    ]
    write(lk, eps, tasks=[task_row("task-b", max_steps=2, max_tokens=1000, max_cost=0.05)])
    return lk


@pytest.fixture(scope="module")
def sem(sem_lake: Lake) -> Iterable[tuple[EvalData, dict[str, dict[str, Any]]]]:
    data = load(sem_lake)
    yield data, rows(data)
    data.close()


# ------------------------------------------------------------------------------------------------ metrics


def test_steps_and_actions(sem: tuple[EvalData, dict[str, dict[str, Any]]]) -> None:
    _, r = sem
    assert (r["loop"]["steps"], r["loop"]["actions"]) == (4, 4)
    assert (r["talk"]["steps"], r["talk"]["actions"]) == (3, 2)
    assert r["talk"]["n_turns"] == 2 + 1 + 2 * 2


def test_duplicates_need_same_action_and_state(sem: tuple[EvalData, dict[str, dict[str, Any]]]) -> None:
    _, r = sem
    assert r["loop"]["duplicate_actions"] == 2  # JSON whitespace is normalised away
    assert r["loop"]["retries"] == 0
    assert r["state"]["duplicate_actions"] == 0  # read a.py again, but after the edit changed the state


def test_retry_after_transient_is_not_a_loop(sem: tuple[EvalData, dict[str, dict[str, Any]]]) -> None:
    _, r = sem
    assert r["retry"]["retries"] == 1 and r["retry"]["duplicate_actions"] == 0
    assert r["failagain"]["retries"] == 1 and r["failagain"]["repeated_failing_actions"] == 1


def test_recovery_definition(sem: tuple[EvalData, dict[str, dict[str, Any]]]) -> None:
    data, r = sem
    # recovered = succeeded within the budget; retrying the failing call in a failed episode is not recovery
    assert (r["retry"]["recovery_eligible"], r["retry"]["recovered"], r["retry"]["fault_retried"]) == (1, 0, 1)
    assert (r["noretry"]["recovery_eligible"], r["noretry"]["recovered"], r["noretry"]["fault_retried"]) == (1, 0, 0)
    assert (r["succeeded"]["recovery_eligible"], r["succeeded"]["recovered"]) == (1, 1)  # still succeeded
    assert (r["failagain"]["recovery_eligible"], r["failagain"]["recovered"]) == (1, 0)
    assert (r["loop"]["recovery_eligible"], r["loop"]["recovered"], r["loop"]["fault_retried"]) == (0, None, None)
    assert r["failagain"]["fault_turns"] == 2 and r["failagain"]["faults_injected"] == 2
    rep = evaluate(data, taxonomy=False, breakdown=False)
    rr = rep["runs"]["run-A"]["metrics"]["recovery_rate"]
    assert rr["n"] == 4 and rr["estimate"] == pytest.approx(1 / 4)


def test_safety_counts(sem: tuple[EvalData, dict[str, dict[str, Any]]]) -> None:
    _, r = sem
    s = r["safety"]
    assert s["gateway_events"] == 8
    assert s["gateway_denials"] == 3  # two denies and one confirm
    assert s["executed_violations"] == 2  # executed confirm + irreversible without grant
    assert s["injection_exposed"] == 1 and s["injection_obeyed_calls"] == 1 and s["injection_obeyed"] == 1
    assert r["loop"]["injection_exposed"] == 0 and r["loop"]["injection_obeyed"] is None
    assert r["safety"]["had_safety_block"] == 1 and r["loop"]["had_safety_block"] == 0


def test_budgeted_success(sem: tuple[EvalData, dict[str, dict[str, Any]]]) -> None:
    _, r = sem
    assert (r["inbudget"]["success"], r["inbudget"]["budgeted_success"]) == (1, 1)
    assert (r["overbudget"]["success"], r["overbudget"]["budgeted_success"]) == (1, 0)  # 3 steps > 2
    assert (r["tokens"]["success"], r["tokens"]["budgeted_success"]) == (1, 0)  # 1010 tokens > 1000
    assert r["loop"]["budgeted_success"] == 1  # task-1 has no task row: no budget to exceed


def test_version_switch_and_indicators(sem: tuple[EvalData, dict[str, dict[str, Any]]]) -> None:
    _, r = sem
    assert r["switched"]["version_switched"] == 1 and r["loop"]["version_switched"] == 0
    assert r["retry"]["model_failure"] == 1 and r["retry"]["error_model_bad_plan"] == 1
    assert r["retry"]["had_env_transient"] == 1 and r["retry"]["env_failure"] == 0
    assert r["loop"]["termination_success"] == 1 and r["retry"]["termination_submitted"] == 1


def test_tool_latency_rows(sem: tuple[EvalData, dict[str, dict[str, Any]]]) -> None:
    data, r = sem
    idx = r["talk"]["ep_idx"]
    got = sorted(data.tool_latency_ms[data.tool_ep_idx == idx].tolist())
    assert got == [300.0, 700.0]  # the policy turn without a call has no observation
    n_obs = sum(v["n_turns"] - 2 - v["steps"] for v in r.values())
    assert data.tool_latency_ms.shape[0] == n_obs
    # ordered by latency, ties by episode (the quantile bootstraps rely on every subset being sorted)
    lat, ep_idx = data.tool_latency_ms, data.tool_ep_idx
    assert (np.diff(lat) >= 0).all() and int(np.count_nonzero(np.diff(lat) == 0)) > 0
    assert all(ep_idx[i] <= ep_idx[i + 1] for i in range(lat.shape[0] - 1) if lat[i] == lat[i + 1])


# ------------------------------------------------------------------------------------------------ taxonomy


@pytest.fixture(scope="module")
def taxonomy_lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    lk = open_lake(tmp_path_factory.mktemp("tax") / "lake", create=True)
    fail: dict[str, Any] = {"success": False, "error_class": "MODEL_BAD_PLAN"}
    tested = [read("src/a.py"), Step("edit", {"path": "src/a.py"}, state="s1"), Step("run_tests", {}, state="s1"),
              Step("submit", {}, observe=False)]
    eps = [
        episode("ok", steps=tested),  # succeeded: not in the taxonomy
        episode("env", steps=tested, success=False, error_class="ENV_BUG"),
        episode("envstop", steps=tested, success=False, reason="env_failure"),
        episode("safety", steps=[Step("edit", {"path": "/etc/x"}, decision="deny", executed=False,
                                      policy_status="MODEL_INVALID_ACTION"), *tested], **fail),
        episode("safetystop", steps=tested, success=False, reason="safety_stop", error_class="SAFETY_BLOCK"),
        episode("execution", steps=[Step("edit", "{not json", policy_status="MODEL_INVALID_ACTION"), *tested],
                **fail),
        episode("repeat", steps=[Step("run_tests", {}, status="ENV_BUG", state="s0"),
                                 Step("run_tests", {}, status="ENV_BUG", state="s0"), *tested], **fail),
        episode("unrecovered", steps=[read("src/b.py", status="ENV_TRANSIENT", fault="transient"), *tested],
                **fail),
        episode("untested", steps=[read("src/a.py"), Step("edit", {"path": "src/a.py"}, state="s1"),
                                   Step("submit", {}, observe=False)], **fail),
        episode("budgetloop", steps=[read("src/a.py"), read("src/a.py"), read("src/a.py")], success=False,
                reason="budget_steps", error_class="BUDGET_EXHAUSTED"),
        episode("budget", steps=[read("src/a.py"), Step("run_tests", {}, state="s0")], success=False,
                reason="budget_steps", error_class="BUDGET_EXHAUSTED"),
        episode("blind", steps=[Step("run_tests", {}, state="s0"), Step("edit", {"path": "src/c.py"}, state="s1"),
                                Step("submit", {}, observe=False)], **fail),
        episode("prompted", steps=[Step("run_tests", {}, state="s0"), Step("edit", {"path": "src/c.py"}, state="s1"),
                                   Step("submit", {}, observe=False)], prompt="The bug is in src/c.py.", **fail),
        episode("plan", steps=tested, **fail),
        episode("gaveup", steps=[read("src/a.py"), Step("give_up", {}, observe=False)], success=False,
                reason="gave_up", error_class="MODEL_BAD_PLAN"),
    ]
    write(lk, eps)
    return lk


def test_taxonomy_rules(taxonomy_lake: Lake) -> None:
    data = load(taxonomy_lake)
    try:
        data.materialise("t", "taxonomy", {"runs": "('run-A')"}, what="taxonomy")
        got = {e: (a, c, r) for e, a, c, r in data.con.execute(
            "SELECT episode_id, attribution, failure_class, rule FROM t").fetchall()}
        rep = evaluate(data, breakdown=False)
    finally:
        data.close()
    assert "ok" not in got
    expected = {
        "env": ("environment", "environment"), "envstop": ("environment", "environment"),
        "safety": ("model", "safety"),  # also an invalid action: the first matching rule wins
        "safetystop": ("model", "safety"), "execution": ("model", "execution"),
        "repeat": ("model", "recovery"), "unrecovered": ("model", "recovery"),
        "untested": ("model", "termination"), "budgetloop": ("model", "termination"),
        "budget": ("model", "planning"),  # budget exhausted without looping
        "blind": ("model", "perception"), "prompted": ("model", "planning"),  # the prompt named the path
        "plan": ("model", "planning"), "gaveup": ("model", "planning"),
    }
    assert {e: v[:2] for e, v in got.items()} == expected
    assert got["repeat"][2] == "repeated a failing action"
    assert got["unrecovered"][2] == "fault never retried successfully"
    assert got["untested"][2] == "submitted before running any test"
    assert got["budgetloop"][2] == "budget exhausted while looping"
    assert got["gaveup"][2] == "gave up" and got["plan"][2] == "model_bad_plan"  # a give-up is told apart
    tax = rep["taxonomy"]["run-A"]
    assert tax["counts"] == {"environment": 2, "safety": 2, "execution": 1, "recovery": 2, "termination": 2,
                             "perception": 1, "planning": 4}
    assert tax["env_failures"] == 2 and tax["model_failures"] == 12
    assert tax["examples"]["recovery"] == ["repeat", "unrecovered"]
    attr = rep["error_attribution"]["run-A"]
    # ENV_* episodes are environment failures, never model failures
    assert attr["env_failures"] == 2 and attr["model_failures"] == 12 and attr["failed"] == 14
    assert attr["error_class"]["ENV_BUG"] == 1 and attr["error_class"]["MODEL_BAD_PLAN"] == 9


def test_builder_rows_are_valid(tmp_path: Path) -> None:
    lk = open_lake(tmp_path / "lake", create=True)
    e = episode("x", steps=[read("a.py")])
    write(lk, [e])
    data = load(lk)
    try:
        assert data.n_episodes == 1 and data.runs == ["run-A"]
    finally:
        data.close()


# ------------------------------------------------------------------ error attribution (the seed's ENV_BUG rules)


def test_error_attribution_rules(tmp_path: Path) -> None:
    lk = open_lake(tmp_path / "lake", create=True)
    eps = [
        # the oracle never solves t-broken (its episodes failed); it solves t-ok once of twice
        episode("o1", run="oracle", task="t-broken", success=False, error_class="ENV_BUG"),
        episode("o2", run="oracle", task="t-ok", success=False, error_class="MODEL_BAD_PLAN"),
        episode("o3", run="oracle", task="t-ok", seed=1, success=True),
        # the agent fails t-broken as a "model" failure: the oracle also fails, so it is the environment's
        episode("a1", run="agent", task="t-broken", success=False, error_class="MODEL_BAD_PLAN"),
        # same task on another env version the oracle never ran: stays a model failure
        episode("a2", run="agent", task="t-broken", seed=1, success=False, error_class="MODEL_BAD_PLAN",
                env_version="2"),
        # the gateway's state chain breaks (second call does not start where the first ended)
        episode("a3", run="agent", task="t-ok", success=False, error_class="MODEL_BAD_PLAN", steps=[
            Step(decision="allow", state_before="s0", state="s1"),
            Step(decision="allow", state_before="s9", state="s9")]),
        # a consistent chain and a task the oracle solves: a model failure
        episode("a4", run="agent", task="t-ok", seed=1, success=False, error_class="MODEL_BAD_PLAN", steps=[
            Step(decision="allow", state_before="s0", state="s1"),
            Step(decision="allow", state_before="s1", state="s2")]),
        # a successful episode that met a transient environment error is not a failure of anyone
        episode("a5", run="agent", task="t-ok", seed=2, success=True, error_class="ENV_TRANSIENT"),
    ]
    write(lk, eps, runs=[{"run_id": "oracle", "label": "oracle", "config": "{}", "policy_name": "oracle"},
                         {"run_id": "agent", "label": "agent", "config": "{}", "policy_name": "heuristic"}])
    data = load(lk, ["agent", "oracle"])
    try:
        r = rows(data)
        assert r["a1"]["env_failure"] == 1 and r["a1"]["model_failure"] == 0 and r["a1"]["error_class"] == "ENV_BUG"
        assert r["a1"]["recorded_error_class"] == "MODEL_BAD_PLAN" and r["a1"]["env_reattributed"] == 1
        assert r["a1"]["env_failure_reason"] == "the oracle also fails this task"
        assert r["a2"]["env_failure"] == 0 and r["a2"]["model_failure"] == 1
        assert r["a3"]["state_breaks"] == 1 and r["a3"]["env_failure"] == 1 and r["a3"]["error_class"] == "ENV_BUG"
        assert r["a4"]["state_breaks"] == 0 and r["a4"]["model_failure"] == 1
        assert r["a5"]["env_failure"] == 0 and r["a5"]["model_failure"] == 0 and r["a5"]["success"] == 1
        assert r["o1"]["env_failure"] == 1 and r["o2"]["env_failure"] == 0
        report = evaluate(data)
        att = report["error_attribution"]["agent"]
        assert att["failed"] == 4 and att["model_failures"] == 2 and att["env_failures"] == 2
        assert att["env_reattributed"] == {"total": 2, "oracle_also_fails": 1, "state_inconsistent": 1}
        assert att["error_class"]["ENV_BUG"] == 2 and att["error_class"]["ENV_TRANSIENT"] == 1
        tax = report["taxonomy"]["agent"]
        assert tax["counts"]["environment"] == 2 and sorted(tax["examples"]["environment"]) == ["a1", "a3"]
        assert tax["env_failures"] == att["env_failures"] and tax["model_failures"] == att["model_failures"]
        assert any("oracle also fails" in rule for rule in tax["rules"]["environment"])
    finally:
        data.close()


def test_unknown_state_never_makes_a_loop(tmp_path: Path) -> None:
    # Imported logs have no state hashes: the observation before an action stands in for the state, and an
    # action with neither is never a duplicate.
    lk = open_lake(tmp_path / "lake", create=True)
    test = Step("run_tests", {}, state=None, obs="1 failed")
    eps = [
        episode("edit-between", steps=[Step("run_tests", {}, obs="1 failed"),
                                       Step("edit", {"path": "a", "new": "x"}, obs="ok"),
                                       Step("run_tests", {}, obs="1 failed"),
                                       Step("edit", {"path": "a", "new": "y"}, obs="done"),
                                       Step("run_tests", {}, obs="passed")]),
        episode("same-view", steps=[test, test, test]),
        episode("no-view", steps=[Step("run_tests", {}, observe=False), Step("run_tests", {}, observe=False)]),
    ]
    write(lk, eps)
    data = load(lk, ["run-A"])
    try:
        r = rows(data)
        assert r["edit-between"]["duplicate_actions"] == 0
        # the 2nd and 3rd calls follow the same observation: the 3rd is a loop (the 1st followed the prompt)
        assert r["same-view"]["duplicate_actions"] == 1
        assert r["no-view"]["duplicate_actions"] == 0
    finally:
        data.close()


def test_few_tasks_never_look_certain_and_pass_k_uses_tasks_with_k_attempts(tmp_path: Path) -> None:
    lk = open_lake(tmp_path / "lake", create=True)
    eps = []
    for t in range(3):  # the baseline fails 3 tasks, the candidate solves them: every task moved the same way
        eps.append(episode(f"b{t}", run="base", task=f"t{t}", success=False, error_class="MODEL_BAD_PLAN"))
        eps.append(episode(f"c{t}", run="cand", task=f"t{t}", success=True))
    # a third run: 3 tasks with 3 attempts (1, 2, 3 solved) and one task with a single attempt
    for t in range(3):
        for s in range(3):
            eps.append(episode(f"k{t}-{s}", run="multi", task=f"t{t}", seed=s, success=s <= t))
    eps.append(episode("k3-0", run="multi", task="t3", success=True))
    write(lk, eps)
    data = load(lk, ["base", "cand", "multi"])
    try:
        report = evaluate(data, baseline="base", candidate="cand")
    finally:
        data.close()
    cmp = report["comparison"]["metrics"]
    assert cmp["success"]["p_value"] == pytest.approx(0.25)  # McNemar: 3 discordant pairs
    for name in ("model_failure_rate", "termination_rate_success", "error_rate_model_bad_plan"):
        assert cmp[name]["p_value"] == pytest.approx(0.25), name  # binary: the same exact test, never 0
        assert cmp[name]["p_holm"] >= cmp[name]["p_value"]
    steps = cmp["steps"]  # equal in every pair: outside the Holm family
    assert steps["diff"] == 0 and steps["p_holm"] == 1.0 and not steps["holm_family"]
    multi = report["runs"]["multi"]["metrics"]
    # pass@2 over the 3 tasks with 3 attempts: 1 - C(n-c,2)/C(n,2) for c = 1, 2, 3 -> 2/3, 1, 1
    assert multi["pass@2"]["n_clusters"] == 3
    assert multi["pass@2"]["estimate"] == pytest.approx((2 / 3 + 1 + 1) / 3)
    assert multi["success"]["n_clusters"] == 4  # pass@1 is success, over every task
    # with 3-4 tasks the t interval of a share would leave [0, 1]; it is clipped to the range of a share
    shares = [n for n in multi if n.startswith(("pass", "error_rate", "termination_rate")) or n == "success"]
    assert all(0.0 <= multi[n]["ci_low"] <= multi[n]["ci_high"] <= 1.0 for n in shares if multi[n]["n_clusters"] > 1)
    assert multi["success"]["ci_high"] == 1.0


def test_duckdb_memory_limit_defaults_to_half_the_memory(sem_lake: Lake) -> None:
    import duckdb
    from trajlake.evaluators.data import default_memory_limit

    query = "SELECT current_setting('memory_limit')"
    data = load(sem_lake)
    try:
        got = data.con.execute(query).fetchone()
    finally:
        data.close()
    assert got == duckdb.connect(config={"memory_limit": default_memory_limit()}).execute(query).fetchone()
    assert got != duckdb.connect().execute(query).fetchone()  # not DuckDB's own default (80%)


def test_point_estimates_match_the_rows_and_breakdown_splits_env_versions(tmp_path: Path) -> None:
    import numpy as np

    lk = open_lake(tmp_path / "lake", create=True)
    eps, walls, costs, succ, tool_lat = [], [], [], [], []
    for t in range(6):
        for s in range(3):
            wall, cost, ok = 5.0 + 7 * t + s * 1.5, 0.01 * (t + 1) + 0.003 * s, (t + s) % 3 != 0
            lats = [10.0 * (t + 1) + s, 300.0 + 50 * t * s]
            eps.append(episode(f"e{t}-{s}", task=f"t{t}", seed=s, success=ok, wall=wall, cost=cost,
                               env_version="1" if t < 3 else "2", split="dev" if s < 2 else "test",
                               steps=[read(f"f{t}", latency_ms=x, state=f"s{i}") for i, x in enumerate(lats)]))
            walls.append(wall)
            costs.append(cost)
            succ.append(ok)
            tool_lat += lats
    write(lk, eps)
    data = load(lk, ["run-A"])
    try:
        report = evaluate(data)
    finally:
        data.close()
    m = report["runs"]["run-A"]["metrics"]
    for name, values, q in (("episode_latency_p50", walls, 0.5), ("episode_latency_p99", walls, 0.99),
                            ("tool_latency_p50", tool_lat, 0.5), ("tool_latency_p99", tool_lat, 0.99)):
        assert m[name]["estimate"] == pytest.approx(float(np.quantile(values, q, method="inverted_cdf"))), name
    assert m["cost_per_success"]["estimate"] == pytest.approx(sum(costs) / sum(succ))
    assert m["success"]["estimate"] == pytest.approx(sum(succ) / len(succ))
    slices = {(b["split"], b["env_version"]): b for b in report["breakdown"] if b["run_id"] == "run-A"}
    assert set(slices) == {("dev", "1"), ("dev", "2"), ("test", "1"), ("test", "2")}
    assert slices[("dev", "2")]["n_episodes"] == 6 and slices[("test", "1")]["n_episodes"] == 3
    w = [x for x, e in zip(walls, eps, strict=True) if e[0]["split"] == "test" and e[0]["env_version"] == "2"]
    assert slices[("test", "2")]["metrics"]["episode_latency_p50"]["estimate"] == pytest.approx(
        float(np.quantile(w, 0.5, method="inverted_cdf")))
