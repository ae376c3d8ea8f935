"""Asynchrony with version semantics (issue 29): the selection enforces ``max_staleness`` and the trajectory TTL
``max_env_age`` (by time and by environment version) on hand-made rows; the deterministic staleness mode
(``fixed_staleness = k``) trains on data exactly k versions old; the asynchronous trainer (``async_rollouts``)
plays rollouts while the learner updates, so episodes record ``policy_lag`` > 0, and its log shows lag and age."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import T0, make_episode

from trajlake import Lake, LakeWriter
from trajlake.errors import TrajlakeError
from trajlake.train.data.selection import (
    EnvAge,
    Selection,
    env_version_ages,
    env_versions_in_lake_order,
    select_episodes,
    staleness_of,
)


def _write(lake: Lake, specs: list[dict[str, Any]], first: int = 0) -> None:
    """Hand-made episodes ep-<first>, ...; ``ended_min``: the episode (and its turns) shifted to end that many
    minutes after T0."""
    rows, turns = [], []
    for i, spec in enumerate(specs, start=first):
        overrides = {k: v for k, v in spec.items() if k != "ended_min"}
        ep, tu = make_episode(f"ep-{i:03d}", **overrides)
        shift = T0 + dt.timedelta(minutes=spec["ended_min"]) - ep["ended_at"]
        for row in (ep, *tu):
            row["started_at"] += shift
            row["ended_at"] += shift
        rows.append(ep)
        turns += tu
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_batch(rows, turns).raise_if_rejected()


def _at(minutes: float) -> dict[str, Any]:
    return {"ended_min": minutes}


# episode: policy version, env id, env version, ended (minutes after T0)
AGED: list[dict[str, Any]] = [
    {"policy_version_start": "x-base", "env_version": "1.0", **_at(0)},     # 0
    {"policy_version_start": "x-R1.1", "env_version": "1.0", **_at(10)},    # 1
    {"policy_version_start": "x-R1.2", "env_version": "1.1", **_at(20)},    # 2
    {"policy_version_start": "x-R1.3", "env_version": "2.0", **_at(30)},    # 3
    {"policy_version_start": "other", "env_version": "2.0", **_at(40)},     # 4: a version never published
    {"policy_version_start": "x-R1.2", "env_id": "env-b", "env_version": "9", **_at(50)},  # 5: another env
]
ORDER = ["x-base", "x-R1.1", "x-R1.2", "x-R1.3"]


def _ids(sel: pa.Table) -> list[int]:
    return [int(e.removeprefix("ep-")) for e in sel["episode_id"].to_pylist()]


def test_staleness_and_env_version_age_of_hand_made_values() -> None:
    assert [staleness_of(v, ORDER) for v in ORDER] == [3, 2, 1, 0]
    assert staleness_of("x-base", ORDER, "x-R1.1") == 1 and staleness_of("x-R1.3", ORDER, "x-R1.1") == -2
    assert staleness_of("other", ORDER) is None and staleness_of("x-base", ORDER, "nope") is None
    order = {"e": ["1", "2", "3"]}
    assert env_version_ages(["e"] * 4 + ["f"], ["1", "2", "3", "4", "1"], order) == [2, 1, 0, None, None]
    # the running version decides: an episode newer than it has no defined age
    assert env_version_ages(["e"] * 3, ["1", "2", "3"], order, {"e": "2"}) == [1, 0, None]


def test_selection_enforces_max_staleness_on_hand_made_rows(lake: Lake) -> None:
    _write(lake, AGED)
    late = T0 + dt.timedelta(hours=1)
    cases: list[tuple[Selection, list[int]]] = [
        (Selection(max_staleness=0, policy_version_order=ORDER, now=late), [3]),
        (Selection(max_staleness=1, policy_version_order=ORDER, now=late), [2, 3, 5]),
        (Selection(max_staleness=3, policy_version_order=ORDER, now=late), [0, 1, 2, 3, 5]),  # never "other"
        # the learner at x-R1.1: x-R1.2 and x-R1.3 are ahead of it, left out
        (Selection(max_staleness=1, policy_version_order=ORDER, learner_version="x-R1.1"), [0, 1]),
    ]
    for s, want in cases:
        assert _ids(select_episodes(lake, s)) == want, s
    with pytest.raises(TrajlakeError, match="policy_version_order"):
        select_episodes(lake, Selection(max_staleness=1))


def test_selection_enforces_the_trajectory_ttl_by_time_and_env_version(lake: Lake) -> None:
    _write(lake, AGED)
    now = T0 + dt.timedelta(minutes=35)
    by_time = [
        (EnvAge(seconds=15 * 60), [2, 3, 4, 5]),   # ended at or after minute 20 (5 ended after "now": age < 0)
        (EnvAge(seconds=5 * 60), [3, 4, 5]),
        (EnvAge(seconds=0), [4, 5]),
    ]
    for age, want in by_time:
        assert _ids(select_episodes(lake, Selection(max_env_age=age, now=now))) == want, age
    # by environment version: the lake first saw test-env's 1.0, then 1.1, then 2.0; env-b only 9
    assert env_versions_in_lake_order(lake, lake.versions()["episodes"]) == {"test-env": ["1.0", "1.1", "2.0"],
                                                                          "env-b": ["9"]}
    by_version = [
        (EnvAge(versions=0), None, None, [3, 4, 5]),
        (EnvAge(versions=1), None, None, [2, 3, 4, 5]),
        (EnvAge(versions=2), None, None, [0, 1, 2, 3, 4, 5]),
        # the running environment is 1.1: 2.0 (newer) has no defined age
        (EnvAge(versions=0), None, {"test-env": "1.1"}, [2, 5]),
        # an explicit order: 1.1 was withdrawn, 2.0 follows 1.0 directly; 1.1 is in no order
        (EnvAge(versions=1), {"test-env": ["1.0", "2.0"], "env-b": ["9"]}, None, [0, 1, 3, 4, 5]),
    ]
    for age, order, current, want in by_version:
        s = Selection(max_env_age=age, env_version_order=order, current_env_version=current)
        assert _ids(select_episodes(lake, s)) == want, (age, order, current)
    # both bounds at once, and with max_staleness
    s = Selection(max_env_age=EnvAge(seconds=15 * 60, versions=0), now=now, max_staleness=0,
                  policy_version_order=ORDER)
    assert _ids(select_episodes(lake, s)) == [3]
    # the order is the lake's *first* sight of each version: a later 1.0 episode does not make 1.0 newer
    _write(lake, [{"env_version": "1.0", **_at(45)}], first=len(AGED))
    assert env_versions_in_lake_order(lake, lake.versions()["episodes"])["test-env"] == ["1.0", "1.1", "2.0"]
    with pytest.raises(TrajlakeError, match="timezone"):
        select_episodes(lake, Selection(max_env_age=EnvAge(seconds=1), now=dt.datetime(2026, 1, 1)))


# -- the trainer's schedules --------------------------------------------------------------------------------------

pytest.importorskip("torch")
pytest.importorskip("transformers")

#: Four tool-lookup train tasks (two RLOO groups each with 2 attempts).
TASKS = ("tool-lookup/code/p0/0", "tool-lookup/two_hop/p0/0", "tool-lookup/pair/p0/0", "tool-lookup/pair/p1/0")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trajlake.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "model", max_positions=1024, env="tool-lookup",
                            corpus_tasks=8)


def _train(tmp_path: Path, model: Path, stage: dict[str, Any], tasks: tuple[str, ...] = TASKS[:2],
           seeds: str = "0") -> tuple[Path, list[dict[str, Any]]]:
    """One RL stage on tool-lookup from ``model``; returns the lake and the stage's log rows."""
    import pyarrow.parquet as pq
    from train_configs import rollout, tiny_config, write_config
    from typer.testing import CliRunner

    from trajlake.cli import app

    stage = {"name": "R1", "kind": "rl", "algo": "rloo", "steps": 1, "batch_size": 16, "lr": 1e-2,
             "rollout": rollout(tasks, attempts=2, max_new_tokens=16, max_steps=3, seeds=seeds), **stage}
    cfg = write_config(tmp_path / "rl.toml", tiny_config("x", [stage], model=model, out=tmp_path / "out",
                                                         env="tool-lookup", max_length=1024,
                                                         task_reward="reward_total", lambda_cost=1.0))
    res = CliRunner().invoke(app, ["train", "--config", str(cfg), "--lake", str(tmp_path / "lake")])
    assert res.exit_code == 0, res.output + repr(res.exception)
    log = [r for r in pq.read_table(tmp_path / "out" / "train_log.parquet").to_pylist() if r["stage"] == "R1"]
    return tmp_path / "lake", log


def _episodes(lake: Path) -> dict[str, list[tuple[str, int]]]:
    """run -> [(policy_version_start, policy_lag)] of the stage's rollouts."""
    from trajlake.query import connect

    out: dict[str, list[tuple[str, int]]] = {}
    for run, version, lag in connect(lake).execute(
            "select run_id, policy_version_start, policy_lag from episodes where run_id like 'R1-it%' "
            "order by run_id, episode_id").fetchall():
        out.setdefault(run, []).append((version, lag))
    return out


def test_fixed_staleness_trains_on_data_exactly_k_versions_old(tmp_path: Path, tiny_model: Path) -> None:
    # with a TTL every episode passes (played minutes ago on the environment version now running), which the log
    # shows as env_version_age_max 0
    lake, log = _train(tmp_path, tiny_model, {"iterations": 3, "fixed_staleness": 1, "max_staleness": 1,
                                              "max_env_age": {"seconds": 3600, "versions": 0}}, tasks=TASKS[:1])
    # iteration i plays the version of 1 update before (the stage's first while none exists)
    played = {1: "x-base", 2: "x-base", 3: "x-R1.1"}
    want_lag = {1: 0, 2: 1, 3: 1}
    episodes = _episodes(lake)
    assert sorted(episodes) == [f"R1-it{i}" for i in range(1, 4)]
    for i in range(1, 4):
        assert set(episodes[f"R1-it{i}"]) == {(played[i], want_lag[i])}, i  # the runner's recorded lag
        rows = [r for r in log if r["iteration"] == i]
        assert len(rows) == 1 and rows[0]["played_version"] == played[i]
        # the learner trains on that rollout only: every episode exactly that many versions behind it
        assert rows[0]["staleness_max"] == rows[0]["staleness_mean"] == want_lag[i]
        assert rows[0]["policy_lag_max"] == want_lag[i] and 0 < rows[0]["age_seconds_max"] < 3600
        assert rows[0]["env_version_age_max"] == 0 and rows[0]["policy_tokens"] > 0
    # each rollout sampled a stream of its own although x-base played two of them
    from trajlake.query import connect

    seeds = connect(lake).execute("select run_id, json_extract_string(config, '$.policy_args.seed') from runs "
                                  "where run_id like 'R1-it%'").fetchall()
    assert len({s for _, s in seeds}) == 3


def test_async_rollouts_record_real_lag_and_the_log_shows_lag_and_age(tmp_path: Path, tiny_model: Path) -> None:
    lake, log = _train(tmp_path, tiny_model, {"iterations": 2, "async_rollouts": True, "max_staleness": 1,
                                                 "batch_size": 32},
                       tasks=TASKS, seeds="0-1")
    episodes = _episodes(lake)
    assert sorted(episodes) == ["R1-it1", "R1-it2"]
    assert {v for v, _ in episodes["R1-it1"]} == {"x-base"}
    assert {lag for _, lag in episodes["R1-it1"]} == {0}
    # the actor started rollout 2 as soon as rollout 1 was written, before the learner had a new version: it plays
    # x-base while the learner makes R1.1 ...
    assert {v for v, _ in episodes["R1-it2"]} == {"x-base"}
    # ... and the learner published R1.1 while it played: the episodes that started after that record lag 1 (11 of
    # the 16 on a loaded 2-core machine: the learner's iteration took about 5 episodes' time)
    lags = [lag for _, lag in episodes["R1-it2"]]
    assert max(lags) == 1 and min(lags) >= 0, episodes
    assert [r["iteration"] for r in log] == [1, 2]
    for row in log:
        assert row["policy_lag_mean"] is not None and row["age_seconds_max"] > 0
    # iteration 2 trains on rollouts 1 and 2, both played by x-base: one version behind the learner (R1.1); the batch
    # (32: every episode selected) holds the lagged episodes, so the log shows the recorded lag too
    assert log[1]["played_version"] == "x-base" and log[1]["staleness_max"] == log[1]["staleness_mean"] == 1
    assert log[1]["policy_lag_max"] == 1 and log[0]["policy_lag_max"] == 0


def test_the_schedule_keys_are_read_and_checked() -> None:
    from trajlake.errors import ConfigError
    from trajlake.train.config import parse_config

    def stage(**keys: Any) -> dict[str, Any]:
        return {"name": "x", "device": "cpu", "model": {"build_tiny": True},
                "stages": [{"name": "R1", "kind": "rl", "rollout": {"attempts": 2}, **keys}]}

    s = parse_config(stage(max_staleness=2, fixed_staleness=2, max_env_age={"seconds": 3600, "versions": 1})).stages[0]
    assert s.fixed_staleness == 2 and s.max_env_age == EnvAge(seconds=3600.0, versions=1) and not s.async_rollouts
    assert parse_config(stage(async_rollouts=True, max_staleness=1)).stages[0].async_rollouts
    bad = [({"fixed_staleness": 2, "max_staleness": 1}, "set max_staleness >= 2"),
           ({"fixed_staleness": 1, "max_staleness": 1, "async_rollouts": True}, "two modes"),
           ({"max_env_age": {"seconds": -1}}, "max_env_age.seconds = -1"),
           ({"max_env_age": {"versions": -2}}, "max_env_age.versions = -2"),
           ({"max_env_age": {"days": 1}}, "unknown key"),
           ({"fixed_staleness": -1}, "fixed_staleness = -1"),
           ({"turn_upgrades": True}, "only with async_rollouts"),
           ({"partial_rollouts": True, "async_rollouts": True, "max_staleness": 1}, "only with turn_upgrades")]
    for keys, message in bad:
        with pytest.raises(ConfigError, match=message):
            parse_config(stage(**keys), "c.toml")


def test_a_version_that_plays_two_rollouts_samples_a_stream_per_rollout(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    from trajlake.rollout.runner import RolloutSummary, _config_json
    from trajlake.train import loop
    from trajlake.train.config import RolloutSpec, TrainConfig

    seen: list[Any] = []
    monkeypatch.setattr(loop, "run_rollout", lambda rc: seen.append(rc) or RolloutSummary())
    cfg, spec = TrainConfig(name="x", env="tool-lookup"), RolloutSpec(attempts=2, policy_args={"seed": "5"})
    for run in ("R1-it1", "R1-it2"):
        loop._rollout(cfg, spec, str(tmp_path), run, "R1", tmp_path, "x-base", lambda _: None, training=True,
                      per_run_seeds=True, turn_upgrades=run == "R1-it2")
    first, second = (rc.policy_args["seed"] for rc in seen)
    assert [rc.turn_upgrades for rc in seen] == [False, True]  # the stage's turn_upgrades reaches the runner
    assert first == str(loop.training_seed(5, "x-base|R1-it1")) and first != second
    assert [_config_json(rc)["sampling_seed_rule"] for rc in seen] == [loop.FRESH_RUN_SEEDS] * 2


def test_turn_upgrades_switch_the_version_only_at_a_turn_boundary(tmp_path: Path, tiny_model: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A version published during an episode is loaded before the episode's next policy turn: the turns before
    record the old version, the turns after the new one, and their behaviour log-probs are the new weights'."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from trajlake.policies.hf import load_model, score_tokens
    from trajlake.query import connect
    from trajlake.rollout import runner
    from trajlake.rollout.runner import RolloutConfig, run_rollout
    from trajlake.rollout.versions import PolicyVersions

    newer = tmp_path / "newer"
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), local_files_only=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    model.save_pretrained(str(newer))
    for f in tiny_model.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")):
            shutil.copy2(f, newer / f.name)
    lake = tmp_path / "lake"
    Lake.init(lake)
    versions = PolicyVersions(lake, "v")
    versions.publish("v-1", checkpoint=str(tiny_model))
    boundaries: list[str] = []
    original = runner._Worker.upgrade

    def publish_during_the_episode(self: Any, policy: Any) -> None:
        boundaries.append(policy.policy_version)
        if len(boundaries) == 2:  # the learner publishes between the episode's 2nd and 3rd policy turns
            versions.publish("v-2", checkpoint=str(newer))
        original(self, policy)

    monkeypatch.setattr(runner._Worker, "upgrade", publish_during_the_episode)
    cfg = RolloutConfig(lake=str(lake), run_id="up", env="tool-lookup", policy=f"hf:{tiny_model}", split="train",
                        seeds=(0,), policy_version="v-1", policy_name="v", turn_upgrades=True,
                        task_ids=(TASKS[0],), policy_args={"max_new_tokens": "8"},
                        env_kwargs={"budget": {"max_steps": 4}})
    assert run_rollout(cfg).written == 1
    con = connect(lake)
    start, end = con.execute("select policy_version_start, policy_version_end from episodes").fetchone()
    assert (start, end) == ("v-1", "v-2")
    turns = con.execute("select actor, policy_version, token_ids, behavior_logprobs, loss_mask from turns "
                        "order by turn_idx").fetchall()
    policy = [t for t in turns if t[0] == "policy"]
    assert [t[1] for t in policy] == ["v-1", "v-1", "v-2", "v-2"]  # switched at the boundary, never within a turn
    # the turns after the switch were sampled by the new weights: their recorded log-probs are the new model's
    old_model, _ = load_model(tiny_model)
    new_model, _ = load_model(newer)
    context: list[int] = []
    for actor, version, ids, logprobs, mask in turns:
        if actor == "policy":
            chosen = [i for i, m in enumerate(mask) if m == 1]
            recorded = [logprobs[i] for i in chosen]
            by_new = score_tokens(new_model, context, ids)
            by_old = score_tokens(old_model, context, ids)
            mine, other = (by_new, by_old) if version == "v-2" else (by_old, by_new)
            assert [mine[i] for i in chosen] == pytest.approx(recorded, abs=1e-4), version
            assert [other[i] for i in chosen] != pytest.approx(recorded, abs=1e-4), version
        context += list(ids)
    assert json.loads(con.execute("select config from runs where run_id = 'up'").fetchone()[0])["turn_upgrades"]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_versions_keep_the_checkpoint_they_were_published_with(where: str, tmp_path: Path,
                                                               request: pytest.FixtureRequest) -> None:
    from trajlake.rollout.versions import PolicyVersions

    root = str(tmp_path / "lake") if where == "local" else request.getfixturevalue("s3_lake_uri")
    Lake.init(root)
    versions = PolicyVersions(root, "p")
    versions.publish("p-1")
    versions.publish("p-2", checkpoint="/ckpt/2")
    versions.publish("p-2", checkpoint="/elsewhere")  # already published: a no-op
    versions.publish("p/3", checkpoint="/ckpt/3")
    assert versions.all() == ["p-1", "p-2", "p/3"]
    assert [versions.checkpoint(v) for v in ("p-1", "p-2", "p/3", "nope")] == [None, "/ckpt/2", "/ckpt/3", None]


def test_a_partial_rollouts_old_prefix_is_state_not_trained_on(lake: Lake) -> None:
    """An episode whose version switched at a turn boundary (policy turns v1, v2, v2): with partial_rollouts its
    first policy turn is the old prefix (loss mask cleared, still in the context), the continuation is trained,
    and max_staleness counts the continuation's version; an episode of one version is untouched."""
    from trajlake.train.data import LakeTrajectories, pad_collate
    from trajlake.train.loop import mask_prefixes, prefix_turns

    rows, turns = [], []
    for eid, versions in (("switched", ["x-1", "x-2", "x-2"]), ("sticky", ["x-2", "x-2", "x-2"])):
        ep, tu = make_episode(eid, n_steps=3, policy_version_start=versions[0], policy_version_end=versions[-1])
        policy_turns = [t for t in tu if t["actor"] == "policy"]
        for t, v in zip(policy_turns, versions, strict=True):
            t["policy_version"] = v
        for t in tu:
            t["tokenizer_id"] = "model|tok:aaaa|tmpl:bbbb"
        rows.append(ep)
        turns += tu
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_batch(rows, turns).raise_if_rejected()
    episodes = select_episodes(lake, Selection())
    assert prefix_turns(str(lake.location), episodes) == {"switched": 1, "sticky": 0}
    batch = pad_collate(list(LakeTrajectories(lake, Selection(), episodes=episodes)))
    masked, n = mask_prefixes(batch, {"switched": 1, "sticky": 0})
    assert n == 2  # the two tokens of the switched episode's first policy turn
    for b, eid in enumerate(batch["episode_id"]):
        turn, before, after = batch["token_turn"][b], batch["loss_mask"][b], masked["loss_mask"][b]
        cleared = (before == 1) & (after == 0)
        assert bool((cleared == ((turn == 0) & (before == 1) & (eid == "switched"))).all()), eid
    assert bool((masked["input_ids"] == batch["input_ids"]).all())  # the prefix stays as context
    order = ["x-1", "x-2"]
    by_start = Selection(max_staleness=0, policy_version_order=order)
    assert select_episodes(lake, by_start)["episode_id"].to_pylist() == ["sticky"]
    by_end = Selection(max_staleness=0, policy_version_order=order, staleness_version="end")
    assert select_episodes(lake, by_end)["episode_id"].to_pylist() == ["sticky", "switched"]


def test_turn_upgrades_are_refused_for_a_policy_that_cannot_load_a_checkpoint(tmp_path: Path) -> None:
    from trajlake.rollout.runner import RolloutConfig, _Worker

    Lake.init(tmp_path / "lake")
    cfg = RolloutConfig(lake=str(tmp_path / "lake"), run_id="r", env="tool-lookup", policy="oracle", split="train",
                        seeds=(0,), turn_upgrades=True)
    with pytest.raises(TrajlakeError, match="policy oracle cannot load a checkpoint"):
        _Worker(cfg)
