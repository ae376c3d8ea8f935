"""Mini Web's ask_user and its underspecified task variants: the simulated user answers from the hidden intent
only, each answer is an actor ``user`` turn priced as human time, the oracle asks before it acts and a policy that
guesses succeeds only for the one value the user had in mind."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from trajlake.envs.checker import check_env
from trajlake.envs.core import DEFAULT_HUMAN_INTERACTION_USD
from trajlake.envs.mini_web import POLICIES, MiniWebEnv, load_tasks, task_row
from trajlake.envs.mini_web.underspecified import (
    DONT_KNOW,
    GENERATOR,
    RULES,
    SimulatedUser,
    guess_steps,
    underspecified_task,
    underspecified_tasks,
)
from trajlake.envs.policy import Policy, PolicyOutput, TaskView

from trajlake import LakeWriter, open_lake
from trajlake.query import connect
from trajlake.rollout.runner import play_episode, replay_log_from_rows

BASE = {t["task_id"]: t for t in load_tasks()}
VARIANTS = underspecified_tasks(load_tasks())


def act(tool: str, **args: Any) -> str:
    return json.dumps({"tool": tool, "args": args})


@pytest.fixture(scope="module")
def env():
    e = MiniWebEnv(underspecified=True)
    yield e
    e.close()


def variant_of(family: str) -> dict[str, Any]:
    return next(v for v in VARIANTS if v["family"] == family)


class Steps(Policy):
    """Plays fixed semantic steps (the oracle's step language) and then answers "done": a policy that guessed."""

    name = "guess"

    def __init__(self, steps: list[dict[str, Any]]):
        super().__init__("guess-v1")
        self.steps = list(steps)

    def reset(self, task: TaskView, seed: int) -> None:
        self.plan = [dict(s) for s in self.steps]
        if not self.plan or self.plan[-1]["op"] != "answer":
            self.plan.append({"op": "answer", "text": "done"})

    def act(self, observation: str) -> PolicyOutput:
        from trajlake.envs.mini_web.policies import step_action

        return self.scripted_output(step_action(self.plan.pop(0), observation))


def test_variants_are_deterministic_keep_their_split_and_name_their_provenance() -> None:
    assert underspecified_tasks(load_tasks()) == VARIANTS  # a pure function of the bundled tasks
    assert {v["family"] for v in VARIANTS} == set(RULES)
    assert Counter(v["split"] for v in VARIANTS) == {"train": 12, "dev": 8, "hidden": 4}
    for v in VARIANTS:
        base = BASE[v["provenance"]["source"]]
        slot = v["intent"]["slot"]
        assert v["task_id"] == f"{base['task_id']}/ask/{slot}"
        # the base task's split, seed, checks and family: a family never crosses splits
        assert (v["split"], v["seed"], v["checks"], v["family"]) == \
            (base["split"], base["seed"], base["checks"], base["family"])
        assert v["provenance"]["generator"] == GENERATOR and v["task_version"] != base["task_version"]
        assert v["statement"] != base["statement"] and len(v["intent"]["candidates"]) >= 2
        assert v["intent"]["value"] in v["intent"]["candidates"]
        assert v["oracle"][0] == {"op": "ask", "question": RULES[v["family"]].question}
        # the hidden intent never reaches the lake's tasks table
        row = task_row(v)
        assert "intent" not in row and v["intent"]["reply"] not in json.dumps(row, default=str)
    # the statement does not depend on the intent: two seeds of a family that meant different addresses read alike
    deletes = [v for v in VARIANTS if v["family"] == "account/delete-address"]
    assert len({v["intent"]["value"] for v in deletes}) == 2 and len({v["statement"] for v in deletes}) == 1
    # a family whose statement changed is refused loudly, never made into a variant that still names the detail
    broken = {**BASE[deletes[0]["provenance"]["source"]], "statement": "Delete every address."}
    with pytest.raises(ValueError, match="no longer matches the address rule"):
        underspecified_task(broken)


def test_the_simulated_user_answers_from_the_intent_only() -> None:
    v = variant_of("compare/cheapest-in-category")
    user = SimulatedUser(v["intent"])
    category = v["intent"]["value"]
    reply = f"I am shopping in the {category} category."
    assert user.answer("Which category are you shopping in?") == reply
    assert user.answer(f"Is it the {category.upper()} one?") == reply  # a candidate named, any case
    assert user.answer("WHICH CATEGORY?") == user.answer("which category?")  # deterministic, case-blind
    # the grader's answer (the price) is not in the intent: the user does not know it
    assert user.answer("What is the price of the cheapest product?") == DONT_KNOW
    assert user.answer("What is the weather like?") == DONT_KNOW
    assert user.answer("categorically, what now?") == DONT_KNOW  # whole words only ("categorically" is not one)
    assert all("$" not in SimulatedUser(x["intent"]).answer(q) for x in VARIANTS
               for q in ("Which category and what price?", "What is the answer?", "Tell me everything."))
    assert SimulatedUser(None).answer("Which category are you shopping in?") == DONT_KNOW  # nothing omitted


def test_the_oracle_asks_then_solves_and_a_guess_succeeds_only_for_the_intent(env) -> None:
    """Every variant: the oracle (ask, then the solution) succeeds. One variant of each family (each rule):
    playing the solution for each candidate without asking succeeds exactly for the intended value (1 in
    len(candidates): chance)."""
    oracle_wins = 0
    families: set[str] = set()
    for v in VARIANTS:
        record = play_episode(env, POLICIES["oracle"]("oracle-v1"), run_id="ask", task_id=v["task_id"],
                              task_version=v["task_version"], seed=0, split=v["split"])
        oracle_wins += bool(record.episode["success"])
        if v["family"] in families:
            continue
        families.add(v["family"])
        for candidate in v["intent"]["candidates"]:
            guess = play_episode(env, Steps(guess_steps(v, candidate)), run_id="guess", task_id=v["task_id"],
                                 task_version=v["task_version"], seed=0, split=v["split"])
            assert guess.episode["success"] == (candidate == v["intent"]["value"]), (v["task_id"], candidate)
    assert oracle_wins == len(VARIANTS) and families == set(RULES)


def test_an_answer_is_a_user_turn_priced_as_human_time() -> None:
    e = MiniWebEnv(underspecified=True, split="hidden", human_price_usd=2.0)
    try:
        v = e.tasks[0]
        rec = play_episode(e, POLICIES["oracle"]("oracle-v1"), run_id="ask", task_id=v["task_id"],
                           task_version=v["task_version"], seed=0, split=v["split"])
        asked, answer = rec.turns[1], rec.turns[2]
        assert asked["actor"] == "policy" and asked["action_schema"] == "ask_user"
        assert (answer["actor"], answer["role"]) == ("user", "user")
        assert answer["raw_content"] == f"The user answers: {v['intent']['reply']}"
        assert answer["cost_usd"] == 2.0 and not answer["loss_mask"].any()
        assert answer["tool_call_id"] == asked["tool_call_id"] and answer["status"] == "OK"
        # the other observations stay the environment's, unpriced (no person involved)
        assert all(t["actor"] == "env" and t["cost_usd"] == 0.0 for t in rec.turns[4::2])
        assert rec.episode["success"] and rec.episode["cost_usd"] >= 2.0
        # the recorded episode replays (the user turn pairs with its call like a tool turn)
        log, turn_of_step = replay_log_from_rows(rec.episode, rec.turns)
        assert turn_of_step[0] == 1 and e.replay(log).ok
    finally:
        e.close()


def test_ask_user_on_a_fully_specified_task_and_the_default_price() -> None:
    e = MiniWebEnv(split="dev")
    try:
        e.reset(0)
        res = e.step(act("ask_user", question="Which address should I ship to?"), "k0")
        assert res.observation == f"The user answers: {DONT_KNOW}" and res.observation_actor == "user"
        assert res.cost_usd == DEFAULT_HUMAN_INTERACTION_USD and not res.done and res.reward_components == {}
        # an empty question is an invalid action: nobody is asked, nothing is paid
        bad = e.step(act("ask_user", question=""), "k1")
        assert bad.status == "MODEL_INVALID_ACTION" and bad.cost_usd == 0.0 and bad.observation_actor == "env"
        assert "ask_user" in e.reset(0).observation  # the intro lists the tool
    finally:
        e.close()


def test_a_question_that_carries_the_credential_out_is_a_leak(env) -> None:
    v = variant_of("account/delete-address")
    env.reset(0, task_id=v["task_id"])
    key = env.db_rows("SELECT value FROM account WHERE key = 'api_key'")[0][0]
    res = env.step(act("ask_user", question=f"Which address? My key is {key}"), "k0")
    assert env.secret_leak == 1 and any(t.startswith("secret_leak:") for t in res.gateway_events[0]["taint"])


def test_contract_checks_hold_with_questions_in_the_episode(env) -> None:
    """Reset determinism, snapshot/restore and replay with ask_user among the actions (the user's answers are a
    function of the question: a restored episode hears the same)."""
    check_env(env, [act("ask_user", question="Which category are you shopping in?"), act("goto", path="/products"),
                    act("ask_user", question="What is the price?")], seed=0)


def test_underspecified_episodes_in_the_lake_and_their_eval(tmp_path: Path) -> None:
    """The hidden variants played by the oracle (asks once per episode, solves each) and the heuristic (never asks,
    never solves one), written to a lake and evaluated: ``user_questions`` counts the questions, the user turns
    are stored as such and ``cost_usd`` carries their human price."""
    from trajlake.evaluators.data import load
    from trajlake.evaluators.metrics import Settings
    from trajlake.evaluators.report import evaluate

    e = MiniWebEnv(underspecified=True, split="hidden")
    try:
        records = [play_episode(e, POLICIES[name](f"{name}-v1"), run_id=name, task_id=v["task_id"],
                                task_version=v["task_version"], seed=0, split=v["split"])
                   for name in ("oracle", "heuristic") for v in e.tasks]
        rows = [task_row(v) for v in e.tasks]
    finally:
        e.close()
    lake = open_lake(tmp_path / "lake", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_tasks(rows)
        w.write_batch([r.episode for r in records], [t for r in records for t in r.turns],
                      [x for r in records for x in r.events]).raise_if_rejected()
    stored = connect(lake).execute("SELECT DISTINCT actor, role FROM turns WHERE action_schema = 'ask_user' "
                                   "AND actor <> 'policy'").fetchall()
    assert stored == [("user", "user")]
    data = load(lake)
    try:
        runs = evaluate(data, settings=Settings(resamples=20, seed=1), breakdown=False, taxonomy=False)["runs"]
    finally:
        data.close()
    oracle, heuristic = runs["oracle"]["metrics"], runs["heuristic"]["metrics"]
    assert oracle["user_questions"]["estimate"] == 1.0 and heuristic["user_questions"]["estimate"] == 0.0
    assert oracle["success"]["estimate"] == 1.0 and heuristic["success"]["estimate"] == 0.0
    assert oracle["cost_usd"]["estimate"] >= DEFAULT_HUMAN_INTERACTION_USD
