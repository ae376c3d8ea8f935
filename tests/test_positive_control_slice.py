"""The positive control's slice (issue 24): one training seed of B1, R1 and the A/A control in the fifth design
(configs/positive-control-fifth.toml), trained and evaluated on the 240 hidden tasks, and R1 must beat B1 with its
95% interval above 0 while the A/A interval includes 0.

    TRAJLAKE_POSITIVE_CONTROL_SLICE=1 python -m pytest -q tests/test_positive_control_slice.py

Opt-in, not part of README's test command: it trains for ~12-17 minutes on 2 cores (B1's 4,000 supervised steps
on one torch thread are ~11 of them; measured 2026-12-03: 14.3 minutes, R1 - B1 +0.121 [+0.079, +0.162], and again
at 1bad488, after B1's data order was made reproducible (d8053d7): 16.5 minutes, B1 0.138, R1 0.200, R1 - B1 +0.062
[+0.021, +0.104], A/A -0.017 [-0.067, +0.034]), and the whole suite already uses most of CI's ~25-minute budget.
That rerun's B1 trained on other tasks than the sixth design's: from 52ee523 until 8a0b4ef the grown
train split listed its tasks in id order, in which instance 100 comes before 11, so the first 1,000 B1 tasks were
other instances. The list keeps its old order again since then, so at HEAD the slice trains on the sixth design's
data, whose seed-0 B1 (through the experiment command, two torch threads) memorised instead of copying (hidden
0.037, R1 - B1 +0.008): not rerun at HEAD; expect it to fail until a design copies on seed 0. Rollouts are batched 8
episodes at a time, so the figures are reproducible to float rounding, not bit for bit (docs/policies.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("TRAJLAKE_POSITIVE_CONTROL_SLICE") != "1",
                       reason="opt-in (~14 minutes of training): TRAJLAKE_POSITIVE_CONTROL_SLICE=1"),
]


def test_r1_beats_b1_on_hidden_and_the_aa_control_includes_zero(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tests.conftest import load_bench

    module = load_bench("experiment_positive_control")

    out = tmp_path / "pc"
    assert module.main(["--seeds", "1", "--arms", "b1,r1,aa", "--setup",
                        str(ROOT / "configs" / "positive-control-fifth.toml"), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    seed = summary["seeds"][0]
    assert summary["setup"]["sft_steps"] == 4000 and summary["setup"]["data_policy"] == "oracle-shortcut"
    r1, aa = seed["r1_minus_b1"], seed["aa"]
    assert r1["n_pairs"] == 240 and r1["n_tasks"] == 240
    assert r1["estimate"] > 0 and r1["ci_low"] > 0, r1
    assert aa["ci_low"] <= 0 <= aa["ci_high"], aa
    assert seed["success"]["R1"] > seed["success"]["B1"] > 0
