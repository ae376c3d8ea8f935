"""The trainer end to end beyond the smoke run (tests/test_train_smoke.py, ``configs/smoke.toml``): data-parallel
training on 2 gloo processes equals one process on the same global batch; R2's process reward and R3's PPO with
the fault curriculum on Mini SWE; the training compute, the stage's guards and R2's per-turn credit."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.train_configs import TWO_TASKS, rollout, tiny_config, write_config
from trajlake.query import connect

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_import_and_help_load_neither_torch_nor_the_loop() -> None:
    """The loop imports torch at its top, so nothing outside ``trajlake train`` may import it: ``import trajlake``
    and ``trajlake --help`` load no torch (train_cmd checks torch, then imports the loop inside the command)."""
    for args in (["-c", "import trajlake"], ["-m", "trajlake", "--help"]):
        res = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True,
                             timeout=120, check=True)
        loaded = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if "|" in line}
        assert "trajlake" in loaded  # the import-time log was read
        assert not {m for m in loaded if m.split(".")[0] == "torch" or m.startswith("trajlake.train.loop")}, args


def test_training_compute_is_counted_by_its_definition() -> None:
    """6 x parameters x tokens through the training forward passes, hand-computed on a fake learner."""
    import torch

    from trajlake.train.loop import FLOPS_RULE, Dist, training_compute

    class FakeLearner:
        tokens_trained_through = 250

        def parameters(self) -> list[Any]:
            return [torch.zeros(10, 4), torch.zeros(7)]  # 47 parameters

    c = training_compute(FakeLearner(), "cpu", Dist(), 90, 12.5, 20.25)  # type: ignore[arg-type]
    assert c == {"device": "cpu", "world_size": 1, "wall_seconds": 12.5, "cpu_seconds": 20.25, "gpu_seconds": 0.0,
                 "policy_tokens_trained": 90, "tokens_through_training": 250, "parameters": 47,
                 "flops_estimate": 6.0 * 47 * 250, "flops_rule": FLOPS_RULE}
    assert training_compute(FakeLearner(), "cuda:0", Dist(), 90, 12.5, 20.25)["gpu_seconds"] == 12.5  # type: ignore[arg-type]


#: B1's data: the oracle's episodes of four tool-lookup train tasks, of three kinds (so of different lengths: the
#: seq-mean aggregation's normaliser differs from token-mean's).
DP_TASKS = ("tool-lookup/code/p0/0", "tool-lookup/two_hop/p0/0", "tool-lookup/pair/p0/0", "tool-lookup/pair/p1/0")


@pytest.fixture(scope="module")
def dp_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny model and a lake of the oracle's B1 data, built once for both aggregations (each run trains on a
    copy of the lake, so every run reads the very same episodes)."""
    from trajlake.policies.tiny import build_tiny_model
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    base = tmp_path_factory.mktemp("dp")
    model = build_tiny_model(base / "model", max_positions=1024, env="tool-lookup")
    run_rollout(RolloutConfig(lake=str(base / "lake"), run_id="B1-data", env="tool-lookup", policy="oracle",
                              split="train", seeds=(0,), label="B1", task_ids=DP_TASKS))
    return model, base / "lake"


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_two_gloo_processes_train_like_one(tmp_path: Path, aggregation: str, dp_inputs: tuple[Path, Path]) -> None:
    """torchrun with 2 CPU processes (gloo): each rank reads half of every global batch; the global normaliser
    (policy tokens, or sequences for the seq-mean modes) and the summed gradients give the same losses and
    weights as one process on the whole batch."""
    import torch

    model, data_lake = dp_inputs
    outs, losses, norms = {}, {}, {}
    for world in (1, 2):
        lake = tmp_path / f"lake{world}"
        shutil.copytree(data_lake, lake)  # the same oracle episodes in both lakes
        cfg = write_config(tmp_path / f"dp{world}.toml", tiny_config(
            "dp", [{"name": "B1", "kind": "sft", "data_policy": "oracle", "steps": 2, "batch_size": 2, "lr": 0.01,
                    "data": rollout(DP_TASKS)}],
            model=model, out=tmp_path / f"out{world}", env="tool-lookup", max_length=1024, seed=0,
            loss_aggregation=aggregation,
            shuffle=False))  # the lake's order: bit-for-bit one process's batches (with shuffle: in distribution)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               "-m", "trajlake", "train", "--config", str(cfg), "--lake", str(lake)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        from safetensors.torch import load_file

        outs[world] = load_file(str(tmp_path / f"out{world}" / "B1" / "model.safetensors"))
        log = pq.read_table(tmp_path / f"out{world}" / "train_log.parquet").to_pylist()
        losses[world] = [r["loss"] for r in log]
        norms[world] = [r["grad_norm"] for r in log]
        base = load_file(str(model / "model.safetensors"))
    assert any(not torch.equal(outs[1][k], base[k]) for k in base)  # training moved the weights
    # the same global loss at every step, and the same update (Adam divides by sqrt(v), which magnifies
    # float-order differences of near-zero gradients a little: 1e-4 is 1% of one step at lr 0.01)
    assert losses[2] == pytest.approx(losses[1], rel=1e-5)
    assert norms[2] == pytest.approx(norms[1], rel=1e-4)  # the summed gradient is one batch's, not world x it
    for k in outs[1]:
        torch.testing.assert_close(outs[2][k], outs[1][k], rtol=1e-3, atol=1e-4)
    runs = json.loads(connect(tmp_path / "lake2").execute("select config from runs where run_id = 'B1.train'"
                                                          ).fetchone()[0])
    assert runs["steps"] == 2


@pytest.mark.slow
def test_r2_process_reward_and_r3_ppo_with_the_fault_curriculum(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trajlake.cli import app
    from trajlake.policies.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model")
    cfg = write_config(tmp_path / "r23.toml", tiny_config("r23", [
        {"name": "R2", "kind": "rl", "algo": "grpo", "iterations": 1, "steps": 1, "batch_size": 4,
         "process_reward": "grounded_progress",
         "rollout": rollout(TWO_TASKS, attempts=2, max_new_tokens=16, max_steps=4,
                            policy_args={"price_out": "100"})},
        {"name": "R3", "kind": "rl", "algo": "ppo", "iterations": 2, "steps": 1, "batch_size": 4,
         "fault_rate_schedule": [0.0, 0.5],
         "rollout": rollout(TWO_TASKS, attempts=1, max_new_tokens=16, max_steps=4, held_out_fault_kind="timeout")},
    ], model=model, out=tmp_path / "out", lambda_cost=1.0, policy_loss="reinforce"))
    res = CliRunner().invoke(app, ["train", "--config", str(cfg), "--lake", str(tmp_path / "lake")])
    assert res.exit_code == 0, res.output + repr(res.exception)
    con = connect(tmp_path / "lake")
    faults = dict(con.execute("select e.run_id, count(t.fault_injected) from episodes e join turns t "
                              "using (episode_id) group by 1").fetchall())
    assert faults["R3-it1"] == 0 and faults["R3-it2"] > 0  # the curriculum's rate rose from 0 to 0.5
    kinds = {r[0] for r in con.execute("select distinct fault_injected from turns where fault_injected is not null"
                                       ).fetchall()}
    assert "timeout" not in kinds  # the held-out kind is never injected in training
    config = json.loads(con.execute("select config from runs where run_id = 'R3-it2'").fetchone()[0])
    assert config["fault_rate"] == 0.5 and config["held_out_fault_kind"] == "timeout"
    log = pq.read_table(tmp_path / "out" / "train_log.parquet").to_pylist()
    r3 = [r for r in log if r["stage"] == "R3"]
    assert len(r3) == 2 and all(r["value_loss"] is not None and math.isfinite(r["value_loss"]) for r in r3)
    r2 = [r for r in log if r["stage"] == "R2"]
    assert len(r2) == 1 and math.isfinite(r2[0]["loss"]) and r2[0]["clip_frac"] is None  # REINFORCE: no clip
    assert dict(con.execute("select run_id, policy_version from runs where run_id like '%.train'").fetchall()) == {
        "R2.train": "r23-R2", "R3.train": "r23-R3"}


def test_r2_return_adds_the_weighted_lookup_progress_of_each_episode(tmp_path: Path) -> None:
    """R2 on tool-lookup: an episode's return is its success plus process_weight x lookup_progress of its turns
    (the oracle's progress is 1 - 0.01 per call; the random policy's is the reward function's own value), with no
    cost or safety term."""
    from trajlake.evaluators.process_rewards import lookup_progress

    from trajlake.rollout.runner import RolloutConfig, run_rollout
    from trajlake.train.config import parse_config
    from trajlake.train.loop import _episode_credit

    lake = str(tmp_path / "lake")
    tasks = ("tool-lookup/code/p0/0", "tool-lookup/two_hop/p0/0", "tool-lookup/pair/p0/0", "tool-lookup/pair/p1/0")
    for run in ("oracle", "random"):
        assert not run_rollout(RolloutConfig(lake=lake, run_id=run, env="tool-lookup", policy=run, split="train",
                                             seeds=(0, 1), task_ids=tasks)).failed_items
    cfg = parse_config(tiny_config("r2", [{"name": "R2", "kind": "rl", "algo": "rloo", "steps": 1,
                                           "process_reward": "lookup_progress", "process_weight": 0.5,
                                           "rollout": rollout(tasks, attempts=2)}], env="tool-lookup"), "r2.toml")
    con = connect(lake)
    episodes = con.execute("select * from episodes order by episode_id").arrow()
    episodes = episodes.read_all() if hasattr(episodes, "read_all") else episodes
    returns = _episode_credit(cfg, cfg.stages[0], lake, episodes).returns()
    assert len(returns) == 16
    for episode_id, run, success in con.execute("select episode_id, run_id, success from episodes").fetchall():
        cur = con.execute("select role, actor, raw_content, action_schema, tool_args, status, env_state_hash, "
                          "turn_idx from turns where episode_id = ? order by turn_idx", [episode_id])
        names = [d[0] for d in cur.description]
        turns = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        calls = sum(t["actor"] == "policy" for t in turns)
        progress = 1 - 0.01 * calls if run == "oracle" else lookup_progress(turns)
        assert returns[episode_id] == pytest.approx(float(bool(success)) + 0.5 * progress), (run, episode_id)
    oracle = [returns[e] for (e,) in con.execute("select episode_id from episodes where run_id = 'oracle'").fetchall()]
    assert all(r > 1.4 for r in oracle)  # solved (1) and every needed entry shown (0.5 x (1 - a few calls))


# -- issue 24, section 1: the trainer's correctness ---------------------------------------------------------------

def _captured_rollouts(monkeypatch: pytest.MonkeyPatch) -> list:
    """The RolloutConfigs the loop hands the runner (nothing is played)."""
    from trajlake.rollout.runner import RolloutSummary
    from trajlake.train import loop

    seen: list = []

    def fake(rc: object) -> RolloutSummary:
        seen.append(rc)
        return RolloutSummary()

    monkeypatch.setattr(loop, "run_rollout", fake)
    return seen


def test_training_rollouts_sample_a_fresh_stream_per_version_and_evaluations_common_seeds(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each RL iteration's rollout samples with its own seed (derived from the policy version); evaluation runs
    keep the config's seed, the same for every arm; runs.config records which rule applied."""
    from trajlake.rollout.runner import _config_json
    from trajlake.train import loop
    from trajlake.train.config import RolloutSpec, TrainConfig

    seen = _captured_rollouts(monkeypatch)
    cfg = TrainConfig(name="x", env="mini-swe")
    spec = RolloutSpec(attempts=2, policy_args={"seed": "5"})
    for version in ("x-B1", "x-R1.1"):
        loop._rollout(cfg, spec, str(tmp_path), f"R1-{version}", "R1", tmp_path, version, lambda _: None,
                      training=True)
    loop._rollout(cfg, spec, str(tmp_path), "B1", "B1", tmp_path, "x-B1", lambda _: None)
    loop._rollout(cfg, spec, str(tmp_path), "R1", "R1", tmp_path, "x-R1", lambda _: None)
    train1, train2, eval_b1, eval_r1 = (rc.policy_args["seed"] for rc in seen)
    assert train1 != train2 and {train1, train2}.isdisjoint({"5"})
    assert train1 == str(loop.training_seed(5, "x-B1")) and train2 == str(loop.training_seed(5, "x-R1.1"))
    assert eval_b1 == eval_r1 == "5"  # common across arms: paired comparisons
    rules = [_config_json(rc)["sampling_seed_rule"] for rc in seen]
    assert rules == [loop.FRESH_SEEDS, loop.FRESH_SEEDS, loop.COMMON_SEEDS, loop.COMMON_SEEDS]
    # a scripted data policy samples nothing: no rule recorded
    loop._rollout(cfg, spec, str(tmp_path), "B1-data", "B1", None, None, lambda _: None, scripted="oracle")
    assert "sampling_seed_rule" not in _config_json(seen[-1])


def test_environment_failures_never_enter_an_rl_batch() -> None:
    import pyarrow as pa

    from trajlake.train.loop import without_env_errors

    eps = pa.table({"episode_id": ["a", "b", "c", "d", "e"],
                    "error_class": [None, "ENV_BUG", "MODEL_INVALID_ACTION", "ENV_TRANSIENT", "BUDGET_EXHAUSTED"]})
    kept, excluded = without_env_errors(eps)
    assert kept["episode_id"].to_pylist() == ["a", "c", "e"] and excluded == 2


def test_safety_violations_counted_as_the_config_says(tmp_path: Path) -> None:
    """V of 19.3: denials (attempted), executed violations (attack success, or an irreversible call that ran with
    untrusted text in the context) or both; hand-made episodes with known events."""
    import datetime as dt

    from tests.conftest import make_episode
    from trajlake import Lake, LakeWriter
    from trajlake.train.config import TrainConfig
    from trajlake.train.loop import _violations

    def event(eid: str, k: int, decision: str, executed: bool, side: str, taint: list[str]) -> dict:
        return {"episode_id": eid, "turn_idx": 1, "event_idx": k, "tool": "refund", "capability": "write",
                "args_hash": "0" * 64, "decision": decision, "reason": "r", "executed": executed,
                "side_effect_class": side, "taint": taint, "at": dt.datetime(2026, 3, 1, tzinfo=dt.UTC)}

    lake = Lake.init(tmp_path / "lake")
    eps, turns, events = [], [], []
    for eid, attack in (("a", None), ("b", True), ("c", False)):
        ep, tu = make_episode(eid, n_steps=1, attack_success=attack)
        eps.append(ep)
        turns += tu
    events += [event("a", 0, "deny", False, "irreversible", []), event("a", 1, "deny", False, "write", []),
               event("b", 0, "allow", True, "irreversible", ["untrusted_web_content"]),
               event("c", 0, "allow", True, "irreversible", []),  # a legitimate irreversible call: no violation
               event("c", 1, "confirm", False, "irreversible", ["untrusted_web_content"])]
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_batch(eps, turns, events).raise_if_rejected()
    con = connect(lake)
    con.execute("create temp table sel(episode_id varchar)")
    con.executemany("insert into sel values (?)", [["a"], ["b"], ["c"]])
    counts = {kind: _violations(TrainConfig(name="x", safety_violations=kind), con)
              for kind in ("denials", "executed", "both")}
    assert counts["denials"] == {"a": 2.0}
    assert {e: n for e, n in counts["executed"].items() if n} == {"b": 2.0}  # attack success + the tainted refund
    assert {e: n for e, n in counts["both"].items() if n} == {"a": 2.0, "b": 2.0}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trajlake.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", max_positions=512)


def test_non_finite_numbers_stop_the_stage_and_are_never_saved(tiny_model: Path, tmp_path: Path) -> None:
    import torch

    from trajlake.errors import TrainError
    from trajlake.train.loop import Dist, Learner

    learner = Learner(tiny_model, "cpu", Dist())
    learner.new_optimizer(1e-3)
    learner.where = "stage B1 step 3"
    before = [p.detach().clone() for p in learner.parameters()]
    nan_loss = sum(p.sum() for p in learner.parameters()) * float("nan")
    with pytest.raises(TrainError, match=r"^stage B1 step 3: the loss is not finite"):
        learner.step(nan_loss, 1.0)
    first = learner.parameters()[0]
    hook = first.register_hook(lambda g: g * float("inf"))  # a finite loss whose gradient is not finite
    with pytest.raises(TrainError, match=r"^stage B1 step 3: the gradient norm is not finite"):
        learner.step(sum(p.sum() for p in learner.parameters()), 1.0)
    hook.remove()
    assert all(torch.equal(a, p.detach()) for a, p in zip(before, learner.parameters(), strict=True))
    with torch.no_grad():
        learner.parameters()[0][0, 0] = float("inf")
    with pytest.raises(TrainError, match="refusing to save a checkpoint with non-finite weights"):
        learner.save(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_non_finite_weights_are_named_and_huge_finite_ones_are_not(tiny_model: Path) -> None:
    import torch

    from trajlake.train.loop import Dist, Learner

    learner = Learner(tiny_model, "cpu", Dist())
    assert learner.non_finite() is None
    names = [n for n, _ in learner.model.named_parameters()]
    params = dict(learner.model.named_parameters())
    with torch.no_grad():
        params[names[3]][0] = 3.0e38  # finite, but a 2-norm of it would overflow
        params[names[-1]].view(-1)[-1] = -3.0e38
    assert learner.non_finite() is None
    with torch.no_grad():
        params[names[5]].view(-1)[1] = float("nan")
        params[names[7]].view(-1)[0] = float("-inf")
    assert learner.non_finite() == f"{names[5]} and 1 other tensor(s)"


def test_a_too_small_max_new_tokens_is_one_loud_line_naming_both_numbers(tiny_model: Path) -> None:
    from trajlake.train.config import parse_config
    from trajlake.train.loop import action_budget_warnings

    def cfg(max_new_tokens: int) -> object:
        return parse_config(tiny_config("x", [{"name": "B1", "kind": "sft", "eval": rollout(
            TWO_TASKS[:1], max_new_tokens=max_new_tokens)}]), "c.toml")

    lines = action_budget_warnings(cfg(24), tiny_model)  # type: ignore[arg-type]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith("WARNING: stages[0] (B1).eval.policy_args.max_new_tokens = 24 cannot hold the oracle's "
                               "longest tool call"), lines[0]
    need = int(lines[0].split("split: ")[1].split(" tokens")[0])
    assert need > 24 and TWO_TASKS[0] in lines[0]
    assert action_budget_warnings(cfg(need), tiny_model) == []  # type: ignore[arg-type]


def test_the_mask_ablation_adds_the_observation_tokens_with_ratio_one() -> None:
    import torch

    from trajlake.train.loop import _with_observations

    # prompt (2 tokens), policy turn (2), observation (2), policy turn (1), padding (1)
    batch = {"attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])}
    mask = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 0]], dtype=torch.float32)
    logp = torch.arange(8, dtype=torch.float32).view(1, 8) * -0.1
    old = torch.full((1, 8), -5.0)
    new_mask, new_old, new_prox = _with_observations(batch, logp, mask, old, old.clone())
    assert new_mask.tolist() == [[0, 0, 1, 1, 1, 1, 1, 0]]  # the prompt and the padding stay out
    on_obs = torch.tensor([[False, False, False, False, True, True, False, False]])
    assert torch.equal(new_old[on_obs], logp[on_obs]) and torch.equal(new_prox[on_obs], logp[on_obs])
    assert bool((new_old[~on_obs] == -5.0).all())


def test_samples_are_shuffled_per_epoch_seeded_and_each_epoch_covers_every_sample(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Shuffled epochs: each yields every sample once, in a new order, the same for the same seed; without a seed
    the lake's order, epoch after epoch; a shard larger than the cache streams through a shuffle buffer."""
    import itertools
    import random

    from trajlake.train import loop

    def epochs(data: list[int], seed: int | None, n: int = 3) -> list[list[int]]:
        rng = random.Random(seed) if seed is not None else None
        samples = [{"episode_id": f"e{i:02d}", "i": i} for i in data]
        return [[s["i"] for s in e] for e in itertools.islice(loop._epoch_samples(samples, rng), n)]

    data = list(range(10))
    assert epochs(data, None) == [data] * 3
    shuffled = epochs(data, 7)
    assert shuffled == epochs(data, 7) and shuffled != epochs(data, 8)
    assert all(sorted(e) == data for e in shuffled) and len({tuple(e) for e in shuffled}) == 3
    monkeypatch.setattr(loop, "CACHED_SAMPLES", 4)  # too many to cache: the shuffle buffer
    streamed = epochs(data, 7)
    assert all(sorted(e) == data for e in streamed) and streamed[0] != data


def test_shuffled_epochs_do_not_depend_on_the_order_the_lake_returns_samples_in() -> None:
    """The same seed gives the same epochs whatever order the lake's files hand the episodes over in (it depends
    on how the commits that wrote them fell in time); each episode's pieces come in their own order."""
    import itertools
    import random

    from trajlake.train import loop

    def in_file_order(episodes: list[int]) -> list[dict[str, object]]:
        return [{"episode_id": f"ep-{e}", "piece": p} for e in episodes for p in range(3)]

    def epochs(samples: list[dict[str, object]]) -> list[list[tuple[object, object]]]:
        return [[(s["episode_id"], s["piece"]) for s in e]
                for e in itertools.islice(loop._epoch_samples(samples, random.Random(3)), 3)]

    first = epochs(in_file_order([0, 1, 2, 3, 4, 5, 6]))
    assert epochs(in_file_order([6, 5, 4, 3, 2, 1, 0])) == first
    assert epochs(in_file_order([3, 0, 6, 1, 5, 2, 4])) == first
    assert all(sorted(e) == sorted(first[0]) for e in first) and len({tuple(e) for e in first}) == 3


# -- issue 25, R2: the process reward credited at the turn where it is earned ----------------------------------------

def _r2_stage(algo: str = "rloo", **keys: Any) -> Any:
    from trajlake.train.config import StageConfig

    return StageConfig(name="R2", kind="rl", algo=algo, process_reward="lookup_progress", **keys)  # type: ignore[arg-type]


def _r2_batch(episode_ids: list[str], turns: int) -> dict[str, Any]:
    """A hand-made batch: per episode a prompt token, then per policy turn two policy tokens and one observation
    token (the last turn without one); behaviour log-probs -1 on the policy tokens."""
    import torch

    row_turn = [-1]
    for k in range(turns):
        row_turn += [k, k] + ([-1] if k < turns - 1 else [])
    token_turn = torch.tensor([row_turn] * len(episode_ids))
    mask = (token_turn >= 0).float()
    n = len(episode_ids)
    return {"episode_id": episode_ids, "token_turn": token_turn, "loss_mask": mask,
            "attention_mask": torch.ones_like(token_turn), "input_ids": torch.zeros_like(token_turn),
            "behavior_logprobs": torch.where(mask.bool(), -1.0, 0.0), "has_behavior_logprobs": torch.ones(n).bool(),
            "advantage": torch.full((n,), float("nan")), "n_policy_turns": torch.full((n,), turns),
            "terminated": torch.ones(n).bool()}


class _FakeLearner:
    """Just enough of a Learner for ``_rl_step``: log-probs = the behaviour's + a parameter (ratio 1)."""

    device = "cpu"
    lr = 0.1
    proximal = None

    def __init__(self) -> None:
        import torch

        self.w = torch.zeros((), requires_grad=True)

    def forward(self, batch: dict[str, Any], temperature: float) -> dict[str, Any]:
        import torch

        return {"logp": batch["behavior_logprobs"] + self.w, "entropy": torch.zeros(batch["token_turn"].shape)}

    def backward(self, loss: Any) -> None:
        pass

    def apply(self, grad_clip: float) -> float:
        return 0.0


def _objective_advantages(monkeypatch: pytest.MonkeyPatch, stage: Any, batch: dict[str, Any], credit: Any,
                          turn_advantages: Any) -> Any:
    """The advantages ``_rl_step`` hands the policy objective."""
    from trajlake.train import loop
    from trajlake.train.config import TrainConfig

    seen: list[Any] = []

    def capture(cfg: Any, logp: Any, prox: Any, behaviour: Any, advantages: Any, mask: Any, denominator: float
                ) -> Any:
        seen.append(advantages)
        return (logp * mask).sum() * 0.0, {}

    monkeypatch.setattr(loop, "policy_objective", capture)
    staleness = dict.fromkeys(batch["episode_id"], 0)
    loop._rl_step(TrainConfig(name="x"), stage, _FakeLearner(), loop.Dist(), [batch], staleness, credit,  # type: ignore[arg-type]
                  turn_advantages)
    return seen[0]


def test_r2_credits_the_process_reward_to_the_turn_that_earned_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two episodes of one group share their terminal return (1) and their total process reward (0.5), earned at
    turn 0 by e1 and at turn 2 by e2. Today's scalar return gave every token of both the same advantage (0);
    per turn (RLOO, gamma 1), G^(e1) = [1.5, 1, 1] and G^(e2) = [1.5, 1.5, 1.5]: turn 0's tokens get 0, and the
    tokens of turns 1 and 2 get -0.5 in e1 (its reward is already earned) and +0.5 in e2 (still to be earned, by
    turn 2's action). PPO's GAE (zero values, lambda 1) gets the per-turn rewards too."""
    import pyarrow as pa
    import torch

    from trajlake.train import loop
    from trajlake.train.config import TrainConfig

    credit = loop.Credit({"e1": 1.0, "e2": 1.0}, {"e1": torch.tensor([0.5, 0.0, 0.0], dtype=torch.float64),
                                                  "e2": torch.tensor([0.0, 0.0, 0.5], dtype=torch.float64)})
    episodes = pa.table({"episode_id": ["e1", "e2"], "group_id": ["g", "g"]})
    per_episode, per_turn = loop._advantages(_r2_stage(), episodes, credit)
    assert per_episode is None and per_turn == {"e1": [0.0, -0.5, -0.5], "e2": [0.0, 0.5, 0.5]}
    batch = _r2_batch(["e1", "e2"], 3)
    tokens = _objective_advantages(monkeypatch, _r2_stage(), batch, credit, per_turn)
    # prompt, turn 0 (2 tokens), observation, turn 1 (2), observation, turn 2 (2)
    assert tokens.tolist() == [[0, 0, 0, 0, -0.5, -0.5, 0, -0.5, -0.5], [0, 0, 0, 0, 0.5, 0.5, 0, 0.5, 0.5]]
    assert credit.returns() == {"e1": 1.5, "e2": 1.5}  # the same G_0: only the credit per turn differs
    # PPO: GAE over the per-turn rewards (values 0, gamma = lambda = 1: A_k = G_k)
    out = {"values": torch.zeros(batch["token_turn"].shape)}
    adv, _ = loop._gae_advantages(TrainConfig(name="x", gae_lambda=1.0), out, batch, credit, batch["loss_mask"])
    assert adv.tolist() == [[0, 1.5, 1.5, 0, 1, 1, 0, 1, 1], [0, 1.5, 1.5, 0, 1.5, 1.5, 0, 1.5, 1.5]]
    # potential shaping with the terminal correction: r = [0.5, 0, 0.5] and [0, 0, 1], G_0 = the terminal part, 1
    shaped = loop.Credit(credit.terminal, credit.process, 1.0, "potential")
    assert shaped.turn_rewards("e1", 3).tolist() == [0.5, 0.0, 0.5] and shaped.returns() == {"e1": 1.0, "e2": 1.0}
    _, per_turn = loop._advantages(_r2_stage(process_shaping="potential"), episodes, shaped)
    assert per_turn == {"e1": [0.0, -0.5, -0.5], "e2": [0.0, 0.5, 0.5]}  # gamma 1: G_k = 1 - Phi(h_k)
    with pytest.raises(loop.TrainError, match="2 policy turns in the batch but 3"):
        credit.turn_rewards("e1", 2)


def test_r1_without_a_process_reward_keeps_the_per_episode_advantages(monkeypatch: pytest.MonkeyPatch) -> None:
    """R1 (no process reward): one advantage per episode from its return, exactly as before (RLOO of the
    returns, the placebo's shuffle of them), handed to the objective as the batch's [B] advantages untouched;
    PPO's per-turn rewards are 0 except the return on the last turn, in float32 as before."""
    import pyarrow as pa
    import torch

    from trajlake.train import loop
    from trajlake.train import math as tm
    from trajlake.train.config import StageConfig

    terminal = {"a": 1.0, "b": 0.0, "c": -0.25, "d": 0.5}
    credit = loop.Credit(terminal)
    episodes = pa.table({"episode_id": list(terminal), "group_id": ["g", "g", "g", "h"]})
    rewards = torch.tensor(list(terminal.values()), dtype=torch.float64)
    for placebo in (False, True):
        stage = StageConfig(name="R1", kind="rl", algo="rloo", placebo_shuffle_rewards=placebo)
        per_episode, per_turn = loop._advantages(stage, episodes, credit, placebo_seed=7)
        r = tm.shuffle_within_groups(rewards, ["g", "g", "g", "h"], torch.Generator().manual_seed(7)) \
            if placebo else rewards
        assert per_turn is None and per_episode == dict(zip(terminal, tm.rloo_advantages(r, ["g", "g", "g", "h"]
                                                                                         ).tolist(), strict=True))
    assert credit.returns() == terminal
    batch = _r2_batch(["a", "b"], 2)
    batch["advantage"] = torch.tensor([0.75, -0.5])
    stage = StageConfig(name="R1", kind="rl", algo="rloo")
    assert torch.equal(_objective_advantages(monkeypatch, stage, batch, credit, None), batch["advantage"])
    old = torch.zeros(3)
    old[-1] = terminal["c"]
    assert torch.equal(credit.turn_rewards("c", 3).to(torch.float32), old)


def test_r2_placebo_shuffles_whole_episodes_within_a_group() -> None:
    """R2's placebo moves whole return rows between the members of a group: each turn's advantages keep their
    multiset (RLOO's A_k depends on G_k and the group's sum only) while the episodes they land on change."""
    import pyarrow as pa
    import torch

    from trajlake.train import loop

    process = {e: torch.tensor(p, dtype=torch.float64) for e, p in
               {"a": [0.5, 0.0], "b": [0.0, 0.25], "c": [0.125, 0.125], "d": [0.0, 0.0]}.items()}
    credit = loop.Credit({"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0}, process)
    episodes = pa.table({"episode_id": list(process), "group_id": ["g"] * 4})
    _, plain = loop._advantages(_r2_stage(), episodes, credit)
    assert plain is not None
    moved = set()
    for seed in range(8):
        _, shuffled = loop._advantages(_r2_stage(placebo_shuffle_rewards=True), episodes, credit, placebo_seed=seed)
        assert shuffled is not None
        for k in range(2):
            assert sorted(v[k] for v in shuffled.values()) == pytest.approx(sorted(v[k] for v in plain.values()))
        moved.add(tuple(tuple(v) for v in shuffled.values()))
    assert len(moved) > 2  # the link between an attempt and its rewards is gone


def test_the_mask_ablation_gives_observations_the_advantage_of_the_turn_before_them() -> None:
    import torch

    from trajlake.train import loop

    batch = _r2_batch(["e"], 2)  # prompt, turn 0 (2), observation, turn 1 (2)
    loss_mask = torch.tensor([[0.0, 1, 1, 1, 1, 1]])
    assert loop._turn_advantage_tokens(batch, {"e": [0.25, -1.0]}, loss_mask, observations=True).tolist() == [
        [0.0, 0.25, 0.25, 0.25, -1.0, -1.0]]


def test_r2_potential_shaping_trains_on_tool_lookup_and_is_recorded(tmp_path: Path) -> None:
    """A tiny R2 stage (RLOO, lookup_progress, potential shaping) on tool-lookup trains end to end and records
    ``process_shaping`` in its runs.config."""
    from typer.testing import CliRunner

    from trajlake.cli import app
    from trajlake.policies.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", max_positions=1024, env="tool-lookup", corpus_tasks=8)
    cfg = write_config(tmp_path / "r2.toml", tiny_config("r2", [
        {"name": "R2", "kind": "rl", "algo": "rloo", "iterations": 1, "steps": 1, "batch_size": 4,
         "process_reward": "lookup_progress", "process_weight": 0.5, "process_shaping": "potential",
         "rollout": rollout(DP_TASKS[:2], attempts=2, max_new_tokens=16, max_steps=3)},
    ], model=model, out=tmp_path / "out", env="tool-lookup", max_length=1024))
    res = CliRunner().invoke(app, ["train", "--config", str(cfg), "--lake", str(tmp_path / "lake")])
    assert res.exit_code == 0, res.output + repr(res.exception)
    con = connect(tmp_path / "lake")
    config = json.loads(con.execute("select config from runs where run_id = 'R2.train'").fetchone()[0])
    assert config["stage"]["process_shaping"] == "potential" and config["stage"]["process_reward"] == "lookup_progress"
    log = [r for r in pq.read_table(tmp_path / "out" / "train_log.parquet").to_pylist() if r["stage"] == "R2"]
    assert len(log) == 1 and math.isfinite(log[0]["loss"]) and log[0]["policy_tokens"] > 0


# -- the KL penalty to the stage's start (ref_kl_coef) ----------------------------------------------------------------

def test_ref_kl_penalty_is_computed_against_the_stage_start_and_logged(tmp_path: Path) -> None:
    """An RL stage with ``ref_kl_coef`` keeps the policy it started from as pi_ref: its first step sees a policy
    equal to it (kl_ref exactly 0), and every later step that follows an update sees it (the last iteration's
    first step included: pi_ref is not refrozen per iteration); without the key nothing is logged."""
    from typer.testing import CliRunner

    from trajlake.cli import app
    from trajlake.policies.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", max_positions=1024, env="tool-lookup", corpus_tasks=8)
    stage = {"kind": "rl", "algo": "rloo", "iterations": 3, "steps": 1, "batch_size": 4, "lr": 1e-2,
             "rollout": rollout(DP_TASKS[:2], attempts=2, max_new_tokens=16, max_steps=3,
                                policy_args={"price_in": "1", "price_out": "100"})}
    cfg = write_config(tmp_path / "kl.toml", tiny_config("kl", [  # the token cost makes the advantages non-zero
        {"name": "R1", **stage, "ref_kl_coef": 0.5}, {"name": "R1b", **stage}],
        model=model, out=tmp_path / "out", env="tool-lookup", max_length=1024, lambda_cost=1.0))
    res = CliRunner().invoke(app, ["train", "--config", str(cfg), "--lake", str(tmp_path / "lake")])
    assert res.exit_code == 0, res.output + repr(res.exception)
    log = pq.read_table(tmp_path / "out" / "train_log.parquet").to_pylist()
    kl = [r["kl_ref"] for r in log if r["stage"] == "R1"]
    grads = [r["grad_norm"] for r in log if r["stage"] == "R1"]
    # one step per iteration: each step's pi differs from pi_ref exactly when an earlier step moved the weights
    assert len(kl) == 3 and kl[0] == 0.0 and grads[-2] > 0, (kl, grads)
    assert all((k > 0) == any(g > 0 for g in grads[:i]) for i, k in enumerate(kl)), (kl, grads)
    assert all(r["kl_ref"] is None for r in log if r["stage"] == "R1b")
    con = connect(tmp_path / "lake")
    config = json.loads(con.execute("select config from runs where run_id = 'R1.train'").fetchone()[0])
    assert config["stage"]["ref_kl_coef"] == 0.5


def test_ref_kl_adds_beta_times_k2_to_the_loss_of_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_rl_step`` adds ref_kl_coef * mean((log pi - log pi_ref)^2 / 2) over the policy tokens, by hand: the
    reference is 0.3 nats below the policy on every policy token."""
    import torch

    from trajlake.train import loop
    from trajlake.train.config import TrainConfig

    losses: list[float] = []

    class Learner(_FakeLearner):
        reference = object()

        def reference_logprobs(self, batch: dict[str, Any], temperature: float) -> Any:
            return batch["behavior_logprobs"] - 0.3

        def backward(self, loss: Any) -> None:
            losses.append(float(loss.detach()))

    monkeypatch.setattr(loop, "policy_objective", lambda *a: (torch.zeros(()), {}))
    batch = _r2_batch(["a", "b"], 2)
    batch["advantage"] = torch.zeros(2)
    stats = loop._rl_step(TrainConfig(name="x"), _r2_stage(algo="rloo", ref_kl_coef=0.4), Learner(), loop.Dist(),
                          [batch], dict.fromkeys(batch["episode_id"], 0), None)  # type: ignore[arg-type]
    assert stats["kl_ref"] == pytest.approx(0.5 * 0.3 ** 2)
    assert losses == [pytest.approx(0.4 * 0.5 * 0.3 ** 2)]


def test_ref_kl_coef_must_be_a_finite_number_on_an_rl_stage() -> None:
    from trajlake.errors import ConfigError
    from trajlake.train.config import parse_config

    def stage(kind: str, coef: float) -> dict[str, Any]:
        extra = {"data_policy": "oracle"} if kind == "sft" else {"rollout": rollout(TWO_TASKS, attempts=2)}
        return {"name": "S", "kind": kind, "ref_kl_coef": coef, **extra}

    for kind, coef, message in (("rl", -0.1, "stages[0] (S).ref_kl_coef = -0.1: must be a finite number >= 0"),
                                ("rl", math.nan, "stages[0] (S).ref_kl_coef = nan: must be a finite number >= 0"),
                                ("sft", 0.1, "stages[0] (S).ref_kl_coef: only an rl stage")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse_config(tiny_config("x", [stage(kind, coef)]))
    assert parse_config(tiny_config("x", [stage("rl", 0.05)])).stages[0].ref_kl_coef == 0.05


# -- the plateau check of an sft stage ----------------------------------------------------------------------------

@pytest.mark.slow
def test_a_plateau_check_stops_sft_above_its_bar_and_registers_nothing(tmp_path: Path) -> None:
    """``plateau_check``: after its step, the mean of the window's losses (read back from the training log) is
    compared with ``max_loss``; above it the stage raises PlateauError naming the numbers, keeps its training log
    and registers no checkpoint (no ``B1.train`` run, no folder); at or below it the stage trains on to the end."""
    from trajlake.errors import PlateauError
    from trajlake.policies.tiny import build_tiny_model
    from trajlake.train.config import parse_config
    from trajlake.train.loop import train

    model = build_tiny_model(tmp_path / "model", max_positions=1024, env="tool-lookup", corpus_tasks=8)

    def config(name: str, max_loss: float) -> Any:
        stage = {"name": "B1", "kind": "sft", "steps": 5, "batch_size": 2, "lr": 1e-3,
                 "data": rollout(DP_TASKS, max_steps=4),
                 "plateau_check": {"step": 3, "window": 2, "max_loss": max_loss}}
        return parse_config(tiny_config(name, [stage], model=model, out=tmp_path / name, env="tool-lookup",
                                        max_length=1024, run_prefix=f"{name}-"))

    lines: list[str] = []
    with pytest.raises(PlateauError, match=r"^stage B1: mean training loss \d+\.\d{4} over steps 1-2 is above "
                                           r"plateau_check\.max_loss = 0\.001: the model is still on its loss "
                                           r"plateau; no checkpoint was saved$") as e:
        train(config("low", 1e-3), str(tmp_path / "lake"), log=lines.append)
    losses = [r["loss"] for r in pq.read_table(tmp_path / "low" / "train_log.parquet").to_pylist()]
    assert len(losses) == 3 and e.value.step == 3
    assert e.value.mean_loss == pytest.approx((losses[1] + losses[2]) / 2, rel=1e-12)
    assert any("plateau check failed" in line for line in lines)
    assert not (tmp_path / "low" / "B1").exists()
    con = connect(tmp_path / "lake")
    assert con.execute("select count(*) from runs where run_id = 'low-B1.train'").fetchone()[0] == 0

    result = train(config("high", e.value.mean_loss + 1.0), str(tmp_path / "lake"), log=lines.append)
    assert result.stages[0].steps == 5 and (tmp_path / "high" / "B1").is_dir()
    assert any("plateau check passed" in line for line in lines)
    con = connect(tmp_path / "lake")
    assert con.execute("select count(*) from runs where run_id = 'high-B1.train'").fetchone()[0] == 1


def test_a_plateau_check_is_refused_where_it_cannot_work() -> None:
    """One clear line per problem, before anything runs: an rl stage, a step outside [window, steps), a bar that
    is not a finite positive number."""
    from trajlake.errors import ConfigError
    from trajlake.train.config import parse_config

    def problems(stage: dict[str, Any]) -> str:
        with pytest.raises(ConfigError) as e:
            parse_config(tiny_config("x", [stage]))
        return str(e.value)

    sft = {"name": "B1", "kind": "sft", "steps": 10, "data": rollout(TWO_TASKS)}
    assert "stages[0] (B1).plateau_check: step = 10: must lie in [window, steps) = [4, 10)" in problems(
        {**sft, "plateau_check": {"step": 10, "window": 4, "max_loss": 0.5}})
    assert "stages[0] (B1).plateau_check: step = 2: must lie in [window, steps) = [4, 10)" in problems(
        {**sft, "plateau_check": {"step": 2, "window": 4, "max_loss": 0.5}})
    assert "plateau_check: max_loss = nan: must be a finite number > 0" in problems(
        {**sft, "plateau_check": {"step": 5, "window": 4, "max_loss": float("nan")}})
    assert "plateau_check: only an sft stage has a plateau check (this one is rl)" in problems(
        {"name": "R1", "kind": "rl", "rollout": rollout(TWO_TASKS),
         "plateau_check": {"step": 5, "window": 4, "max_loss": 0.5}})


def test_the_environments_arguments_decide_which_task_ids_a_stage_may_name(tmp_path: Path) -> None:
    """A data rollout's task ids are checked against the split its ``env_args`` make (tool-lookup's
    ``train_phrasings`` adds train families), before anything is written."""
    from trajlake.errors import ConfigError
    from trajlake.train.config import parse_config
    from trajlake.train.loop import check_environment

    extra = "tool-lookup/code/p12/0"
    stage = {"name": "B1", "kind": "sft", "steps": 1, "data": rollout([extra, "tool-lookup/code/p0/0"])}
    with_args = {**stage, "data": {**stage["data"], "env_args": {"train_phrasings": 12}}}
    check_environment(parse_config(tiny_config("ok", [with_args], out=tmp_path / "a", env="tool-lookup")))
    with pytest.raises(ConfigError, match=f"tasks: {extra} not in tool-lookup's 'train' split"):
        check_environment(parse_config(tiny_config("bad", [stage], out=tmp_path / "b", env="tool-lookup")))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def _rl_samples(n: int, seed: int) -> list[dict[str, Any]]:
    """Reader-shaped samples of different lengths for the tiny model: a prompt, then policy turns of 3-6 tokens
    with observations of 2-4 tokens between them; behaviour log-probs near the model's, one episode in three stale."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        turns = int(rng.integers(1, 4))
        ids, mask, turn_of = list(rng.integers(5, 500, 4)), [0.0] * 4, [-1] * 4
        for k in range(turns):
            m = int(rng.integers(3, 7))
            ids += list(rng.integers(5, 500, m))
            mask += [1.0] * m
            turn_of += [k] * m
            if k < turns - 1:
                o = int(rng.integers(2, 5))
                ids += list(rng.integers(5, 500, o))
                mask += [0.0] * o
                turn_of += [-1] * o
        lp = np.where(np.asarray(mask) == 1, -6.2 + rng.normal(0, 0.3, len(ids)), np.nan)
        out.append({"input_ids": np.asarray(ids, np.int64), "loss_mask": np.asarray(mask, np.float32),
                    "behavior_logprobs": lp.astype(np.float32), "token_turn": np.asarray(turn_of, np.int64),
                    "advantage": float(rng.normal()), "reward": float(rng.integers(0, 2)), "terminated": i % 4 != 3,
                    "n_policy_turns": turns, "episode_id": f"e{i}", "group_id": f"g{i // 2}",
                    "policy_version": "v0", "policy_lag": i % 3})
    return out


@pytest.mark.parametrize("setting", ["clip-kl-ref", "ppo", "mask-ablation-seq-mean", "reinforce-r2"])
def test_micro_batches_give_the_gradient_of_the_whole_batch(tiny_model: Path, setting: str) -> None:
    """One RL step on six episodes of different lengths, as one padded batch and as micro-batches of 1 and of 4
    (each padded to its own longest episode): the accumulated gradients equal the whole batch's (to float
    rounding) for every loss term (the clipped objective with stale episodes re-scored by pi_prox, the KL to the
    behaviour policy and to the reference, PPO's value loss, the mask ablation's denominator, per-turn R2
    advantages), and so do the logged loss and statistics."""
    import torch

    from trajlake.train import loop
    from trajlake.train.config import TrainConfig
    from trajlake.train.data.collate import pad_collate

    samples = _rl_samples(6, seed=3)
    keys: dict[str, Any] = {"kl_coef": 0.3}
    stage_keys: dict[str, Any] = {}
    algo = "rloo"
    turn_advantages = None
    if setting == "clip-kl-ref":
        stage_keys = {"ref_kl_coef": 0.2}
    elif setting == "ppo":
        algo = "ppo"
    elif setting == "mask-ablation-seq-mean":
        keys["loss_aggregation"] = "seq-mean-token-mean"
        stage_keys = {"loss_on_observations": True}
    else:
        keys["policy_loss"] = "reinforce"
        turn_advantages = {s["episode_id"]: [0.5 - 0.25 * k for k in range(s["n_policy_turns"])] for s in samples}
    cfg = TrainConfig(name="x", grad_clip=0.0, **keys)
    stage = _r2_stage(algo=algo, **stage_keys)
    staleness = {s["episode_id"]: int(s["policy_lag"] > 0) for s in samples}
    credit = loop.Credit(terminal={s["episode_id"]: s["reward"] for s in samples})

    def one_step(size: int) -> tuple[list[Any], dict[str, Any]]:
        torch.manual_seed(0)
        learner = loop.Learner(tiny_model, "cpu", loop.Dist(), value_head=algo == "ppo")
        learner.new_optimizer(1e-3)
        learner.freeze_proximal()
        learner.freeze_reference()
        with torch.no_grad():  # pi_prox and pi_ref differ from the learner, so their terms are not zero
            for p in learner.model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        micro = [pad_collate(samples[lo:lo + size]) for lo in range(0, len(samples), size)]
        for b in micro:
            b["grammar_masks"] = None
        row = loop._rl_step(cfg, stage, learner, loop.Dist(), micro, staleness, credit, turn_advantages)
        return [p.grad.detach().clone() for p in learner.parameters()], row

    whole_grads, whole = one_step(6)
    for size in (1, 4):
        grads, row = one_step(size)
        for g, w in zip(grads, whole_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)
        for key in ("loss", "kl", "kl_ref", "entropy", "ratio_mean", "log_ratio_var", "staleness_mean", "clip_frac",
                    "is_weight_mean", "value_loss", "policy_tokens"):
            assert (row[key] is None) == (whole[key] is None), key
            if whole[key] is not None:
                assert row[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key
    assert any(float(g.abs().sum()) > 0 for g in whole_grads)


def test_a_stage_trained_in_micro_batches_makes_the_same_steps(tmp_path: Path) -> None:
    """``micro_batch_size = 1``: B1 (4 episodes a step) trains to the same losses and weights as in one pass (to
    float rounding), and an RL stage trains in micro-batches through the loop (prefix masks, lag and age columns)."""
    import torch

    from trajlake.policies.tiny import build_tiny_model
    from trajlake.train.config import parse_config
    from trajlake.train.loop import train

    model = build_tiny_model(tmp_path / "model", max_positions=1024, env="tool-lookup", corpus_tasks=8)

    def run(name: str, micro: int) -> tuple[list[float], dict[str, Any]]:
        stages = [{"name": "B1", "kind": "sft", "steps": 3, "batch_size": 4, "lr": 1e-3,
                   "data": rollout(DP_TASKS, max_steps=4)},
                  {"name": "R1", "kind": "rl", "steps": 1, "batch_size": 4, "lr": 1e-4,
                   "rollout": rollout(DP_TASKS[:2], attempts=2, max_new_tokens=16, max_steps=2)}]
        cfg = parse_config(tiny_config(name, stages, model=model, out=tmp_path / name, env="tool-lookup",
                                       max_length=1024, run_prefix=f"{name}-", micro_batch_size=micro,
                                       shuffle=False))
        train(cfg, str(tmp_path / "lake"))
        log = pq.read_table(tmp_path / name / "train_log.parquet").to_pylist()
        from safetensors.torch import load_file

        weights = load_file(str(tmp_path / name / "B1" / "model.safetensors"))
        assert [r["stage"] for r in log] == ["B1", "B1", "B1", "R1"]
        assert log[-1]["policy_tokens"] > 0 and math.isfinite(log[-1]["loss"])
        return [r["loss"] for r in log if r["stage"] == "B1"], weights

    whole_losses, whole = run("whole", 0)
    micro_losses, micro = run("micro", 1)
    assert micro_losses == pytest.approx(whole_losses, rel=1e-5)
    for key, w in whole.items():
        torch.testing.assert_close(micro[key], w, rtol=1e-4, atol=1e-6)
