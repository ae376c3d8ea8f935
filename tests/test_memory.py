"""Episodic memory (envs/memory.py) in the built-in environments: a capability the run grants, a cost, limits,
recorded turns, and a scope of one episode (nothing written in one episode or run is readable in another)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from trajlake.envs import registry
from trajlake.envs.core import EnvError
from trajlake.envs.gateway import Gateway, Permissions, ToolSpec
from trajlake.envs.memory import MEMORY_TOOLS, EpisodicMemory, MemoryConfig
from trajlake.envs.policy import Policy, PolicyOutput, TaskView
from trajlake.envs.tool_lookup.env import ToolLookupEnv
from trajlake.envs.tool_lookup.policies import OraclePolicy
from trajlake.schemas.vocab import Capability, Status

from trajlake.query import connect
from trajlake.record.episode import CostModel
from trajlake.rollout.runner import RolloutConfig, play_episode, replay_log_from_rows, run_rollout

ROOMY = {"max_steps": 10}  # the tasks' own budget (6 steps) leaves no room for the probe's memory calls


def rows_of(con: Any, sql: str) -> list[dict[str, Any]]:
    rel = con.execute(sql)
    cols = [d[0] for d in rel.description]
    return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]


def act(tool: str, **args: Any) -> str:
    return json.dumps({"tool": tool, "args": args}, sort_keys=True)


@pytest.fixture
def lookup(tmp_path: Path) -> Iterator[Callable[..., ToolLookupEnv]]:
    made: list[ToolLookupEnv] = []

    def make(budget: Mapping[str, Any] = ROOMY, **kwargs: Any) -> ToolLookupEnv:
        env = ToolLookupEnv("dev", workdir=tmp_path, budget=budget, **kwargs)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


def test_memory_needs_the_capability_which_only_a_run_that_turns_it_on_grants(lookup: Any) -> None:
    off = lookup()
    assert not set(MEMORY_TOOLS) & set(off.listed_tool_docs)  # not listed: runs without memory see the old tools
    assert ToolLookupEnv.tool_docs_for({}) == ToolLookupEnv.tool_docs
    r = off.reset(0)
    res = off.step(act("memory_write", key="k", text="v"))
    ev = res.gateway_events[0]
    assert (res.status, ev["decision"], ev["executed"], ev["capability"]) == \
        (Status.SAFETY_BLOCK, "deny", False, Capability.MEMORY)
    assert "capability not granted: memory" in res.observation and res.state_hash == r.state_hash
    assert off.step(act("memory_read", key="k")).status == Status.SAFETY_BLOCK

    on = lookup(memory=True)
    view = on.task_view(on.list_tasks()[0]["task_id"], on.list_tasks()[0]["task_version"])
    assert set(MEMORY_TOOLS) <= set(view.tools) and dict(view.tools) == dict(ToolLookupEnv.tool_docs_for(
        {"memory": True}))  # what the policy is shown is what a run's grammar is built from
    r = on.reset(0)
    assert r.state_hash == off.reset(0).state_hash  # an empty memory leaves the state hash as it always was
    w = on.step(act("memory_write", key="k", text="v"))
    ev = w.gateway_events[0]
    assert (w.status, ev["decision"], ev["executed"], ev["capability"], ev["side_effect_class"]) == \
        (Status.OK, "allow", True, Capability.MEMORY, "write")
    assert ev["state_hash_before"] == r.state_hash != ev["state_hash_after"] == w.state_hash
    read = on.step(act("memory_read", key="k"))
    assert (read.status, read.observation) == (Status.OK, "v")
    assert read.gateway_events[0]["side_effect_class"] == "read" and read.state_hash == w.state_hash
    with pytest.raises(EnvError, match=r"tool-lookup: memory: unknown key\(s\) entries; expected max_entries"):
        lookup(memory={"entries": 3})
    with pytest.raises(EnvError, match="memory: max_entry_bytes must be a positive integer"):
        lookup(memory={"max_entry_bytes": 0})
    with pytest.raises(EnvError, match="memory: expected true, false or a mapping"):
        lookup(memory="yes")


def test_limits_refuse_in_one_line_and_store_nothing(lookup: Any) -> None:
    env = lookup(memory={"max_entries": 2, "max_entry_bytes": 8, "max_key_chars": 4}, budget={"max_steps": 20})
    env.reset(0)

    def call(tool: str, **args: Any) -> tuple[str, str]:
        res = env.step(act(tool, **args))
        return res.status, res.observation

    assert call("memory_write", key="a", text="12345678")[0] == Status.OK  # exactly the limit
    status, obs = call("memory_write", key="b", text="éééé1")  # 5 characters, 9 bytes
    assert status == Status.MODEL_INVALID_ACTION and obs.startswith("error: memory_write: the text is 9 bytes")
    assert "\n" not in obs and env.memory.entries == {"a": "12345678"}
    status, obs = call("memory_write", key="b", text="x" * 9)  # over the limit in characters: the schema says so
    assert status == Status.MODEL_INVALID_ACTION and "invalid arguments: $.text: longer than 8" in obs
    status, obs = call("memory_write", key="toolong", text="x")
    assert status == Status.MODEL_INVALID_ACTION and "$.key: longer than 4" in obs
    status, obs = call("memory_write", key="\x07", text="x")
    assert status == Status.MODEL_INVALID_ACTION and "control characters" in obs
    assert call("memory_write", key="b", text="two")[0] == Status.OK
    status, obs = call("memory_write", key="c", text="three")
    assert status == Status.MODEL_INVALID_ACTION and "memory is full (2 entries)" in obs
    assert call("memory_write", key="a", text="one")[0] == Status.OK  # replacing a key takes no new entry
    assert env.memory.entries == {"a": "one", "b": "two"}
    assert call("memory_list") == (Status.OK, "2 of 2 entries:\n'a': 3 bytes\n'b': 3 bytes")
    status, obs = call("memory_read", key="zz")  # asking is how an agent learns nothing is there: no mistake
    assert status == Status.OK and obs.startswith("no memory entry named 'zz'")


def test_a_memory_call_costs_a_turn_its_tokens_and_priced_tool_time(lookup: Any) -> None:
    env = lookup(memory={"seconds_per_call": 0.5})
    task = env.list_tasks()[0]
    rec = play_episode(env, _Probe("v"), run_id="cost", task_id=task["task_id"], task_version=task["task_version"],
                       seed=0, cost_model=CostModel(price_tool_second=2.0))
    memory_obs = [t for t in rec.turns if t["actor"] == "env" and t["action_schema"] in MEMORY_TOOLS]
    assert len(memory_obs) == 3
    for t in memory_obs:  # charged, priced at the run's price per tool second
        assert t["tool_seconds"] == 0.5 and t["cost_usd"] == pytest.approx(1.0)
    others = [t for t in rec.turns if t["actor"] == "env" and t["action_schema"] not in MEMORY_TOOLS]
    assert others and all(t["tool_seconds"] == 0.0 for t in others)
    assert rec.episode["tool_seconds"] == pytest.approx(1.5)
    # the calls count against the step budget like any action: 4 steps leave the probe no room to finish
    short = lookup(memory=True, budget={"max_steps": 4})
    cut = play_episode(short, _Probe("v"), run_id="cut", task_id=task["task_id"], task_version=task["task_version"],
                       seed=0)
    assert cut.episode["termination_reason"] == "budget_steps" and not cut.episode["success"]


class _Probe(OraclePolicy):
    """The oracle, after three memory calls: read the key ``note`` (a fresh episode must find nothing), write
    ``note``, read it back (the episode must see its own value)."""

    name = "memory-probe"

    def __init__(self, policy_version: str):
        super().__init__(policy_version)
        self.memory_calls: list[str] = []

    def reset(self, task: TaskView, seed: int) -> None:
        super().reset(task, seed)
        note = f"{task.task_id} seed {seed}"
        self.memory_calls = [act("memory_read", key="note"), act("memory_write", key="note", text=note),
                             act("memory_read", key="note")]

    def act(self, observation: str) -> PolicyOutput:
        if self.memory_calls:
            return self.scripted_output(self.memory_calls.pop(0))
        return super().act(observation)


def test_a_scripted_policy_reads_back_what_it_wrote_and_the_turns_carry_the_calls(lookup: Any) -> None:
    env = lookup(memory=True)
    task = env.list_tasks()[1]
    rec = play_episode(env, _Probe("v"), run_id="probe", task_id=task["task_id"], task_version=task["task_version"],
                       seed=3)
    assert rec.episode["success"]
    note = f"{task['task_id']} seed 3"
    pol = [t for t in rec.turns if t["actor"] == "policy"]
    obs = [t for t in rec.turns if t["actor"] == "env"]
    assert [t["action_schema"] for t in pol[:3]] == ["memory_read", "memory_write", "memory_read"]
    assert json.loads(pol[1]["tool_args"]) == {"key": "note", "text": note}
    assert obs[0]["raw_content"].startswith("no memory entry named 'note'") and obs[2]["raw_content"] == note
    events = [e for e in rec.events if e["capability"] == Capability.MEMORY]
    assert [(e["tool"], e["turn_idx"], e["executed"]) for e in events] == \
        [(t["action_schema"], t["turn_idx"], True) for t in pol[:3]]


def test_a_reused_instance_starts_every_episode_with_an_empty_memory(lookup: Any) -> None:
    env = lookup(memory=True)
    env.reset(0)
    env.step(act("memory_write", key="k", text="secret of episode 0"))
    snap = env.snapshot()
    assert env.state_hash() != env.reset(0).state_hash  # same task and seed again: the memory is gone
    assert env.step(act("memory_read", key="k")).observation.startswith("no memory entry")
    assert env.step(act("memory_list")).observation == "memory is empty"
    env.restore(snap)  # the memory is part of the state: a snapshot brings it back (same episode only)
    assert env.memory.entries == {"k": "secret of episode 0"} and env.state_hash() == snap.state_hash


class _ProbeLookup(ToolLookupEnv):
    @classmethod
    def policies(cls) -> Mapping[str, Callable[[str], Policy]]:
        return {**super().policies(), "memory-probe": _Probe}


def test_nothing_written_in_training_is_readable_in_another_episode_or_in_evaluation(tmp_path: Path) -> None:
    registry.register("tool-lookup-memory-probe", _ProbeLookup, override=True)
    try:
        lake = tmp_path / "lake"
        train = ToolLookupEnv("train")
        picked = tuple(t["task_id"] for t in train.list_tasks()[:: len(train.list_tasks()) // 2][:2])
        train.close()
        # one worker: one environment instance plays every episode of a run, one after the other
        dev = ToolLookupEnv("dev")
        evaluated = tuple(t["task_id"] for t in dev.list_tasks()[:2])
        dev.close()
        # one worker (the default): one environment instance plays every episode of a run, one after the other
        for run_id, split, tasks, seeds in (("train", "train", picked, (0, 1)), ("eval", "dev", evaluated, (0,))):
            cfg = RolloutConfig(lake=str(lake), run_id=run_id, env="tool-lookup-memory-probe", policy="memory-probe",
                                split=split, seeds=seeds, task_ids=tasks, commit_every_s=60,
                                env_kwargs={"memory": True, "budget": ROOMY})
            summary = run_rollout(cfg)
            assert not summary.failed_items and summary.played == summary.successes == len(tasks) * len(seeds)
        con = connect(lake)
        # turn 2: the answer to each episode's first call, memory_read("note"); turn 6: to the read after its write
        rows = con.execute("select e.run_id, e.task_id, e.env_seed, t.turn_idx, t.raw_content from episodes e "
                           "join turns t using (episode_id) where t.turn_idx in (2, 6) order by e.run_id").fetchall()
        assert sorted({r[0] for r in rows}) == ["eval", "train"] and len(rows) == 2 * (4 + 2)
        for run_id, task_id, seed, turn_idx, seen in rows:
            if turn_idx == 2:  # whatever the instance played before (this run's or the training run's episodes)
                assert seen.startswith("no memory entry named 'note' in this episode (0 stored"), (run_id, seen)
            else:
                assert seen == f"{task_id} seed {seed}"  # its own note, and only its own
        configs = con.execute("select config from runs").fetchall()
        assert [json.loads(c[0])["env_kwargs"]["memory"] for c in configs] == [True, True]
        # a trainer re-rendering these episodes lists the tools their policy was shown: the run's, memory included
        from trajlake.train.data import LakeTrajectories

        ds = LakeTrajectories(lake)
        assert ds.run_env_kwargs == {"train": {"memory": True, "budget": ROOMY}, "eval": {"memory": True, "budget": ROOMY}}
        assert set(MEMORY_TOOLS) <= set(ds.builder._tool_docs("tool-lookup-memory-probe", ds.run_env_kwargs["eval"]) or ())
        assert not set(MEMORY_TOOLS) & set(ds.builder._tool_docs("tool-lookup-memory-probe") or ())
        # the notes are state: a replay reproduces every state hash only with memory on (as the run had it)
        ep = next(iter(rows_of(con, "select * from episodes where run_id = 'eval'")))
        turns = rows_of(con, f"select * from turns where episode_id = '{ep['episode_id']}' order by turn_idx")
        log = replay_log_from_rows(ep, turns)[0]
        for memory, ok in ((True, True), (None, False)):
            env = ToolLookupEnv("dev", memory=memory, budget=ROOMY)
            try:
                report = env.replay(log)
            finally:
                env.close()
            assert report.ok is ok and (ok or report.first_divergence == 1)  # step 1: the write
        # `trajlake replay` and replay suites build the environment with the run's recorded arguments
        from trajlake import open_lake
        from trajlake.rollout.replay import replay_episode, replay_rows, run_env_kwargs, run_episodes
        from trajlake.rollout.suites import compare_rows, episodes_env_kwargs, run_for_pinning

        assert replay_episode(lake, ep["episode_id"]).ok
        assert all(o.ok for o in replay_rows(run_episodes(lake, "train"), run_env_kwargs(con, ["train"])))
        assert not all(o.ok for o in replay_rows(run_episodes(lake, "train")))  # default arguments: drift
        _, triples = run_for_pinning(open_lake(lake), "eval", None)
        assert [o.drift for o in compare_rows(triples, episodes_env_kwargs(open_lake(lake), triples))] == [None] * 2
    finally:
        registry.unregister("tool-lookup-memory-probe")


def test_a_credential_written_to_memory_has_not_left_the_episode(tmp_path: Path) -> None:
    memory = EpisodicMemory(MemoryConfig())
    answer = ToolSpec("answer", Capability.READ, "read", {"type": "object", "properties": {"text": {"type": "string"}}},
                      lambda a: "ok", egress=True)
    gw = Gateway(tmp_path, Permissions(capabilities=memory.capabilities({Capability.READ})),
                 [answer, *memory.tools()], lambda: "h")
    key = gw.issue_credential("api_key", 0, "task@v")
    stored = gw.call("memory_write", {"key": "k", "text": f"key is {key}"}, idempotency_key=None)
    assert stored.executed and not any(t.startswith("secret_leak") for t in stored.event["taint"])
    sent = gw.call("answer", {"text": memory.entries["k"]}, idempotency_key=None)
    assert any(t.startswith("secret_leak:api_key") for t in sent.event["taint"])


def test_mini_swe_offers_memory_in_its_intro_state_and_snapshots(tmp_path: Path) -> None:
    from trajlake.envs.mini_swe.env import MiniSWEEnv

    off = MiniSWEEnv("dev", workdir=tmp_path, allow_unisolated=True)
    env = MiniSWEEnv("dev", workdir=tmp_path, allow_unisolated=True, memory={"seconds_per_call": 0.25})
    try:
        r_off, r = off.reset(0), env.reset(0)
        assert "memory_write" in r.observation and "memory_write" not in r_off.observation
        assert r.state_hash == r_off.state_hash
        denied = off.step(act("memory_write", key="plan", text="fix the branch"))
        assert denied.status == Status.SAFETY_BLOCK
        w = env.step(act("memory_write", key="plan", text="fix the branch"))
        assert w.status == Status.OK and w.state_hash != r.state_hash and w.tool_seconds >= 0.25
        snap = env.snapshot()
        assert env.step(act("memory_read", key="plan")).observation == "fix the branch"
        env.reset(0)
        assert env.step(act("memory_read", key="plan")).observation.startswith("no memory entry")
        env.restore(snap)
        assert env.memory.entries == {"plan": "fix the branch"} and env.state_hash() == snap.state_hash
    finally:
        off.close()
        env.close()


def test_mini_web_answers_a_memory_call_alone_and_a_stored_credential_is_no_leak(tmp_path: Path) -> None:
    from trajlake.envs.mini_web.env import MiniWebEnv

    env = MiniWebEnv("dev", workdir=tmp_path, memory=True)
    try:
        r = env.reset(0)
        assert "memory_write" in r.observation and "memory_write" in env.task_view(r.task_id, r.task_version).tools
        key = next(v for (v,) in env.db_rows("SELECT value FROM account WHERE key = 'api_key'"))
        w = env.step(act("memory_write", key="api", text=key))
        assert (w.status, w.tool_seconds) == (Status.OK, 0.05) and w.observation.startswith("stored 'api'")
        assert w.state_hash != r.state_hash and env.secret_leak == 0  # it has not left the episode
        snap = env.snapshot()
        assert env.step(act("memory_read", key="api")).observation == key
        page = env.step(act("goto", path="/"))
        assert page.status == Status.OK and page.observation.startswith("URL: /") and page.tool_seconds == 0.0
        env.restore(snap)
        assert env.memory.entries == {"api": key}
        env.reset(1)
        assert env.step(act("memory_list")).observation == "memory is empty"
    finally:
        env.close()
