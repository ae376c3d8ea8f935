"""tool-lookup, the positive-control environment: its task set (splits by family, determinism, sizes), the contract
(checker, oracle on every instance, replay, the fault kind), the CLI, its process reward and the tokenizer trained
on its rendered episodes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from trajlake.envs import make, make_env, make_policy, taskset
from trajlake.envs.checker import check_env
from trajlake.envs.core import EnvError, StepResult
from trajlake.envs.tool_lookup import ToolLookupEnv, load_tasks, make_task
from trajlake.envs.tool_lookup.env import BUSY
from trajlake.envs.tool_lookup.tasks import (
    CODES,
    EXTRA_HIDDEN_PHRASINGS,
    EXTRA_TRAIN_PHRASINGS,
    INSTANCES_PER_FAMILY,
    KINDS,
    LATE_TRAIN_PHRASINGS,
    MAX_STEPS,
    NAMES,
    PHRASINGS,
    families,
    is_extra_family,
    is_extra_hidden_family,
    is_late_family,
)
from trajlake.evaluators.process_rewards import lookup_progress, lookup_progress_per_turn
from trajlake.evaluators.reward_check import check_reward
from trajlake.schemas.vocab import FaultKind, Split, Status, TerminationReason

from tests.conftest import run_cli
from trajlake.query import connect
from trajlake.rollout.faults import FaultInjector
from trajlake.rollout.runner import RolloutConfig, play_episode, replay_log_from_rows, run_rollout


def act(tool: str, **args: Any) -> str:
    return json.dumps({"tool": tool, "args": args})


@pytest.fixture
def env() -> Iterator[ToolLookupEnv]:
    e = make("tool-lookup", split="dev")
    assert isinstance(e, ToolLookupEnv)
    try:
        yield e
    finally:
        e.close()


def rows(con: Any, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def first(e: ToolLookupEnv, kind: str) -> dict[str, Any]:
    return next(t for t in e.list_tasks() if t["kind"] == kind)


def play(e: ToolLookupEnv, policy: str, task: dict[str, Any], seed: int = 0) -> StepResult:
    pol = make_policy("tool-lookup", policy, "v")
    pol.reset(e.task_view(task["task_id"], task["task_version"], oracle=pol.needs_oracle), seed)
    obs = e.reset(seed, task_id=task["task_id"]).observation
    while True:
        res = e.step(pol.act(obs).action)
        obs = res.observation
        if res.done:
            return res


# -- the task set ----------------------------------------------------------------------------------------------
def test_splits_are_by_family_with_every_kind_in_every_split_and_fixed_sizes() -> None:
    tasks = load_tasks()
    split_of: dict[str, set[str]] = defaultdict(set)
    kinds: dict[str, set[str]] = defaultdict(set)
    for t in tasks:
        split_of[t["family"]].add(t["split"])
        kinds[t["split"]].add(t["kind"])
    assert all(len(s) == 1 for s in split_of.values()), "a family crosses splits"
    assert {s: kinds[s] for s in (Split.TRAIN, Split.DEV, Split.HIDDEN)} == {s: set(KINDS) for s in
                                                                              (Split.TRAIN, Split.DEV, Split.HIDDEN)}
    assert Counter(t["split"] for t in tasks) == {Split.TRAIN: 20400, Split.DEV: 60, Split.HIDDEN: 240}
    assert len({t["task_id"] for t in tasks}) == len(tasks)
    templates = [text for kind in KINDS for _, text in PHRASINGS[kind]]
    assert len(set(templates)) == len(templates)  # a phrasing belongs to one family, hence one split
    for split in (Split.TRAIN, Split.DEV, Split.HIDDEN):
        assert [t["split"] for t in load_tasks(split)] == [split] * sum(
            INSTANCES_PER_FAMILY[split] for _, _, s in families().values() if s == split)


# sha256 of repr([(task_id, task_version), ...]) in generation order, taken before the train split grew from 68 to 680
# instances per family (2026-12-03): dev, hidden and the first 68 instances of every train family.
_GOLDEN_DIGESTS = {
    "train<68": "086c2fbde2251b5e1f156abae0e92c39d5ddebe8ac4fc211baf4e8f6577ac6b3",
    Split.DEV: "3fc98f62b52922c484bdacdfedd4db7a1e87059e4dbf563b8dcd9ac212a31c81",
    Split.HIDDEN: "140ddbed255e60844e7d48ab9af73ff64082f70cb9d78514fe9838719b04c96c",
}


def test_growing_the_train_split_changed_no_earlier_task() -> None:
    """Every task of the 2,040-task train split, and every dev and hidden task, keeps its id and content version,
    so runs and configs made before the train split grew select and score the same tasks."""

    def digest(tasks: list[dict[str, Any]]) -> str:
        return hashlib.sha256(repr([(t["task_id"], t["task_version"]) for t in tasks]).encode()).hexdigest()

    assert digest([t for t in load_tasks(Split.TRAIN) if t["seed"] < 68]) == _GOLDEN_DIGESTS["train<68"]
    assert digest(load_tasks(Split.DEV)) == _GOLDEN_DIGESTS[Split.DEV]
    assert digest(load_tasks(Split.HIDDEN)) == _GOLDEN_DIGESTS[Split.HIDDEN]


def test_the_train_list_starts_with_the_tasks_it_held_before_it_grew_in_their_order() -> None:
    """The tasks the split gained come after the 2,040 it held, which keep their order (task ids sort
    lexicographically, so instance 100 would otherwise come before 11): B1's data and R1's tasks of every earlier
    experiment config, and ``reset(seed)``, pick the same tasks. Digests taken at commit 76419c7."""
    from trajlake.envs import list_tasks

    from trajlake.experiment.config import load_experiment
    from trajlake.experiment.run import task_pools

    ids = [t["task_id"] for t in list_tasks("tool-lookup", Split.TRAIN)]
    assert hashlib.sha256(json.dumps(ids[:2040]).encode()).hexdigest() == (
        "cde47e9a6a8ed91e94cf30c9dddc5cbc3d1bad6f02385530b6aa86ed9506a00e")
    assert all(int(i.rsplit("/", 1)[1]) >= 68 for i in ids[2040:]) and len(ids) == 20400
    quick = load_experiment(Path(__file__).resolve().parent.parent / "configs"
                            / "experiment-positive-control-quick.toml")
    assert hashlib.sha256(json.dumps(list(task_pools(quick))).encode()).hexdigest() == (
        "1e5d2298018839e1f5f6b3c606a13457f47c6e4619f86b2d2dfeba733fc44ca8")


def test_the_tokenizer_corpus_did_not_change_when_the_train_split_grew() -> None:
    """An environment tokenizer's corpus comes from the first 68 instances of every train family, so tokenizers
    built after the split grew (and every model trained with one) are the ones built before: the digests are of
    ``oracle_episodes("tool-lookup", n)`` at commit 76419c7, when the split held 2,040 tasks."""
    from trajlake.policies.tiny import oracle_episodes

    for n, expected in ((64, "e2dac9a6f1b3ed8d0b9d1e7bafa6305d457332315cd362223acef427a1b51efb"),
                        (1000, "df63ce061f3a5e96c14ae9874f6bec715eaea7f02f2e9abfd46a7ead58015ed5")):
        episodes = oracle_episodes("tool-lookup", n)
        assert len(episodes) == n
        assert hashlib.sha256(json.dumps(episodes).encode()).hexdigest() == expected


def test_extra_train_phrasings_add_train_families_after_the_standard_list_and_change_nothing_else() -> None:
    """``train_phrasings = N`` (10-30) adds the extra phrasings p12... as train families of 680 instances each,
    listed after the standard train split, which keeps its order; dev, hidden and the tokenizer's corpus are the
    same; the default is the standard set."""
    from trajlake.envs import list_tasks

    standard = list_tasks("tool-lookup", Split.TRAIN)
    wide = list_tasks("tool-lookup", Split.TRAIN, train_phrasings=12)
    assert wide[:len(standard)] == standard
    added = wide[len(standard):]
    assert Counter(t["family"] for t in added) == {f"{k}/p{i}": 680 for k in KINDS for i in (12, 13)}
    assert {t["split"] for t in added} == {Split.TRAIN}
    for t in added[:50]:
        assert t == make_task(t["family"], t["seed"])
        kind, phrasing = t["kind"], int(t["family"].rsplit("/p", 1)[1])
        assert t["statement"] == EXTRA_TRAIN_PHRASINGS[kind][phrasing - 12].format(
            a=t["plan"][0]["args"]["name"], b=t["plan"][1]["args"]["name"] if kind != "code" else None)
    for split in (Split.DEV, Split.HIDDEN):
        assert list_tasks("tool-lookup", split, train_phrasings=30) == list_tasks("tool-lookup", split)
    wide_env, standard_env = make("tool-lookup", split=Split.TRAIN, train_phrasings=12), make("tool-lookup",
                                                                                               split=Split.TRAIN)
    assert wide_env.tokenizer_corpus_tasks() == standard_env.tokenizer_corpus_tasks()
    assert wide_env.reset(0, task_id=added[0]["task_id"]).observation == added[0]["statement"]
    with pytest.raises(EnvError, match="unknown task 'tool-lookup/code/p12/0'"):
        standard_env.reset(0, task_id=added[0]["task_id"])  # the standard set does not play the extra families


def assert_new_phrasings_keep_their_kinds_cues(extra: dict[str, tuple[str, ...]], others: set[str],
                                               count: int) -> None:
    """``count`` distinct phrasings, none of ``others``; each names its entries in quotes and has its kind's cue
    (two-hop: "partner"; pair: a second name and "dash"; code: neither)."""
    texts = [text for kind in KINDS for text in extra[kind]]
    assert len(texts) == len(set(texts)) == count and not others & set(texts)
    for kind in KINDS:
        for text in extra[kind]:
            assert text.count('"{a}"') >= 1 and ("partner" in text) == (kind == "two_hop"), text
            assert ('"{b}"' in text) == (kind == "pair") and ("dash" in text) == (kind == "pair"), text


def test_the_extra_phrasings_keep_their_kinds_cues_and_are_no_dev_or_hidden_phrasing() -> None:
    assert_new_phrasings_keep_their_kinds_cues(EXTRA_TRAIN_PHRASINGS,
                                               {text for kind in KINDS for _, text in PHRASINGS[kind]}, 60)


def test_the_late_train_phrasings_append_families_p41_to_p46_after_the_thirty() -> None:
    """``train_phrasings`` 31-36 adds the late phrasings p41... (after the hidden p32-p40) as train families of 680
    instances each, listed after the thirty-phrasing split, which keeps its order; dev and hidden do not change."""
    from trajlake.envs import list_tasks

    thirty = list_tasks("tool-lookup", Split.TRAIN, train_phrasings=30)
    late = list_tasks("tool-lookup", Split.TRAIN, train_phrasings=32)
    assert late[:len(thirty)] == thirty
    added = late[len(thirty):]
    assert Counter(t["family"] for t in added) == {f"{k}/p{i}": 680 for k in KINDS for i in (41, 42)}
    assert {t["split"] for t in added} == {Split.TRAIN}
    for t in added[::97]:
        assert t == make_task(t["family"], t["seed"])
        kind, phrasing = t["kind"], int(t["family"].rsplit("/p", 1)[1])
        assert t["statement"] == LATE_TRAIN_PHRASINGS[kind][phrasing - 41].format(
            a=t["plan"][0]["args"]["name"], b=t["plan"][1]["args"]["name"] if kind != "code" else None)
    assert len(list_tasks("tool-lookup", Split.TRAIN, train_phrasings=36)) == 36 * 3 * 680
    for split in (Split.DEV, Split.HIDDEN):
        assert list_tasks("tool-lookup", split, train_phrasings=36) == list_tasks("tool-lookup", split)
    assert [(is_extra_family(f), is_late_family(f), is_extra_hidden_family(f))
            for f in ("code/p31", "code/p32", "code/p40", "code/p41", "pair/p46")] == [
        (True, False, False), (False, False, True), (False, False, True), (True, True, False), (True, True, False)]
    env = make("tool-lookup", split=Split.TRAIN, train_phrasings=32)
    assert env.reset(0, task_id=added[0]["task_id"]).observation == added[0]["statement"]
    assert env.tokenizer_corpus_tasks() == make("tool-lookup", split=Split.TRAIN).tokenizer_corpus_tasks()


def test_the_late_phrasings_keep_their_kinds_cues_and_are_none_of_the_others() -> None:
    others = {text for kind in KINDS for _, text in PHRASINGS[kind]} | {
        text for extra in (EXTRA_TRAIN_PHRASINGS, EXTRA_HIDDEN_PHRASINGS) for kind in KINDS for text in extra[kind]}
    assert_new_phrasings_keep_their_kinds_cues(LATE_TRAIN_PHRASINGS, others, 18)


def test_ten_phrasings_held_out_of_36_leave_b1_the_thirteenth_designs_26_and_its_12000_tasks() -> None:
    """The fifteenth positive-control design (36 train phrasings, 10 held out for RL) gives B1 exactly the
    thirteenth's families and data tasks (30 phrasings, 4 held out), and RL p28-p31 with the late p41-p46."""
    from trajlake.experiment.config import load_experiment
    from trajlake.experiment.run import phrasing_families, task_pools

    configs = Path(__file__).resolve().parent.parent / "configs"
    thirteenth = load_experiment(configs / "experiment-positive-control-phrasings.toml")
    fifteenth = load_experiment(configs / "experiment-positive-control-late-phrasings.toml")
    assert fifteenth.env_args["train_phrasings"] == 36 and fifteenth.rl.holdout_phrasings == 10
    b1, rl = phrasing_families("tool-lookup", 10, fifteenth.env_args)
    assert b1 == phrasing_families("tool-lookup", 4, thirteenth.env_args)[0] and len(b1) == 78
    assert rl == {f"tool-lookup/{k}/p{i}" for k in KINDS for i in (28, 29, 30, 31, 41, 42, 43, 44, 45, 46)}
    assert task_pools(fifteenth)[0] == task_pools(thirteenth)[0]


@pytest.mark.parametrize("bad", [9, 37, True, "30", 12.0, None])
def test_a_bad_train_phrasings_is_refused_in_one_line(bad: Any) -> None:
    from trajlake.errors import TrajlakeError

    with pytest.raises(TrajlakeError, match=r"^tool-lookup: train_phrasings must be a whole number from 10 to 36"):
        make("tool-lookup", split=Split.TRAIN, train_phrasings=bad)


@pytest.mark.parametrize("k", [2, 5, 10])
def test_hidden_phrasings_spread_the_hidden_splits_240_instances_over_k_phrasings_per_kind(k: int) -> None:
    """``hidden_phrasings = K`` keeps 80 hidden instances per kind, 80/K for each of K phrasings (the standard one,
    then p32...); its first 80/K instances of the standard phrasing are the standard set's; train, dev and the
    tokenizer's corpus do not change; the standard set does not play the extra hidden families."""
    from trajlake.envs import list_tasks

    hidden = list_tasks("tool-lookup", Split.HIDDEN, hidden_phrasings=k)
    expected = {f"{kind}/p{i}": 80 // k for kind in KINDS for i in (5, *range(32, 31 + k))}
    assert Counter(t["family"] for t in hidden) == expected and len(hidden) == 240
    assert {t["split"] for t in hidden} == {Split.HIDDEN}
    standard = {t["task_id"]: t for t in list_tasks("tool-lookup", Split.HIDDEN)}
    for t in hidden:
        assert t == make_task(t["family"], t["seed"])
        kind, phrasing = t["kind"], int(t["family"].rsplit("/p", 1)[1])
        if phrasing == 5:
            assert t == standard[t["task_id"]] and t["seed"] < 80 // k
        else:
            assert t["statement"] == EXTRA_HIDDEN_PHRASINGS[kind][phrasing - 32].format(
                a=t["plan"][0]["args"]["name"], b=t["plan"][1]["args"]["name"] if kind != "code" else None)
    for split in (Split.TRAIN, Split.DEV):
        assert list_tasks("tool-lookup", split, hidden_phrasings=k) == list_tasks("tool-lookup", split)
    assert (make("tool-lookup", split=Split.TRAIN, hidden_phrasings=k).tokenizer_corpus_tasks()
            == make("tool-lookup", split=Split.TRAIN).tokenizer_corpus_tasks())
    extra = next(t for t in hidden if t["family"].endswith("/p32"))
    assert make("tool-lookup", split=Split.HIDDEN, hidden_phrasings=k).reset(
        0, task_id=extra["task_id"]).observation == extra["statement"]
    with pytest.raises(EnvError, match=f"unknown task '{extra['task_id']}'"):
        make("tool-lookup", split=Split.HIDDEN).reset(0, task_id=extra["task_id"])


def test_the_extra_hidden_phrasings_keep_their_kinds_cues_and_are_no_train_or_dev_phrasing() -> None:
    others = {text for kind in KINDS for _, text in PHRASINGS[kind]} | {
        text for kind in KINDS for text in EXTRA_TRAIN_PHRASINGS[kind]}
    assert_new_phrasings_keep_their_kinds_cues(EXTRA_HIDDEN_PHRASINGS, others, 27)


@pytest.mark.parametrize("bad", [0, 3, 11, True, "10", 2.0, None])
def test_a_bad_hidden_phrasings_is_refused_in_one_line(bad: Any) -> None:
    from trajlake.errors import TrajlakeError

    with pytest.raises(TrajlakeError, match=r"^tool-lookup: hidden_phrasings must be one of 1, 2, 4, 5, 8, 10 "):
        make("tool-lookup", split=Split.HIDDEN, hidden_phrasings=bad)


def test_the_experiment_splits_the_extra_phrasings_between_b1_and_rl_through_env_args() -> None:
    """``env_args = { train_phrasings = N }`` reaches the experiment's task pools: with 14 train phrasings per kind
    and four held out for RL, B1 gets the standard ten of each kind and RL the four extra ones (p12-p15)."""
    from trajlake.experiment.config import load_experiment
    from trajlake.experiment.run import phrasing_families, task_pools

    b1, rl = phrasing_families("tool-lookup", 4, {"train_phrasings": 14})
    assert rl == {f"tool-lookup/{k}/p{i}" for k in KINDS for i in (12, 13, 14, 15)}
    assert b1 == {f"tool-lookup/{f}" for f, (_, _, split) in families().items() if split == Split.TRAIN}
    cfg = dataclasses.replace(load_experiment(Path(__file__).resolve().parent.parent / "configs"
                                              / "experiment-positive-control-quick.toml"),
                              env_args={"train_phrasings": 14})
    b1_tasks, rl_tasks = task_pools(cfg)
    assert {t.rsplit("/", 1)[0] for t in b1_tasks} == b1 and {t.rsplit("/", 1)[0] for t in rl_tasks} == rl


def test_tasks_are_a_pure_function_of_family_and_seed() -> None:
    a, b = make_task("two_hop/p1", 7), make_task("two_hop/p1", 7)
    assert a == b and a["task_version"] == b["task_version"] == taskset.content_version(a)
    assert make_task("two_hop/p1", 8)["task_version"] != a["task_version"]
    changed = {**a, "answer": "000"}
    assert taskset.content_version(changed) != a["task_version"]
    assert a["provenance"]["seed"] == 7 and a["provenance"]["generator"] == "trajlake.envs.tool_lookup.tasks"
    # the statement names the key, never the answer (codes are digits; two-hop: the partner is not named)
    for t in load_tasks(Split.HIDDEN):
        assert not any(c.isdigit() for c in t["statement"]) and t["answer"] not in t["statement"]
        if t["kind"] == "two_hop":
            assert t["plan"][1]["args"]["name"] not in t["statement"] and "partner" in t["statement"]
        names = list(t["directory"])
        assert 4 <= len(names) <= 8 and all(n in NAMES for n in names)
        assert all(e["code"] in CODES for e in t["directory"].values())


def test_task_rows_keep_the_solution_out_and_documents_give_the_directory(env: ToolLookupEnv) -> None:
    t = env.list_tasks()[0]
    row = env.task_row(t)
    text = json.dumps(row, default=str)
    assert t["answer"] not in text.replace(t["statement"], "")
    assert row["provenance"]["seed"] == t["seed"] and row["budget"]["max_steps"] == MAX_STEPS
    docs = ToolLookupEnv.evaluation_documents([t["task_id"], "nope"])
    assert [d.kind for d in docs] == ["directory"] and t["answer"].split("-")[0] in docs[0].text


# -- the contract ----------------------------------------------------------------------------------------------
def test_check_env_passes(env: ToolLookupEnv) -> None:
    task = env.tasks[0]
    check_env(env, [json.dumps(c) for c in task["plan"][:-1]])


def test_oracle_solves_every_instance_and_the_baselines_differ() -> None:
    for split in (Split.TRAIN, Split.DEV, Split.HIDDEN):
        e = make_env("tool-lookup", split=split)
        try:
            tasks = e.list_tasks()
            assert all(play(e, "oracle", t).reward_components["resolved"] == 1.0 for t in tasks), split
            if split == Split.HIDDEN:
                heuristic = Counter((t["kind"], play(e, "heuristic", t).reward_components["resolved"]) for t in tasks)
                assert heuristic == {("code", 1.0): 80, ("two_hop", 0.0): 80, ("pair", 0.0): 80}
                rnd = sum(play(e, "random", t).reward_components["resolved"] for t in tasks)
                assert 0 < rnd < 40
        finally:
            e.close()


def test_shortcut_oracle_skips_lookups_in_its_share_of_episodes_whatever_the_statement() -> None:
    """``oracle-shortcut`` (the positive control's privileged demonstrator) solves every task, submitting at once in
    ~40% of (task, seed) pairs, at the same rate on every kind, so the statement does not predict a shortcut."""
    from trajlake.envs.tool_lookup.policies import SHORTCUT_RATE, takes_shortcut

    e = make_env("tool-lookup", split=Split.TRAIN)
    try:
        tasks = e.list_tasks()[::5]
        shortcuts: Counter[str] = Counter()
        for t in tasks:
            pol = make_policy("tool-lookup", "oracle-shortcut", "v")
            pol.reset(e.task_view(t["task_id"], t["task_version"], oracle=True), 0)
            obs = e.reset(0, task_id=t["task_id"]).observation
            calls = []
            while True:
                action = pol.act(obs).action
                calls.append(json.loads(action)["tool"])
                res = e.step(action)
                obs = res.observation
                if res.done:
                    break
            assert res.reward_components["resolved"] == 1.0, t["task_id"]
            short = takes_shortcut(t["task_id"], 0)
            assert calls == (["submit"] if short else [c["tool"] for c in t["plan"]]), t["task_id"]
            shortcuts[t["kind"]] += short
        per_kind = Counter(t["kind"] for t in tasks)
        for kind in KINDS:
            assert abs(shortcuts[kind] / per_kind[kind] - SHORTCUT_RATE) < 0.08, (kind, shortcuts, per_kind)
    finally:
        e.close()


def test_steps_errors_and_budget(env: ToolLookupEnv) -> None:
    t = first(env, "code")
    name = t["plan"][0]["args"]["name"]
    env.reset(0, task_id=t["task_id"])
    r = env.step(act("lookup", name="Nobody"))
    assert r.status == Status.MODEL_INVALID_ACTION and r.observation == 'error: no entry named "Nobody"' and not r.done
    r = env.step("not json")
    assert r.status == Status.MODEL_INVALID_ACTION and not r.done
    r = env.step(act("lookup", name=f" {name} "))
    entry = json.loads(r.observation)
    assert r.status == Status.OK and entry == {"name": name, **t["directory"][name]}
    assert r.gateway_events[0]["tool"] == "lookup" and r.gateway_events[0]["side_effect_class"] == "read"
    r = env.step(act("submit", answer=f" {t['answer']}\n"))
    assert r.terminated and r.reward_components == {"resolved": 1.0}
    assert r.termination_reason == TerminationReason.SUCCESS and t["answer"] in r.observation
    env.reset(0, task_id=t["task_id"])
    r = env.step(act("submit", answer="999-1"))
    assert r.terminated and r.reward_components == {"resolved": 0.0}
    assert r.termination_reason == TerminationReason.SUBMITTED
    env.reset(0, task_id=t["task_id"])
    results = [env.step(act("lookup", name=name)) for _ in range(MAX_STEPS)]
    assert not any(x.done for x in results[:-1]) and results[-1].truncated
    assert results[-1].status == Status.BUDGET_EXHAUSTED and results[-1].reward_components == {"resolved": 0.0}
    assert results[-1].termination_reason == TerminationReason.BUDGET_STEPS


def test_directory_busy_fault(env: ToolLookupEnv) -> None:
    t = first(env, "code")
    r0 = env.reset(0, task_id=t["task_id"])
    busy = env.step_with_fault(FaultKind.DIRECTORY_BUSY, json.dumps(t["plan"][0]))
    assert (busy.status, busy.observation, busy.fault_injected) == (Status.ENV_TRANSIENT, BUSY, "directory_busy")
    assert busy.state_hash == r0.state_hash and not busy.gateway_events and not busy.done
    end = env.step_with_fault(FaultKind.DIRECTORY_BUSY, json.dumps(t["plan"][-1]))  # submit: not a lookup
    assert end.fault_injected is None and end.reward_components == {"resolved": 1.0}
    with pytest.raises(Exception, match="makes no fault of kind"):
        env.step_with_fault("flaky_test_run", "{}")


def test_rollout_with_faults_replays_and_the_fault_costs_a_reader(tmp_path: Path, env: ToolLookupEnv) -> None:
    lake = tmp_path / "lake"
    tasks = tuple(t["task_id"] for t in env.list_tasks()[::10])
    cfg = RolloutConfig(lake=str(lake), run_id="busy", env="tool-lookup", policy="oracle", split="dev",
                        seeds=(0, 1), commit_every_s=60, task_ids=tasks, fault_rate=0.5, fault_seed=1,
                        fault_kinds=("directory_busy",))
    s = run_rollout(cfg)
    assert not s.failed_items
    con = connect(lake)
    n_busy = con.execute("select count(*) from turns where fault_injected = 'directory_busy'").fetchone()[0]
    assert n_busy > 0
    turns_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows(con, "select * from turns order by episode_id, turn_idx"):
        turns_of[row["episode_id"]].append(row)
    episodes = rows(con, "select * from episodes")
    assert len(episodes) == 12
    for ep in episodes:
        assert env.replay(replay_log_from_rows(ep, turns_of[ep["episode_id"]])[0]).ok
    # the heuristic reads the lookup's answer and does not retry: a busy directory costs it the episode
    task = first(env, "code")
    rec = play_episode(env, make_policy("tool-lookup", "heuristic", "h"), run_id="h", task_id=task["task_id"],
                       task_version=task["task_version"], seed=0, faults=FaultInjector(1.0, 0, ("directory_busy",)))
    assert not rec.episode["success"] and rec.episode["faults_injected"] == 1


def test_gymnasium_id() -> None:
    gymnasium = pytest.importorskip("gymnasium")
    g = gymnasium.make("trajlake/ToolLookup-v0")
    obs, info = g.reset(seed=0)
    assert obs.startswith("Submit the code") and info["task_id"].startswith("tool-lookup/")
    g.close()


def test_cli_rollout_eval_and_reward_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake = str(tmp_path / "lake")
    for policy in ("oracle", "heuristic", "random"):
        code, out, err = run_cli(capsys, "--lake", lake, "rollout", "--env", "tool-lookup", "--policy", policy,
                                 "--split", "dev")
        assert code == 0, err
    code, out, err = run_cli(capsys, "--lake", lake, "eval", "--baseline", "random-dev", "--candidate",
                             "heuristic-dev", "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    success = {r: report["runs"][r]["metrics"]["success"]["estimate"] for r in ("random-dev", "heuristic-dev")}
    assert success["heuristic-dev"] == pytest.approx(1 / 3) and success["random-dev"] < 0.2
    con = connect(lake)
    assert con.execute("select count(*) from episodes where run_id = 'oracle-dev' and success").fetchone()[0] == 60
    for run in ("oracle-dev", "random-dev"):
        rep = check_reward(lake, run, "trajlake.evaluators.process_rewards:lookup_progress")
        assert rep["hackable_under"] == [], rep["perturbations"]
    # recorded episodes: the oracle's reward is the maximum, 1 minus its calls' cost
    turns: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows(con, "select * from turns where run_id = 'oracle-dev' order by episode_id, turn_idx"):
        turns[row["episode_id"]].append(row)
    assert len(turns) == 60
    for tr in turns.values():
        calls = sum(1 for t in tr if t["actor"] == "policy")
        assert lookup_progress(tr) == pytest.approx(1 - 0.01 * calls)


# -- the process reward -----------------------------------------------------------------------------------------
def statement(text: str) -> dict[str, Any]:
    return {"role": "user", "actor": "user", "raw_content": text, "status": "OK"}


def call(tool: str, **args: Any) -> dict[str, Any]:
    return {"role": "assistant", "actor": "policy", "raw_content": act(tool, **args), "action_schema": tool,
            "status": "OK"}


def seen(name: str, code: str, partner: str, status: str = "OK", tool: str = "lookup") -> dict[str, Any]:
    return {"role": "tool", "actor": "env", "action_schema": tool, "status": status,
            "raw_content": json.dumps({"name": name, "code": code, "partner": partner})}


def lookup(name: str, code: str, partner: str, status: str = "OK") -> list[dict[str, Any]]:
    return [call("lookup", name=name), seen(name, code, partner, status)]


def submit(answer: str) -> list[dict[str, Any]]:
    return [call("submit", answer=answer), {"role": "tool", "actor": "env", "action_schema": "submit",
                                            "status": "OK", "raw_content": "The episode is over."}]


TWO_HOP = 'What is the code of the partner of "Bofa"? Submit it.'


@pytest.mark.parametrize(("turns", "expected"), [
    # one lookup task: the entry is worth 1
    ([statement('Look up "Bofa" and submit its code.'), *lookup("Bofa", "123", "Kilo"), *submit("123")], 1 - 0.02),
    # two-hop, in order: both entries count
    ([statement(TWO_HOP), *lookup("Bofa", "123", "Kilo"), *lookup("Kilo", "456", "Bofa"), *submit("456")],
     1 - 0.03),
    # two-hop, the partner looked up before the entry naming it: only the first entry counts
    ([statement(TWO_HOP), *lookup("Kilo", "456", "Bofa"), *lookup("Bofa", "123", "Kilo"), *submit("456")],
     0.5 - 0.03),
    # a repeated lookup and an unneeded one earn nothing and cost a call each
    ([statement(TWO_HOP), *lookup("Bofa", "123", "Kilo"), *lookup("Bofa", "123", "Kilo"),
      *lookup("Mede", "789", "Bofa"), *submit("123")], 0.5 - 0.04),
    # a busy (faulted) or failed lookup, and text the policy wrote, earn nothing
    ([statement('Look up "Bofa" and submit its code.'), *lookup("Bofa", "123", "Kilo", status="ENV_TRANSIENT"),
      {"role": "assistant", "actor": "policy", "raw_content": '{"name": "Bofa", "code": "123", "partner": "Kilo"}',
       "action_schema": None, "status": "MODEL_INVALID_ACTION"}, *submit("123")], -0.02),
    # a pair task: each quoted entry is half; no partner is needed
    ([statement('Submit the code of "Bofa", a dash, then the code of "Kilo".'), *lookup("Kilo", "456", "Mede"),
      *lookup("Mede", "789", "Bofa"), *submit("456")], 0.5 - 0.03),
])
def test_lookup_progress(turns: list[dict[str, Any]], expected: float) -> None:
    per_turn = lookup_progress_per_turn(turns)
    assert len(per_turn) == len(turns) and sum(per_turn) == pytest.approx(lookup_progress(turns))
    assert lookup_progress(turns) == pytest.approx(expected)
    # credit lands on the observation turn that showed the entry, the cost on the call turn
    assert all(v <= 0 for v, t in zip(per_turn, turns, strict=True) if t["actor"] != "env")


# -- the tokenizer trained on rendered episodes ------------------------------------------------------------------
def test_env_tokenizer_keeps_calls_short_and_pieces_token_exact(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from trajlake.policies.tiny import build_tiny_model, chatml, oracle_episodes, oracle_token_counts
    from trajlake.render.chat import ChatRenderer
    from trajlake.render.toolcall import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

    episodes = oracle_episodes("tool-lookup", 24)
    assert len(episodes) == 24 and all(m["role"] == "assistant" for ep in episodes for m in ep[2::2])
    path = build_tiny_model(tmp_path / "m", env="tool-lookup", episodes=episodes)
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    for wrapper in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE):
        assert len(tok(wrapper, add_special_tokens=False)["input_ids"]) == 1
    counts = oracle_token_counts(tok, episodes)
    assert max(counts["lookup"]) <= 15 and max(counts["submit"]) <= 15 and max(counts["episode"]) <= 400, counts
    renderer = ChatRenderer(tok, "tiny")
    for ep in episodes:
        text = chatml(ep)
        assert text + "<|im_start|>assistant\n" == tok.apply_chat_template(ep, tokenize=False,
                                                                           add_generation_prompt=True)
        assert tok.decode(renderer.encode(text)) == text
        # the pieces an hf: policy builds concatenate to the tokenization of the whole text (the trainer's check)
        pieces = renderer.initial(ep[0]["content"], ep[1]["content"])
        whole = renderer.initial_text(ep[0]["content"], ep[1]["content"])
        for c, o in zip(ep[2::2], ep[3::2], strict=True):
            obs = o["content"].removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")
            pieces += [*renderer.encode(c["content"]), renderer.eos_id, *renderer.observation(obs, True)]
            whole += c["content"] + renderer.eos_text + renderer.observation_text(obs, True)
        assert pieces == renderer.encode(whole)
    # a name is split the same way in the statement, the observation and the call
    ep = episodes[0]
    name = json.loads(ep[2]["content"].removeprefix(TOOL_CALL_OPEN).removesuffix(TOOL_CALL_CLOSE))["arguments"]["name"]
    ids = renderer.encode(name)
    for text in (ep[1]["content"], ep[2]["content"], ep[3]["content"]):
        enc = renderer.encode(text)
        assert any(enc[i:i + len(ids)] == ids for i in range(len(enc))), text


def test_play_episode_records_the_statement_as_the_first_turn(env: ToolLookupEnv) -> None:
    t = first(env, "pair")
    rec = play_episode(env, make_policy("tool-lookup", "oracle", "o"), run_id="r", task_id=t["task_id"],
                       task_version=t["task_version"], seed=0, faults=FaultInjector())
    assert rec.turns[0]["raw_content"] == t["statement"] and rec.episode["success"]
    assert [x["action_schema"] for x in rec.turns if x["actor"] == "policy"] == ["lookup", "lookup", "submit"]


@pytest.mark.parametrize("env_id", ["tool-lookup", "mini-web", "mini-swe"])
def test_a_budget_mapping_from_env_args_is_a_budget_in_every_tool_env(env_id: str) -> None:
    """``--env-arg budget='{"max_steps": 1}'`` and a training config's ``env_args`` give the budget as a mapping:
    every ToolEnv reads it (tool-lookup and Mini Web crashed on it with an AttributeError), and a mistyped key is
    one line naming the environment and the keys."""
    from trajlake.envs.core import Budget, EnvError

    env = make_env(env_id, split="dev", budget={"max_steps": 1})
    try:
        assert env.budget_override == Budget(max_steps=1)
        env.reset(0, task_id=env.tasks[0]["task_id"])
        assert env.tracker.budget.max_steps == 1
    finally:
        env.close()
    with pytest.raises(EnvError, match=r"budget: unknown key\(s\) max_step; expected max_steps, max_tokens"):
        make_env(env_id, split="dev", budget={"max_step": 1})


def test_tiny_model_heads_are_settings_and_a_bad_split_of_heads_is_refused_before_writing(tmp_path: Path) -> None:
    from transformers import AutoConfig

    from trajlake.errors import TrajlakeError
    from trajlake.policies.tiny import build_tiny_model, oracle_episodes

    episodes = oracle_episodes("tool-lookup", 4)
    path = build_tiny_model(tmp_path / "m8", env="tool-lookup", episodes=episodes, heads=8, kv_heads=8)
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (8, 8, 8)
    default = AutoConfig.from_pretrained(str(build_tiny_model(tmp_path / "m", env="tool-lookup", episodes=episodes)),
                                         local_files_only=True)
    assert (default.num_attention_heads, default.num_key_value_heads) == (4, 2)
    for heads, kv_heads in [(3, 1), (8, 3)]:
        with pytest.raises(TrajlakeError, match="divisible"):
            build_tiny_model(tmp_path / "bad", env="tool-lookup", episodes=episodes, heads=heads, kv_heads=kv_heads)
        assert not (tmp_path / "bad").exists()
