"""Contamination scan: planted contamination is found, clean data gives no flags (issue 14)."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from trajlake.envs import registry
from trajlake.envs.core import Env
from trajlake.evaluators import contamination as cm
from trajlake.evaluators.contamination import EvalDocument, ScanSettings, code_tokens, scan

from tests.conftest import run_cli
from trajlake import LakeWriter, open_lake
from trajlake.errors import TrajlakeError

BOILERPLATE = ("Find and fix the cause. The public API must stay the same; you can run the visible tests with "
               "`python -m pytest -q`, though they may not cover this case.")
LATE = dt.datetime(2026, 9, 1, tzinfo=dt.UTC)
EARLY = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
                    for _ in range(n))


def _statement(name: str, rng: random.Random) -> str:
    return (f"Bug report for `{name}` (`src/{name}.py`): `{name}_parse` {_words(rng, 40)}. The documentation "
            f"says: \"{_words(rng, 20)}\"\n\n{BOILERPLATE}")


def _gold(name: str) -> str:
    rng = random.Random(name)  # per-task constants: the tasks' fixes differ in more than their names
    limits = ", ".join(str(rng.randint(100, 999)) for _ in range(11))
    return (f"def {name}_parse(text_value, base_count):\n    total_sum = base_count\n    limits = [{limits}]\n"
            f"    for item_value in text_value.split(','):\n        total_sum = total_sum + int(item_value)\n"
            f"    return total_sum if total_sum in limits else -total_sum\n")


def _task(tid: str, split: str, family: str, statement: str, created: dt.datetime, commit: str) -> dict[str, Any]:
    return {"task_id": tid, "task_version": "v1", "env_id": "test-env", "split": split, "family": family,
            "difficulty": "easy", "created_at": created, "statement": statement,
            "provenance": {"generator": "test", "source": "repo", "commit": commit, "mutator": None, "seed": 0,
                           "diff_hash": None},
            "has_oracle": True, "budget": {"max_steps": 10, "max_tokens": 1000, "max_cost": 1.0}}


def _episode(w: LakeWriter, run_id: str, task_id: str, split: str, user: str, edit: str,
             observation: str = "file contents", success: bool = True) -> None:
    ep = w.start_episode(run_id=run_id, task_id=task_id, task_version="v1", env_id="test-env", env_version="1",
                         split=split, env_seed=0, policy_version="p1", started_at=LATE)
    at = [LATE]

    def tick() -> dict[str, Any]:  # fixed timings: every run has the same latencies
        at[0] += dt.timedelta(seconds=1)
        return {"started_at": at[0] - dt.timedelta(seconds=1), "ended_at": at[0]}

    ep.add_turn("user", user, env_state_hash="s0", **tick())
    for tool, args, obs, state in (("read_file", {"path": "src/x.py"}, observation, "s0"),
                                   ("edit", {"path": "src/x.py", "new": edit}, "edited src/x.py", "s1"),
                                   ("run_tests", {"command": "pytest -q"}, "5 passed, 0 failed (exit code 0)", "s1"),
                                   ("submit", {}, "submitted", "s2")):
        text = json.dumps({"tool": tool, "args": args}, sort_keys=True)
        ep.add_turn("assistant", text, action_schema=tool, tool_args=json.dumps(args, sort_keys=True), **tick())
        ep.add_turn("tool", obs, action_schema=tool, env_state_hash=state, **tick())
    ep.finish(ended_at=at[0], terminated=True, truncated=False, termination_reason="submitted", success=success,
              reward_components={"resolved": float(success)})


def build(root: Path, *, plant: bool) -> tuple[Any, dict[str, str], Path]:
    """Eval split ``hidden`` (e1..e6), train split (t1..t6), runs train-run and eval-run. With ``plant``:
    e1's statement copied into a training observation, e2's gold patch with renamed identifiers in the corpus,
    a train-split sibling of e3 (same family), a training episode replaying e4's actions, e5 created before the
    eval run's data cutoff, and e6 sharing a source commit with t6."""
    rng = random.Random(7)
    lake = open_lake(root / "lake", create=True)
    stmts = {f"e{i}": _statement(f"lib{i}", rng) for i in range(1, 7)}
    stmts |= {f"t{i}": _statement(f"trainlib{i}", rng) for i in range(1, 7)}
    tasks = [_task(f"e{i}", "hidden", f"fam-e{i}", stmts[f"e{i}"], EARLY if plant and i == 5 else LATE,
                   "c-shared" if plant and i == 6 else f"c-e{i}") for i in range(1, 7)]
    tasks += [_task(f"t{i}", "train", f"fam-t{i}", stmts[f"t{i}"], LATE, "c-shared" if i == 6 else f"c-t{i}")
              for i in range(1, 7)]
    if plant:
        tasks.append(_task("t-sib", "train", "fam-e3", stmts["e3"].replace("lib3", "siblib"), LATE, "c-sib"))
    edits = {tid: f"patched {tid} {_words(rng, 6)}" for tid in stmts}
    with LakeWriter(lake) as w:
        w.write_tasks(tasks)
        cutoff = {"data_cutoff": "2026-06-01"} if plant else {}
        for run in ("train-run", "eval-run"):
            w.write_runs([{"run_id": run, "created_at": LATE, "label": run, "config": json.dumps(cutoff),
                           "policy_name": "test", "policy_version": "p1"}])
        for i in range(1, 7):
            obs = "file contents"
            if plant and i == 1:  # a copied statement, e.g. a scraped issue page in an observation
                obs = "Page text:\n" + stmts["e1"]
            tid = f"t{i}"
            _episode(w, "train-run", tid, "train", stmts[tid], edits["e4"] if plant and i == 4 else edits[tid], obs)
            _episode(w, "eval-run", f"e{i}", "hidden", stmts[f"e{i}"], edits[f"e{i}"])
    corpus = root / "sft.jsonl"
    lines = [{"text": _words(rng, 50)} for _ in range(5)]
    if plant:  # e2's fix with every identifier renamed
        renamed = (_gold("lib2").replace("lib2_parse", "decode_numbers").replace("text_value", "raw")
                   .replace("base_count", "start").replace("total_sum", "acc").replace("item_value", "piece")
                   .replace("limits", "bounds"))
        lines.append({"text": renamed})
    corpus.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return lake, stmts, corpus


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, str], Path]:
    return build(tmp_path_factory.mktemp("planted"), plant=True)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, str], Path]:
    return build(tmp_path_factory.mktemp("clean"), plant=False)


class GoldPatchEnv(Env):
    """The test environment as the scan sees it: its tasks carry a gold patch (code), like Mini SWE's. The
    scan only asks the class for documents (``Env.evaluation_documents``); it never builds the environment."""

    env_id = "test-env"
    env_version = "1"

    @classmethod
    def evaluation_documents(cls, task_ids: Sequence[str]) -> list[EvalDocument]:
        return [EvalDocument(t, "gold_patch", _gold(f"lib{t[1:]}") if t.startswith("e") else
                             f"config = load_settings('{t}')\nconfig.retries += {len(t)}\nsave(config, '{t}')\n",
                             code=True) for t in task_ids]


@pytest.fixture(autouse=True)
def _gold_patches() -> Iterator[None]:
    """The test environment registered by name, as a third-party one would be."""
    registry.register("test-env", GoldPatchEnv)
    yield
    registry.unregister("test-env")


def _by_task(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["task_id"]: t for t in report["tasks"]}


def test_planted_contamination_is_found(planted: Any) -> None:
    lake, stmts, corpus = planted
    r = scan(lake, eval_split="hidden", corpus=[corpus])
    tasks = _by_task(r)
    checks = r["checks"]
    # copied statement: the whole statement is covered, the source is the training observation
    assert checks["exact_ngram"]["flagged"] == ["e1"]
    ex = tasks["e1"]["exact_ngram"]
    assert ex["score"] == 1.0 and ex["documents"] == {"statement": 1.0}
    span = ex["spans"][0]
    full = cm.normalise_words(stmts["e1"])
    # one span over the whole statement but the tail of the shared template (boilerplate n-grams)
    assert len(ex["spans"]) == 1 and " ".join(full).startswith(span["text"])
    assert span["words"] >= len(full) - len(cm.normalise_words(BOILERPLATE))
    assert span["n_sources"] == 1 and span["sources"][0]["kind"] == "turn"
    assert span["sources"][0]["source"].endswith("#2")  # the read_file observation of the training episode
    # the statement template shared by all families is boilerplate, not contamination
    assert checks["exact_ngram"]["boilerplate_ngrams"] > 0
    # renamed-identifier paraphrase of e2's gold patch in the SFT corpus
    assert "e2" in checks["near_duplicate"]["flagged"]
    hit = tasks["e2"]["near_duplicates"][0]
    assert hit["kind"] == "corpus" and hit["source"] == f"{corpus}:6" and hit["jaccard"] >= 0.7
    # sibling of e3 in the train split: the family rule and the near-duplicate scan both see it
    assert checks["family"]["flagged"] == ["e3"]
    assert checks["family"]["families_in_several_splits"] == ["fam-e3"]
    assert tasks["e3"]["family_conflict"]["other_splits"] == ["train"]
    assert any(h["source"] == "t-sib" for h in tasks["e3"]["near_duplicates"])
    # a training episode replaying e4's actions
    assert checks["trajectory"]["flagged"] == ["e4"]
    assert tasks["e4"]["trajectory"]["score"] == 1.0
    assert len(tasks["e4"]["trajectory"]["sources"]) == 1
    # e5 was created before the eval run's policy data cutoff
    assert checks["time_split"]["status"] == "checked" and checks["time_split"]["flagged"] == ["e5"]
    # e6 shares a repository commit with t6: listed, not flagged unless asked
    assert checks["repo_commit"]["shared"] == ["e6"] and checks["repo_commit"]["flagged"] == []
    assert r["flagged_tasks"] == ["e1", "e2", "e3", "e4", "e5"]
    assert tasks["e6"]["flags"] == [] and tasks["e6"]["shared_repo_commit"]["commit"] == "c-shared"
    strict = scan(lake, eval_split="hidden", corpus=[corpus], settings=ScanSettings(flag_shared_commits=True))
    assert strict["flagged_tasks"] == ["e1", "e2", "e3", "e4", "e5", "e6"]


def test_clean_data_gives_no_flags(clean: Any) -> None:
    lake, _, corpus = clean
    r = scan(lake, eval_split="hidden", corpus=[corpus], data_cutoff="2026-06-01")
    assert r["flagged_tasks"] == []
    for name in cm.CHECKS:
        assert r["checks"][name]["flagged"] == [], name
    assert r["checks"]["time_split"]["status"] == "checked"
    assert r["checks"]["exact_ngram"]["status"] == "checked"
    assert r["train_side"]["episodes"] == 6 and r["train_side"]["corpus_documents"] == 5


def test_eval_split_episodes_never_count_as_training(clean: Any) -> None:
    lake, _, _ = clean
    # naming the eval run as a training run must not make every eval task its own contamination
    r = scan(lake, eval_split="hidden", train_runs=["eval-run", "train-run"])
    assert r["train_side"]["episodes"] == 6
    assert r["flagged_tasks"] == []


def test_copy_found_at_8_grams_and_minhash_is_deterministic(planted: Any) -> None:
    lake, _, corpus = planted
    r8 = scan(lake, eval_split="hidden", corpus=[corpus], settings=ScanSettings(ngram=8))
    assert "e1" in r8["checks"]["exact_ngram"]["flagged"]
    a = scan(lake, eval_split="hidden", corpus=[corpus])
    b = scan(lake, eval_split="hidden", corpus=[corpus])
    assert [t["near_duplicates"] for t in a["tasks"]] == [t["near_duplicates"] for t in b["tasks"]]


def test_identifier_normalisation() -> None:
    a = "def parse_total(text):\n    return sum(int(x) for x in text.split(','))"
    b = "def count_all(raw):\n    return sum(int(y) for y in raw.split(','))"
    assert code_tokens(a, code=True) == code_tokens(b, code=True)
    assert code_tokens("`parse_duration` breaks", code=False) == code_tokens("`read_span` breaks", code=False)
    assert code_tokens("parse breaks") != code_tokens("parse works")
    assert cm.normalise_words("  12| Hello, World!\n  13| x_y") == ["hello", "world", "x", "y"]


def test_corpus_formats_and_errors(clean: Any, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    lake, stmts, _ = clean
    pq.write_table(pa.table({"text": ["nothing here", stmts["e2"]]}), tmp_path / "c.parquet")
    (tmp_path / "c.txt").write_text("a line\n" + stmts["e3"].replace("\n", " ") + "\n", encoding="utf-8")
    r = scan(lake, eval_split="hidden", corpus=[tmp_path / "c.parquet", tmp_path / "c.txt"])
    assert r["checks"]["exact_ngram"]["flagged"] == ["e2", "e3"]
    srcs = {t["task_id"]: t["exact_ngram"]["spans"][0]["sources"][0]["source"] for t in r["tasks"]
            if t["exact_ngram"]["spans"]}
    assert srcs["e2"] == f"{tmp_path / 'c.parquet'}:2" and srcs["e3"] == f"{tmp_path / 'c.txt'}:2"
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n', encoding="utf-8")
    with pytest.raises(TrajlakeError, match=r"bad\.jsonl: JSONL records have no 'text' field"):
        scan(lake, eval_split="hidden", corpus=[tmp_path / "bad.jsonl"])
    with pytest.raises(TrajlakeError, match="no such file"):
        scan(lake, eval_split="hidden", corpus=[tmp_path / "missing.jsonl"])
    with pytest.raises(TrajlakeError, match="no tasks on split nope"):
        scan(lake, eval_split="nope")
    with pytest.raises(TrajlakeError, match="run 'ghost' is not in the lake"):
        scan(lake, eval_split="hidden", train_runs=["ghost"])


def test_cli_json_markdown_html(planted: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake, _, corpus = planted
    code, out, err = run_cli(capsys, "--lake", str(lake.root), "contamination", "--eval-split", "hidden",
                             "--corpus", str(corpus), "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["flagged_tasks"] == ["e1", "e2", "e3", "e4", "e5"]
    code, out, _ = run_cli(capsys, "--lake", str(lake.root), "contamination", "--eval-split", "hidden",
                           "--ngram", "13", "--format", "markdown", "--fail-on-flags")
    assert code == 2 and "| e1 | exact_ngram" in out
    html_out = tmp_path / "r" / "c.html"
    code, _, err = run_cli(capsys, "--lake", str(lake.root), "contamination", "--eval-split", "hidden",
                           "--format", "html", "--out", str(html_out))
    assert code == 0 and html_out.read_text().startswith("<!doctype html>")
    code, out, _ = run_cli(capsys, "--lake", str(lake.root), "contamination", "--eval-split", "hidden")
    assert code == 0 and "flagged: 4 of 6 task(s)" in out
    code, _, err = run_cli(capsys, "--lake", str(lake.root), "contamination", "--eval-split", "hidden",
                           "--corpus", str(tmp_path / "nope.jsonl"))
    assert code == 1 and "nope.jsonl: no such file" in err


def test_mini_swe_created_at_comes_from_the_task_file() -> None:
    from trajlake.envs.mini_swe.build import stamp_created_at, task_version
    from trajlake.envs.mini_swe.env import task_row
    from trajlake.envs.mini_swe.grading import load_tasks

    tasks = load_tasks()
    assert all(t["created_at"] for t in tasks)
    t = tasks[0]
    row = task_row(t)
    assert row["created_at"] == dt.datetime.fromisoformat(t["created_at"].replace("Z", "+00:00"))
    # the date is provenance, not content: the task version does not move with it
    assert task_version(dict(t, created_at="2030-01-01T00:00:00Z")) == t["task_version"]
    # a rebuild keeps the date of a known (task_id, task_version) and stamps new tasks with the build time
    known = dict(t)
    new = dict(tasks[1], created_at=None, task_version="0123456789abcdef")
    fresh = [{k: v for k, v in known.items() if k != "created_at"}, new]
    stamp_created_at(fresh, previous=tasks, now="2027-02-03T04:05:06Z")
    assert fresh[0]["created_at"] == t["created_at"] and fresh[1]["created_at"] == "2027-02-03T04:05:06Z"


def test_environment_documents_come_through_the_env_contract() -> None:
    """Mini SWE gives its gold patch and hidden tests through ``Env.evaluation_documents``; a task it does not
    know and an environment that is not registered give nothing (their statements are scanned all the
    same)."""
    from trajlake.envs.mini_swe.grading import load_tasks

    task = next(t for t in load_tasks() if t["split"] == "dev")
    asked = [task["task_id"], "mini-swe/no-such-task"]
    docs = {d.kind: d for d in cm.environment_documents("mini-swe", asked)}
    assert sorted(docs) == ["gold_patch", "hidden_test_names", "hidden_tests"]
    assert all(d.task_id == task["task_id"] and d.code for d in docs.values())
    added = [ln[1:] for ln in task["fix_diff"].splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert docs["gold_patch"].text == "\n".join(added)
    hidden = sorted((set(task["FAIL_TO_PASS"]) | set(task["PASS_TO_PASS"])) - set(task["visible_tests"]))
    assert docs["hidden_test_names"].text.splitlines() == hidden
    functions = {n.rsplit("::", 1)[-1].split("[", 1)[0] for n in hidden}  # parametrised ids share a body
    assert all(f"def {f}(" in docs["hidden_tests"].text for f in functions)
    assert cm.environment_documents("no-such-env", ["x"]) == []


def test_diagnose_uses_the_scan(tmp_path: Path) -> None:
    from trajlake.evaluators.diagnose import diagnose

    lake, stmts, _ = build(tmp_path, plant=True)
    with LakeWriter(lake) as w:  # a candidate that fails every eval task: a significant drop (6 of 6 pairs)
        w.write_runs([{"run_id": "cand-run", "created_at": LATE, "label": "cand", "config": "{}",
                       "policy_name": "test", "policy_version": "p2"}])
        for i in range(1, 7):
            _episode(w, "cand-run", f"e{i}", "hidden", stmts[f"e{i}"], f"wrong edit {i}", success=False)
    d = diagnose(lake, "eval-run", "cand-run")
    node = d["path"][-1]
    assert node["node"] == "contamination" and node["result"] == "yes"
    assert d["diagnosis"] == "contamination"
    assert node["flagged_tasks"] == ["e1", "e3", "e4", "e5"]  # e2's paraphrase is only in the corpus file
    assert any(line.startswith("exact_ngram: checked, 1 task(s) flagged") for line in node["evidence"])


def test_hf_card_contamination_section(planted: Any, tmp_path: Path) -> None:
    from trajlake.io.hf import export_hf

    lake, _, _ = planted
    s = export_hf(lake, tmp_path / "hf", include_hidden=True)
    (c,) = s.contamination
    assert c["split"] == "hidden" and c["flagged_tasks"] == ["e1", "e3", "e4", "e5"]
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "### Contamination scan" in card
    assert "| `hidden` | 6 | 4 | 1 | 1 | 1 | 1 | 1 | 1 |" in card
    # the hidden split is not exported by default, so it is not scanned for the card either
    assert export_hf(lake, tmp_path / "hf2").contamination == ()


def test_engines_agree(planted: Any) -> None:
    """The vectorised (numpy) and the pure-SQL (duckdb) n-gram hashing find the same spans and sources."""
    lake, _, corpus = planted
    a = scan(lake, eval_split="hidden", corpus=[corpus], checks=["exact_ngram"], settings=ScanSettings(engine="numpy"))
    b = scan(lake, eval_split="hidden", corpus=[corpus], checks=["exact_ngram"],
             settings=ScanSettings(engine="duckdb"))
    assert a["flagged_tasks"] == b["flagged_tasks"] == ["e1"]
    assert [t["exact_ngram"] for t in a["tasks"]] == [t["exact_ngram"] for t in b["tasks"]]
    assert a["checks"]["near_duplicate"]["status"] == "skipped"
    with pytest.raises(TrajlakeError, match="--engine must be numpy or duckdb"):
        scan(lake, eval_split="hidden", settings=ScanSettings(engine="gpu"))
