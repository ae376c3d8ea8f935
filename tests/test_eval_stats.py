"""Statistics of the evaluation layer checked against direct implementations on the same lake data: clustered
SE, pass@k, paired differences, Holm, pairing and the paired quantile bootstrap."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trajlake.evaluators.data import load
from trajlake.evaluators.metrics import METRICS, Settings, bootstrap_p_value, paired_quantile_difference
from trajlake.evaluators.report import evaluate

from tests.test_eval_sql import episode, read, write
from trajlake import Lake, LakeWriter, connect, open_lake
from trajlake.demo import write_demo

FAST = Settings(resamples=400, seed=7)


@pytest.fixture(scope="module")
def demo4(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    """Demo runs with 3 seeds on 12 tasks in two splits (pass@k up to k=3, several pairs per task)."""
    lk = open_lake(tmp_path_factory.mktemp("demo4") / "lake", create=True)
    with LakeWriter(lk, handle_signals=False) as w:
        write_demo(w, seeds=3, n_tasks=12)
    return lk


@pytest.fixture(scope="module")
def demo_report(demo4: Lake) -> Iterable[dict[str, Any]]:
    data = load(demo4)
    try:
        yield evaluate(data, baseline="demo-B0", candidate="demo-R1", settings=FAST)
    finally:
        data.close()


def _direct_clustered_se(values: list[float], clusters: list[str]) -> float:
    """SE = sqrt(C/(C-1) * sum_c (sum_{i in c}(x_ic - mean))^2) / n, written out with plain Python."""
    n = len(values)
    mean = sum(values) / n
    resid: dict[str, float] = defaultdict(float)
    for x, c in zip(values, clusters, strict=True):
        resid[c] += x - mean
    big_c = len(resid)
    return math.sqrt(big_c / (big_c - 1) * sum(r * r for r in resid.values())) / n


@pytest.mark.parametrize("metric,column", [("success", "success::INT"), ("steps", None),
                                           ("cost_usd", "cost_usd"), ("tokens_out", "tokens_out")])
def test_clustered_se_matches_direct_formula(demo4: Lake, demo_report: dict[str, Any], metric: str,
                                             column: str | None) -> None:
    con = connect(demo4)
    if column is None:  # steps: count the policy turns straight from the turns view
        q = ("SELECT e.task_id, count(t.turn_idx) FILTER (WHERE t.actor = 'policy') FROM episodes e "
             "LEFT JOIN turns t USING (episode_id) WHERE e.run_id = 'demo-B1' GROUP BY e.episode_id, e.task_id")
    else:
        q = f"SELECT task_id, {column} FROM episodes WHERE run_id = 'demo-B1'"
    got = con.execute(q).fetchall()
    values = [float(v) for _, v in got]
    clusters = [str(t) for t, _ in got]
    m = demo_report["runs"]["demo-B1"]["metrics"][metric]
    assert m["estimate"] == pytest.approx(sum(values) / len(values), rel=1e-12)
    assert m["se"] == pytest.approx(_direct_clustered_se(values, clusters), rel=1e-9)
    assert m["n"] == len(values) and m["n_clusters"] == len(set(clusters)) == 12
    # several seeds per task: the clustered SE is not the naive iid one
    naive = float(np.std(values, ddof=1) / math.sqrt(len(values)))
    assert m["se"] != pytest.approx(naive, rel=1e-3)
    assert m["ci_low"] < m["estimate"] < m["ci_high"]


def test_pass_at_k_matches_combinatorial_formula(demo4: Lake, demo_report: dict[str, Any]) -> None:
    con = connect(demo4)
    per_task = con.execute("SELECT task_id, count(*), sum(success::INT) FROM episodes WHERE run_id = 'demo-B0' "
                           "GROUP BY task_id").fetchall()
    metrics = demo_report["runs"]["demo-B0"]["metrics"]
    for k in (2, 3):
        at_k = [1 - math.comb(n - c, k) / math.comb(n, k) for _, n, c in per_task]
        hat_k = [math.comb(c, k) / math.comb(n, k) for _, n, c in per_task]
        assert metrics[f"pass@{k}"]["estimate"] == pytest.approx(sum(at_k) / len(at_k), rel=1e-12)
        assert metrics[f"pass^{k}"]["estimate"] == pytest.approx(sum(hat_k) / len(hat_k), rel=1e-12)
        assert metrics[f"pass@{k}"]["se"] == pytest.approx(np.std(at_k, ddof=1) / math.sqrt(len(at_k)), rel=1e-9)
    assert "pass@5" not in metrics  # only 3 samples per task


def test_contract_metrics_present_with_intervals(demo_report: dict[str, Any]) -> None:
    for run in ("demo-B0", "demo-R1"):
        m = demo_report["runs"][run]["metrics"]
        for spec in METRICS:
            assert spec.name in m
        for name in ("cost_per_success", "episode_latency_p50", "episode_latency_p99", "tool_latency_p50",
                     "tool_latency_p99"):
            assert m[name]["method"].startswith("cluster_bootstrap")
            assert m[name]["ci_low"] <= m[name]["estimate"] <= m[name]["ci_high"]
        assert m["episode_latency_p50"]["estimate"] <= m["episode_latency_p99"]["estimate"]


def test_paired_difference_sign_and_antisymmetry(demo4: Lake, demo_report: dict[str, Any]) -> None:
    cmp = demo_report["comparison"]
    b, c = demo_report["runs"]["demo-B0"]["metrics"], demo_report["runs"]["demo-R1"]["metrics"]
    assert cmp["n_pairs"] == 36 and cmp["n_tasks"] == 12
    # every episode is paired, so the paired mean difference is the difference of the run means
    for name in ("success", "steps", "cost_usd", "wall_seconds"):
        assert cmp["metrics"][name]["diff"] == pytest.approx(c[name]["estimate"] - b[name]["estimate"], abs=1e-12)
    assert cmp["metrics"]["success"]["diff"] > 0  # R1 is the stronger policy of the demo
    assert cmp["metrics"]["cost_per_success"]["diff"] == pytest.approx(
        c["cost_per_success"]["estimate"] - b["cost_per_success"]["estimate"], rel=1e-9)
    data = load(demo4, ["demo-B0", "demo-R1"])
    try:
        rev = evaluate(data, baseline="demo-R1", candidate="demo-B0", settings=FAST, breakdown=False,
                       taxonomy=False)["comparison"]
    finally:
        data.close()
    for name in ("success", "steps", "budgeted_success", "pass@2"):
        fwd, bwd = cmp["metrics"][name], rev["metrics"][name]
        assert bwd["diff"] == pytest.approx(-fwd["diff"], abs=1e-12)
        assert bwd["se"] == pytest.approx(fwd["se"], rel=1e-12)
        assert bwd["p_value"] == pytest.approx(fwd["p_value"], rel=1e-12)
    assert cmp["metrics"]["success"]["test"] == "mcnemar_exact_task_collapsed"  # 3 pairs per task


def test_holm_over_the_vector(demo_report: dict[str, Any]) -> None:
    # deprecated names are copies of their metric, not tests of their own (docs/names.md)
    m = {n: v for n, v in demo_report["comparison"]["metrics"].items() if "alias_of" not in v}
    # metrics equal in every pair cannot be rejected: outside the family, p_holm 1
    degenerate = [n for n in m if m[n]["diff"] == 0 and m[n]["se"] == 0]
    assert degenerate and all(m[n]["p_holm"] == 1.0 and not m[n]["holm_family"] for n in degenerate)
    names = [n for n in m if m[n]["p_value"] is not None and math.isfinite(m[n]["p_value"]) and n not in degenerate]
    assert all(m[n]["holm_family"] for n in names)
    p = np.array([m[n]["p_value"] for n in names])
    # direct step-down: sort, scale by (m - i), running max, cap at 1
    order = np.argsort(p, kind="stable")
    adj = np.empty_like(p)
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (len(p) - i) * p[j]))
        adj[j] = running
    for n, a in zip(names, adj, strict=True):
        assert m[n]["p_holm"] == pytest.approx(a, rel=1e-12)
        assert m[n]["p_holm"] >= m[n]["p_value"]
    nan_p = [n for n in m if not math.isfinite(m[n]["p_value"])]
    assert all(not math.isfinite(m[n]["p_holm"]) for n in nan_p)


def test_power_line(demo_report: dict[str, Any]) -> None:
    pw = demo_report["comparison"]["power"]
    se = demo_report["comparison"]["metrics"]["success"]["se"]
    assert pw["se"] == pytest.approx(se) and pw["n_tasks"] == 12
    assert pw["mdd"] == pytest.approx(2.8016 * se, rel=1e-3)
    assert pw["tasks_needed"] == math.ceil(12 * (2.8015852 * se / 0.05) ** 2 * (1 - 1e-12))


@pytest.fixture(scope="module")
def pairing_lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    lk = open_lake(tmp_path_factory.mktemp("pairs") / "lake", create=True)
    eps = []
    for t in ("t1", "t2", "t3"):
        for s in (0, 1):
            eps.append(episode(f"A-{t}-{s}", run="A", task=t, seed=s, steps=[read("a.py")] * (1 + s),
                               success=s == 0))
    for t in ("t1", "t2"):
        for s in (0, 1):
            eps.append(episode(f"B-{t}-{s}", run="B", task=t, seed=s, steps=[read("a.py")] * (2 + s)))
    eps.append(episode("B-t4-0", run="B", task="t4", seed=0, steps=[read("a.py")]))
    # key (t2, 1, 0) twice in B: ambiguous, dropped on both sides
    eps.append(episode("B-t2-1-dup", run="B", task="t2", seed=1, steps=[read("a.py")]))
    # a NULL seed pairs with a NULL seed
    eps.append(episode("A-t5-null", run="A", task="t5", seed=None, steps=[read("a.py")]))
    eps.append(episode("B-t5-null", run="B", task="t5", seed=None, steps=[read("a.py")] * 4))
    write(lk, eps)
    return lk


def test_pairs_and_dropped_counts(pairing_lake: Lake) -> None:
    data = load(pairing_lake)
    try:
        rep = evaluate(data, baseline="A", candidate="B", settings=FAST, breakdown=False, taxonomy=False)
    finally:
        data.close()
    cmp = rep["comparison"]
    # pairs: (t1,0), (t1,1), (t2,0), (t5,NULL); t2 seed 1 is ambiguous; t3 only in A; t4 only in B
    assert cmp["n_pairs"] == 4 and cmp["n_tasks"] == 3
    d = cmp["dropped"]
    assert d["baseline"] == {"run_id": "A", "total": 3, "unmatched": 2, "ambiguous": 1}
    assert d["candidate"] == {"run_id": "B", "total": 3, "unmatched": 1, "ambiguous": 2}
    reasons = {(e["task_id"], e["env_seed"], e["reason"]) for e in d["examples"]}
    assert ("t3", 0, "unmatched") in reasons and ("t4", 0, "unmatched") in reasons
    assert ("t2", 1, "ambiguous") in reasons
    # steps: A has 1 step for seed 0 and 2 for seed 1; B has 2, 3 and 4 (t5): diffs (1, 1, 1, 3)
    assert cmp["metrics"]["steps"]["diff"] == pytest.approx((1 + 1 + 1 + 3) / 4)
    assert cmp["metrics"]["steps"]["baseline"] == pytest.approx((1 + 2 + 1 + 1) / 4)
    # success: A fails seed 1, B succeeds everywhere -> +1 on (t1, 1): 1/4
    assert cmp["metrics"]["success"]["diff"] == pytest.approx(0.25)
    assert cmp["metrics"]["success"]["test"] == "mcnemar_exact_task_collapsed"


def test_paired_quantile_bootstrap_draws_the_same_tasks_in_both_arms() -> None:
    rng = np.random.default_rng(3)
    codes = np.repeat(np.arange(40), 25).astype(np.float64)
    values = rng.lognormal(0, 1, codes.shape[0]) * (1 + codes / 10)
    same = paired_quantile_difference(values, codes, values.copy(), codes.copy(), [0.5, 0.99], n_resamples=300,
                                      confidence=0.95, seed=11)
    for r in same:  # identical arms: every replicate difference is exactly 0
        assert (r["diff"], r["se"], r["ci_low"], r["ci_high"], r["p_value"]) == (0.0, 0.0, 0.0, 0.0, 1.0)
    shifted = paired_quantile_difference(values, codes, values + 5.0, codes.copy(), [0.5, 0.99], n_resamples=300,
                                         confidence=0.95, seed=11)
    for r in shifted:  # a constant shift moves every quantile, in every resample, by exactly 5
        assert r["diff"] == pytest.approx(5.0) and r["se"] == pytest.approx(0.0, abs=1e-9)
        assert r["ci_low"] == pytest.approx(5.0) and r["ci_high"] == pytest.approx(5.0)
        assert r["p_value"] < 0.01
    # rows are reordered and a task missing from one arm is dropped from both
    order = rng.permutation(codes.shape[0])
    keep = codes[order] != 0
    part = paired_quantile_difference(values, codes, values[order][keep], codes[order][keep], [0.5],
                                      n_resamples=300, confidence=0.95, seed=11)[0]
    assert part["n_clusters"] == 39


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_tasks_in_both_arms_equal_the_set_operations(dtype: type) -> None:
    # issue 28: the paired quantile bootstrap finds the tasks of both arms from one factorisation, not from
    # intersect1d / isin; rows kept and task count must be theirs exactly (also with NaN labels, which never match)
    from trajlake.evaluators.metrics import _in_both

    rng = np.random.default_rng(3)
    b = rng.integers(0, 50, 400).astype(dtype)
    c = rng.integers(30, 90, 300).astype(dtype)
    cases = [(b, c), (b[:0], c), (b, b[::-1])]
    if dtype is np.float64:
        cases += [(np.array([1.0, np.nan, 2.5]), np.array([np.nan, 2.5, 7.0])), (b + 0.5, c + 0.5)]
    for base, cand in cases:
        common = np.intersect1d(np.unique(base), np.unique(cand))
        mb, mc, n = _in_both(base, cand)
        np.testing.assert_array_equal(mb, np.isin(base, common))
        np.testing.assert_array_equal(mc, np.isin(cand, common))
        assert n == common.shape[0]


def test_bootstrap_p_value() -> None:
    assert bootstrap_p_value(np.zeros(99)) == 1.0
    assert bootstrap_p_value(np.ones(99)) == pytest.approx(2 / 100)
    assert math.isnan(bootstrap_p_value(np.array([np.nan, np.inf])))
    reps = np.concatenate([np.full(25, -1.0), np.full(74, 1.0)])
    assert bootstrap_p_value(reps) == pytest.approx(2 * 26 / 100)


def test_breakdown_by_split_and_env_version(demo_report: dict[str, Any]) -> None:
    rows = demo_report["breakdown"]
    keys = {(b["run_id"], b["split"], b["env_version"]) for b in rows}
    assert ("demo-B0", "train", "1.0") in keys and ("demo-R1", "dev", "1.0") in keys
    for run in ("demo-B0", "demo-B1", "demo-R1"):
        parts = [b for b in rows if b["run_id"] == run]
        assert sum(b["n_episodes"] for b in parts) == demo_report["runs"][run]["n_episodes"]
        total = sum(b["metrics"]["success"]["estimate"] * b["n_episodes"] for b in parts)
        assert total / demo_report["runs"][run]["n_episodes"] == pytest.approx(
            demo_report["runs"][run]["metrics"]["success"]["estimate"])


def test_reports_are_deterministic_given_the_seed(tmp_path: Path) -> None:
    lk = open_lake(tmp_path / "lake", create=True)
    write(lk, [episode(f"e{i}", task=f"t{i % 5}", seed=i, steps=[read("a.py", latency_ms=10.0 * (i + 1))] * (i % 3 + 1),
                       cost=0.01 * (i + 1), success=i % 2 == 0, wall=float(i + 1)) for i in range(20)])
    reps = []
    for _ in range(2):
        data = load(lk)
        try:
            reps.append(evaluate(data, settings=FAST, taxonomy=False))
        finally:
            data.close()
    a, b = (r["runs"]["run-A"]["metrics"] for r in reps)
    for name in ("cost_per_success", "episode_latency_p99", "tool_latency_p50"):
        assert (a[name]["ci_low"], a[name]["ci_high"]) == (b[name]["ci_low"], b[name]["ci_high"])


def test_a_slice_holding_its_whole_run_reports_the_run_vector(tmp_path: Path) -> None:
    """A run played on one split and env_version has one breakdown slice with every episode of the run: it
    reports the run's metric vector, intervals included (the same episodes, tool calls and tasks); a run split in
    two keeps a vector per part, bootstrapped on its own."""
    lk = open_lake(tmp_path / "lake", create=True)
    eps = [episode(f"a{i}", run="run-A", task=f"t{i % 12}", seed=i, steps=[read("a.py", latency_ms=5.0 * (i + 1))],
                   cost=0.01 * (i % 7 + 1), success=i % 3 == 0, wall=float(i % 5 + 1)) for i in range(48)]
    eps += [episode(f"b{i}", run="run-B", task=f"t{i % 12}", seed=i, steps=[read("a.py", latency_ms=3.0 * (i + 1))],
                    cost=0.01 * (i % 5 + 1), success=i % 2 == 0, wall=float(i % 4 + 1),
                    split="dev" if i < 24 else "test") for i in range(48)]
    write(lk, eps)
    data = load(lk)
    try:
        rep = evaluate(data, settings=FAST, taxonomy=False)
    finally:
        data.close()
    a_slices = [b for b in rep["breakdown"] if b["run_id"] == "run-A"]
    assert len(a_slices) == 1 and a_slices[0]["n_episodes"] == 48
    assert a_slices[0]["metrics"] == rep["runs"]["run-A"]["metrics"]
    assert a_slices[0]["metrics"] is not rep["runs"]["run-A"]["metrics"]
    b_slices = [b for b in rep["breakdown"] if b["run_id"] == "run-B"]
    assert [b["n_episodes"] for b in b_slices] == [24, 24]
    assert all(b["metrics"]["cost_usd"]["n"] == 24 != rep["runs"]["run-B"]["metrics"]["cost_usd"]["n"]
               for b in b_slices)


def test_the_taxonomy_runs_beside_the_statistics_and_its_errors_reach_the_caller(
        demo4: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure taxonomy runs in a thread while the statistics are computed: the report keeps its key order
    (taxonomy before comparison), and a failing taxonomy query still stops the report with its own error."""
    from trajlake.evaluators import report as report_module

    from trajlake.errors import QueryError

    data = load(demo4)
    try:
        rep = evaluate(data, baseline="demo-B0", candidate="demo-R1", settings=FAST)
        assert list(rep)[-3:] == ["distributions", "taxonomy", "comparison"]
        assert rep["taxonomy"]["demo-B0"]["counts"]

        def broken(_: Any) -> dict[str, Any]:
            raise QueryError("failure taxonomy (taxonomy.sql) failed: boom")

        monkeypatch.setattr(report_module, "_taxonomy", broken)
        with pytest.raises(QueryError, match="boom"):
            evaluate(data, baseline="demo-B0", candidate="demo-R1", settings=FAST)
    finally:
        data.close()
