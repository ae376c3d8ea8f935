"""Mini SWE task set: invariants of tasks.json, workspaces, SWE-bench style grading and error handling."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from trajlake.envs import make_env, make_policy, task_view_fn
from trajlake.envs.mini_swe.build import check_tasks, main, split_for_family, task_version
from trajlake.envs.mini_swe.grading import (
    PASSING,
    apply_fix,
    apply_mutation,
    grade,
    load_tasks,
    materialize_workspace,
)
from trajlake.envs.mini_swe.library import (
    filter_test_source,
    find_test_functions,
    function_key,
    list_libraries,
    load_library,
    parse_python,
)
from trajlake.envs.mini_swe.mutate import MUTATORS, mutate_library
from trajlake.envs.mini_swe.patching import PatchError, apply_diff, make_diff, parse_patch, reverse_diff
from trajlake.envs.mini_swe.sandbox import bwrap_available

from trajlake.rollout.runner import play_episode

TASKS = load_tasks()
BY_ID = {t["task_id"]: t for t in TASKS}
REQUIRED = {
    "task_id", "task_version", "env_id", "split", "family", "difficulty", "statement", "provenance",
    "has_oracle", "budget", "library", "file", "function", "mutation_diff", "fix_diff", "FAIL_TO_PASS",
    "PASS_TO_PASS", "visible_tests",
}


def _one_per_library() -> list[str]:
    """The first task of each library."""
    seen: dict[str, str] = {}
    for t in TASKS:
        seen.setdefault(t["library"], t["task_id"])
    return sorted(seen.values())


def _changed_lines(diff: str) -> list[str]:
    return [
        line[1:].strip()
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---")) and len(line[1:].strip()) >= 6
    ]


def _all_test_names(library: str) -> set[str]:
    lib = load_library(library)
    names: set[str] = set()
    for rel in lib.test_files():
        names.update(key.rsplit("::", 1)[-1] for key in find_test_functions(lib.read(rel), rel))
    return names


# ------------------------------------------------------------------------------------- (a) invariants
def test_task_counts_and_libraries() -> None:
    assert len(TASKS) >= 40
    libraries = Counter(t["library"] for t in TASKS)
    assert len(libraries) >= 4
    assert set(libraries) <= set(list_libraries())
    assert len(BY_ID) == len(TASKS), "duplicate task ids"
    for t in TASKS:
        prov = t["provenance"]
        assert t["task_id"] == f"mini-swe/{t['library']}/{prov['mutator']}/{prov['seed']}"
        assert prov["mutator"] in MUTATORS


def test_splits_are_by_family() -> None:
    splits_of: dict[str, set[str]] = defaultdict(set)
    for t in TASKS:
        assert t["family"] == f"{t['library']}/{t['provenance']['mutator']}"
        assert t["split"] == split_for_family(t["family"])
        splits_of[t["family"]].add(t["split"])
    assert all(len(s) == 1 for s in splits_of.values()), "a family crosses splits"
    per_split = Counter(t["split"] for t in TASKS)
    assert set(per_split) == {"train", "dev", "hidden"}
    assert per_split["dev"] >= 8
    assert per_split["hidden"] >= 8


def test_records_have_required_fields() -> None:
    for t in TASKS:
        assert set(t) >= REQUIRED, t["task_id"]
        assert t["env_id"] == "mini-swe"
        assert t["has_oracle"] is True
        assert t["difficulty"] in ("easy", "medium", "hard")
        assert set(t["provenance"]) == {"generator", "source", "commit", "mutator", "seed", "diff_hash"}
        assert t["provenance"]["generator"] == "trajlake.envs.mini_swe.build"
        assert t["provenance"]["source"] == t["library"]
        assert set(t["budget"]) == {"max_steps", "max_tokens", "max_cost"}
        assert t["file"].startswith("src/") and t["file"].endswith(".py")


def test_task_version_matches_content() -> None:
    for t in TASKS:
        assert re.fullmatch(r"[0-9a-f]{16}", t["task_version"])
        assert t["task_version"] == task_version(t), t["task_id"]


def test_provenance_hashes() -> None:
    commits = {name: load_library(name).commit() for name in list_libraries()}
    for t in TASKS:
        assert t["provenance"]["commit"] == commits[t["library"]], f"{t['task_id']}: library changed"
        assert t["provenance"]["diff_hash"] == hashlib.sha256(t["mutation_diff"].encode()).hexdigest()


def test_fail_to_pass_and_pass_to_pass() -> None:
    for t in TASKS:
        f2p, p2p, visible = set(t["FAIL_TO_PASS"]), set(t["PASS_TO_PASS"]), set(t["visible_tests"])
        assert f2p and p2p, t["task_id"]
        assert not f2p & p2p
        assert visible and visible <= p2p, t["task_id"]
        hidden_functions = {function_key(n) for n in f2p}
        assert not {function_key(n) for n in visible} & hidden_functions
        assert t["FAIL_TO_PASS"] == sorted(f2p) and t["PASS_TO_PASS"] == sorted(p2p)


def test_statements_do_not_leak_tests_or_patch() -> None:
    names = {lib: _all_test_names(lib) for lib in list_libraries()}
    for t in TASKS:
        statement = t["statement"]
        assert len(statement) > 80
        assert "test_" not in statement, t["task_id"]
        for name in names[t["library"]]:
            assert name not in statement, (t["task_id"], name)
        for line in _changed_lines(t["mutation_diff"]):
            assert line not in statement, (t["task_id"], line)
        assert "@@" not in statement and t["mutation"]["description"] not in statement


def test_diffs_round_trip_and_fix_is_reverse() -> None:
    for t in TASKS:
        clean = load_library(t["library"]).read(t["file"])
        mutated = apply_diff(clean, t["mutation_diff"])
        assert mutated != clean
        assert apply_diff(mutated, t["fix_diff"]) == clean
        assert t["fix_diff"] == reverse_diff(t["mutation_diff"])
        compile(mutated, t["file"], "exec")


@pytest.mark.parametrize("task_id", [TASKS[0]["task_id"], TASKS[len(TASKS) // 2]["task_id"], TASKS[-1]["task_id"]])
def test_mutation_is_deterministic(task_id: str) -> None:
    t = BY_ID[task_id]
    prov = t["provenance"]
    library = load_library(t["library"])
    first = mutate_library(library, prov["mutator"], prov["seed"])
    second = mutate_library(library, prov["mutator"], prov["seed"])
    assert first is not None and second is not None
    assert first.diff == second.diff == t["mutation_diff"]


def test_patching_handles_offsets_and_mismatches() -> None:
    old = "".join(f"line {i}\n" for i in range(20))
    new = old.replace("line 10\n", "line ten\n")
    diff = make_diff(old, new, "src/x.py")
    assert apply_diff(old, diff) == new
    shifted = "header\nheader\n" + old
    assert apply_diff(shifted, diff) == "header\nheader\n" + new
    assert apply_diff(new, reverse_diff(diff)) == old
    with pytest.raises(PatchError):
        apply_diff(old.replace("line 9\n", "changed\n"), diff)


def test_filter_test_source_keeps_only_listed_functions() -> None:
    source = "import x\n\n\ndef test_a():\n    pass\n\n\n@mark\ndef test_b():\n    pass\n\n\ndef helper():\n    pass\n"
    out = filter_test_source(source, "tests/t.py", {"tests/t.py::test_a"})
    assert "def test_a" in out and "test_b" not in out and "@mark" not in out and "def helper" in out


# --------------------------------------------------------------------------------- workspaces & grading
def test_workspace_contains_mutated_source_and_visible_tests_only(tmp_path: Path) -> None:
    t = TASKS[0]
    ws = materialize_workspace(t, tmp_path / "ws")
    library = load_library(t["library"])
    assert (ws / "pytest.ini").is_file()
    assert (ws / t["file"]).read_text() == apply_diff(library.read(t["file"]), t["mutation_diff"])
    present: set[str] = set()
    for path in sorted((ws / "tests").glob("test_*.py")):
        rel = path.relative_to(ws).as_posix()
        present.update(find_test_functions(path.read_text(), rel))
    assert present == {function_key(n) for n in t["visible_tests"]}
    with pytest.raises(FileExistsError):
        materialize_workspace(t, ws)


@pytest.mark.parametrize("task_id", _one_per_library())
def test_mutated_workspace_fails_and_oracle_fix_resolves(tmp_path: Path, task_id: str) -> None:
    t = BY_ID[task_id]
    ws = materialize_workspace(t, tmp_path / "ws")
    before = grade(ws, t)
    assert before.error is None, before.output_tail
    assert not before.resolved
    assert before.partial == 0.0
    assert all(o not in PASSING for o in before.fail_to_pass.values())
    assert all(o in PASSING for o in before.pass_to_pass.values())
    assert not (ws / "tests" / "hidden").exists()
    apply_fix(ws, t)
    after = grade(ws, t)
    assert after.resolved, after.output_tail
    assert after.partial == 1.0
    assert after.error is None and after.exit_code == 0
    assert after.sandbox in ("bwrap", "rlimit")
    with pytest.raises(PatchError):
        apply_fix(ws, t)  # already fixed: the reverse patch no longer applies


def test_agent_test_edits_do_not_matter(tmp_path: Path) -> None:
    t = TASKS[0]
    ws = materialize_workspace(t, tmp_path / "ws")
    for path in (ws / "tests").glob("*.py"):
        path.write_text("def test_nothing():\n    pass\n")
    (ws / "conftest.py").write_text("collect_ignore_glob = ['*']\n")
    (ws / "src" / "conftest.py").write_text("raise SystemExit(0)\n")
    (ws / "pytest.ini").write_text("[pytest]\naddopts = --collect-only\n")
    result = grade(ws, t)
    assert not result.resolved
    assert result.error is None
    assert set(result.outcomes) == set(t["FAIL_TO_PASS"]) | set(t["PASS_TO_PASS"])


def test_syntax_error_is_an_error_never_a_pass(tmp_path: Path) -> None:
    t = TASKS[0]
    ws = materialize_workspace(t, tmp_path / "ws", mutated=False)
    target = ws / t["file"]
    target.write_text(target.read_text() + "\ndef broken(:\n")
    result = grade(ws, t)
    assert not result.resolved
    assert result.partial == 0.0
    assert result.error is not None and "collection" in result.error


def test_missing_source_is_an_error(tmp_path: Path) -> None:
    t = TASKS[0]
    ws = materialize_workspace(t, tmp_path / "ws")
    (ws / t["file"]).unlink()
    result = grade(ws, t)
    assert not result.resolved and result.error is not None


@pytest.mark.slow
def test_timeout_is_an_error(tmp_path: Path) -> None:
    t = TASKS[0]
    ws = materialize_workspace(t, tmp_path / "ws", mutated=False)
    target = ws / t["file"]
    target.write_text(target.read_text() + "\nimport time\nwhile True:\n    time.sleep(0.1)\n")
    start = time.monotonic()
    result = grade(ws, t, timeout_s=3)
    assert time.monotonic() - start < 30
    assert result.timed_out and not result.resolved and result.partial == 0.0
    assert result.error is not None and "timed out" in result.error


def test_clean_workspace_resolves_in_rlimit_sandbox(tmp_path: Path) -> None:
    t = TASKS[-1]
    ws = materialize_workspace(t, tmp_path / "ws", mutated=False)
    result = grade(ws, t, sandbox="rlimit")
    assert result.sandbox == "rlimit"
    assert result.resolved and result.partial == 1.0


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not installed or does not work here")
def test_bwrap_sandbox_blocks_writes_outside_the_workspace(tmp_path: Path) -> None:
    t = TASKS[-1]
    ws = materialize_workspace(t, tmp_path / "ws", mutated=False)
    outside = tmp_path / "outside.txt"
    target = ws / t["file"]
    target.write_text(
        target.read_text() + f"\ntry:\n    open({str(outside)!r}, 'w').write('x')\nexcept OSError:\n    pass\n"
    )
    result = grade(ws, t, sandbox="bwrap")
    assert result.sandbox == "bwrap"
    assert result.resolved
    assert not outside.exists()


def test_apply_mutation_then_fix_restores_clean_source(tmp_path: Path) -> None:
    t = TASKS[1]
    ws = materialize_workspace(t, tmp_path / "ws", mutated=False)
    clean = (ws / t["file"]).read_text()
    apply_mutation(ws, t)
    assert (ws / t["file"]).read_text() != clean
    apply_fix(ws, t)
    assert (ws / t["file"]).read_text() == clean


def test_check_detects_a_tampered_task(tmp_path: Path) -> None:
    good = dict(TASKS[0])
    bad = dict(TASKS[1], PASS_TO_PASS=TASKS[1]["PASS_TO_PASS"][1:])
    bad["task_version"] = task_version(bad)
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps({"tasks": [good, bad]}))
    problems = check_tasks(path, runs=1, log=lambda _: None)
    assert len(problems) == 1 and problems[0].startswith(bad["task_id"])
    assert "PASS_TO_PASS" in problems[0]
    assert main(["--check", "--out", str(path), "--runs", "1", "--quiet"]) == 1


# ------------------------------------------------------------------------------------ (d) everything
def _mutated_problem(task: dict[str, Any], root: Path) -> str | None:
    """What is wrong with the task's mutated workspace, graded directly: it must fail a FAIL_TO_PASS test and
    pass every PASS_TO_PASS test."""
    ws = materialize_workspace(task, root / task["task_id"].replace("/", "__"))
    before = grade(ws, task)
    if before.error or before.resolved or any(o in PASSING for o in before.fail_to_pass.values()):
        return f"{task['task_id']}: mutated workspace graded {before.resolved=} {before.error=}"
    if any(o not in PASSING for o in before.pass_to_pass.values()):
        return f"{task['task_id']}: a PASS_TO_PASS test fails on the mutated workspace"
    return None


def _oracle_problem(env: Any, oracle: Any, view: Any, task: dict[str, Any], lines: Counter[str]) -> str | None:
    """What is wrong with the oracle's episode on the task, played through the env (reset, the oracle's tool
    calls, submit, graded in a sandbox): it must resolve it (a task whose oracle fails would be ENV_BUG and must
    not ship), each of its edits minimal-span (a part of its hunk of the fix, never more lines; ``lines`` counts
    the hunks' and the edits' lines)."""
    rec = play_episode(env, oracle, run_id="all", task_id=task["task_id"], task_version=task["task_version"],
                       seed=0, task_view=view)
    ep = rec.episode
    hunks = [(fp.path, h) for fp in parse_patch(task["fix_diff"]) for h in fp.hunks]
    calls = [json.loads(t["raw_content"]) for t in rec.turns if t["actor"] == "policy"]
    edits = [c["args"] for c in calls if c["tool"] == "edit"]
    if len(edits) != len(hunks):
        return f"{task['task_id']}: {len(edits)} edit(s) for {len(hunks)} hunk(s)"
    for args, (path, h) in zip(edits, hunks, strict=True):
        old, new = "".join(h.old_lines), "".join(h.new_lines)
        if args["path"] != path or args["old"] not in old or args["new"] not in new or \
                args["old"].count("\n") > len(h.old_lines):
            return f"{task['task_id']}: edit {args} is not a part of its hunk {old!r} -> {new!r}"
        lines["hunks"] += len(h.old_lines) + len(h.new_lines)
        lines["edits"] += args["old"].count("\n") + args["new"].count("\n")
    if (ep["success"] and ep["error_class"] is None and ep["terminated"] and ep["termination_reason"] == "success"
            and ep["reward_components"]["resolved"] == 1.0 and ep["sandbox"] in ("bwrap", "rlimit")):
        return None
    return (f"{task['task_id']}: oracle episode success={ep['success']} error={ep['error_class']} "
            f"reason={ep['termination_reason']} sandbox={ep['sandbox']}")


@pytest.mark.slow
def test_every_task_fails_mutated_and_resolves_with_oracle(tmp_path: Path) -> None:
    """Every shipped task: the mutated workspace fails as its task says, and the oracle policy resolves it through
    the env. (One test for both: each grades every task, which is most of the suite's env time.)"""

    def check_share(share: int) -> tuple[int, list[str], Counter[str]]:
        # each thread its own env (an env plays one episode at a time); the time goes to the graders' pytest
        # processes, so two shares use both cores
        env = make_env("mini-swe", split=None)
        try:
            oracle = make_policy("mini-swe", "oracle", "oracle-v1")
            view = task_view_fn(env, oracle=True)
            assert sorted(t["task_id"] for t in env.tasks) == sorted(BY_ID)
            problems, lines = [], Counter[str]()
            for task in TASKS[share::2]:
                problems += [p for p in (_mutated_problem(task, tmp_path),
                                         _oracle_problem(env, oracle, view, task, lines)) if p]
            return len(env.tasks), problems, lines
        finally:
            env.close()

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        (n_tasks, even, lines), (_, odd, odd_lines) = pool.map(check_share, (0, 1))
    lines += odd_lines
    print(f"checked {n_tasks} tasks in {time.monotonic() - start:.1f}s")
    assert n_tasks == len(TASKS) == 80
    assert not even + odd, "\n".join(even + odd)
    # minimal-span: the oracle's edits hold well under half the lines of the fix's hunks (each with its context)
    assert lines["edits"] < lines["hunks"] / 2, lines


@pytest.mark.slow
def test_parse_python_is_safe_from_many_threads() -> None:
    # CPython 3.11's ast.parse fails under this load with "AST constructor recursion depth mismatch"
    # (gh-106905; it broke a CI run of check_tasks). The collector and a tiny switch interval make thread switches
    # happen inside the AST conversion, which reproduced the failure every time with plain ast.parse (5 of 5 runs
    # with 2 parses per thread, in about a second; the test makes 8).
    import gc
    import sys

    source = (Path(mutate_library.__code__.co_filename)).read_text()

    class Finaliser:
        def __del__(self) -> None:
            time.sleep(0)

    def work(_: int) -> int:
        for _ in range(8):
            junk = [Finaliser() for _ in range(50)]
            for j in junk:
                j.self = j  # type: ignore[attr-defined]  # a cycle, so the collector runs the finalisers
            del junk
            parse_python(source)
        return 1

    old_interval, old_threshold = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(50, 1, 1)
    try:
        with ThreadPoolExecutor(8) as pool:
            assert sum(pool.map(work, range(16))) == 16
    finally:
        sys.setswitchinterval(old_interval)
        gc.set_threshold(*old_threshold)
