"""The positive-control experiment's own logic (bench/experiment_positive_control.py): the preregistered criterion,
the arms it accepts and the report it writes, on hand-made results (no training here)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def experiment() -> ModuleType:
    from tests.conftest import load_bench

    return load_bench("experiment_positive_control")


def diff(estimate: float, low: float, high: float) -> dict[str, Any]:
    return {"estimate": estimate, "ci_low": low, "ci_high": high, "p_value": 0.01, "n_pairs": 240, "n_tasks": 240,
            "baseline": "B1", "candidate": "x"}


def test_the_criterion_needs_r1_above_b1_and_both_controls_at_zero(experiment: ModuleType) -> None:
    good = {"seed": 0, "r1_minus_b1": diff(0.2, 0.1, 0.3), "aa": diff(0.01, -0.05, 0.07),
            "placebo_minus_b1": diff(-0.02, -0.08, 0.04)}
    ok, lines = experiment.verdict([good])
    assert ok is True and "r1_minus_b1 +0.200 [+0.100, +0.300] above 0: yes" in lines[0]
    for key, bad in (("r1_minus_b1", diff(0.05, -0.01, 0.11)), ("aa", diff(0.1, 0.02, 0.18)),
                     ("placebo_minus_b1", diff(0.12, 0.05, 0.19))):
        ok, lines = experiment.verdict([good, {**good, "seed": 1, key: bad}])
        assert ok is False and ": NO" in lines[1] and ": NO" not in lines[0]
    ok, lines = experiment.verdict([{"seed": 0, "r1_minus_b1": diff(0.2, 0.1, 0.3)}])
    assert ok is None and "aa not run" in lines[0]  # an arm the criterion needs was not run: no verdict


def test_arms_must_come_with_what_they_compare_against(experiment: ModuleType, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    for arms, needle in (("r1", "r1 needs b1"), ("b1,matched", "matched needs r1"), ("b1,mask", "mask needs r1"),
                         ("b1,dpo", "unknown arm(s) dpo")):
        with pytest.raises(SystemExit):
            experiment.main(["--seeds", "1", "--out", str(tmp_path), "--arms", arms])
        assert needle in capsys.readouterr().err


def test_other_settings_in_the_same_folder_are_one_line_and_nothing_runs(experiment: ModuleType, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "experiment").mkdir()
    earlier = experiment.to_toml(experiment.experiment_config(experiment.Setup(), ["b1"], 1))
    (tmp_path / "experiment" / "experiment.toml").write_text(earlier, encoding="utf-8")
    assert experiment.main(["--seeds", "2", "--out", str(tmp_path), "--arms", "b1"]) == 1
    err = capsys.readouterr().err
    assert "holds the experiment of other settings" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "experiment.toml").exists() and not (tmp_path / "experiment" / "lake").exists()


def test_the_report_states_the_verdict_the_table_and_the_curves(experiment: ModuleType, tmp_path: Path) -> None:
    seed = {"seed": 0, "success": {"B1": 0.4, "R1": 0.6, "A/A": 0.41}, "r1_minus_b1": diff(0.2, 0.1, 0.3),
            "aa": diff(0.01, -0.05, 0.07), "curves": {"R1": [(1, 0.3), (2, 0.45), (3, 0.5)]}, "seconds": {"b1": 60}}
    experiment.write_report(tmp_path, experiment.Setup(), ["b1", "r1", "aa"], [seed], "python bench/x.py --seeds 1")
    md = (tmp_path / "report.md").read_text()
    assert "**Verdict: incomplete**" in md  # no placebo arm: the criterion cannot be judged
    assert "| 0 | 0.400 | 0.600 | 0.410 |" in md and "r1_minus_b1 (x - B1) | +0.200 | [+0.100, +0.300]" in md
    svg = (tmp_path / "curves-seed0.svg").read_text()
    assert svg.startswith("<svg") and "polyline" in svg and "R1" in svg
    assert json.loads(md.split("```json")[1].split("```")[0])["env"] == "tool-lookup"


def test_pooled_moves_sum_gained_and_lost_over_seeds_with_a_sign_test(experiment: ModuleType) -> None:
    """The fifteenth design's placebo: 3, 2 and 5 hidden episodes gained, none lost: p = 2 * 0.5**10; R1's 14, 1,
    14 gained and 0 lost; a comparison on one seed only, or without counts (an old summary), gives no line."""
    def seed(s: int, placebo: tuple[int, int], r1: tuple[int, int]) -> dict[str, Any]:
        return {"seed": s, "placebo_minus_b1": {**diff(0.0, -0.1, 0.1), "gained": placebo[0], "lost": placebo[1]},
                "r1_minus_b1": {**diff(0.0, -0.1, 0.1), "gained": r1[0], "lost": r1[1]}, "aa": diff(0.0, -0.1, 0.1)}

    lines = experiment.pooled_moves([seed(0, (3, 0), (14, 0)), seed(1, (2, 0), (1, 0)), seed(2, (5, 0), (14, 0))])
    assert "- placebo_minus_b1: 10 gained, 0 lost over 3 seeds (sign test p 0.00195)" in lines
    assert "- r1_minus_b1: 29 gained, 0 lost over 3 seeds (sign test p 3.73e-09)" in lines
    assert not any(line.startswith("- aa") for line in lines)
    assert experiment.pooled_moves([seed(0, (3, 0), (14, 0))]) == []


def test_the_design_runs_as_an_experiment_config(experiment: ModuleType) -> None:
    """The wrapper's config is the Setup's design in the experiment's terms, and the experiment parses it."""
    from trajlake.experiment.config import parse_experiment

    setup = experiment.Setup(data_policy="oracle-shortcut", policy_args={"batch_episodes": "8"})
    cfg = parse_experiment(tomllib.loads(experiment.to_toml(experiment.experiment_config(
        setup, list(experiment.ARMS), 3))), "x")
    assert cfg.all_arms() == ["B1", "R1", "B1M", "AA", "PLACEBO", "MASK"] and cfg.seeds == 3
    assert [h.id for h in cfg.hypotheses] == ["H1a"]  # names B1M, so the experiment trains the matched arm
    assert (cfg.b1.data_policy, cfg.b1.tasks, cfg.b1.steps, cfg.b1.lr) == ("oracle-shortcut", 1000, 2000, 1e-2)
    assert (cfg.rl.holdout_phrasings, cfg.rl.tasks, cfg.rl.iterations, cfg.rl.lr) == (4, 64, 10, 3e-4)
    assert (cfg.model.heads, cfg.model.kv_heads, cfg.model.vocab_size) == (8, 8, 1024)
    assert cfg.policy_args == {"max_new_tokens": "48", "batch_episodes": "8"} and cfg.eval_splits == ("hidden",)
    few = parse_experiment(tomllib.loads(experiment.to_toml(experiment.experiment_config(setup, ["b1", "r1"], 1))),
                           "x")
    assert few.all_arms() == ["B1", "R1"] and few.hypotheses == ()


def test_every_prefix_of_the_train_tasks_holds_every_family_alike(experiment: ModuleType) -> None:
    """B1's data and the held-out tasks are consecutive slices of B1's order, R1's tasks a prefix of its own: each
    must hold every template family of its pool (the split's own order put only code and pair phrasings in the
    first 1,000 tasks). The experiment's task pools, as the wrapper's config sets them."""
    from collections import Counter

    from trajlake.envs import list_tasks

    from trajlake.experiment.config import parse_experiment
    from trajlake.experiment.run import interleaved_tasks, phrasing_families, task_pools

    setup = experiment.Setup()
    cfg = parse_experiment(tomllib.loads(experiment.to_toml(experiment.experiment_config(setup, ["b1", "r1"], 1))),
                           "x")
    order = interleaved_tasks("tool-lookup", "train")
    assert sorted(order) == sorted(t["task_id"] for t in list_tasks("tool-lookup", "train"))
    b1, rl = phrasing_families("tool-lookup", setup.rl_phrasings)
    rp = setup.rl_phrasings
    assert len(b1) == 3 * (10 - rp) and len(rl) == 3 * rp and not b1 & rl
    b1_order, rl_order = interleaved_tasks("tool-lookup", "train", b1), interleaved_tasks("tool-lookup", "train", rl)
    assert not set(b1_order) & set(rl_order) and len(b1_order) + len(rl_order) == len(order)
    assert task_pools(cfg) == (b1_order[:setup.sft_tasks], rl_order[:setup.rl_tasks])
    for tasks, families, slices in ((b1_order, b1, ((0, setup.sft_tasks), (setup.sft_tasks, setup.sft_tasks + 200))),
                                    (rl_order, rl, ((0, 64),))):
        for start, stop in slices:
            counts = Counter(t.rsplit("/", 1)[0] for t in tasks[start:stop])
            assert set(counts) == families and max(counts.values()) - min(counts.values()) <= 1, (start, counts)


def test_r1_plays_the_last_train_phrasings_of_every_kind() -> None:
    from trajlake.errors import TrajlakeError
    from trajlake.experiment.run import phrasing_families

    b1, rl = phrasing_families("tool-lookup", 2)
    assert sorted(rl) == [f"tool-lookup/{k}/p{n}" for k in ("code", "pair", "two_hop") for n in (10, 11)]
    assert "tool-lookup/code/p9" in b1 and "tool-lookup/code/p4" not in b1  # dev and hidden are not train
    assert "tool-lookup/code/p5" not in b1
    with pytest.raises(TrajlakeError, match=r"rl\.holdout_phrasings = 10: kind tool-lookup/code has 10 train"):
        phrasing_families("tool-lookup", 10)


def write_seed0_lake(folder: Path) -> None:
    """A hand-made experiment lake of seed 0: 20 hidden tasks in 4 template families of 5 (t0-t4 in f0, ...);
    B1 solves tasks 0-4, R1 tasks 0-9, A/A tasks 0-4 and 19, the placebo tasks 0-3; R1's training rollouts
    solve 1 then 3 of 4."""
    from tests.conftest import make_episode
    from trajlake import LakeWriter, open_lake

    solved = {"B1": range(5), "R1": range(10), "AA": [*range(5), 19], "PLACEBO": range(4)}
    lake = open_lake(folder / "lake", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_tasks([{"task_id": f"t{i}", "task_version": "v1", "env_id": "test-env", "split": "hidden",
                        "family": f"f{i // 5}", "difficulty": "easy", "created_at": dt.datetime(2026, 12, 1, tzinfo=dt.UTC),
                        "statement": "s", "provenance": {"generator": "test", "source": None, "commit": None,
                                                         "mutator": "m", "seed": i, "diff_hash": None},
                        "has_oracle": True, "budget": {"max_steps": 6, "max_tokens": None, "max_cost": None}}
                       for i in range(20)])
        for arm, tasks in solved.items():
            for i in range(20):
                ep, turns = make_episode(f"{arm}-{i}", f"s0-{arm}-hidden", split="hidden", task_id=f"t{i}",
                                         group_id=f"t{i}:v1:0:1", success=i in tasks)
                w.write_batch([ep], turns).raise_if_rejected()
        for it, wins in ((1, 1), (2, 3)):  # R1's training rollouts: 1 then 3 of 4 successful
            for i in range(4):
                ep, turns = make_episode(f"it{it}-{i}", f"s0-R1-it{it}", split="train", task_id=f"t{i}",
                                         group_id=f"t{i}:v1:0:{it}", success=i < wins)
                w.write_batch([ep], turns).raise_if_rejected()


def test_seed_results_read_the_experiment_folder(experiment: ModuleType, tmp_path: Path) -> None:
    """Per seed, from the experiment's lake and state: success per arm, the paired differences, the training
    curves and the seconds per arm, against hand-counted episodes."""
    from trajlake.experiment.run import State

    write_seed0_lake(tmp_path)
    state = State(tmp_path / "state.json")
    state.stages = {"s0/B1/train": {"status": "done", "seconds": 60.0, "runs": ["s0-B1-data"]},
                    "s0/B1/eval:hidden": {"status": "done", "seconds": 5.0},
                    "s0/R1/train": {"status": "done", "seconds": 100.0, "runs": ["s0-R1-it1", "s0-R1-it2"]},
                    "s1/R1/train": {"status": "done", "seconds": 999.0}}
    state.save()
    got = experiment.seed_results(tmp_path, experiment.Setup(), ["b1", "r1", "aa", "placebo"], 0)
    assert got["success"] == {"B1": 0.25, "R1": 0.5, "A/A": 0.3, "placebo": 0.2}
    assert got["r1_minus_b1"]["estimate"] == pytest.approx(0.25) and got["r1_minus_b1"]["n_pairs"] == 20
    assert got["aa"]["estimate"] == pytest.approx(0.05) and got["placebo_minus_b1"]["estimate"] == pytest.approx(-0.05)
    assert got["r1_minus_b1"]["baseline"] == "s0-B1-hidden" and got["r1_minus_b1"]["candidate"] == "s0-R1-hidden"
    # matched episodes gained / lost: R1 solves t5-t9 beyond B1's t0-t4, A/A adds t19, the placebo drops t4
    assert [(got[k]["gained"], got[k]["lost"]) for k in ("r1_minus_b1", "aa", "placebo_minus_b1")] == [
        (5, 0), (1, 0), (0, 1)]
    assert "matched_minus_b1" not in got and got["curves"] == {"R1": [(1, 0.25), (2, 0.75)], "placebo": []}
    assert got["seconds"] == {"b1": 65.0, "r1": 100.0}
    assert got["mixed_groups"] == {"R1": [(1, 0.0), (2, 0.0)]}  # one attempt per task: no group is mixed
    # families as clusters, by hand: differences 1 on t5-t9 (family f1), else 0; mean 0.25; residual sums per
    # family -1.25, +3.75, -1.25, -1.25; SE = sqrt(4/3 * 18.75) / 20 = 0.25; t(3, 0.975) = 3.182446
    by_family = got["r1_minus_b1"]["by_family"]
    assert by_family["estimate"] == pytest.approx(0.25) and (by_family["n_tasks"], by_family["n_families"]) == (20, 4)
    assert by_family["ci_low"] == pytest.approx(0.25 - 3.182446 * 0.25, abs=1e-6)
    assert by_family["ci_high"] == pytest.approx(0.25 + 3.182446 * 0.25, abs=1e-6)


def test_behaviour_counts_success_phrasings_read_and_unread_submits_per_kind(experiment: ModuleType,
                                                                            tmp_path: Path) -> None:
    """Per task kind, against a hand-made run: code (families code/p1, code/p2: t0-t3) and pair (pair/p1: t4, t5);
    t0, t1 and t4 solved; the first action of t1 and t3 is a submit call, of t5 unparsable, else a lookup."""
    from tests.conftest import make_episode
    from trajlake import LakeWriter, open_lake
    from trajlake.query import connect
    from trajlake.render.toolcall import format_call

    families = ["code/p1", "code/p1", "code/p2", "code/p2", "pair/p1", "pair/p1"]
    first = {1: format_call("submit", {"answer": "12"}), 3: format_call("submit", {"answer": "40"}),
             5: "I think the answer is 12"}
    lake = open_lake(tmp_path / "lake", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        w.write_tasks([{"task_id": f"t{i}", "task_version": "v1", "env_id": "test-env", "split": "hidden",
                        "family": fam, "difficulty": "easy", "created_at": dt.datetime(2026, 12, 1, tzinfo=dt.UTC),
                        "statement": "s", "provenance": {"generator": "test", "source": None, "commit": None,
                                                         "mutator": "m", "seed": i, "diff_hash": None},
                        "has_oracle": True, "budget": {"max_steps": 6, "max_tokens": None, "max_cost": None}}
                       for i, fam in enumerate(families)])
        for i in range(6):
            ep, turns = make_episode(f"e{i}", "s0-B1-hidden", split="hidden", task_id=f"t{i}",
                                     group_id=f"t{i}:v1:0:1", success=i in (0, 1, 4))
            turns[1]["raw_content"] = first.get(i, format_call("lookup", {"name": "Bofa"}))
            turns[3]["raw_content"] = format_call("submit", {"answer": "99"})  # a later submit does not count
            w.write_batch([ep], turns).raise_if_rejected()
    con = connect(tmp_path / "lake")
    got = experiment.behaviour(con, "s0-B1-hidden")
    assert got == {"code": {"episodes": 4, "success": 0.5, "phrasings_read": 1, "phrasings": 2,
                            "first_action_submit": 0.5},
                   "pair": {"episodes": 2, "success": 0.5, "phrasings_read": 1, "phrasings": 1,
                            "first_action_submit": 0.0}}
    assert experiment.behaviour(con, "no-such-run") is None


def test_mixed_groups_count_the_tasks_whose_attempts_disagree_per_iteration(experiment: ModuleType,
                                                                            tmp_path: Path) -> None:
    """Iteration 1: t0 (solved, failed), t1 (solved twice), t2 (failed twice), t3 (failed, solved): 2 of 4 mixed;
    iteration 2: every attempt solved: none mixed; runs without ``-it`` (B1's data) are not iterations."""
    from tests.conftest import make_episode
    from trajlake import LakeWriter, open_lake
    from trajlake.query import connect

    outcomes = {1: [(True, False), (True, True), (False, False), (False, True)], 2: [(True, True)] * 4}
    lake = open_lake(tmp_path / "lake", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        for it, tasks in outcomes.items():
            for i, attempts in enumerate(tasks):
                for a, won in enumerate(attempts):
                    ep, turns = make_episode(f"it{it}-t{i}-a{a}", f"s0-R1-it{it}", split="train", task_id=f"t{i}",
                                             group_id=f"t{i}:v1:0:{it}", attempt=a, success=won)
                    w.write_batch([ep], turns).raise_if_rejected()
    con = connect(tmp_path / "lake")
    assert experiment.mixed_groups(con, ["s0-B1-data", "s0-R1-it2", "s0-R1-it1"]) == [(1, 0.5), (2, 0.0)]
    assert experiment.mixed_groups(con, ["s0-B1-data"]) == []


def test_a_config_gives_back_the_setup_that_wrote_it(experiment: ModuleType) -> None:
    """--judge reports a folder with the settings its config ran: setup_from_config inverts experiment_config."""
    from trajlake.experiment.config import parse_experiment

    setup = experiment.Setup(data_policy="oracle-shortcut", sft_steps=4000, rl_lr=1e-4, hidden_size=96,
                             eval_sampling_seed=3, aa_sampling_seed=7, max_new_tokens=40,
                             policy_args={"batch_episodes": "8"})
    cfg = parse_experiment(tomllib.loads(experiment.to_toml(experiment.experiment_config(
        setup, list(experiment.ARMS), 3))), "x")
    assert experiment.setup_from_config(cfg) == setup
    restarting = dataclasses.replace(setup, sft_restarts=3,
                                     sft_plateau_check={"step": 3000, "window": 500, "max_loss": 0.5})
    cfg = parse_experiment(tomllib.loads(experiment.to_toml(experiment.experiment_config(
        restarting, list(experiment.ARMS), 3))), "x")
    assert cfg.b1.restarts == 3 and cfg.b1.plateau_check is not None and cfg.b1.plateau_check.max_loss == 0.5
    assert experiment.setup_from_config(cfg) == restarting


def test_judge_reads_a_folder_the_experiment_ran_and_judges_its_finished_seeds(experiment: ModuleType,
                                                                              tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """--judge runs nothing: arms, seeds and settings come from the folder's experiment.toml; only seeds whose
    every arm is evaluated are judged, so a folder still running gives an incomplete verdict."""
    from trajlake.experiment.run import State

    folder, out = tmp_path / "exp", tmp_path / "judged"
    write_seed0_lake(folder)
    setup = experiment.Setup(data_policy="oracle-shortcut", sft_steps=4000)
    (folder / "experiment.toml").write_text(experiment.to_toml(experiment.experiment_config(
        setup, ["b1", "r1", "aa", "placebo"], 2)))
    state = State(folder / "state.json")
    state.stages = {f"s0/{arm}/eval:hidden": {"status": "done", "seconds": 1.0} for arm in ("B1", "R1", "AA", "PLACEBO")}
    state.stages["s1/B1/eval:hidden"] = {"status": "done", "seconds": 1.0}  # seed 1's other arms not evaluated yet
    state.stages["s0/B1/train"] = {"status": "done", "model_seed": 2000, "restarts": [  # B1 restarted twice
        {"restart": 0, "model_seed": 0, "step": 3000, "mean_loss": 0.571, "prefix": "s0-"},
        {"restart": 1, "model_seed": 1000, "check": "rl_tasks", "rl_tasks_success": 0.016, "run": "s0r1-B1-rl-tasks-check",
         "prefix": "s0r1-"}], "rl_tasks_check": {"success": 0.375, "run": "s0r2-B1-rl-tasks-check"}}
    state.save()
    assert experiment.main(["--judge", str(folder), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"][0]["b1_restarts"]["model_seed"] == 2000
    assert summary["seeds"][0]["b1_rl_tasks_success"] == 0.375
    assert ("Seed 0: B1 from model seed 2000; model seed 0 stopped at step 3000 (mean loss 0.571), model seed 1000 "
            "stopped after training (success 0.016 on R1's tasks); it solved 0.375 of R1's train tasks"
            in (out / "report.md").read_text())
    assert summary["arms"] == ["b1", "r1", "aa", "placebo"] and (summary["seeds_done"], summary["seeds_planned"]) == (1, 2)
    assert summary["setup"]["sft_steps"] == 4000 and summary["setup"]["data_policy"] == "oracle-shortcut"
    assert summary["seeds"][0]["r1_minus_b1"]["estimate"] == pytest.approx(0.25) and summary["criterion_met"] is None
    assert summary["seeds"][0]["r1_minus_b1"]["by_family"]["n_families"] == 4  # the sensitivity, beside it
    assert "| 0 | r1_minus_b1 | +0.250 | [-0.546, +1.046] | 4 |" in (out / "report.md").read_text()
    assert "**Verdict: incomplete** (1 of 2 seeds done)" in (out / "report.md").read_text()
    capsys.readouterr()
    assert experiment.main(["--judge", str(tmp_path / "nothing"), "--out", str(out)]) == 1
    assert "no experiment.toml" in capsys.readouterr().err


def test_outputs_after_each_seed_say_what_is_done_and_whether_b1_is_in_its_band(experiment: ModuleType,
                                                                                  tmp_path: Path) -> None:
    """summary.json and report.md are written after every seed: a stopped run keeps its finished seeds, and a
    verdict that only the finished seeds meet says it is incomplete; B1's band is reported apart from the
    criterion."""
    good = {"seed": 0, "success": {"B1": 0.3, "R1": 0.4, "A/A": 0.31, "placebo": 0.3},
            "r1_minus_b1": diff(0.1, 0.05, 0.15), "aa": diff(0.01, -0.02, 0.04),
            "placebo_minus_b1": diff(0.0, -0.03, 0.03), "curves": {}}
    setup, arms = experiment.Setup(), ["b1", "r1", "aa", "placebo"]
    experiment.write_outputs(tmp_path, setup, arms, [good], "cmd", seeds_planned=3)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["seeds_done"] == 1 and summary["seeds_planned"] == 3 and summary["criterion_met"] is None
    assert summary["seeds"][0]["b1_in_band"] is True
    md = (tmp_path / "report.md").read_text()
    assert "**Verdict: incomplete** (1 of 3 seeds done)" in md
    assert "seed 0: B1's hidden success 0.300 is inside the design's band [0.20, 0.60]" in md
    failed = {**good, "seed": 1, "success": {**good["success"], "B1": 0.004}, "r1_minus_b1": diff(-0.01, -0.02, 0.01)}
    experiment.write_outputs(tmp_path, setup, arms, [good, failed], "cmd", seeds_planned=3)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["criterion_met"] is False and summary["seeds"][1]["b1_in_band"] is False  # a failed seed decides
    md = (tmp_path / "report.md").read_text()
    assert "**Verdict: criterion NOT met** (2 of 3 seeds done)" in md and "0.004 is OUTSIDE" in md
    experiment.write_outputs(tmp_path, setup, arms, [good, {**good, "seed": 1}, {**good, "seed": 2}], "cmd",
                             seeds_planned=3)
    assert json.loads((tmp_path / "summary.json").read_text())["criterion_met"] is True
    assert "**Verdict: criterion met**\n" in (tmp_path / "report.md").read_text()


def test_a_config_runs_with_its_seeds_and_arms_replaced_and_everything_else_as_written(experiment: ModuleType,
                                                                                       tmp_path: Path) -> None:
    source = ROOT / "configs" / "experiment-positive-control-constant.toml"
    text = source.read_text(encoding="utf-8")
    slice_text = experiment.config_with(text, str(source), seeds=1, arms=["b1", "r1", "aa"])
    data, original = tomllib.loads(slice_text), tomllib.loads(text)
    assert data["seeds"] == 1 and data["arms"] == ["B1", "R1", "AA"]
    # the name (run prefixes, B1's data order) and every other setting are the eighth design's
    assert {k: v for k, v in data.items() if k not in ("seeds", "arms")} == \
        {k: v for k, v in original.items() if k not in ("seeds", "arms")}
    assert data["name"] == "positive-control-12k" and data["rl"]["ref_kl_coef"] == 0.04
    assert experiment.config_with(text, "x", seeds=None, arms=None) == text
    with pytest.raises(SystemExit, match=r"no top-level `arms = \.\.\.` line"):
        experiment.config_with(text.replace('arms = ["B1"', 'arms = [\n"B1"').replace("\narms =", "\n# arms ="),
                               "x.toml", seeds=None, arms=["b1"])


def test_a_config_and_a_setup_are_refused_together_and_another_config_in_the_folder_runs_nothing(
        experiment: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = ROOT / "configs" / "experiment-positive-control-constant.toml"
    with pytest.raises(SystemExit):
        experiment.main(["--config", str(config), "--setup", str(config), "--out", str(tmp_path)])
    assert "give one" in capsys.readouterr().err
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "experiment.toml").write_text(config.read_text(encoding="utf-8"), encoding="utf-8")
    assert experiment.main(["--config", str(config), "--seeds", "1", "--arms", "b1,r1,aa", "--out",
                            str(tmp_path)]) == 1
    assert "holds the experiment of another config" in capsys.readouterr().err
    assert not (tmp_path / "experiment" / "lake").exists()
