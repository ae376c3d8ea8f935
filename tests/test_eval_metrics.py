"""The metric vector as the seed defines it (spec section 7), checked against hand-computed rows: recovery,
unknown cost, partial success and its verification source, ungraded episodes, and intervals that stay in the
metric's range and say when there are too few task clusters."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trajlake.evaluators.data import load
from trajlake.evaluators.diagnose import diagnose_data
from trajlake.evaluators.metrics import Settings
from trajlake.evaluators.render import FEW_CLUSTERS_MARK, render_html, render_markdown, report_tables
from trajlake.evaluators.report import evaluate, to_json

from tests.test_eval_sql import Episode, Step, episode, read, rows, task_row, write
from trajlake import Lake, open_lake

FAST = Settings(resamples=300, seed=3)


def _lake(tmp_path: Path, eps: list[Episode], **kw: Any) -> Lake:
    lk = open_lake(tmp_path / "lake", create=True)
    write(lk, eps, **kw)
    return lk


def _report(lk: Lake, runs: list[str] | None = None, **kw: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    data = load(lk, runs)
    try:
        return evaluate(data, settings=FAST, **kw), rows(data)
    finally:
        data.close()


def _fault(path: str, **kw: Any) -> Step:
    """A read whose observation is an injected transient fault (as the runner's --fault-rate writes it)."""
    return read(path, status="ENV_TRANSIENT", fault="transient", **kw)


# ------------------------------------------------------------------------------------------------ recovery


def test_recovery_rate_is_success_among_faulted_episodes(tmp_path: Path) -> None:
    # A heuristic run with --fault-rate 0.2 reported 0.667 where 2 of 6 faulted episodes succeeded: the failed
    # episodes that retried the failing call were counted as recovered. Six faulted episodes, two successes.
    fail: dict[str, Any] = {"success": False, "error_class": "MODEL_BAD_PLAN"}
    eps = [
        episode("s-retried", task="t0", steps=[_fault("a.py"), read("a.py")]),
        episode("s-moved-on", task="t1", steps=[_fault("a.py"), read("b.py")]),
        episode("f-retried-1", task="t2", steps=[_fault("a.py"), read("a.py")], **fail),
        episode("f-retried-2", task="t3", steps=[read("x.py"), _fault("a.py"), read("a.py")], **fail),
        episode("f-unretried", task="t4", steps=[_fault("a.py"), read("b.py")], **fail),
        episode("f-failagain", task="t5", steps=[_fault("a.py"), _fault("a.py")], **fail),
        # no fault met: not in the denominator, whatever the outcome
        episode("clean-ok", task="t0", seed=1, steps=[read("a.py")]),
        episode("clean-fail", task="t1", seed=1, steps=[read("a.py")], **fail),
        # a transient error the environment reported on its own, not an injected fault: not in the denominator
        episode("natural-transient", task="t2", seed=1, steps=[read("a.py", status="ENV_TRANSIENT"), read("a.py")]),
    ]
    report, r = _report(_lake(tmp_path, eps))
    rr = report["runs"]["run-A"]["metrics"]["recovery_rate"]
    assert rr["n"] == 6 and rr["estimate"] == pytest.approx(2 / 6)
    assert [r[e]["recovered"] for e in ("s-retried", "s-moved-on", "f-retried-1", "f-retried-2", "f-unretried",
                                        "f-failagain")] == [1, 1, 0, 0, 0, 0]
    assert r["clean-ok"]["recovered"] is None and r["clean-fail"]["recovery_eligible"] == 0
    assert r["natural-transient"]["recovery_eligible"] == 0 and r["natural-transient"]["retries"] == 1
    # the taxonomy still tells a failing call that was never retried from one that was
    tax = report["taxonomy"]["run-A"]
    assert tax["examples"]["recovery"] == ["f-failagain", "f-unretried"]
    assert sorted(tax["rules"]["recovery"]) == ["fault never retried successfully", "repeated a failing action"]


def test_recovery_needs_the_budget_and_a_grade(tmp_path: Path) -> None:
    eps = [
        # solved, but with 3 steps where the task allows 2: not within the remaining budget
        episode("over", task="tb", steps=[_fault("a.py"), read("a.py"), read("b.py")]),
        episode("within", task="tb", seed=1, steps=[_fault("a.py"), read("a.py")]),
        # never graded: not known to have recovered, so not in the denominator
        episode("ungraded", task="tb", seed=2, steps=[_fault("a.py"), read("a.py")], success=None),
        # the episode counts an injected fault that no turn is flagged with: it met a fault all the same
        episode("episode-level", task="tc", steps=[read("a.py")]),
    ]
    eps[3][0]["faults_injected"] = 1
    report, r = _report(_lake(tmp_path, eps, tasks=[task_row("tb", max_steps=2)]))
    assert (r["over"]["recovery_eligible"], r["over"]["recovered"]) == (1, 0)
    assert (r["within"]["recovery_eligible"], r["within"]["recovered"]) == (1, 1)
    assert (r["ungraded"]["recovery_eligible"], r["ungraded"]["recovered"]) == (1, None)
    assert (r["episode-level"]["recovery_eligible"], r["episode-level"]["recovered"]) == (1, 1)
    rr = report["runs"]["run-A"]["metrics"]["recovery_rate"]
    assert rr["n"] == 3 and rr["n_unknown"] == 1 and rr["estimate"] == pytest.approx(2 / 3)


# ------------------------------------------------------------------------------------------------ cost


def test_unknown_cost_is_no_data_never_zero(tmp_path: Path) -> None:
    eps = [episode(f"n{t}", run="nocost", task=f"t{t}", cost=None, success=t % 2 == 0) for t in range(4)]
    # mixed: two episodes with cost data (0.03 solved, 0.05 failed), one solved without
    eps += [episode("m0", run="mixed", task="t0", cost=0.03), episode("m1", run="mixed", task="t1", cost=0.05,
                                                                      success=False),
            episode("m2", run="mixed", task="t2", cost=None)]
    # the cost limit cannot be checked without a cost: the other limits still apply
    lk = _lake(tmp_path, eps, tasks=[task_row("t2", max_cost=0.001)])
    report, r = _report(lk)
    no = report["runs"]["nocost"]["metrics"]
    for name in ("cost_usd", "cost_per_success"):
        assert no[name]["estimate"] is None or math.isnan(no[name]["estimate"]), name
        assert no[name]["n"] == 0 and no[name]["n_unknown"] == 4, name
    js = json.loads(to_json(report))["runs"]["nocost"]["metrics"]
    assert js["cost_per_success"]["estimate"] is None and js["cost_usd"]["estimate"] is None
    table = next(t for t in report_tables(report) if t.title == "Metrics per run")
    cps = next(row for row in table.rows if row[0] == "cost_per_success")
    assert cps[table.columns.index("nocost")] == "no data"
    mixed = report["runs"]["mixed"]["metrics"]
    assert mixed["cost_usd"]["estimate"] == pytest.approx(0.04) and mixed["cost_usd"]["n_unknown"] == 1
    # total USD of the graded episodes with cost data / their successes: 0.08 / 1
    assert mixed["cost_per_success"]["estimate"] == pytest.approx(0.08)
    assert r["m2"]["cost_usd"] is None and r["m2"]["within_budget"] == 1 and r["m2"]["budgeted_success"] == 1


# ------------------------------------------------------------------------------------------------ partial


def test_partial_success_and_its_verification_source(tmp_path: Path) -> None:
    eps = [
        episode("p0", task="t0", success=False, reward={"resolved": 0.0, "partial": 0.25}),
        episode("p1", task="t1", success=False, reward={"resolved": 0.0, "partial": 0.5}),
        episode("p2", task="t2", reward={"resolved": 1.0, "partial": 1.0}),
        episode("none", task="t3", success=False, reward={"resolved": 0.0}),  # no partial credit recorded
        episode("scored", task="t4", reward={"resolved": 1.0}),
    ]
    for e in eps[:4]:
        e[0]["verification_source"] = "hidden_tests"
    eps[4][0]["verification_source"] = "scorer:match"
    report, r = _report(_lake(tmp_path, eps))
    assert (r["p0"]["partial"], r["p0"]["has_partial"]) == (0.25, 1)
    assert (r["none"]["partial"], r["none"]["has_partial"]) == (None, 0)
    assert r["scored"]["verification_source"] == "scorer:match"
    run = report["runs"]["run-A"]
    ps = run["metrics"]["partial_success"]
    assert ps["n"] == 3 and ps["estimate"] == pytest.approx((0.25 + 0.5 + 1.0) / 3)
    assert run["verification_sources"] == {"hidden_tests": 4, "scorer:match": 1}
    assert run["metrics"]["success"]["verification_sources"] == run["verification_sources"]
    assert ps["verification_sources"] == run["verification_sources"]
    table = next(t for t in report_tables(report) if t.title == "Metrics per run")
    assert ["verification source", "hidden_tests (4), scorer:match (1)"] in table.rows
    assert any(row[0] == "partial_success" for row in table.rows)


# ------------------------------------------------------------------------------------------------ ungraded


def test_ungraded_episodes_are_counted_apart_and_never_fail(tmp_path: Path) -> None:
    # Imported logs without a grader: submitted without ever running a test, but nobody knows the outcome.
    untested = [read("a.py"), Step("edit", {"path": "a.py"}, state="s1"), Step("submit", {}, observe=False)]
    eps = []
    for t in range(3):
        eps.append(episode(f"u{t}", run="imported", task=f"t{t}", steps=untested, success=None, reason="submitted"))
        eps.append(episode(f"g{t}", run="imported", task=f"t{t}", seed=1, steps=untested, success=t == 0,
                           error_class=None if t == 0 else "MODEL_BAD_PLAN"))
        eps.append(episode(f"b{t}", run="base", task=f"t{t}", seed=1, steps=untested, success=False,
                           error_class="MODEL_BAD_PLAN"))
        eps.append(episode(f"bu{t}", run="base", task=f"t{t}", steps=untested, success=t != 1))
    lk = _lake(tmp_path, eps, runs=[{"run_id": "oracle", "label": "o", "config": "{}", "policy_name": "oracle"}])
    report, r = _report(lk, baseline="base", candidate="imported")
    assert r["u0"]["success"] is None and r["u0"]["ungraded"] == 1 and r["u0"]["graded"] == 0
    assert r["u0"]["model_failure"] is None and r["u0"]["env_failure"] is None
    assert r["u0"]["budgeted_success"] is None
    m = report["runs"]["imported"]["metrics"]
    # success over the three graded episodes only (one solved), never 1/6
    assert m["success"]["estimate"] == pytest.approx(1 / 3) and m["success"]["n"] == 3
    assert m["success"]["n_unknown"] == 3
    assert m["model_failure_rate"]["estimate"] == pytest.approx(2 / 3) and m["model_failure_rate"]["n"] == 3
    assert m["ungraded_rate"]["estimate"] == pytest.approx(0.5) and m["ungraded_rate"]["n"] == 6
    assert report["runs"]["imported"]["n_ungraded"] == 3 and report["runs"]["imported"]["n_graded"] == 3
    attr = report["error_attribution"]["imported"]
    assert attr["ungraded"] == 3 and attr["failed"] == 2 and attr["model_failures"] == 2
    tax = report["taxonomy"]["imported"]
    assert sum(tax["counts"].values()) == 2 and tax["counts"]["termination"] == 2  # g1, g2 only
    assert tax["examples"]["termination"] == ["g1", "g2"]
    # paired over pairs graded on both sides: (t0..t2, seed 1) are graded in both runs, seed 0 only in base
    cmp = report["comparison"]["metrics"]["success"]
    assert cmp["n"] == 3 and cmp["n_unknown"] == 3
    assert cmp["baseline"] == pytest.approx(0.0) and cmp["candidate"] == pytest.approx(1 / 3)
    # the diagnosis walks the same rows without tripping over unknown outcomes
    data = load(lk, ["base", "imported"])
    try:
        d = diagnose_data(data, "base", "imported", FAST)
    finally:
        data.close()
    assert d["diagnosis"] == "no_drop"


def test_pass_at_k_counts_graded_attempts_only(tmp_path: Path) -> None:
    # t0: 2 graded attempts (1 solved) and 1 ungraded; t1: 1 graded attempt and 2 ungraded (too few for pass@2)
    eps = [episode("a", task="t0", seed=0, success=True), episode("b", task="t0", seed=1, success=False),
           episode("c", task="t0", seed=2, success=None), episode("d", task="t1", seed=0, success=True),
           episode("e", task="t1", seed=1, success=None), episode("f", task="t1", seed=2, success=None)]
    report, _ = _report(_lake(tmp_path, eps))
    m = report["runs"]["run-A"]["metrics"]
    assert m["pass@2"]["n_clusters"] == 1 and m["pass@2"]["estimate"] == pytest.approx(1.0)  # 1 - C(1,2)/C(2,2)
    assert m["pass^2"]["estimate"] == pytest.approx(0.0)
    assert "pass@3" not in m


# ------------------------------------------------------------------------------------------------ intervals


def _two_cluster_lake(tmp_path: Path) -> Lake:
    """Two tasks: 1 step / 0.1 tool seconds against 81 steps / 8.1 tool seconds (mean 41, 4.1)."""
    eps = []
    for run in ("A", "B"):
        for t, n in (("t0", 1), ("t1", 81)):
            e = episode(f"{run}-{t}", run=run, task=t, steps=[read(f"f{i}", state=f"s{i}") for i in range(n)],
                        success=(t == "t0") == (run == "A"))
            e[0]["tool_seconds"] = sum(x["tool_seconds"] for x in e[1])
            eps.append(e)
    return _lake(tmp_path, eps)


def test_intervals_never_leave_the_metric_range(tmp_path: Path) -> None:
    report, _ = _report(_two_cluster_lake(tmp_path), baseline="A", candidate="B")
    m = report["runs"]["A"]["metrics"]
    assert m["steps"]["estimate"] == pytest.approx(41.0)
    assert m["tool_seconds"]["estimate"] == pytest.approx(4.1)
    # clustered SE with one episode per task: sqrt(2 * (40^2 + 40^2)) / 2 = 40; t(0.975, 1) = 12.706
    assert m["steps"]["se"] == pytest.approx(40.0)
    assert m["steps"]["ci_high"] == pytest.approx(41.0 + 12.7062047 * 40.0)
    for name, spec in m.items():
        lo, hi = spec["ci_low"], spec["ci_high"]
        if lo is None or not math.isfinite(lo):
            continue
        assert lo >= 0.0, name  # every metric of the vector is non-negative
        if name.endswith(("_rate", "success")) or name.startswith("pass"):
            assert hi <= 1.0, name
    assert m["steps"]["ci_low"] == 0.0 and m["tool_seconds"]["ci_low"] == 0.0
    cmp = report["comparison"]["metrics"]
    assert cmp["success"]["ci_low"] >= -1.0 and cmp["success"]["ci_high"] <= 1.0


def test_too_few_clusters_are_flagged_next_to_the_number(tmp_path: Path) -> None:
    report, _ = _report(_two_cluster_lake(tmp_path), baseline="A", candidate="B")
    m = report["runs"]["A"]["metrics"]
    assert report["settings"]["min_clusters_t"] == 10 and report["settings"]["min_clusters_bootstrap"] == 20
    for name in ("steps", "tool_seconds", "success", "cost_per_success", "episode_latency_p99"):
        assert m[name]["few_clusters"] is True and m[name]["n_clusters"] == 2, name
    assert m["steps"]["min_clusters"] == 10 and m["cost_per_success"]["min_clusters"] == 20
    assert all(v["few_clusters"] for v in report["comparison"]["metrics"].values())
    assert all(b["metrics"]["steps"]["few_clusters"] for b in report["breakdown"])
    md = render_markdown(report)
    lo, hi = m["steps"]["ci_low"], m["steps"]["ci_high"]
    assert f"| steps | 41 [0, {hi:.4g}]{FEW_CLUSTERS_MARK} |" in md and lo == 0.0
    assert "fewer task clusters than the interval's method needs" in md
    html = render_html(report)
    assert f"41 [0, {hi:.4g}]{FEW_CLUSTERS_MARK}" in html
    js = json.loads(to_json(report))
    assert js["runs"]["A"]["metrics"]["steps"]["few_clusters"] is True


def test_enough_clusters_are_not_flagged(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    eps = [episode(f"e{t}", task=f"t{t:02d}", steps=[read(f"f{i}", state=f"s{i}") for i in range(1 + t % 3)],
                   success=bool(rng.integers(2)), cost=0.01 * (1 + t % 4)) for t in range(24)]
    report, _ = _report(_lake(tmp_path, eps))
    m = report["runs"]["run-A"]["metrics"]
    assert m["steps"]["few_clusters"] is False and m["success"]["few_clusters"] is False
    assert m["cost_per_success"]["few_clusters"] is False  # 24 tasks >= 20 for the bootstrap
    md = render_markdown(report)
    steps_row = next(line for line in md.splitlines() if line.startswith("| steps |"))
    assert FEW_CLUSTERS_MARK not in steps_row


# ------------------------------------------------------------------ policy lag and version switches (docs/names.md)


def test_policy_lag_mean_is_the_recorded_lag_over_episodes_that_record_it(tmp_path: Path) -> None:
    eps = [episode(f"l{t}", task=f"t{t}") for t in range(4)]
    for e, lag in zip(eps, [0, 1, 2, None], strict=True):
        e[0]["policy_lag"] = lag
    report, r = _report(_lake(tmp_path, eps))
    assert [r[f"l{t}"]["policy_lag"] for t in range(4)] == [0.0, 1.0, 2.0, None]
    assert [r[f"l{t}"]["has_policy_lag"] for t in range(4)] == [1, 1, 1, 0]
    m = report["runs"]["run-A"]["metrics"]
    assert m["policy_lag_mean"]["n"] == 3 and m["policy_lag_mean"]["estimate"] == pytest.approx(1.0)
    # a mid-episode version change is a different thing: none here
    assert [r[f"l{t}"]["version_switched"] for t in range(4)] == [0, 0, 0, 0]
    assert m["version_switch_rate"]["estimate"] == 0.0


def test_deprecated_lag_metric_names_carry_the_same_numbers(tmp_path: Path) -> None:
    """policy_lag_rate and policy_versions_behind stay in the report (runs, breakdown, comparison, JSON) as
    copies of version_switch_rate and policy_lag_mean, outside Holm's family and the rendered tables."""
    eps = []
    for t, (lag_a, lag_b, switch_b) in enumerate([(0, 1, True), (1, 1, True), (2, 3, False), (None, 3, False)]):
        a, b = episode(f"a{t}", run="A", task=f"t{t}"), episode(f"b{t}", run="B", task=f"t{t}",
                                                                  policy_end="p2" if switch_b else "p1")
        a[0]["policy_lag"], b[0]["policy_lag"] = lag_a, lag_b
        eps += [a, b]
    report, _ = _report(_lake(tmp_path, eps), baseline="A", candidate="B")
    a, b = report["runs"]["A"]["metrics"], report["runs"]["B"]["metrics"]
    assert (a["policy_lag_mean"]["estimate"], a["policy_lag_mean"]["n"]) == (pytest.approx(1.0), 3)  # (0+1+2)/3
    assert (b["policy_lag_mean"]["estimate"], b["policy_lag_mean"]["n"]) == (pytest.approx(2.0), 4)  # (1+1+3+3)/4
    assert (a["version_switch_rate"]["estimate"], b["version_switch_rate"]["estimate"]) == (0.0, 0.5)
    cmp = report["comparison"]["metrics"]
    assert cmp["version_switch_rate"]["diff"] == pytest.approx(0.5)  # pairs t0..t3: (1+1+0+0)/4 - 0
    # pairs where both sides record a lag: t0, t1, t2; differences 1, 0, 1
    assert cmp["policy_lag_mean"]["diff"] == pytest.approx(2 / 3) and cmp["policy_lag_mean"]["n"] == 3
    for metrics in (a, b, cmp, *(s["metrics"] for s in report["breakdown"])):
        for old, new in (("policy_lag_rate", "version_switch_rate"), ("policy_versions_behind", "policy_lag_mean")):
            assert metrics[old] == {**metrics[new], "alias_of": new}
    assert b["policy_lag_rate"]["estimate"] == 0.5 and b["policy_versions_behind"]["estimate"] == pytest.approx(2.0)
    assert cmp["policy_lag_rate"]["diff"] == pytest.approx(0.5)
    assert cmp["policy_versions_behind"]["diff"] == pytest.approx(2 / 3)
    js = json.loads(to_json(report))
    assert js["runs"]["B"]["metrics"]["policy_lag_rate"]["estimate"] == 0.5
    assert js["comparison"]["metrics"]["policy_versions_behind"]["alias_of"] == "policy_lag_mean"
    md = render_markdown(report)
    assert "| version_switch_rate |" in md and "| policy_lag_mean |" in md
    assert "policy_lag_rate" not in md and "policy_versions_behind" not in md
