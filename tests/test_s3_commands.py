"""The commands that read a lake someone else wrote -- replay, best-of, reward-check, contamination and diagnose --
on an ``s3://`` lake (moto's S3 server on loopback), each checked against the same command on a local lake holding
the same rows: same reports, counts and metric values, not only exit 0.

The inputs are played once into a local lake and copied row for row into the S3 lake (one module-scoped pair), so
even the timing-dependent columns are equal. ``quickstart`` and ``train``, which play their own episodes into an
empty lake of each kind, are in tests/test_s3_quickstart_train.py (a module of their own, so that
``--dist loadscope`` can run them beside these)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.conftest import run_cli
from tests.s3_server import S3Server, new_s3_lake_uri
from trajlake import Lake, LakeWriter, connect, open_lake, verify

REPO = Path(__file__).resolve().parents[1]
TABLES = ("tasks", "runs", "episodes", "turns", "gateway_events")
SQL_REWARD = ("SELECT traj_id, count(*) FILTER (WHERE raw_content LIKE '%passed%') AS reward FROM trajectories "
              "GROUP BY traj_id")


@dataclass(frozen=True)
class Lakes:
    local: str
    s3: str

    def both(self) -> tuple[str, str]:
        return self.local, self.s3


def _copy_rows(src: str, dst: str) -> None:
    """Every committed row of ``src`` into the empty lake ``dst`` (the writer recomputes the bookkeeping
    columns)."""
    from trajlake.schema import table_def

    con = connect(src)
    tables: dict[str, pa.Table] = {}
    for name in TABLES:
        cols = ", ".join(f'"{c}"' for c in table_def(name).column_names)
        t = con.execute(f"select {cols} from {name}").arrow()
        t = t.read_all() if hasattr(t, "read_all") else t
        for col in ("content_hash", "written_at"):
            if col in t.column_names:
                t = t.set_column(t.schema.get_field_index(col), col, pa.nulls(t.num_rows, t.schema.field(col).type))
        tables[name] = t
    with LakeWriter(Lake.init(dst), handle_signals=False) as w:
        w.write_tasks(tables["tasks"])
        w.write_runs(tables["runs"])
        w.write_batch(tables["episodes"], tables["turns"], tables["gateway_events"],
                      check_existing=False).raise_if_rejected()


@pytest.fixture(scope="module")
def lakes(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lakes]:
    """Mini SWE episodes played once into a local lake and copied into a new S3 lake: the oracle and the random
    policy (2 attempts, 3 steps at most) on 6 dev tasks, and the oracle on 2 train tasks (the contamination
    scan's training turns)."""
    from trajlake.envs import list_tasks

    from trajlake.rollout.runner import RolloutConfig, run_rollout

    dev = tuple(t["task_id"] for t in list_tasks("mini-swe", "dev")[:6])
    train = tuple(t["task_id"] for t in list_tasks("mini-swe", "train")[:2])
    local = str(tmp_path_factory.mktemp("s3cmd") / "lake")
    for run_id, policy, split, tasks, extra in (
            ("oracle", "oracle", "dev", dev, {}),
            ("random", "random", "dev", dev, {"attempts": 2, "env_kwargs": {"budget": {"max_steps": 3}}}),
            ("train-oracle", "oracle", "train", train, {})):
        s = run_rollout(RolloutConfig(lake=local, run_id=run_id, env="mini-swe", policy=policy, split=split,
                                      seeds=(0,), task_ids=tasks, commit_every_s=0.0, **extra))
        assert not s.failed_items, s.failed_items
    with pytest.MonkeyPatch.context() as mp:
        uri = new_s3_lake_uri(s3_server, mp)
        _copy_rows(local, uri)
        q = "select run_id, count(*), sum(n_turns), sum(success::int) from episodes group by 1 order by 1"
        assert connect(uri).execute(q).fetchall() == connect(local).execute(q).fetchall()
        yield Lakes(local, uri)


def _both(capsys: pytest.CaptureFixture[str], lakes: Lakes, *args: str, code: int = 0) -> tuple[str, str]:
    """Run ``trajlake ARGS --lake L`` on the local and on the S3 lake; their standard outputs."""
    outs = []
    for lake in lakes.both():
        rc, out, err = run_cli(capsys, *args, "--lake", lake)
        assert rc == code, f"{lake}: {err[-2000:]}"
        outs.append(out)
    return outs[0], outs[1]


def _same_report(local: dict[str, Any], s3: dict[str, Any], *, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """The two JSON reports are equal but for where they read (``lake``, its table versions) and the ``ignore``
    keys; returns the first without those."""
    assert set(s3) == set(local)
    drop = ("lake", "lake_versions", *ignore)
    local = {k: v for k, v in local.items() if k not in drop}
    assert {k: v for k, v in s3.items() if k not in drop} == local
    return local


@pytest.mark.slow
def test_replay_on_s3(lakes: Lakes, capsys: pytest.CaptureFixture[str]) -> None:
    con = connect(lakes.s3)
    episodes = [r[0] for r in con.execute("select min(episode_id) from episodes where run_id in ('oracle', "
                                          "'random') group by run_id order by 1").fetchall()]
    assert len(episodes) == 2
    for ep in episodes:
        rc, out_local, err = run_cli(capsys, "replay", "--episode", ep, "--lake", lakes.local)
        assert rc == 0, err
        rc, out_s3, err = run_cli(capsys, "replay", "--episode", ep, "--lake", lakes.s3)
        assert rc == 0, err
        n_steps = con.execute("select count(*) from turns where episode_id = ? and actor = 'policy'",
                              [ep]).fetchone()
        assert out_s3 == out_local == f"episode {ep}: replayed {n_steps[0]} step(s); every state hash matches\n"


@pytest.mark.slow
def test_reward_check_on_s3(lakes: Lakes, capsys: pytest.CaptureFixture[str]) -> None:
    for reward, run in (("trajlake.evaluators.process_rewards:grounded_progress", "oracle"), (SQL_REWARD, "random")):
        local, s3 = _both(capsys, lakes, "reward-check", "--reward", reward, "--run", run, "--format", "json")
        report = _same_report(json.loads(local), json.loads(s3))
        assert report["trajectories"] == (6 if run == "oracle" else 12)
        assert set(report["perturbations"]) == {"delete_key_call", "insert_useless_call", "swap_steps",
                                                "fabricated_progress"}
    # the SQL reward counts "passed" in any text: a fabricated progress message raises it on every trajectory
    assert report["hackable_under"] == ["fabricated_progress"]
    assert report["perturbations"]["fabricated_progress"]["wrong"] == 12


@pytest.mark.slow
def test_contamination_on_s3(lakes: Lakes, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # against the training split's episodes (train-oracle) and a local corpus file holding the statement of one
    # dev task nobody played (exact n-grams); a data cutoff after the creation of every task (time split: the 6
    # tasks the dev runs evaluated)
    con = connect(lakes.s3)
    played = {r[0] for r in con.execute("select task_id from episodes where run_id = 'oracle'").fetchall()}
    unplayed, statement = con.execute("select task_id, statement from tasks where split = 'dev' and task_id not in "
                                      "(select task_id from episodes) order by 1 limit 1").fetchone()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": statement}) + "\n", encoding="utf-8")
    args = ("contamination", "--eval-split", "dev", "--corpus", str(corpus), "--data-cutoff", "2100-01-01",
            "--format", "json")
    local, s3 = _both(capsys, lakes, *args)
    report = _same_report(json.loads(local), json.loads(s3))
    assert json.loads(s3)["lake"] == lakes.s3
    n_dev = con.execute("select count(*) from tasks where split = 'dev'").fetchone()[0]
    assert len(report["tasks"]) == n_dev > 6
    assert report["checks"]["exact_ngram"]["flagged"] == [unplayed]
    assert set(report["checks"]["time_split"]["flagged"]) == played and len(played) == 6
    assert set(report["flagged_tasks"]) == played | {unplayed}
    # the n-gram hashing in SQL reads the same turns from S3 and finds the same
    rc, s3_duckdb, err = run_cli(capsys, *args, "--engine", "duckdb", "--lake", lakes.s3)
    assert rc == 0, err
    by_sql = json.loads(s3_duckdb)
    assert by_sql["settings"] == {**json.loads(s3)["settings"], "engine": "duckdb"}
    assert _same_report(json.loads(s3), by_sql, ignore=("settings",)) == {k: v for k, v in report.items()
                                                                           if k != "settings"}


@pytest.mark.slow
def test_diagnose_on_s3(lakes: Lakes, capsys: pytest.CaptureFixture[str]) -> None:
    local, s3 = _both(capsys, lakes, "diagnose", "--baseline", "oracle", "--candidate", "random", "--format",
                      "json")
    # as_of pins the table versions read, which differ between the two lakes (the copy is one commit)
    report = _same_report(json.loads(local), json.loads(s3), ignore=("as_of",))
    assert json.loads(local)["as_of"].split("=")[0] == json.loads(s3)["as_of"].split("=")[0] == "episodes"
    # 6 tasks solved by the oracle and failed by the random policy: a significant drop, so the walk goes on
    assert report["path"][0]["result"] == "yes", report["path"][0]
    assert len(report["path"]) > 1


@pytest.mark.slow
def test_best_of_on_s3(lakes: Lakes, capsys: pytest.CaptureFixture[str]) -> None:
    local, s3 = _both(capsys, lakes, "best-of", "--run", "random", "--out-run", "b2")
    assert s3 == local and "b2 from random: 6 group(s)" in s3
    q_eps = ("select episode_id, task_id, attempt, success, n_turns, tokens_in, tokens_out from episodes "
             "where run_id = 'b2' order by 1")
    q_turns = "select count(*), sum(len(token_ids)) from turns t join episodes e using (episode_id) where e.run_id = 'b2'"
    q_run = "select config, policy_name from runs where run_id = 'b2'"
    for q in (q_eps, q_turns, q_run):
        assert connect(lakes.s3).execute(q).fetchall() == connect(lakes.local).execute(q).fetchall(), q
    assert len(connect(lakes.s3).execute(q_eps).fetchall()) == 6
    assert verify(open_lake(lakes.s3)).ok
    # a second selection into the same run is refused on S3 as locally
    _both(capsys, lakes, "best-of", "--run", "random", "--out-run", "b2", code=1)
