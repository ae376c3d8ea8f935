"""`trajlake replay --run ID` and `--from DIR`: every episode of a run, or of an exported bundle, replayed in one
command; exit 0 only if every state hash of every episode matches (2: drift, 1: bad input). Replay suites
(`--run ID --pin-suite NAME`, `--suite NAME`, `diagnose --suite NAME`): pinned episodes replayed on the current
environment code, compared turn by turn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli
from trajlake.query import connect

TASKS = "tool-lookup/code/p0/0,tool-lookup/two_hop/p0/0,tool-lookup/pair/p0/0"


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake with two runs of the tool-lookup oracle: 3 episodes of run `a`, 1 of run `b`."""
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    lake = tmp_path_factory.mktemp("replay") / "lake"
    for run_id, tasks in (("a", tuple(TASKS.split(","))), ("b", tuple(TASKS.split(","))[:1])):
        s = run_rollout(RolloutConfig(lake=str(lake), run_id=run_id, env="tool-lookup", policy="oracle",
                                      split="train", seeds=(0,), task_ids=tasks, commit_every_s=0))  # a file each
        assert s.written == len(tasks)
    return lake


def test_replay_run_replays_every_episode_of_that_run(played: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--lake", str(played), "replay", "--run", "a", "--format", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 3 and {r["result"] for r in rows} == {"matched"} and all(r["steps"] > 0 for r in rows)
    assert "replayed 3 episode(s): 3 matched, 0 drifted" in err
    code, _, err = run_cli(capsys, "--lake", str(played), "replay", "--run", "b")
    assert code == 0 and "every state hash matches" in err + _ and "replayed 1 episode(s)" in err


def test_replay_from_an_exported_bundle_and_a_drifted_episode_fails(played: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "bundle"
    code, _, err = run_cli(capsys, "--lake", str(played), "export", "hf", "--out", str(out_dir), "--tables",
                           "episodes,turns")
    assert code == 0, err
    code, out, err = run_cli(capsys, "replay", "--from", str(out_dir), "--format", "csv")
    assert code == 0, err
    assert out.splitlines()[0].startswith("episode_id,result") and len(out.splitlines()) == 1 + 4
    # an environment that now answers differently (here: a recorded hash changed) is a drifted episode
    shard = next((out_dir / "data" / "turns").glob("*.parquet"))
    t = pq.read_table(shard)
    victim = t["episode_id"][0].as_py()
    rows = t.to_pylist()
    last = max(i for i, r in enumerate(rows) if r["episode_id"] == victim and r["actor"] == "env")
    rows[last]["env_state_hash"] = "0" * 64
    pq.write_table(t.from_pylist(rows, schema=t.schema), shard)
    code, out, err = run_cli(capsys, "replay", "--from", str(out_dir), "--format", "json")
    assert code == 2  # drift; bad input is 1
    result = {r["episode_id"]: r for r in json.loads(out)}
    assert result[victim]["result"] == "drifted" and result[victim]["where"].startswith("turn ")
    assert sum(r["result"] == "matched" for r in result.values()) == 3
    assert "4 episode(s): 3 matched, 1 drifted" in err
    assert pc.sum(pc.equal(t["episode_id"], victim)).as_py() > 0


@pytest.mark.parametrize(("args", "message"), [
    ([], "exactly one of --episode ID, --run ID, --from DIR"),
    (["--run", "a", "--episode", "x"], "exactly one of"),
    (["--run", "nope"], "run 'nope': no episodes to replay"),
    (["--episode", "x", "--format", "json"], "--format applies to --run, --from and --suite"),
])
def test_replay_options_are_checked(played: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                    message: str) -> None:
    code, _, err = run_cli(capsys, "--lake", str(played), "replay", *args)
    assert code != 0 and message in err and len(err.strip().splitlines()) == 1, err


def test_replay_from_a_folder_that_is_not_a_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "replay", "--from", str(tmp_path))
    assert code != 0 and "no episodes shards" in err and "trajectories layout" in err, err


def _copy(played: Path, tmp_path: Path) -> Path:
    import shutil

    lake = tmp_path / "lake"
    shutil.copytree(played, lake)
    return lake


def _answer_differently(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment's code changes how `lookup` answers (a read: the state hash does not see it)."""
    from trajlake.envs.tool_lookup.env import ToolLookupEnv

    original = ToolLookupEnv._lookup
    monkeypatch.setattr(ToolLookupEnv, "_lookup", lambda self, args: original(self, args).replace('"code"', '"Code"'))


def test_a_pinned_suite_matches_on_unchanged_code(played: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`--run ID --pin-suite NAME` pins the run's episodes (ids, lake versions, env versions, content hashes) in
    the lake once they all replay; `--suite NAME` replays exactly them: matched, exit 0."""
    lake = _copy(played, tmp_path)
    code, _, err = run_cli(capsys, "--lake", str(lake), "replay", "--run", "a", "--pin-suite", "smoke")
    assert code == 0 and "pinned replay suite smoke: 3 episode(s) at episodes=" in err, err
    doc = json.loads((lake / "_trajlake" / "suites" / "smoke.json").read_text())
    assert doc["source"] == "run a" and doc["env_versions"] == {"tool-lookup": ["1.0"]} and doc["created_at"]
    assert len(doc["episodes"]) == 3 and all(len(e["content_hash"]) == 64 for e in doc["episodes"])
    assert set(doc["versions"]) == {"episodes", "turns", "tasks", "runs", "gateway_events"}
    code, _, err = run_cli(capsys, "--lake", str(lake), "replay", "--run", "a", "--pin-suite", "smoke")
    assert code == 1 and "exists already" in err and len(err.strip().splitlines()) == 1, err
    code, out, err = run_cli(capsys, "--lake", str(lake), "replay", "--suite", "smoke", "--format", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["result"] for r in rows] == ["matched"] * 3 and all(r["steps"] >= 2 for r in rows)
    assert {r["episode_id"] for r in rows} == {e["episode_id"] for e in doc["episodes"]}
    assert all(r["turn"] is None and r["field"] is None for r in rows)
    assert "read at the pinned versions" in err and "3 matched, 0 drifted" in err
    # a suite of the first layout (ids and an as-of string only) is read at its versions
    first = {"name": "old", "episode_ids": [e["episode_id"] for e in doc["episodes"]], "created_at": "2026-12-02",
             "source": "run a", "as_of": ",".join(f"{t}={v}" for t, v in doc["versions"].items())}
    (lake / "_trajlake" / "suites" / "old.json").write_text(json.dumps(first))
    code, out, err = run_cli(capsys, "--lake", str(lake), "replay", "--suite", "old", "--format", "json")
    assert code == 0 and [r["env_version"] for r in json.loads(out)] == ["1.0"] * 3, err


def test_a_suite_drifts_when_the_environment_answers_differently(played: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A lookup answered differently is drift at that turn, field `raw_content`, with both values (exit 2), even
    though every state hash still matches (`--run` replay cannot see it); a new env_version alone is not drift."""
    lake = _copy(played, tmp_path)
    assert run_cli(capsys, "--lake", str(lake), "replay", "--run", "a", "--pin-suite", "s")[0] == 0
    from trajlake.envs.tool_lookup.env import ToolLookupEnv

    monkeypatch.setattr(ToolLookupEnv, "env_version", "1.1")  # a version bump that changes no behaviour
    code, out, err = run_cli(capsys, "--lake", str(lake), "replay", "--suite", "s", "--format", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert {(r["result"], r["env_version"], r["env_version_now"]) for r in rows} == {("matched", "1.0", "1.1")}
    assert "environment versions since: tool-lookup 1.0 -> 1.1" in err
    _answer_differently(monkeypatch)
    code, out, err = run_cli(capsys, "--lake", str(lake), "replay", "--suite", "s", "--format", "json")
    assert code == 2, err
    rows = json.loads(out)
    assert {r["result"] for r in rows} == {"drifted"} and {r["field"] for r in rows} == {"raw_content"}
    assert {r["turn"] for r in rows} == {2}  # statement (0), the policy's lookup (1), its answer (2)
    assert all('"code"' in r["expected"] and '"Code"' in r["got"] for r in rows)
    assert "3 drifted" in err
    code, _, err = run_cli(capsys, "--lake", str(lake), "replay", "--suite", "s")
    assert code == 2 and "drifted at turn 2, field raw_content" in err
    monkeypatch.setattr(ToolLookupEnv, "env_version", "1.0")
    assert run_cli(capsys, "--lake", str(lake), "replay", "--run", "a")[0] == 0  # the state hashes cannot tell


def test_a_suite_survives_compaction(played: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After `compact` has merged the run's files and vacuumed the ones the pinned versions read, the suite reads
    the current versions and checks each pinned content hash; `--episodes` pins exactly those episodes. (Later
    writes: the diagnose test below pins before writing two runs.)"""
    from trajlake import open_lake
    from trajlake.lake.maintenance import compact

    lake = _copy(played, tmp_path)
    con = connect(str(lake))
    ids = sorted(r[0] for r in con.execute("select episode_id from episodes where run_id = 'a'").fetchall())
    con.close()
    code, _, err = run_cli(capsys, "--lake", str(lake), "replay", "--run", "a", "--pin-suite", "two",
                           "--episodes", ",".join(ids[:2]))
    assert code == 0 and "2 episode(s)" in err, err
    report = compact(open_lake(lake), retention_hours=0)
    assert report.files_after["episodes"] < report.files_before["episodes"] and report.vacuumed_files > 0
    code, out, err = run_cli(capsys, "--lake", str(lake), "replay", "--suite", "two", "--format", "json")
    assert code == 0, err
    assert sorted(r["episode_id"] for r in json.loads(out)) == ids[:2]
    assert "read at the current versions (the pinned files were vacuumed; content hashes checked)" in err
    # a pinned hash the lake no longer holds: refused, naming the episode
    path = lake / "_trajlake" / "suites" / "two.json"
    doc = json.loads(path.read_text())
    doc["episodes"][1]["content_hash"] = "0" * 64
    path.write_text(json.dumps(doc))
    code, _, err = run_cli(capsys, "--lake", str(lake), "replay", "--suite", "two")
    assert code == 1 and f"episode {ids[1]}: content_hash" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(("args", "message"), [
    (["--suite", "nope"], "replay suite 'nope' is not in the lake"),
    (["--suite", "../x"], "use letters, digits"),
    (["--episode", "x", "--pin-suite", "s"], "--pin-suite pins the episodes of --run ID"),
    (["--run", "a", "--episodes", "x"], "--episodes chooses the episodes --pin-suite pins"),
    (["--run", "a", "--pin-suite", "s", "--episodes", "x,y"], "episode 'x' is not an episode of run 'a' (and 1 more)"),
    (["--run", "nope", "--pin-suite", "s"], "run 'nope': no episodes to pin"),
])
def test_replay_suite_options_are_checked(played: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                          message: str) -> None:
    code, _, err = run_cli(capsys, "--lake", str(played), "replay", *args)
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err  # bad input: 1, drift: 2
    assert not (played / "_trajlake" / "suites" / "s.json").exists()


def test_diagnose_first_node_reports_the_suites_drift(played: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`diagnose --suite NAME` replays the suite as its first node: on unchanged code nothing drifted and the walk
    goes on; once the environment answers differently the drop is the environment's, with the turn and field."""
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    lake = _copy(played, tmp_path)
    assert run_cli(capsys, "--lake", str(lake), "replay", "--run", "a", "--pin-suite", "s")[0] == 0
    tasks = tuple(f"tool-lookup/{kind}/p0/{i}" for kind in ("two_hop", "pair") for i in range(3))
    for run_id, policy in (("base", "oracle"), ("cand", "heuristic")):  # heuristic: wrong on these by design
        run_rollout(RolloutConfig(lake=str(lake), run_id=run_id, env="tool-lookup", policy=policy, split="train",
                                  seeds=(0,), task_ids=tasks))  # written after the pin: not in the suite

    def diagnose() -> dict[str, Any]:
        code, out, err = run_cli(capsys, "--lake", str(lake), "diagnose", "--baseline", "base", "--candidate",
                                 "cand", "--suite", "s", "-f", "json", "--resamples", "50")
        assert code == 0, err
        return dict(json.loads(out))

    clean = diagnose()
    first = clean["path"][1]
    assert first["node"] == "oracle_suite" and first["result"] != "yes" and clean["diagnosis"] != \
        "environment_regression"
    assert "0 of 3 episode(s) drifted" in first["evidence"][0] and "run a" in first["evidence"][0]
    _answer_differently(monkeypatch)
    d = diagnose()
    assert d["diagnosis"] == "environment_regression" and d["path"][1]["result"] == "yes"
    assert "3 of 3 episode(s) drifted" in d["path"][1]["evidence"][0]
    assert "turn 2, raw_content" in d["path"][1]["evidence"][1]
    code, _, err = run_cli(capsys, "--lake", str(lake), "diagnose", "--baseline", "base", "--candidate", "cand",
                           "--suite", "missing")
    assert code == 1 and "replay suite 'missing' is not in the lake" in err


def _wrap_step(monkeypatch: pytest.MonkeyPatch, tool: str, **changes: Any) -> None:
    """The environment's step answers as before, except that a `tool` step's result gets ``changes``."""
    import dataclasses

    from trajlake.envs.tool_lookup.env import ToolLookupEnv

    original = ToolLookupEnv.step

    def step(self: ToolLookupEnv, *args: Any, **kwargs: Any) -> Any:
        res = original(self, *args, **kwargs)
        return dataclasses.replace(res, **changes) if res.tool == tool else res

    monkeypatch.setattr(ToolLookupEnv, "step", step)


def _break(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    from trajlake.envs.core import EnvError
    from trajlake.envs.tool_lookup.env import ToolLookupEnv

    def no_task(self: ToolLookupEnv, *args: Any, **kwargs: Any) -> Any:
        raise EnvError("unknown task (regenerated)")

    def invalid(self: ToolLookupEnv, args: dict[str, Any]) -> str:
        self._invalid = "error: no such entry"
        return self._invalid

    changes: dict[str, dict[str, Any]] = {
        "task_gone": {"task_for": no_task},
        "reset_state": {"state_hash": lambda self: "another hash"},
        "status": {"_lookup": invalid},
        "reward": {"_final_grade": lambda self: {"resolved": 0.5}},
    }
    for name, value in changes.get(how, {}).items():
        monkeypatch.setattr(ToolLookupEnv, name, value)
    if how == "ends_early":
        _wrap_step(monkeypatch, "lookup", terminated=True)
    elif how == "never_ends":
        _wrap_step(monkeypatch, "submit", terminated=False, termination_reason=None)


@pytest.mark.parametrize(("how", "turn", "field", "expected", "got"), [
    ("nothing", None, None, None, None),
    ("task_gone", 0, "task_version", "tool-lookup/two_hop/p0/0@", "unknown task (regenerated)"),
    ("reset_state", 0, "env_state_hash", None, "another hash"),
    ("status", 2, "status", "OK", "MODEL_INVALID_ACTION"),
    ("reward", -1, "reward_components", '{"resolved": 1.0}', '{"resolved": 0.5}'),
    ("ends_early", 2, "terminated", "False (the recording goes on)", "True (ended here)"),
    ("never_ends", -1, "terminated", "True", "False"),
])
def test_a_suite_names_the_first_differing_turn_and_field(monkeypatch: pytest.MonkeyPatch, how: str,
                                                          turn: int | None, field: str | None,
                                                          expected: str | None, got: str | None) -> None:
    """Each kind of changed behaviour is reported at the recorded turn that shows it, with the field and both
    values (turn -1: the last turn, the one that ended the episode)."""
    from trajlake.envs import make_policy, task_view_fn
    from trajlake.envs.registry import make

    from trajlake.rollout.runner import play_episode
    from trajlake.rollout.suites import PinnedEpisode, compare_episode

    with make("tool-lookup", split=None) as env:
        rec = play_episode(env, make_policy("tool-lookup", "oracle", "o"), run_id="R",
                           task_id="tool-lookup/two_hop/p0/0", task_version=None, seed=0,
                           task_view=task_view_fn(env, oracle=True))
    e = rec.episode
    pinned = PinnedEpisode(e["episode_id"], e["env_id"], e["env_version"], e["task_id"], e["task_version"], None)
    _break(monkeypatch, how)
    with make("tool-lookup", split=None) as env:
        outcome = compare_episode(env, pinned, e, rec.turns)
    last = rec.turns[-1]["turn_idx"]
    assert outcome.ok == (field is None)
    if field is None:
        assert outcome.steps == len(rec.turns) // 2
        return
    d = outcome.drift
    assert d is not None and (d.turn_idx, d.field) == (last if turn == -1 else turn, field), outcome.message()
    assert expected is None or d.expected.startswith(expected), d
    assert got is None or d.got == got, d


def test_a_bundle_replays_each_run_with_the_environment_arguments_it_was_played_with(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An exported bundle with its runs table replays each episode in the environment its run was played in
    (``runs.config.env_kwargs``): a tool-lookup task of an extra train phrasing exists only with
    ``train_phrasings``, so with default arguments it could not even be reset."""
    from trajlake.rollout.runner import RolloutConfig, run_rollout

    lake = tmp_path / "lake"
    run_rollout(RolloutConfig(lake=str(lake), run_id="wide", env="tool-lookup", policy="oracle", split="train",
                              seeds=(0,), task_ids=("tool-lookup/code/p12/0",), commit_every_s=0,
                              env_kwargs={"train_phrasings": 12}))
    out_dir = tmp_path / "bundle"
    code, _, err = run_cli(capsys, "--lake", str(lake), "export", "hf", "--out", str(out_dir), "--tables",
                           "episodes,turns,runs")
    assert code == 0, err
    code, out, err = run_cli(capsys, "replay", "--from", str(out_dir), "--format", "json")
    assert code == 0, err
    assert [r["result"] for r in json.loads(out)] == ["matched"]
