"""Mini Web: the loopback site, the task set, the contract, bad actions, side effects and the built-in policies."""

from __future__ import annotations

import copy
import json
import re
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import gymnasium
import pytest
import trajlake.envs  # registers trajlake/MiniWeb-v0
from gymnasium.utils.env_checker import check_env as gym_check_env
from trajlake.envs.checker import check_env
from trajlake.envs.core import Budget, LoggedStep, ReplayLog
from trajlake.envs.mini_web import POLICIES, MiniWebEnv, load_tasks, task_row, task_view
from trajlake.envs.mini_web.build import build_tasks, check_tasks, split_for_family, task_version
from trajlake.envs.mini_web.env import TOOL_DOCS

from tests.env_play import play_policy
from trajlake import LakeWriter, open_lake
from trajlake.rollout.runner import play_episode

TASKS = load_tasks()


def act(tool: str, **args: Any) -> str:
    return json.dumps({"tool": tool, "args": args})


@pytest.fixture(scope="module")
def env():
    e = MiniWebEnv()
    yield e
    e.close()


def by_family(family: str) -> dict[str, Any]:
    return next(t for t in TASKS if t["family"] == family)


def ids_by_name(observation: str) -> dict[str, int]:
    from trajlake.envs.mini_web.policies import elements

    return {e.name: e.bid for e in elements(observation)}


def run_policy(env: MiniWebEnv, name: str, task: dict[str, Any], seed: int = 0, max_steps: int = 80) -> list[Any]:
    return play_policy(env, POLICIES[name](f"{name}-v1"), task["task_id"], task["task_version"], seed=seed,
                       max_steps=max_steps)


# ----------------------------------------------------------------------------------------------- task set
def test_task_set_size_families_and_splits() -> None:
    assert len(TASKS) >= 40
    families = Counter(t["family"] for t in TASKS)
    assert len(families) >= 10
    groups = {f.split("/")[0] for f in families}
    assert {"compare", "forms", "orders", "tickets", "account"} <= groups
    spans: dict[str, set[str]] = {}
    for t in TASKS:
        spans.setdefault(t["family"], set()).add(t["split"])
        assert t["split"] == split_for_family(t["family"])
    assert all(len(s) == 1 for s in spans.values()), "a family crosses splits"
    assert {t["split"] for t in TASKS} == {"train", "dev", "hidden"}
    assert len({t["task_id"] for t in TASKS}) == len(TASKS)


def test_records_have_required_fields_and_versions() -> None:
    for t in TASKS:
        for key in ("statement", "seed", "budget", "oracle", "created_at", "provenance", "split", "family"):
            assert t.get(key) not in (None, "", []), (t["task_id"], key)
        assert t["checks"] or t["answer"], f"{t['task_id']} has no success predicate"
        assert t["task_version"] == task_version(t)
        assert t["provenance"]["template"] == t["family"] and t["provenance"]["seed"] == t["seed"]
        row = task_row(t)
        assert row["env_id"] == "mini-web" and row["created_at"].tzinfo is not None
        assert row["provenance"]["mutator"] == t["family"]


def test_stored_tasks_match_a_fresh_build(tmp_path: Path) -> None:
    assert check_tasks() == []
    tampered = [dict(t) for t in build_tasks()]
    tampered[3]["statement"] += " (edited)"
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps({"tasks": tampered}))
    problems = check_tasks(path)
    assert any(tampered[3]["task_id"] in p and "task_version" in p for p in problems)


def test_statements_do_not_leak_the_solution() -> None:
    for t in TASKS:
        if t["answer"] is not None:
            answer = t["oracle"][-1]["text"]
            assert answer not in t["statement"] or t["answer"]["kind"] == "text", t["task_id"]


# --------------------------------------------------------------------------------------------- the server
def test_real_http_server_on_loopback_and_shut_down_on_close() -> None:
    e = MiniWebEnv(split="dev")
    e.reset(0)
    assert e.site is not None
    base = e.site.base_url
    assert base.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(base + "/products?category=office") as resp:
        body = resp.read().decode()
    assert resp.status == 200 and "Products" in body and "<script" not in body and "http" not in body.split("</title>")[1]
    before = e.site.requests
    e.step(act("goto", path="/tickets"), "k0")
    assert e.site.requests == before + 1  # the env's page load is a real request to the server
    e.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(base + "/", timeout=2)


def test_observation_is_an_accessibility_tree_with_unique_ids(env) -> None:
    r = env.reset(0, task_id=by_family("orders/cheapest-rated")["task_id"])
    assert "URL: /" in r.observation and "Last action error: none" in r.observation
    res = env.step(act("goto", path="/products/3"), "k0")
    lines = [ln for ln in res.observation.splitlines() if ln.lstrip().startswith("[")]
    ids = [int(ln.lstrip()[1:].split("]")[0]) for ln in lines]
    assert ids == list(range(1, len(ids) + 1))
    names = ids_by_name(res.observation)
    assert "Add to cart" in names and "Quantity" in names and "Reviews" in names
    assert 'spinbutton "Quantity" value="1"' in res.observation


# ------------------------------------------------------------------------------------------------ contract
def test_passes_the_project_checker() -> None:
    e = MiniWebEnv(split="dev")
    try:
        check_env(e, [act("goto", path="/products"), act("goto", path="/products/2"), act("click", id=16),
                      act("goto", path="/cart")])
    finally:
        e.close()


def test_gymnasium_check_env() -> None:
    assert trajlake.envs is not None
    genv = gymnasium.make("trajlake/MiniWeb-v0")
    try:
        gym_check_env(genv.unwrapped)
        _, info = genv.reset(seed=3)
        assert set(info) == {"task_id", "task_version", "state_hash"}
        _, reward, terminated, _, info = genv.step(genv.action_space.sample())
        assert info["status"] == "MODEL_INVALID_ACTION" and not terminated and reward == 0.0
    finally:
        genv.close()


def test_oracle_solves_every_task_and_doing_nothing_solves_none(env) -> None:
    for t in TASKS:
        results = run_policy(env, "oracle", t)
        last = results[-1]
        assert last.terminated and last.reward_components == {"resolved": 1.0}, (t["task_id"], env.failures)
        assert last.termination_reason == "success"
        assert all(r.status == "OK" for r in results), t["task_id"]
        env.reset(0, task_id=t["task_id"])
        res = env.step(act("answer", text="done"), "k")
        assert res.terminated and res.reward_components == {"resolved": 0.0}, t["task_id"]


def test_reset_is_seeded_and_order_does_not_matter(env) -> None:
    a, b = TASKS[0], by_family("orders/two-items-coupon")
    alone = run_policy(env, "oracle", b)[-1].state_hash
    run_policy(env, "oracle", a)
    r1 = env.reset(0, task_id=b["task_id"])
    after = run_policy(env, "oracle", b)[-1].state_hash
    r2 = env.reset(0, task_id=b["task_id"])
    assert alone == after and r1.state_hash == r2.state_hash and r1.observation == r2.observation


def test_snapshot_restore_and_replay_are_hash_identical(env) -> None:
    task = by_family("orders/two-items-coupon")
    r = env.reset(0, task_id=task["task_id"])
    snap = env.snapshot()
    results = run_policy(env, "oracle", task)  # resets on the same task and seed
    assert env.db_rows("SELECT kind FROM ledger") == [("payment",)]
    env.reset(0, task_id=task["task_id"])
    env.restore(snap)
    assert env.db_rows("SELECT count(*) FROM ledger") == [(0,)] and env.snapshot().state_hash == r.state_hash
    pol = POLICIES["oracle"]("o")
    pol.reset(task_view(env, task["task_id"], task["task_version"], oracle=True), 0)
    obs, actions = env.reset(0, task_id=task["task_id"]).observation, []
    for i in range(len(results)):
        a = pol.act(obs).action
        actions.append(LoggedStep(a, f"k{i}", results[i].state_hash))
        obs = env.step(a, f"k{i}").observation
    log = ReplayLog(env.env_id, env.env_version, task["task_id"], task["task_version"], 0, r.state_hash, actions)
    rep = env.replay(log)
    assert rep.ok and rep.steps_replayed == len(results)


# ----------------------------------------------------------------------------------------------- bad actions
@pytest.mark.parametrize(("action", "fragment"), [
    (act("click", id=999), "no element with id 999"),
    (act("click", id=11), "only links and buttons can be clicked"),
    (act("type", id=2, text="x"), "not a textbox"),
    (act("select", id=2, value="x"), "not a combobox"),
    (act("click", id="seven"), "expected integer"),
    (act("type", id=13), "missing required property 'text'"),
    (act("goto", path="http://evil.example/steal"), "outside the site"),
    (act("goto", path="//evil.example/x"), "outside the site"),
    (act("goto", path="products"), "starts with '/'"),
    (act("goto", path="/no/such/page"), "no page at /no/such/page"),
    (act("fly", to="moon"), "unknown tool"),
    ("click 12", "expected a JSON object"),
    (json.dumps(["click", 1]), "string field \"tool\""),
])
def test_bad_actions_get_a_clear_observation_and_status(env, action: str, fragment: str) -> None:
    env.reset(0, task_id=by_family("compare/cheapest-in-category")["task_id"])
    env.step(act("goto", path="/products"), "k0")
    res = env.step(action, "k1")
    assert res.status == "MODEL_INVALID_ACTION" and not res.done, res.observation
    assert fragment in res.observation
    ok = env.step(act("goto", path="/"), "k2")  # the episode goes on
    assert ok.status == "OK" and "Last action error: none" in ok.observation


@pytest.mark.security
@pytest.mark.parametrize(("action", "status", "fragment"), [
    (act("goto", path="/produçts"), "MODEL_INVALID_ACTION", "no page at /produ%C3%A7ts"),  # was ENV_BUG
    (act("goto", path="/products?q=red shoes"), "OK", ""),  # was ENV_TRANSIENT: a space broke the request line
    (act("goto", path="/prod ucts"), "MODEL_INVALID_ACTION", "no page at /prod%20ucts"),
    (act("goto", path="/products\x7f"), "MODEL_INVALID_ACTION", "control characters"),  # was ENV_TRANSIENT
    ('{"tool": "type", "args": {"id": 3, "text": "\\ud800"}}', "MODEL_INVALID_ACTION", "lone surrogate"),
    ('{"tool": "answer", "args": {"text": "a\\udfffb"}}', "MODEL_INVALID_ACTION", "lone surrogate"),
])
def test_characters_are_model_mistakes_never_environment_failures(env, action: str, status: str,
                                                                  fragment: str) -> None:
    """A character in an action is the model's business: it never ends an episode as ENV_BUG/ENV_TRANSIENT, and a
    lone surrogate (which made an observation that is not UTF-8 and lost the episode) is an invalid action."""
    env.reset(0, task_id=by_family("compare/cheapest-in-category")["task_id"])
    env.step(act("goto", path="/products"), "k0")
    res = env.step(action, "k1")
    assert res.status == status and not res.done and fragment in res.observation, res.observation
    res.observation.encode("utf-8")
    ok = env.step(act("goto", path="/"), "k2")  # the episode goes on
    assert ok.status == "OK"


def test_a_site_that_stops_answering_is_a_transient_error_not_a_crash() -> None:
    e = MiniWebEnv(split="dev")
    try:
        e.reset(0)
        assert e.site is not None and e.site.server is not None
        e.site.server.shutdown()
        e.site.server.server_close()
        res = e.step(act("goto", path="/products"), "k0")
        assert res.status == "ENV_TRANSIENT" and not res.done and "the site did not answer" in res.observation
    finally:
        e.close()


def test_select_rejects_unknown_options_and_accepts_labels(env) -> None:
    env.reset(0, task_id=by_family("compare/cheapest-in-category")["task_id"])
    obs = env.step(act("goto", path="/products"), "k0").observation
    sort = ids_by_name(obs)["Sort by"]
    res = env.step(act("select", id=sort, value="by colour"), "k1")
    assert res.status == "MODEL_INVALID_ACTION" and "not an option" in res.observation
    res = env.step(act("select", id=sort, value="price, low to high"), "k2")
    assert res.status == "OK" and 'combobox "Sort by" value="price_asc"' in res.observation


def test_server_side_form_errors_are_shown_not_crashed(env) -> None:
    env.reset(0, task_id=by_family("forms/contact")["task_id"])
    obs = env.step(act("goto", path="/contact"), "k0").observation
    res = env.step(act("click", id=ids_by_name(obs)["Send message"]), "k1")
    assert res.status == "OK" and "HTTP 400" in res.observation and "required" in res.observation


# -------------------------------------------------------------------------------------- effects and gateway
def test_irreversible_effects_go_to_the_ledger_through_the_gateway(env) -> None:
    task = by_family("account/delete-address")
    results = run_policy(env, "oracle", task)
    events = [ev for r in results for ev in r.gateway_events]
    deletes = [ev for ev in events if ev["tool"] == "delete"]
    assert len(deletes) == 1 and deletes[0]["side_effect_class"] == "irreversible" and deletes[0]["executed"]
    assert deletes[0]["state_hash_before"] != deletes[0]["state_hash_after"]
    assert {ev["tool"] for ev in events} <= {"goto", "click", "answer", "delete"}
    assert [r[0] for r in env.db_rows("SELECT kind FROM ledger")] == ["delete"]


def test_a_retried_payment_runs_once(env) -> None:
    task = by_family("orders/two-items-coupon")
    env.reset(0, task_id=task["task_id"])
    obs = env.step(act("goto", path=f"/products/{task['oracle'][0]['path'].rsplit('/', 1)[1]}"), "a").observation
    env.step(act("click", id=ids_by_name(obs)["Add to cart"]), "b")
    obs = env.step(act("goto", path="/cart"), "c").observation
    pay = act("click", id=ids_by_name(obs)["Place order and pay"])
    cart_page = copy.deepcopy(env.browser)
    first = env.step(pay, "pay-1")
    assert first.gateway_events[0]["tool"] == "payment" and first.gateway_events[0]["executed"]
    # The answer was lost: the agent retries the same call from the page it still sees, with the same key.
    env.browser, env._page = copy.deepcopy(cart_page), None
    again = env.step(pay, "pay-1")
    assert not again.gateway_events[0]["executed"] and "duplicate" in again.gateway_events[0]["reason"]
    # Under a new key the call runs, and the site refuses a second checkout of the emptied cart.
    env.browser, env._page = copy.deepcopy(cart_page), None
    third = env.step(pay, "pay-2")
    assert third.gateway_events[0]["executed"] and "the cart is empty" in third.observation
    assert env.db_rows("SELECT kind, target FROM ledger") == [("payment", "order:3")]


def test_confirm_irreversible_holds_payments() -> None:
    e = MiniWebEnv(split="dev", confirm_irreversible=True)
    try:
        task = next(t for t in e.tasks if t["ledger"])
        results = run_policy(e, "oracle", task)
        held = [ev for r in results for ev in r.gateway_events if ev["side_effect_class"] == "irreversible"]
        assert held and all(ev["decision"] == "confirm" and not ev["executed"] for ev in held)
        assert e.db_rows("SELECT count(*) FROM ledger") == [(0,)] and results[-1].reward_components["resolved"] == 0
    finally:
        e.close()


def test_answers_are_checked_against_the_database(env) -> None:
    task = by_family("compare/cheapest-in-category")
    right = task["oracle"][-1]["text"]
    for text, ok in ((right, 1.0), (right.replace("$", "") + " dollars", 1.0), ("$0.01", 0.0), ("no idea", 0.0)):
        env.reset(0, task_id=task["task_id"])
        assert env.step(act("answer", text=text), "k").reward_components == {"resolved": ok}, text
    pair = by_family("compare/higher-rated")
    both = " or ".join(pair["answer"]["alternatives"])
    env.reset(0, task_id=pair["task_id"])
    assert env.step(act("answer", text=both), "k").reward_components == {"resolved": 0.0}


def test_untrusted_pages_taint_the_next_call(env) -> None:
    task = by_family("compare/review-count")
    env.reset(0, task_id=task["task_id"])
    res = env.step(act("goto", path="/products/1"), "k0")
    assert res.taint == ("untrusted_web_content",)
    nxt = env.step(act("goto", path="/"), "k1")
    assert nxt.gateway_events[0]["taint"] == ["untrusted_web_content"] and nxt.taint == ()


def test_budget_truncates_and_grades() -> None:
    e = MiniWebEnv(split="dev", budget=Budget(max_steps=2))
    try:
        e.reset(0)
        e.step(act("goto", path="/products"), "k0")
        res = e.step(act("goto", path="/cart"), "k1")
        assert res.truncated and not res.terminated and res.status == "BUDGET_EXHAUSTED"
        assert res.termination_reason == "budget_steps" and res.reward_components == {"resolved": 0.0}
    finally:
        e.close()


# -------------------------------------------------------------------------------------------------- policies
def test_heuristic_and_random_run_through_the_runner_and_into_the_lake(env, tmp_path: Path) -> None:
    records = []
    for name in ("heuristic", "random", "oracle"):
        for t in TASKS[::7]:
            pol = POLICIES[name](f"{name}-v1")
            records.append(play_episode(env, pol, run_id=f"mw-{name}", task_id=t["task_id"],
                                        task_version=t["task_version"], seed=1, split=t["split"],
                                        task_view=lambda tid, tv, p=pol: task_view(env, tid, tv, p.needs_oracle)))
    by_policy = Counter((r.episode["run_id"], r.episode["success"]) for r in records)
    assert by_policy[("mw-oracle", True)] == len(TASKS[::7])
    assert by_policy[("mw-random", True)] == 0
    heuristic_wins = [r.episode["task_id"] for r in records if r.episode["run_id"] == "mw-heuristic" and r.episode["success"]]
    assert heuristic_wins and all("cheapest" in t or "count-by-status" in t for t in heuristic_wins)
    assert {r.episode["sandbox"] for r in records} == {"none"}  # Env.sandbox_kind: no agent code runs
    lake = open_lake(tmp_path / "lake", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_tasks([task_row(t) for t in TASKS])
        w.write_batch([r.episode for r in records], [t for r in records for t in r.turns],
                      [e for r in records for e in r.events]).raise_if_rejected()


def test_tool_docs_match_the_action_set() -> None:
    assert set(TOOL_DOCS) == {"click", "type", "select", "goto", "submit", "answer", "give_up", "ask_user"}
    assert set(POLICIES) == {"oracle", "heuristic", "random", "gullible"}


def test_registered_and_supplies_the_contract() -> None:
    from trajlake.envs import list_tasks, make_env, make_policy, policy_names, task_rows, task_view_fn

    env = make_env("mini-web", split="dev")
    try:
        assert isinstance(env, MiniWebEnv) and env.verification_source == "backend_state"
        tasks = list_tasks("mini-web", "dev")
        assert [t["task_id"] for t in tasks] == [t["task_id"] for t in env.tasks] and tasks
        assert task_rows("mini-web", tasks[:2]) == [task_row(t) for t in tasks[:2]]
        assert policy_names("mini-web") == ["gullible", "heuristic", "oracle", "random"]
        assert make_policy("mini-web", "oracle", "o").needs_oracle
        view = task_view_fn(env, oracle=True)(tasks[0]["task_id"], tasks[0]["task_version"])
        assert view.oracle == {"steps": tasks[0]["oracle"]} and set(view.tools) == set(TOOL_DOCS)
        assert task_view_fn(env)(tasks[0]["task_id"], tasks[0]["task_version"]).oracle is None
        reqs = {r.name: r for r in env.requirements()}
        assert reqs["loopback"].ok and reqs["loopback"].required
        assert not reqs["chromium"].required and not reqs["playwright"].required  # only browser="chromium" needs them
    finally:
        env.close()


def test_fuzzed_actions_never_crash(env) -> None:
    import random

    rng = random.Random(7)
    words = ["", "x", "/", "//", "/products/1/../../etc", "/products?q=%00", "/orders/-1", "/tickets/99999999",
             "\u00e9\u4e2d", "1" * 40, "<script>", "' OR 1=1 --", "/checkout", "/account?msg=" + "a" * 600]
    allowed = {"OK", "MODEL_INVALID_ACTION", "BUDGET_EXHAUSTED"}
    for episode in range(4):
        obs = env.reset(episode).observation
        for i in range(60):
            ids = [int(x) for x in re.findall(r"^\s*\[(\d+)\]", obs, re.M)] or [1]
            tool = rng.choice(["click", "type", "select", "goto", "submit", "type", "click"])
            args: dict[str, Any] = {"id": rng.choice([*ids, 0, 10**6])}
            if tool in ("type", "select"):
                args["text" if tool == "type" else "value"] = rng.choice(words)
            if tool == "goto":
                args = {"path": rng.choice(words)}
            res = env.step(json.dumps({"tool": tool, "args": args}), f"f{episode}-{i}")
            assert res.status in allowed, (tool, args, res.observation[:300])
            assert "Last action error" in res.observation or res.done
            obs = res.observation
            if res.done:
                break


def test_a_site_bug_is_env_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    from trajlake.envs.mini_web.app import Site

    def broken(self: Site, q: dict[str, list[str]]) -> Any:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(Site, "orders", broken)
    e = MiniWebEnv(split="dev")
    try:
        e.reset(0)
        res = e.step(act("goto", path="/orders"), "k0")
        assert res.status == "ENV_BUG" and "HTTP 500" in res.observation and "ZeroDivisionError" in res.observation
        assert e.step(act("goto", path="/"), "k1").status == "OK"
    finally:
        e.close()


def test_out_of_scope_writes_fail_the_task(env) -> None:
    triage = by_family("tickets/triage")
    tid = int(triage["scope"]["tickets"][0])
    other = 1 if tid != 1 else 2
    run_policy(env, "oracle", triage, max_steps=len(triage["oracle"]))  # solved, not answered yet
    obs = env.step(act("goto", path=f"/tickets/{other}"), "x1").observation
    env.step(act("select", id=ids_by_name(obs)["Status"], value="closed"), "x2")
    env.step(act("click", id=ids_by_name(obs)["Save ticket"]), "x3")
    res = env.step(act("answer", text="done"), "x4")
    assert res.reward_components == {"resolved": 0.0}
    assert env.failures == (f"out-of-scope change: tickets row {other} changed",)
    question = by_family("compare/cheapest-in-category")
    env.reset(0, task_id=question["task_id"])
    obs = env.step(act("goto", path="/products/1"), "y1").observation
    env.step(act("click", id=ids_by_name(obs)["Add to cart"]), "y2")
    res = env.step(act("answer", text=question["oracle"][-1]["text"]), "y3")
    assert res.reward_components == {"resolved": 0.0} and env.failures == ("out-of-scope change: cart_items row 1 added",)


@pytest.mark.slow
def test_quickstart_and_rollout_with_mini_web(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import run_cli

    lake, out = tmp_path / "lake", tmp_path / "report.html"
    code, text, err = run_cli(capsys, "--lake", str(lake), "quickstart", "--env", "mini-web", "--seeds", "0",
                              "--workers", "1", "--out", str(out), "--resamples", "200")
    assert code == 0, err
    assert "quickstart-mini-web-oracle: 8 new episode(s)" in text and "8 of the new ones successful" in text, text
    assert "<svg" in out.read_text()
    code, text, err = run_cli(capsys, "--lake", str(lake), "sql", "select episode_id from episodes where run_id = "
                              "'quickstart-mini-web-oracle' order by 1 limit 1", "--format", "json")
    episode = json.loads(text)[0]["episode_id"]
    code, text, err = run_cli(capsys, "--lake", str(lake), "replay", "--episode", episode)
    assert code == 0 and "every state hash matches" in text, err  # a fresh environment (own server), the same hashes
    code, text, err = run_cli(capsys, "--lake", str(lake), "rollout", "--env", "mini-web", "--policy", "gullible",
                              "--split", "dev", "--seeds", "0", "--workers", "1", "--run-id", "attacked",
                              "--env-arg", "injection=important_instructions")
    assert code == 0, err
    assert "32 episode(s) written (0 successful)" in text, text
