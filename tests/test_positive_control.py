"""The positive-control experiment's own logic (bench/experiment_positive_control.py): the preregistered criterion,
the arms it accepts and the report it writes, on hand-made results (no training here)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def experiment() -> ModuleType:
    spec = importlib.util.spec_from_file_location("experiment_positive_control",
                                                  ROOT / "bench" / "experiment_positive_control.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
    for arms, needle in (("r1", "r1 needs b1"), ("b1,matched", "matched needs r1"), ("b1,dpo", "unknown arm(s) dpo")):
        with pytest.raises(SystemExit):
            experiment.main(["--seeds", "1", "--out", str(tmp_path), "--arms", arms])
        assert needle in capsys.readouterr().err


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


def test_every_prefix_of_the_train_tasks_holds_every_family_alike(experiment: ModuleType) -> None:
    """B1's data and the held-out tasks are consecutive slices of B1's order, R1's tasks a prefix of its own: each
    must hold every template family of its pool (the split's own order put only code and pair phrasings in the
    first 1,000 tasks)."""
    from collections import Counter

    from trajlake.envs import list_tasks

    setup = experiment.Setup()
    order = experiment.interleaved_train_tasks("tool-lookup")
    assert sorted(order) == sorted(t["task_id"] for t in list_tasks("tool-lookup", "train"))
    b1, rl = experiment.split_train_families("tool-lookup", setup.rl_phrasings)
    rp = setup.rl_phrasings
    assert len(b1) == 3 * (10 - rp) and len(rl) == 3 * rp and not set(b1) & set(rl)
    seed = experiment.Seed(setup, 0, Path("unused"), print)
    b1_order, rl_order = seed.b1_tasks(), seed.rl_tasks()
    assert not set(b1_order) & set(rl_order) and len(b1_order) + len(rl_order) == len(order)
    for tasks, families, slices in ((b1_order, b1, ((0, setup.sft_tasks), (setup.sft_tasks, setup.sft_tasks + 200))), (rl_order, rl, ((0, 64),))):
        for start, stop in slices:
            counts = Counter(t.split("/", 1)[1].rsplit("/", 1)[0] for t in tasks[start:stop])
            assert set(counts) == set(families) and max(counts.values()) - min(counts.values()) <= 1, (start, counts)


def test_r1_plays_the_last_train_phrasings_of_every_kind(experiment: ModuleType) -> None:
    b1, rl = experiment.split_train_families("tool-lookup", 2)
    assert rl == ["code/p10", "code/p11", "pair/p10", "pair/p11", "two_hop/p10", "two_hop/p11"]
    assert "code/p9" in b1 and "code/p4" not in b1 and "code/p5" not in b1  # dev and hidden are not train
    assert experiment.split_train_families("tool-lookup", 0)[1] == []
    with pytest.raises(ValueError, match="rl_phrasings = 10: kind code has 10 train phrasings"):
        experiment.split_train_families("tool-lookup", 10)



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
