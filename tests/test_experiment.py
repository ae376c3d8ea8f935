"""``trajlake experiment``: the config, the verdict rules against hand-computed rows, and the whole matrix end to end
on a shrunken smoke config (arms, hypotheses, bundle, resume after a kill)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from trajlake.errors import ConfigError
from trajlake.experiment.config import DecisionRule, load_experiment, parse_experiment
from trajlake.experiment.hypotheses import (
    decide,
    entry_statistics,
    hypothesis_verdict,
    metric_values,
    with_holm,
)

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "experiment-smoke.toml"


# -- config -----------------------------------------------------------------------------------------------------
def test_shipped_configs_parse() -> None:
    for name in ("smoke", "positive-control", "mini-swe", "mini-web"):
        cfg = load_experiment(ROOT / "configs" / f"experiment-{name}.toml")
        assert cfg.hypotheses, name
        assert {h.hypothesis for h in cfg.hypotheses} == {"H1", "H2", "H3", "H4"}, name
    quick = load_experiment(ROOT / "configs" / "experiment-positive-control-quick.toml")
    full = load_experiment(ROOT / "configs" / "experiment-positive-control.toml")
    assert quick.all_arms() == ["B1", "R1", "AA", "PLACEBO"] and {h.hypothesis for h in quick.hypotheses} == {"H4"}
    assert (quick.model, quick.b1, quick.rl) == (full.model, full.b1, full.rl)  # the same design, fewer arms
    assert full.b1.data_policy == "oracle-shortcut"
    smoke = load_experiment(ROOT / "configs" / "experiment-mini-swe-cpu-smoke.toml")  # the GPU config, cut down
    gpu = load_experiment(ROOT / "configs" / "experiment-mini-swe.toml")
    assert (smoke.model, smoke.policy_args, smoke.max_length) == (gpu.model, gpu.policy_args, gpu.max_length)
    assert smoke.micro_batch_size == 1 and gpu.micro_batch_size == 4


def test_smoke_config_names_all_six_arms_and_derives_b1m() -> None:
    cfg = load_experiment(SMOKE)
    assert set(cfg.arms) == {"B0", "B1", "B2", "R1", "R2", "R3"}
    assert cfg.all_arms() == ["B1", "B0", "R1", "B1M", "B2", "R2", "R3"]


def test_control_arms_are_planned_after_what_they_need() -> None:
    from trajlake.experiment.run import Experiment

    data = tomllib.loads(SMOKE.read_text(encoding="utf-8"))
    data["arms"] = ["B1", "R1", "AA", "PLACEBO", "MASK"]
    cfg = parse_experiment(data, "x")
    assert cfg.all_arms() == ["B1", "R1", "B1M", "AA", "PLACEBO", "MASK"]
    plan = [(what, arm) for what, _, arm, _ in Experiment.plan_of(cfg)]
    assert ("train", "PLACEBO") in plan and ("train", "MASK") in plan and ("eval", "AA") in plan
    assert ("train", "AA") not in plan  # A/A plays B1's checkpoint again
    data["arms"] = ["B1", "MASK"]
    data["hypotheses"] = []
    with pytest.raises(ConfigError, match="MASK needs R1"):
        parse_experiment(data, "x")


@pytest.mark.parametrize(("change", "message"), [
    ({"arms": ["R1"]}, "R1 needs B1"),
    ({"arms": ["B1", "R9"]}, "unknown arm(s) R9"),
    ({"colour": "red"}, "unknown key(s) colour"),
    ({"seeds": "two"}, "seeds: expected int"),
    ({"micro_batch_size": -1}, "arm B1 (from [b1]): micro_batch_size = -1: must be >= 0"),
    ({"policy_args": {"grammar": "none"}}, "policy_args: --policy-arg grammar must be one of"),
    ({"b1": {"data_policy": "teacher"}}, "b1.data_policy = 'teacher': not a scripted policy of tool-lookup"),
    ({"hypotheses": [{"id": "H1a", "hypothesis": "H1", "claim": "x", "metric": "success", "baseline": "B7",
                      "candidate": "R1"}]}, "unknown arm 'B7'"),
    ({"hypotheses": [{"id": "H3", "hypothesis": "H3", "claim": "x", "metric": "recovery_held_out",
                      "baseline": "B2", "candidate": "R3"}]}, "recovery_held_out compares"),
])
def test_bad_config_is_one_clear_error(change: dict[str, object], message: str) -> None:
    data = tomllib.loads(SMOKE.read_text(encoding="utf-8"))
    data.update(change)
    with pytest.raises(ConfigError, match=r"experiment-smoke\.toml") as e:
        parse_experiment(data, str(SMOKE))
    assert message in str(e.value)


def test_micro_batch_size_reaches_every_arms_trainer() -> None:
    from trajlake.experiment.config import train_table

    data = tomllib.loads(SMOKE.read_text(encoding="utf-8"))
    data["micro_batch_size"] = 2
    cfg = parse_experiment(data, str(SMOKE))
    table = train_table(cfg, name="x", seed=0, out_dir="o", run_prefix="p-", tags={}, model={}, stage={})
    assert cfg.micro_batch_size == 2 and table["micro_batch_size"] == 2


@pytest.mark.parametrize(("table", "key", "value", "message"), [
    ("rl", "lr", float("inf"), "arm R1 (from [rl]): lr = inf: must be a finite number > 0"),
    ("rl", "ref_kl_coef", -0.5, "arm R1 (from [rl]): ref_kl_coef = -0.5: must be a finite number >= 0"),
    ("rl", "attempts", 1, "arm R1 (from [rl]): attempts = 1: rloo needs groups"),
    ("b1", "min_lr_ratio", 2.0, "arm B1 (from [b1]): min_lr_ratio = 2.0: must lie in [0, 1]"),
    ("b1", "lr", 0.0, "arm B1 (from [b1]): lr = 0.0: must be a finite number > 0"),
    ("policy_args", "top_p", "0.9", "arm R1 (from [rl]): policy_args.top_p = 0.9: the learner re-scores without"),
])
def test_the_trainers_checks_of_every_arm_run_before_anything_is_written(
        tmp_path: Path, table: str, key: str, value: object, message: str) -> None:
    """Each trained arm's stage goes through the trainer's own checks when the config is read: a value the trainer
    refuses stops the experiment before B1 trains (not in R1, an hour later), in one line naming the file, the arm
    and the key, and no output folder is made."""
    from trajlake.experiment.run import run_experiment

    data = tomllib.loads(SMOKE.read_text(encoding="utf-8"))
    data.setdefault(table, {})[key] = value
    with pytest.raises(ConfigError, match=r"experiment-smoke\.toml") as e:
        parse_experiment(data, str(SMOKE))
    assert message in str(e.value) and "\n" not in str(e.value)
    if (table, key) == ("rl", "lr"):  # through the command's entry point: refused before the folder is made
        bad = tmp_path / "bad.toml"
        bad.write_text(SMOKE.read_text(encoding="utf-8").replace("lr = 3e-4", "lr = inf"), encoding="utf-8")
        with pytest.raises(ConfigError, match=r"bad\.toml: arm R1 \(from \[rl\]\): lr = inf"):
            run_experiment(bad, tmp_path / "out", log=lambda line: None)
        assert not (tmp_path / "out").exists()


def test_b1_learns_from_the_configured_demonstrator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[b1] data_policy`` reaches B1's training stage (the positive control's fourth design: oracle-shortcut)."""
    from trajlake.experiment.run import Experiment

    stages: list[dict[str, object]] = []
    monkeypatch.setattr(Experiment, "_train", lambda self, seed, arm, attempt, model, stage, restart=0: stages.append(stage)
                        or {"tokens": 1, "steps": 1, "runs": []})
    for data_policy in ("oracle", "oracle-shortcut"):
        data = tomllib.loads(SMOKE.read_text(encoding="utf-8"))
        data["b1"] = {**data.get("b1", {}), "data_policy": data_policy}
        (tmp_path / data_policy).mkdir()
        Experiment(parse_experiment(data, "x"), tmp_path / data_policy, lambda line: None).b1(0)
    assert [s["data_policy"] for s in stages] == ["oracle", "oracle-shortcut"]


def test_b1_restarts_from_a_new_initialisation_while_its_plateau_check_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[b1] plateau_check`` and ``restarts``: each B1 whose check fails is trained again from model seed
    ``seed + 1000 k`` under its own run prefix and folder; the last restart runs without the check; the stopped
    attempts are recorded in the state entry (the bundle's ``training``)."""
    from trajlake.errors import PlateauError
    from trajlake.experiment.run import Experiment

    calls: list[tuple[int, dict[str, object], dict[str, object]]] = []
    stuck = {"first": 2}  # this many initialisations stay on the plateau (while the check is on)

    def fake_train(self: Experiment, seed: int, arm: str, attempt: int, model: dict[str, object],
                   stage: dict[str, object], restart: int = 0) -> dict[str, object]:
        calls.append((restart, model, stage))
        on_disk = json.loads((self.folder / "state.json").read_text())["stages"][f"s{seed}/B1/train"]
        assert [r["restart"] for r in on_disk.get("restarts", [])] == list(range(restart))  # saved as they stop
        if "plateau_check" in stage and restart < stuck["first"]:
            raise PlateauError("stage B1: on the plateau", mean_loss=0.61 + restart / 100, step=30)
        return {"checkpoint": "ckpt", "tokens": 1, "steps": 40, "runs": [f"{self.prefix(seed, attempt, restart)}B1-data"]}

    monkeypatch.setattr(Experiment, "_train", fake_train)
    data = tomllib.loads(SMOKE.read_text(encoding="utf-8"))
    data["seeds"] = 3
    data["b1"] = {**data.get("b1", {}), "steps": 40, "restarts": 3,
                  "plateau_check": {"step": 30, "window": 10, "max_loss": 0.5}}
    exp = Experiment(parse_experiment(data, "x"), tmp_path, lambda line: None)
    exp.b1(2)
    assert [(r, m["seed"], "plateau_check" in st) for r, m, st in calls] == [
        (0, 2, True), (1, 1002, True), (2, 2002, True)]
    assert calls[0][2]["plateau_check"] == {"step": 30, "window": 10, "max_loss": 0.5}
    entry = exp.state.done("s2/B1/train")
    assert entry is not None and entry["model_seed"] == 2002 and entry["runs"] == ["s2r2-B1-data"]
    assert entry["restarts"] == [
        {"restart": 0, "model_seed": 2, "step": 30, "mean_loss": 0.61, "prefix": "s2-"},
        {"restart": 1, "model_seed": 1002, "step": 30, "mean_loss": 0.62, "prefix": "s2r1-"}]

    calls.clear()
    data["b1"]["restarts"] = 1  # every check fails: the last restart trains to the end without one
    stuck["first"] = 99
    (tmp_path / "again").mkdir()
    exp = Experiment(parse_experiment(data, "x"), tmp_path / "again", lambda line: None)
    exp.b1(0)
    assert [(r, m["seed"], "plateau_check" in st) for r, m, st in calls] == [(0, 0, True), (1, 1000, False)]
    assert [a["prefix"] for a in exp.state.done("s0/B1/train")["restarts"]] == ["s0-"]


def test_b1_restarts_while_it_solves_too_few_of_the_rl_arms_train_tasks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[b1] rl_tasks_check``: a B1 that trained to the end (and passed its plateau check) plays the RL arms' own
    train tasks; below ``min_success`` it is trained again from a new initialisation, the stopped attempt recorded
    with its success and check run; the last restart is neither checked on its loss nor on R1's tasks."""
    from trajlake.experiment.run import Experiment, task_pools

    data = tomllib.loads(SMOKE.read_text(encoding="utf-8"))
    data["b1"] = {**data.get("b1", {}), "steps": 40, "restarts": 2,
                  "plateau_check": {"step": 30, "window": 10, "max_loss": 0.5},
                  "rl_tasks_check": {"min_success": 0.25, "attempts": 2}}
    cfg = parse_experiment(data, "x")
    _, rl_tasks = task_pools(cfg)
    rates = {"s0-": 0.0, "s0r1-": 0.25}  # the first B1 solves none of R1's tasks, the second exactly the bar
    trained: list[tuple[int, bool]] = []
    played: list[tuple[str, str, str, int, list[str] | None]] = []

    def fake_train(self: Experiment, seed: int, arm: str, attempt: int, model: dict[str, object],
                   stage: dict[str, object], restart: int = 0) -> dict[str, object]:
        trained.append((restart, "plateau_check" in stage))
        prefix = self.prefix(seed, attempt, restart)
        return {"checkpoint": f"ckpt-{prefix}", "policy_version": prefix, "tokens": 1, "steps": 40,
                "runs": [f"{prefix}B1-data"]}

    def fake_play(self: Experiment, run_id: str, arm: str, seed: int, policy: str, version: str | None, split: str,
                  *, attempts: int = 1, task_ids: list[str] | None = None, **_: object) -> dict[str, object]:
        played.append((run_id, policy, split, attempts, task_ids))
        n = len(task_ids or []) * attempts
        prefix = run_id[: run_id.index("B1-")]
        return {"run": run_id, "episodes": n, "written": n, "successes": round(rates[prefix] * n)}

    monkeypatch.setattr(Experiment, "_train", fake_train)
    monkeypatch.setattr(Experiment, "_play", fake_play)
    exp = Experiment(cfg, tmp_path, lambda line: None)
    exp.b1(0)
    assert trained == [(0, True), (1, True)]  # the second passed at the bar (>= min_success): no third
    assert [(r, p, sp, a) for r, p, sp, a, _ in played] == [
        ("s0-B1-rl-tasks-check", "hf:ckpt-s0-", "train", 2), ("s0r1-B1-rl-tasks-check", "hf:ckpt-s0r1-", "train", 2)]
    assert all(t == rl_tasks for *_, t in played) and rl_tasks
    entry = exp.state.done("s0/B1/train")
    assert entry is not None and entry["model_seed"] == 1000 and entry["checkpoint"] == "ckpt-s0r1-"
    assert entry["restarts"] == [{"restart": 0, "model_seed": 0, "check": "rl_tasks", "rl_tasks_success": 0.0,
                                  "run": "s0-B1-rl-tasks-check", "prefix": "s0-"}]
    assert entry["rl_tasks_check"] == {"success": 0.25, "run": "s0r1-B1-rl-tasks-check"}

    rates["s0r1-"] = 0.0  # every check fails: the last restart trains to the end without either check
    trained.clear()
    played.clear()
    (tmp_path / "again").mkdir()
    exp = Experiment(cfg, tmp_path / "again", lambda line: None)
    exp.b1(0)
    assert trained == [(0, True), (1, True), (2, False)] and len(played) == 2
    entry = exp.state.done("s0/B1/train")
    assert entry is not None and entry["model_seed"] == 2000 and "rl_tasks_check" not in entry
    assert [r["prefix"] for r in entry["restarts"]] == ["s0-", "s0r1-"]


@pytest.mark.slow
def test_a_restarted_b1_trains_under_its_own_prefix_and_folder(tmp_path: Path) -> None:
    """The real trainer under a plateau check no loss can pass: the first B1 stops at the check with its data run
    in the lake and no ``.train`` run; the restart (model seed 1000) trains to the end as ``s0r1-``, in
    ``seed0/B1.r1``, and is the checkpoint the other arms would start from."""
    from trajlake.experiment.run import Experiment
    from trajlake.query import connect

    data = tomllib.loads(SMOKE.read_text(encoding="utf-8"))
    data["model"] = {**data["model"], "corpus_tasks": 8}
    data["b1"] = {**data["b1"], "tasks": 8, "steps": 6, "batch_size": 2, "restarts": 1,
                  "plateau_check": {"step": 3, "window": 2, "max_loss": 1e-6}}
    exp = Experiment(parse_experiment(data, "x"), tmp_path, lambda line: None)
    exp.b1(0)
    entry = exp.state.done("s0/B1/train")
    assert entry is not None and entry["model_seed"] == 1000 and entry["steps"] == 6
    assert [(r["restart"], r["model_seed"], r["step"], r["prefix"]) for r in entry["restarts"]] == [(0, 0, 3, "s0-")]
    assert entry["restarts"][0]["mean_loss"] > 1e-6
    assert Path(entry["checkpoint"]) == tmp_path / "seed0" / "B1.r1" / "B1" and exp.checkpoint(0, "B1").is_dir()
    assert not (tmp_path / "seed0" / "B1" / "B1").exists()
    runs = {r for (r,) in connect(tmp_path / "lake").execute("select run_id from runs").fetchall()}
    assert {"s0-B1-data", "s0r1-B1-data", "s0r1-B1.train"} <= runs and "s0-B1.train" not in runs
    assert entry["train_run"] == "s0r1-B1.train"


@pytest.mark.slow
def test_b1s_rl_tasks_check_plays_the_rl_arms_train_tasks_into_the_lake(tmp_path: Path) -> None:
    """The real trainer and rollout under a bar no tiny B1 reaches (success 1.0 on R1's tasks): the first B1 trains
    to the end, plays each of R1's train tasks ``attempts`` times as ``s0-B1-rl-tasks-check``, is stopped with its
    measured success, and the restart (unchecked) is the B1 the other arms start from."""
    from trajlake.experiment.run import Experiment, task_pools
    from trajlake.query import connect

    data = tomllib.loads(SMOKE.read_text(encoding="utf-8"))
    data["model"] = {**data["model"], "corpus_tasks": 8}
    data["b1"] = {**data["b1"], "tasks": 8, "steps": 4, "batch_size": 2, "restarts": 1,
                  "rl_tasks_check": {"min_success": 1.0, "attempts": 2}}
    data["rl"] = {**data["rl"], "tasks": 3}
    cfg = parse_experiment(data, "x")
    exp = Experiment(cfg, tmp_path, lambda line: None)
    exp.b1(0)
    entry = exp.state.done("s0/B1/train")
    assert entry is not None and entry["model_seed"] == 1000 and entry["train_run"] == "s0r1-B1.train"
    (stopped,) = entry["restarts"]
    assert stopped["check"] == "rl_tasks" and stopped["run"] == "s0-B1-rl-tasks-check" and stopped["prefix"] == "s0-"
    con = connect(tmp_path / "lake")
    rows = con.execute("select task_id, split, count(*), avg(case when success then 1.0 else 0.0 end) "
                       "from episodes where run_id = 's0-B1-rl-tasks-check' group by 1, 2 order by 1").fetchall()
    _, rl_tasks = task_pools(cfg)
    assert [(t, sp, n) for t, sp, n, _ in rows] == [(t, "train", 2) for t in sorted(rl_tasks)]
    measured = sum(float(r[3]) for r in rows) / len(rows)
    assert stopped["rl_tasks_success"] == pytest.approx(measured) and measured < 1.0


@pytest.mark.parametrize(("b1", "message"), [
    ({"restarts": 2}, "b1: plateau_check or rl_tasks_check and restarts >= 1 go together"),
    ({"plateau_check": {"step": 30, "window": 10, "max_loss": 0.5}}, "b1: plateau_check or rl_tasks_check and"),
    ({"rl_tasks_check": {"min_success": 0.1}}, "b1: plateau_check or rl_tasks_check and restarts >= 1 go"),
    ({"restarts": 1, "rl_tasks_check": {"min_success": 1.5}}, "b1.rl_tasks_check.min_success = 1.5: a success"),
    ({"restarts": 1, "rl_tasks_check": {"min_success": float("nan")}}, "b1.rl_tasks_check.min_success = nan"),
    ({"restarts": 1, "rl_tasks_check": {"min_success": 0.1, "attempts": 0}}, "rl_tasks_check.attempts = 0: at least"),
    ({"restarts": -1}, "b1.restarts = -1: must be >= 0"),
    ({"restarts": 1, "steps": 20, "plateau_check": {"step": 30, "window": 10, "max_loss": 0.5}},
     "arm B1 (from [b1]): plateau_check: step = 30: must lie in [window, steps) = [10, 20)"),
])
def test_b1_restart_settings_are_checked_before_anything_runs(b1: dict[str, object], message: str) -> None:
    data = tomllib.loads(SMOKE.read_text(encoding="utf-8"))
    data["b1"] = {**data.get("b1", {}), **b1}
    with pytest.raises(ConfigError, match=r"experiment-smoke\.toml") as e:
        parse_experiment(data, str(SMOKE))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_b0_plays_unbatched_when_the_experiment_batches_its_hf_arms(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``policy_args.batch_episodes`` batches the hf: arms; B0's single-turn policy refuses the key, so its
    evaluation leaves it out (the positive-control config stopped at B0 before this); the other arms keep it."""
    from trajlake.experiment.run import Experiment
    from trajlake.policies import check_policy_spec
    from trajlake.rollout import runner

    seen: dict[str, dict[str, str]] = {}

    def fake_rollout(config: runner.RolloutConfig) -> object:
        if config.policy.startswith("single-turn:"):  # the check the real rollout makes first (no model here)
            check_policy_spec(config.env, config.policy, config.policy_args)
        seen[config.run_id] = dict(config.policy_args)
        return type("Summary", (), {"failed_items": [], "written": 1, "skipped_existing": 0, "successes": 0})()

    # Modules that bind run_rollout when first imported must be imported before the patch: imported under it
    # (evaluate imports the trainer), they kept the fake for the rest of the process, and every later training
    # rollout in that test process "wrote 1 episode, 0 successful" (test_train_smoke, test_s3_quickstart_train).
    import trajlake.rollout.quickstart
    import trajlake.train.loop

    monkeypatch.setattr(runner, "run_rollout", fake_rollout)
    data = tomllib.loads(SMOKE.read_text(encoding="utf-8"))
    data["policy_args"] = {**data.get("policy_args", {}), "batch_episodes": "8"}
    exp = Experiment(parse_experiment(data, "x"), tmp_path, lambda line: None)
    (tmp_path / "b1").mkdir()
    (tmp_path / "b1" / "config.json").write_text("{}")  # a model folder, as far as the spec check looks
    exp.state.stages["s0/B1/train"] = {"status": "done", "checkpoint": str(tmp_path / "b1"), "policy_version": "v"}
    exp.evaluate(0, "B0", "hidden")
    exp.evaluate(0, "B1", "hidden")
    assert "batch_episodes" not in seen["s0-B0-hidden"] and seen["s0-B1-hidden"]["batch_episodes"] == "8"
    assert trajlake.train.loop.run_rollout is trajlake.rollout.quickstart.run_rollout is not fake_rollout


# -- verdicts against hand-computed rows --------------------------------------------------------------------------
def test_decide_follows_the_rule() -> None:
    kw = {"alpha": 0.05, "min_effect": 0.05}
    assert decide(0.2, 0.1, 0.3, 0.01, direction="greater", **kw) == "supported"
    # an interval that includes 0 is never supported, whatever p says
    assert decide(0.2, -0.01, 0.41, 0.001, direction="greater", **kw) == "inconclusive"
    # significant but not after Holm: inconclusive
    assert decide(0.2, 0.1, 0.3, 0.2, direction="greater", **kw) == "inconclusive"
    assert decide(-0.2, -0.3, -0.1, 0.01, direction="greater", **kw) == "refuted"
    # the interval rules out the smallest claimed effect
    assert decide(0.0, -0.02, 0.03, 0.9, direction="greater", **kw) == "refuted"
    # direction less: a negative difference supports it
    assert decide(-1.0, -1.5, -0.5, 0.001, direction="less", **kw) == "supported"
    assert decide(1.0, 0.5, 1.5, 0.001, direction="less", **kw) == "refuted"
    assert decide(math.nan, math.nan, math.nan, math.nan, direction="greater", **kw) == "inconclusive"


def test_hypothesis_verdict_from_entries() -> None:
    assert hypothesis_verdict(["supported", "supported"]) == "supported"
    assert hypothesis_verdict(["supported", "inconclusive"]) == "inconclusive"
    assert hypothesis_verdict(["supported", "refuted"]) == "refuted"
    assert hypothesis_verdict([]) == "inconclusive"


def test_entry_statistics_and_holm_by_hand() -> None:
    # 4 tasks, 2 pairs each: differences per pair 1,1 | 1,0 | 0,0 | 1,1 -> task means 1, .5, 0, 1
    b = np.zeros(8)
    c = np.array([1, 1, 1, 0, 0, 0, 1, 1], dtype=float)
    tasks = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    s = entry_statistics(b, c, tasks, DecisionRule(alpha=0.05))
    assert s["estimate"] == pytest.approx(5 / 8)
    # clustered SE by hand: residual sums per task (d - m): 2-1.25=.75, 1-1.25=-.25, 0-1.25=-1.25, .75
    sums = np.array([0.75, -0.25, -1.25, 0.75])
    se = math.sqrt(4 / 3 * float((sums ** 2).sum())) / 8
    assert s["se"] == pytest.approx(se)
    from scipy import stats

    t = stats.t.ppf(0.975, 3)
    assert s["ci_low"] == pytest.approx(5 / 8 - t * se)
    assert s["p_value"] == pytest.approx(2 * stats.t.sf(abs(5 / 8 / se), 3))
    assert s["mdd"] == pytest.approx((stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * se)
    assert (s["n_pairs"], s["n_tasks"]) == (8, 4)
    entries = [dict(s, direction="greater", hypothesis="H1"),
               dict(s, p_value=0.04, direction="greater", hypothesis="H2"),
               dict(entry_statistics(np.zeros(0), np.zeros(0), np.zeros(0), DecisionRule()), direction="greater",
                    hypothesis="H3")]
    out = with_holm(entries, DecisionRule(alpha=0.05))
    ps = sorted([s["p_value"], 0.04])
    assert sorted([out[0]["p_holm"], out[1]["p_holm"]]) == pytest.approx([min(1, 2 * ps[0]), max(min(1, 2 * ps[0]),
                                                                                                ps[1])])
    assert math.isnan(out[2]["p_holm"]) and out[2]["verdict"] == "inconclusive"
    # both arms at 0 on every task: SE 0, a degenerate interval [0, 0] that would "rule out" any effect
    zeros = entry_statistics(np.zeros(6), np.zeros(6), np.arange(6), DecisionRule())
    assert (zeros["ci_low"], zeros["ci_high"], zeros["se"]) == (0.0, 0.0, 0.0)
    [flat] = with_holm([dict(zeros, direction="greater", hypothesis="H1")], DecisionRule())
    assert flat["verdict"] == "inconclusive" and math.isnan(flat["mdd"]) and "degenerate" in flat["notes"][0]


def test_capped_metrics_by_hand() -> None:
    # baseline run: steps 2, 4 (mean 3); cost .1, .3 (mean .2). Candidate: success within / beyond the caps.
    ep = {"success": np.array([1, 1, 1, 1, np.nan, 0], dtype=float),
          "steps": np.array([2, 4, 3, 5, 1, 1], dtype=float),
          "cost_usd": np.array([0.1, 0.3, 0.2, 0.25, 0.1, np.nan]),
          "recovery_eligible": np.array([1, 0, 1, 1, 1, 1], dtype=float),
          "recovered": np.array([1, np.nan, 0, 1, np.nan, 0], dtype=float)}
    b_idx, c_idx = np.array([0, 1, 4]), np.array([2, 3, 5])
    base = np.array([0, 1])
    b, c, keep = metric_values(ep, b_idx, c_idx, "success_at_steps", base)
    # pair 0: base 1 (2 <= 3), cand 1 (3 <= 3); pair 1: base 0 (4 > 3), cand 0 (5 > 3); pair 2: base unknown
    assert keep.tolist() == [True, True, False]
    assert b[keep].tolist() == [1.0, 0.0] and c[keep].tolist() == [1.0, 0.0]
    b, c, keep = metric_values(ep, b_idx, c_idx, "success_at_cost", base)
    # cap .2: base .1 -> 1, .3 -> 0; cand .2 -> 1, .25 -> 0; pair 2: candidate cost unknown
    assert keep.tolist() == [True, True, False] and b[keep].tolist() == [1, 0] and c[keep].tolist() == [1, 0]
    b, c, keep = metric_values(ep, b_idx, c_idx, "recovery_held_out", base)
    # pair 1: the baseline met no fault; pair 2: the baseline is ungraded (recovered unknown)
    assert keep.tolist() == [True, False, False] and (b[0], c[0]) == (1.0, 0.0)


# -- end to end ---------------------------------------------------------------------------------------------------
def _tiny_config(tmp: Path, **top: object) -> Path:
    """The smoke config shrunk to minutes: fewer tasks, steps and episodes, same arms and hypotheses. Rollouts
    play in the experiment's own process (``workers = 1`` unless given): two spawned workers per rollout started
    Python, torch and the model twice for 6-24 tiny episodes, ~25 times over the matrix."""
    data = tomllib.loads(SMOKE.read_text(encoding="utf-8"))
    text = SMOKE.read_text(encoding="utf-8")
    for key, value in {"eval_tasks = 24": "eval_tasks = 6", "tasks = 64": "tasks = 16", "steps = 60": "steps = 8",
                       "tasks = 12": "tasks = 4", "attempts = 4\niterations = 2": "attempts = 2\niterations = 2",
                       "trajectories = 100": "trajectories = 20"}.items():
        assert key in text, key
        text = text.replace(key, value)
    for key, value in {"workers": 1, **top}.items():
        assert f"{key} = {json.dumps(data[key])}" in text, key
        text = text.replace(f"{key} = {json.dumps(data[key])}", f"{key} = {json.dumps(value)}")
    path = tmp / "experiment-tiny.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "trajlake", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=1800)


@pytest.mark.slow
def test_experiment_end_to_end_with_a_kill_and_resume(tmp_path: Path) -> None:
    config = _tiny_config(tmp_path, arms=["B0", "B1", "B2", "R1", "R2", "R3", "AA", "PLACEBO"])
    out = tmp_path / "exp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # kill the experiment in the middle of R1's training stage, then run the same command again
    proc = subprocess.Popen([sys.executable, "-m", "trajlake", "experiment", "run", "--config", str(config), "--out",
                             str(out)], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        # R1's first iteration has played (its second is still to come): the stage is surely part-way
        if "rollout s0-R1-it1:" in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=600)
    state = json.loads((out / "state.json").read_text())
    assert state["stages"]["s0/B1/train"]["status"] == "done"
    assert state["stages"]["s0/R1/train"]["status"] == "started"
    done = _cli("experiment", "run", "--config", str(config), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "attempt 2: the previous one was killed" in done.stderr
    state = json.loads((out / "state.json").read_text())
    assert all(s["status"] == "done" for s in state["stages"].values())
    assert state["stages"]["s0/B1/train"]["attempt"] == 1  # finished stages are never run again
    assert [a["stage"] for a in state["abandoned"]] == ["s0/R1/train"]
    for name in ("report.md", "report.html", "summary.json", "model_card.md", "contamination.json", "unrun.md",
                 "browser.html"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    ids = [e["id"] for e in summary["hypotheses"]]
    assert ids == ["H1a", "H1b", "H2a", "H2b", "H3", "H4a", "H4b"]
    for e in summary["hypotheses"]:
        assert e["verdict"] in ("supported", "refuted", "inconclusive") and e["rule"], e
        for key in ("estimate", "ci_low", "ci_high", "p_holm", "mdd"):
            assert key in e
    assert set(summary["verdicts"]) == {"H1", "H2", "H3", "H4"}
    # every evaluated arm in the matrix, every run labelled and tagged
    arms = {r["arm"] for r in summary["matrix"]["pooled"]}
    assert arms == {"B0", "B1", "B1M", "B2", "R1", "R2", "R3", "AA", "PLACEBO"}
    assert [c["control"] for c in summary["controls"]] == ["aa", "placebo"]
    assert all(c["expect"] == "includes 0" and c["n_pairs"] == 6 for c in summary["controls"])
    from trajlake.query import connect

    con = connect(out / "lake")
    rows = con.execute("select run_id, label, config from runs where run_id like 's0-%'").fetchall()
    tagged = [(r, lab, json.loads(c).get("tags")) for r, lab, c in rows if not r.endswith(".train")]
    assert tagged and all(t == {"experiment": "smoke", "arm": lab, "seed": "0"} for _, lab, t in tagged), tagged
    # no duplicate episode in any run the report read; the killed attempt's runs stay in the lake
    dup = con.execute("select run_id, task_id, env_seed, attempt, count(*) from episodes group by all "
                      "having count(*) > 1").fetchall()
    assert dup == []
    assert con.execute("select count(*) from runs where run_id like 's0t2-%'").fetchone()[0] >= 1
    # the trajectories: exported and replayed, every state hash matching
    tr = summary["trajectories"]
    assert tr["episodes"] >= 20 and tr["matched"] == tr["replayed"] == tr["episodes"]
    replay = _cli("replay", "--from", str(out / "trajectories"), cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    # the report again from the folder alone gives the same verdicts
    again = _cli("experiment", "report", str(out), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "summary.json").read_text())["verdicts"] == summary["verdicts"]


# -- B2's copies pair with one-attempt runs -------------------------------------------------------------------------
def test_best_of_copies_are_attempt_zero_and_pair_with_the_agent(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``trajlake eval`` pairs by (task, seed, attempt): a chosen attempt 3 kept as attempt 3 left its group out of
    every B2 comparison. The copy is the new run's attempt 0; the pool's attempt stays in the run's config."""
    from trajlake.evaluators.report import build_report

    from trajlake.policies import best_of
    from trajlake.query import connect
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    lake = str(tmp_path / "lake")
    tasks = ("tool-lookup/code/p0/0", "tool-lookup/pair/p0/0", "tool-lookup/two_hop/p0/0")
    for run, attempts in (("agent", 1), ("pool", 3)):
        run_rollout(RolloutConfig(lake=lake, run_id=run, env="tool-lookup", policy="oracle", split="train",
                                  seeds=(0,), task_ids=tasks, attempts=attempts, commit_every_s=0.0))
    real_choose = best_of.choose

    def last_attempt(cands: list[best_of.Candidate], budget_tokens: float | None, budget_cost: float | None = None
                     ) -> tuple[dict[str, best_of.Candidate], dict[str, list[best_of.Candidate]]]:
        _, considered = real_choose(cands, budget_tokens, budget_cost)
        return {g: max(cs, key=lambda c: c.attempt) for g, cs in considered.items()}, considered

    monkeypatch.setattr(best_of, "choose", last_attempt)
    report = best_of.select_best(lake, "pool", "b2")
    assert set(report.chosen.values()) == {2}
    rows = connect(lake).execute("select episode_id, attempt from episodes where run_id = 'b2'").fetchall()
    assert len(rows) == 3 and all(a == 0 and e.endswith("/a0") for e, a in rows), rows
    cmp = build_report(lake, baseline="agent", candidate="b2", breakdown=False, taxonomy=False)["comparison"]
    assert cmp["n_pairs"] == 3
