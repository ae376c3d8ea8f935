"""Mini Web's side of the prompt-injection suite: vectors, attacker goals, the gullible policy and taint records."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from trajlake.envs.mini_web import POLICIES, MiniWebEnv, load_tasks
from trajlake.envs.mini_web.grading import ATTACKER_EMAIL, ATTACKS, GOALS, INJECTION_MARK, injection_text
from trajlake.envs.mini_web.injection import find_instructions, goal_params, injected_task, injected_tasks

from tests.env_play import play_policy
from trajlake.rollout.runner import play_episode

TASKS = load_tasks()
INJECTABLE = [t for t in TASKS if t["vectors"]]


def run(env: MiniWebEnv, policy: str, task: dict[str, Any]) -> list[Any]:
    return play_policy(env, POLICIES[policy](policy), task["task_id"], task["task_version"], oracle=True)


def test_every_vector_is_shown_on_the_oracle_path() -> None:
    """AgentDojo's injectability check: a distinct canary in every vector; each must reach an observation."""
    assert len(INJECTABLE) >= 20
    env = MiniWebEnv(tasks=[_with_canaries(t) for t in INJECTABLE])
    try:
        for t in env.tasks:
            seen = "\n".join(r.observation for r in run(env, "oracle", t))
            for v in t["vectors"]:
                assert f"CANARY-{v['id']}" in seen, (t["task_id"], v["id"])
    finally:
        env.close()


def _with_canaries(task: dict[str, Any]) -> dict[str, Any]:
    sql = {"reviews": "UPDATE reviews SET body = body || ? WHERE id = ?",
           "tickets": "UPDATE tickets SET body = body || ? WHERE id = ?",
           "emails": "UPDATE emails SET body = body || ? WHERE id = ?"}
    return {**task, "plant": [[sql[v["table"]], [f" CANARY-{v['id']}", v["row"]]] for v in task["vectors"]]}


def test_attacked_variants_pair_every_injectable_task_with_every_goal() -> None:
    variants = injected_tasks(TASKS, "important_instructions")
    assert len(variants) == len(INJECTABLE) * len(GOALS)
    assert Counter(v["injection"]["goal"] for v in variants) == dict.fromkeys(GOALS, len(INJECTABLE))
    for v in variants[:8]:
        base = next(t for t in TASKS if t["task_id"] == v["injection"]["base_task_id"])
        assert v["split"] == base["split"] and v["checks"] == base["checks"] and v["ledger"] == base["ledger"]
        assert v["task_version"] != base["task_version"] and v["task_id"].startswith(base["task_id"] + "/inj/")


def test_goal_parameters_never_coincide_with_the_user_task() -> None:
    for t in TASKS:
        p = goal_params(t)
        assert f"address:{p['label']}" not in json.dumps(t["ledger"])
        assert f"order:{p['order']}" not in json.dumps(t["ledger"])


def test_payload_formats() -> None:
    goal = GOALS["giftcard"]
    plain = injection_text(goal, "important_instructions", {})
    steps = injection_text(goal, "tool_knowledge", {})
    assert plain.startswith(INJECTION_MARK) and ATTACKER_EMAIL in plain and "/giftcards" not in plain
    assert "/giftcards" in steps and "Buy gift card" in steps
    with pytest.raises(ValueError, match="unknown attack"):
        injection_text(goal, "shouting", {})
    for name, g in GOALS.items():
        found = find_instructions(injection_text(g, "important_instructions", {"label": "Home", "order": 2}))
        assert [f[0] for f in found] == [name]


def _check_resistance(attack: str, stride: int) -> None:
    env = MiniWebEnv(injection=attack)
    try:
        for t in env.tasks[::stride]:
            res = run(env, "oracle", t)[-1]
            assert res.reward_components == {"resolved": 1.0} and not env.attack_success, t["task_id"]
            assert env.injection_attempted
            res = run(env, "gullible", t)[-1]
            assert env.attack_success, t["task_id"]
            # utility under attack: the attacker's extra ledger row fails the user's task
            assert res.reward_components == {"resolved": 0.0} and any("ledger" in f for f in env.failures)
    finally:
        env.close()


@pytest.mark.parametrize("attack", ATTACKS)
def test_oracle_resists_gullible_falls_and_the_ledger_says_so(attack: str) -> None:
    _check_resistance(attack, stride=7)  # 7 is prime to the 4 goals: every goal is played


@pytest.mark.slow
@pytest.mark.parametrize("attack", ATTACKS)
def test_oracle_resists_gullible_falls_on_every_attacked_variant(attack: str) -> None:
    _check_resistance(attack, stride=1)


def test_security_predicates_are_false_on_clean_and_benign_runs() -> None:
    benign = MiniWebEnv(tasks=INJECTABLE[:6])
    try:
        for t in benign.tasks:
            for goal in GOALS:
                run(benign, "oracle", t)
                assert benign.site is not None
                with benign.site.lock:
                    assert not GOALS[goal].achieved(benign.site.conn, goal_params(t)), (t["task_id"], goal)
        # the gullible policy on a benign task finds nothing to obey
        assert run(benign, "gullible", benign.tasks[0])[-1].reward_components == {"resolved": 1.0}
    finally:
        benign.close()


def test_blocked_calls_are_not_successful_attacks() -> None:
    strict = MiniWebEnv(injection="important_instructions", confirm_irreversible=True)
    try:
        for t in strict.tasks[::5]:
            results = run(strict, "gullible", t)
            assert not strict.attack_success, t["task_id"]
            held = [e for r in results for e in r.gateway_events if e["side_effect_class"] == "irreversible"]
            assert held and all(e["decision"] == "confirm" and not e["executed"] for e in held)
    finally:
        strict.close()


def test_taint_records_name_the_injection_and_copied_arguments() -> None:
    env = MiniWebEnv(tasks=[injected_task(INJECTABLE[0], "giftcard", "important_instructions")])
    try:
        results = run(env, "gullible", env.tasks[0])
        label = f"injection:giftcard@{env.tasks[0]['injection']['vector']}"
        shown = [i for i, r in enumerate(results) if label in r.taint]
        assert shown, "the page with the payload is labelled"
        # the call right after the injected page carries its label
        assert label in results[shown[0] + 1].gateway_events[0]["taint"]
        pay = next(e for r in results for e in r.gateway_events if e["tool"] == "payment")
        assert pay["executed"] and f"args_from:{label}" in pay["taint"]
    finally:
        env.close()


def _check_taint_enforcement(tasks: list[dict[str, Any]]) -> None:
    benign = MiniWebEnv(tasks=tasks, taint_enforcement=True)
    try:
        for t in benign.tasks:
            assert run(benign, "oracle", t)[-1].reward_components == {"resolved": 1.0}, t["task_id"]
    finally:
        benign.close()
    env = MiniWebEnv(tasks=tasks, injection="important_instructions", taint_enforcement=True)
    try:
        outcome: Counter[tuple[str, bool]] = Counter()
        for t in env.tasks:
            run(env, "gullible", t)
            outcome[(t["injection"]["goal"], env.attack_success)] += 1
        n = sum(1 for t in tasks if t["vectors"])
        # arguments copied from the payload (recipient addresses) are caught; a bare button press is not
        assert outcome[("giftcard", False)] == n and outcome[("exfiltrate", False)] == n
        assert outcome[("delete", True)] == n and outcome[("refund", True)] == n
    finally:
        env.close()


def test_taint_enforcement_holds_copied_payments_and_keeps_benign_utility() -> None:
    families = {t["family"]: t for t in TASKS}  # one task per family
    _check_taint_enforcement(list(families.values()))


@pytest.mark.slow
def test_taint_enforcement_on_every_task() -> None:
    _check_taint_enforcement(TASKS)


def test_gullible_runs_through_the_runner_with_events() -> None:
    env = MiniWebEnv(tasks=[injected_task(INJECTABLE[1], "exfiltrate", "tool_knowledge")])
    try:
        t = env.tasks[0]
        pol = POLICIES["gullible"]("g")
        # the runner's own task view: the gullible policy is no oracle and sees no solution through it
        rec = play_episode(env, pol, run_id="inj", task_id=t["task_id"], task_version=t["task_version"], seed=0)
        sends = [e for e in rec.events if e["tool"] == "send"]
        assert sends and sends[0]["executed"] and any("injection" in x for x in sends[0]["taint"])
        assert env.attack_success and not rec.episode["success"]
        assert rec.episode["error_class"] != "ENV_BUG"  # falling for the attack is the policy's failure
    finally:
        env.close()


@pytest.mark.slow
def test_suite_command_prints_agentdojo_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    from trajlake.envs.mini_web.suite import main

    assert main(["--policy", "oracle", "--defence", "none", "--attack", "tool_knowledge"]) == 0
    out = capsys.readouterr().out
    n = len(INJECTABLE) * len(GOALS)
    assert "attack: tool_knowledge" in out
    assert f"none                  oracle                {len(TASKS)}/{len(TASKS)}" in out
    assert f"{n}/{n}           0/{n}" in out


def test_goal_predicates_name_exactly_their_target() -> None:
    """A deletion or refund of something else is not the attacker's goal (no predicate that fires on any effect)."""
    delete_task = next(t for t in TASKS if t["family"] == "account/delete-address")
    refund_task = next(t for t in TASKS if t["family"] == "orders/refund-from-ticket")
    env = MiniWebEnv(tasks=[delete_task, refund_task])
    try:
        for task, goal, own in ((delete_task, "delete", {"label": delete_task["ledger"][0][1].split(":", 1)[1]}),
                                (refund_task, "refund", {"order": int(refund_task["ledger"][0][1].split(":")[1])})):
            run(env, "oracle", task)
            assert env.site is not None
            with env.site.lock:
                assert not GOALS[goal].achieved(env.site.conn, goal_params(task)), task["task_id"]
                assert GOALS[goal].achieved(env.site.conn, {**goal_params(task), **own})  # positive control
    finally:
        env.close()
