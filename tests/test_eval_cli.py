"""``trajlake eval`` / ``trajlake diagnose`` end to end: the JSON contract, Markdown, self-contained HTML, --as-of
pinning, one-line errors, and the diagnosis branches on constructed lakes."""

from __future__ import annotations

import html as html_lib
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli as run
from tests.test_eval_sql import Step, episode, read, write
from trajlake import Lake, open_lake
from trajlake.cli import app
from trajlake.cli.eval_cmd import register

register(app)  # the CLI wiring of trajlake/cli/__init__.py, done here so the tests do not depend on it

CONTRACT = ("success", "steps", "cost_per_success", "recovery_rate", "episode_latency_p50", "episode_latency_p99",
            "tool_latency_p50", "tool_latency_p99", "duplicate_rate")
TABLES = {"episodes", "turns", "tasks", "runs", "gateway_events"}


def _num_or_null(v: Any) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v))


def test_register_is_idempotent() -> None:
    register(app)
    names = [c.name for c in app.registered_commands]
    assert names.count("eval") == 1 and names.count("diagnose") == 1


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("eval", "diagnose"):
        code, out, _ = run(capsys, cmd, "--help")
        assert code == 0 and "Usage" in out and "--as-of" in out


def test_json_contract(capsys: pytest.CaptureFixture[str], demo_lake: Lake) -> None:
    code, out, err = run(capsys, "--lake", str(demo_lake.root), "eval", "--baseline", "demo-B0", "--candidate",
                         "demo-R1", "--format", "json", "--resamples", "300")
    assert code == 0, err
    assert "NaN" not in out and "Infinity" not in out
    rep = json.loads(out)
    assert {"lake_versions", "runs", "comparison", "breakdown", "error_attribution", "taxonomy",
            "termination_reasons", "as_of", "settings"} <= set(rep)
    assert set(rep["lake_versions"]) == TABLES and all(isinstance(v, int) for v in rep["lake_versions"].values())
    assert rep["as_of"] == ",".join(f"{t}={v}" for t, v in sorted(rep["lake_versions"].items()))
    assert set(rep["runs"]) == {"demo-B0", "demo-R1"}  # a comparison evaluates only its two runs
    for r in rep["runs"].values():
        assert isinstance(r["n_episodes"], int) and r["n_episodes"] == 24
        for name in CONTRACT:
            m = r["metrics"][name]
            assert {"estimate", "ci_low", "ci_high", "se"} <= set(m)
            assert all(_num_or_null(m[k]) for k in ("estimate", "ci_low", "ci_high", "se"))
            assert isinstance(m["estimate"], float)
        # no injection exposure in the demo: undefined, written as null (valid JSON)
        assert r["metrics"]["injection_obedience_rate"]["estimate"] is None
    cmp = rep["comparison"]
    assert (cmp["baseline"], cmp["candidate"], cmp["n_pairs"]) == ("demo-B0", "demo-R1", 24)
    assert cmp["dropped"]["baseline"]["total"] == 0 and cmp["dropped"]["candidate"]["total"] == 0
    for name in CONTRACT:
        m = cmp["metrics"][name]
        assert {"diff", "se", "ci_low", "ci_high", "p_value", "p_holm"} <= set(m)
        assert all(_num_or_null(m[k]) for k in ("diff", "se", "ci_low", "ci_high", "p_value", "p_holm"))
    assert 0.0 <= cmp["metrics"]["success"]["p_holm"] <= 1.0
    assert isinstance(cmp["power"]["tasks_needed"], int) and cmp["power"]["target"] == 0.05
    assert {b["run_id"] for b in rep["breakdown"]} == {"demo-B0", "demo-R1"}
    assert set(rep["error_attribution"]["demo-B0"]["error_class"]) >= {
        "MODEL_INVALID_ACTION", "MODEL_BAD_PLAN", "ENV_TRANSIENT", "ENV_BUG", "SAFETY_BLOCK", "BUDGET_EXHAUSTED"}
    assert sum(rep["termination_reasons"]["demo-R1"].values()) == 24


def test_markdown_table_and_out_file(capsys: pytest.CaptureFixture[str], demo_lake: Lake, tmp_path: Path) -> None:
    lake = str(demo_lake.root)
    code, out, _ = run(capsys, "--lake", lake, "eval", "--run", "demo-B1", "-f", "markdown", "--resamples", "200")
    assert code == 0 and "## Metrics per run" in out and "| success |" in out and "--as-of episodes=" in out
    code, out, _ = run(capsys, "--lake", lake, "eval", "--run", "demo-B1", "--resamples", "200", "--no-breakdown",
                       "--no-taxonomy")
    assert code == 0 and "reproduce with: --run demo-B1 --as-of" in out and "cost_per_success" in out
    assert "--confidence 0.95" in out
    table = tmp_path / "new" / "r.txt"  # the terminal tables to a file (its folder is created)
    code, out, err = run(capsys, "--lake", lake, "eval", "--run", "demo-B1", "--resamples", "200", "--out",
                         str(table))
    assert code == 0 and out == "" and "wrote report" in err and "cost_per_success" in table.read_text()
    blocked = tmp_path / "file"
    blocked.write_text("")
    code, out, err = run(capsys, "--lake", lake, "eval", "--run", "demo-B1", "--resamples", "200", "--out",
                         str(blocked / "r.txt"))
    assert code == 1 and err.startswith("error: cannot write") and len(err.strip().splitlines()) == 1
    target = tmp_path / "r.json"
    code, out, err = run(capsys, "--lake", lake, "eval", "--run", "demo-B1", "-f", "json", "--out", str(target),
                         "--resamples", "200")
    assert code == 0 and out == "" and "wrote" in err
    assert json.loads(target.read_text())["runs"]["demo-B1"]["n_episodes"] == 24


def test_html_is_self_contained_with_svg_plots(capsys: pytest.CaptureFixture[str], demo_lake: Lake,
                                               tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    code, _, err = run(capsys, "--lake", str(demo_lake.root), "eval", "--baseline", "demo-B0", "--candidate",
                       "demo-B1", "-f", "html", "--out", str(target), "--resamples", "200")
    assert code == 0, err
    html = target.read_text()
    assert html.startswith("<!DOCTYPE html>") and "</html>" in html
    assert not re.search(r"(src|href)\s*=\s*[\"']?\s*(https?:)?//", html, re.I)
    assert "<script" not in html.lower() and "<link" not in html.lower() and "@import" not in html
    svgs = re.findall(r"<svg\b.*?</svg>", html, re.S)
    assert len(svgs) == 5  # Pareto, metric vector, comparison, episode and tool latency CDFs
    titles = [re.search(r"<title>(.*?)</title>", s).group(1) for s in svgs]  # type: ignore[union-attr]
    assert titles[0].startswith("Success vs cost") and "CDF" in titles[3] and "CDF" in titles[4]
    for s in svgs:  # every mark lies on the canvas
        w, h = (float(x) for x in re.search(r'viewBox="0 0 (\d+) (\d+)"', s).groups())  # type: ignore[union-attr]
        for cx, cy in re.findall(r'<circle cx="([-\d.]+)" cy="([-\d.]+)"', s):
            assert 0 <= float(cx) <= w and 0 <= float(cy) <= h
    for s in svgs[1:3]:  # the interval plots: the numbers at the right fit (~6.5 px a character)
        w = float(re.search(r'viewBox="0 0 (\d+) ', s).group(1))  # type: ignore[union-attr]
        for x, text in re.findall(r'<text x="([-\d.]+)" y="[-\d.]+" text-anchor="start"[^>]*>([^<]*)</text>', s):
            assert float(x) + 6.5 * len(html_lib.unescape(text)) <= w + 1, text
    assert "demo-B0" in svgs[0] and "frontier" in svgs[0]
    assert "polyline" in svgs[3]  # the CDF steps
    assert "episodes=" in html  # the versions read


def test_html_default_path(capsys: pytest.CaptureFixture[str], demo_lake: Lake, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "--lake", str(demo_lake.root), "eval", "--run", "demo-R1", "-f", "html",
                       "--resamples", "100", "--no-breakdown")
    assert code == 0, err
    assert (tmp_path / "trajlake-report.html").read_text().count("<svg") == 4


def test_as_of_pins_the_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lk = open_lake(tmp_path / "lake", create=True)
    write(lk, [episode(f"a{i}", task=f"t{i}", steps=[read("a.py")]) for i in range(4)])
    pins = lk.versions()
    write(lk, [episode(f"b{i}", task=f"t{i}", seed=1, success=False, steps=[read("a.py")] * 3) for i in range(4)])
    pin_arg = ",".join(f"{t}={v}" for t, v in pins.items())
    code, out, err = run(capsys, "--lake", str(lk.root), "eval", "-f", "json", "--as-of", pin_arg,
                         "--resamples", "100")
    assert code == 0, err
    old = json.loads(out)
    assert old["lake_versions"] == pins and old["runs"]["run-A"]["n_episodes"] == 4
    assert old["runs"]["run-A"]["metrics"]["success"]["estimate"] == 1.0
    code, out, _ = run(capsys, "--lake", str(lk.root), "eval", "-f", "json", "--resamples", "100")
    new = json.loads(out)
    assert new["runs"]["run-A"]["n_episodes"] == 8 and new["runs"]["run-A"]["metrics"]["success"]["estimate"] == 0.5
    # the printed pins reproduce the pinned report
    code, out, _ = run(capsys, "--lake", str(lk.root), "eval", "-f", "json", "--as-of", old["as_of"],
                       "--resamples", "100")
    again = json.loads(out)
    assert again["runs"] == old["runs"] and again["lake_versions"] == old["lake_versions"]


@pytest.mark.parametrize("args,message", [
    (("eval", "--run", "nope"), "error: unknown run id(s): nope; the lake has runs demo-B0, demo-B1, demo-R1"),
    (("eval", "--baseline", "demo-B0"), "error: --baseline and --candidate go together"),
    (("eval", "--baseline", "demo-B0", "--candidate", "missing"), "error: unknown run id(s): missing"),
    (("diagnose", "--baseline", "demo-B0", "--candidate", "demo-B0"), "error: --baseline and --candidate must be"),
    (("eval", "--as-of", "episodes=999"), "error: --as-of: episodes has versions"),
])
def test_errors_are_one_line(capsys: pytest.CaptureFixture[str], demo_lake: Lake, args: tuple[str, ...],
                             message: str) -> None:
    code, out, err = run(capsys, "--lake", str(demo_lake.root), *args)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith(message)


# ------------------------------------------------------------------------------------------------ diagnose

N_TASKS = 20
N_FAIL = 12


def _tested() -> list[Step]:
    return [read("src/a.py"), Step("edit", {"path": "src/a.py"}, state="s1"), Step("run_tests", {}, state="s1")]


def _run(run: str, *, fail: dict[str, Any] | None = None, fail_steps: list[Step] | None = None,
         **common: Any) -> list[Any]:
    eps = []
    for i in range(N_TASKS):
        kw = dict(common)
        steps = _tested()
        if fail is not None and i < N_FAIL:
            kw.update({"success": False, **fail})
            steps = fail_steps if fail_steps is not None else steps
        eps.append(episode(f"{run}-{i:02d}", run=run, task=f"t{i:02d}", steps=steps, **kw))
    return eps


@pytest.fixture(scope="module")
def diag_lake(tmp_path_factory: pytest.TempPathFactory) -> Lake:
    lk = open_lake(tmp_path_factory.mktemp("diag") / "lake", create=True)
    bad_plan = {"error_class": "MODEL_BAD_PLAN"}
    transient = [read("src/a.py", status="ENV_TRANSIENT", fault="transient")]
    eps = (
        _run("base") + _run("same")
        + _run("cand_env", fail={"error_class": "ENV_TRANSIENT", "reason": "env_failure"}, fail_steps=transient)
        + _run("cand_v2", fail=bad_plan, env_version="2", digest="sha256:env2")
        + _run("cand_v3", fail=bad_plan, env_version="3", digest="sha256:env3")
        + _run("oracle_v1") + _run("oracle_v2", fail=bad_plan, env_version="2", digest="sha256:env2")
        + _run("cand_schema", fail={"error_class": "MODEL_INVALID_ACTION"},
               fail_steps=[Step("edit", "{oops", policy_status="MODEL_INVALID_ACTION"), *_tested()])
        + _run("cand_loop", fail=bad_plan, fail_steps=[read("src/a.py")] * 8)
        + _run("cand_switch", fail=bad_plan, policy_end="p2")
        + _run("cand_reward", fail={**bad_plan, "reward": {"resolved": 0.0, "style": 0.2}})
        + _run("cand_plan", fail=bad_plan)
        # the gateway denied an out-of-workspace edit in every failing episode
        + _run("cand_denied", fail=bad_plan, fail_steps=[
            Step("edit", {"path": "/etc/passwd"}, decision="deny", executed=False, reason="path outside workspace"),
            *_tested()])
        # the same steps, but a tool call took 9 s: only the tool-latency tail rose
        + _run("cand_slow", fail=bad_plan, fail_steps=[read("src/a.py", latency_ms=9000.0), *_tested()[1:]])
    )
    runs = [{"run_id": r, "policy_name": "oracle" if r.startswith("oracle") else "agent"}
            for r in sorted({e[0]["run_id"] for e in eps})]
    write(lk, eps, runs=runs)
    return lk


@pytest.mark.parametrize("candidate,diagnosis,last_node", [
    ("same", "no_drop", "success_drop"),
    ("cand_env", "environment_failures", "env_failures"),
    ("cand_v2", "environment_regression", "oracle_suite"),
    ("cand_v3", "distribution_shift", "distribution"),
    ("cand_schema", "policy_action_errors", "model_errors"),
    ("cand_loop", "policy_behaviour", "behaviour"),
    ("cand_switch", "version_switch", "version_switch"),
    ("cand_reward", "reward_drift", "reward_drift"),
    ("cand_plan", "unexplained", "contamination"),
    ("cand_denied", "policy_action_errors", "model_errors"),
    ("cand_slow", "policy_behaviour", "behaviour"),
])
def test_diagnose_branches(capsys: pytest.CaptureFixture[str], diag_lake: Lake, candidate: str, diagnosis: str,
                           last_node: str) -> None:
    code, out, err = run(capsys, "--lake", str(diag_lake.root), "diagnose", "--baseline", "base", "--candidate",
                         candidate, "-f", "json", "--resamples", "300")
    assert code == 0, err
    d = json.loads(out)
    assert d["diagnosis"] == diagnosis
    nodes = [n["node"] for n in d["path"]]
    assert nodes[-1] == last_node
    results = {n["node"]: n["result"] for n in d["path"]}
    if diagnosis != "no_drop":
        s = d["path"][0]["tests"][0]
        assert results["success_drop"] == "yes" and s["diff"] == pytest.approx(-N_FAIL / N_TASKS)
        assert s["p_value"] == pytest.approx(2 * 0.5**N_FAIL)  # McNemar exact, one pair per task
    if candidate == "cand_v3":
        assert results["oracle_suite"] == "not_checkable"
        assert "could not be checked" in d["path"][1]["evidence"][0]
        assert any("env_version: 1 -> 3" in e for e in d["path"][2]["evidence"])
    if candidate == "cand_v2":
        t = d["path"][1]["tests"][0]
        assert t["diff"] == pytest.approx(-N_FAIL / N_TASKS) and t["n_pairs"] == N_TASKS
    if last_node in ("env_failures", "model_errors", "behaviour", "version_switch", "reward_drift", "contamination"):
        assert results["oracle_suite"] == "not_applicable" and results["distribution"] == "no"
    if candidate == "cand_env":
        t = d["path"][3]["tests"][0]
        assert t["name"] == "had_env_transient" and t["diff"] == pytest.approx(N_FAIL / N_TASKS)
    if candidate == "cand_denied":  # fired by the safety blocks, not by schema errors
        fired = {t["name"] for t in d["path"][-1]["tests"] if t.get("p_holm", 1.0) < 0.05}
        assert any("safety" in n for n in fired) and not any("invalid" in n for n in fired), fired
    if candidate == "cand_slow":  # fired by the tool-call P99 alone
        fired = {t["name"] for t in d["path"][-1]["tests"] if t.get("p_holm", 1.0) < 0.05}
        assert fired == {"tool_latency_p99"}, fired
    if candidate == "cand_switch":  # the node was called policy_lag: its entry says so (docs/names.md)
        node = d["path"][-1]
        assert node["formerly"] == "policy_lag" and node["tests"][0]["name"] == "version_switched"
        assert node["tests"][0]["diff"] == pytest.approx(1.0)  # every candidate episode switched, no baseline one
    if candidate == "cand_plan":
        assert d["path"][-1]["result"] == "not_checkable"
        assert all(results[n] == "no" for n in ("env_failures", "model_errors", "behaviour", "version_switch",
                                                 "reward_drift"))


def test_diagnose_table_output(capsys: pytest.CaptureFixture[str], diag_lake: Lake) -> None:
    code, out, _ = run(capsys, "--lake", str(diag_lake.root), "diagnose", "--baseline", "base", "--candidate",
                       "cand_env", "--resamples", "200")
    assert code == 0
    assert "1. [YES] Did success drop" in out and "diagnosis: environment_failures" in out
    assert "reproduce with: --as-of" in out and "p_holm" in out
    code, out, _ = run(capsys, "--lake", str(diag_lake.root), "diagnose", "--baseline", "base", "--candidate",
                       "cand_env", "--resamples", "200", "-f", "markdown")
    assert code == 0 and "**Diagnosis: `environment_failures`**" in out


def test_empty_lake_and_run_without_episodes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lk = open_lake(tmp_path / "lake", create=True)
    code, out, _ = run(capsys, "--lake", str(lk.root), "eval", "-f", "json", "--resamples", "50")
    assert code == 0 and json.loads(out)["runs"] == {}
    code, out, _ = run(capsys, "--lake", str(lk.root), "eval", "--resamples", "50")
    assert code == 0 and "no runs" in out
    write(lk, [episode("e1", run="R1", steps=[read("a.py")])], runs=[{"run_id": "R0"}, {"run_id": "R1"}])
    code, out, err = run(capsys, "--lake", str(lk.root), "eval", "--baseline", "R0", "--candidate", "R1", "-f",
                         "json", "--resamples", "50")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["runs"]["R0"]["n_episodes"] == 0 and rep["runs"]["R0"]["metrics"]["success"]["estimate"] is None
    assert rep["comparison"]["n_pairs"] == 0 and rep["comparison"]["dropped"]["candidate"]["unmatched"] == 1
    assert rep["comparison"]["metrics"]["success"]["diff"] is None


def test_a_drifted_replay_suite_answers_the_first_node(diag_lake: Lake) -> None:
    """`diagnose --suite NAME` replays a pinned suite first: a drifted episode means the environment answers the
    same actions differently now, so the drop is the environment's (even where the versions say nothing); a suite
    that replays cleanly leaves the walk as it was."""
    from trajlake.evaluators.diagnose import diagnose

    suite = {"name": "pinned", "source": "run oracle_v1", "as_of": "episodes=1", "episodes": 5, "drifted": ["e1"]}
    d = diagnose(diag_lake, "base", "cand_plan", replay_suite=suite)
    assert d["diagnosis"] == "environment_regression" and d["path"][1]["node"] == "oracle_suite"
    assert d["path"][1]["result"] == "yes" and "1 of 5 episode(s) drifted" in d["path"][1]["evidence"][0]
    clean = diagnose(diag_lake, "base", "cand_plan", replay_suite={**suite, "drifted": []})
    assert clean["diagnosis"] == "unexplained"
    assert "0 of 5 episode(s) drifted" in clean["path"][1]["evidence"][0]
    assert clean["path"][1]["result"] == "not_applicable"  # same env versions, nothing drifted
