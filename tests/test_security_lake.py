"""Red-team tests of `verify` and the writer's duplicate check (issue 9): a broken or edited Delta log and edited
statistics are errors by default; Delta errors print one line even with RUST_BACKTRACE=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import make_episode
from trajlake import Lake, LakeWriter, open_lake
from trajlake.lake.delta_log import DELTA_LOG, log_entry_name
from trajlake.lake.maintenance import verify

pytestmark = pytest.mark.security


def write(lake: Lake, *ids: str) -> None:
    with LakeWriter(lake, handle_signals=False) as w:
        for episode_id in ids:
            ep, turns = make_episode(episode_id)
            w.write_batch([ep], turns)


@pytest.fixture
def three_commits(tmp_path: Path) -> Lake:
    lake = open_lake(tmp_path / "lake", create=True)
    for episode_id in ("ep-a", "ep-b", "ep-c"):
        write(lake, episode_id)
    assert lake.versions()["episodes"] >= 3
    return lake


def log_entry(lake: Lake, table: str, version: int) -> Path:
    return lake.root / table / DELTA_LOG / log_entry_name(version)


def stored_ids(lake: Lake) -> list[str]:
    """Episode ids in every episodes data file on disk, whatever the log says."""
    out: list[str] = []
    for path in sorted((lake.root / "episodes").rglob("*.parquet")):
        out += pq.read_table(path, columns=["episode_id"])["episode_id"].to_pylist()
    return out


def test_a_missing_log_entry_in_the_chain_fails_verify_by_default(three_commits) -> None:
    assert verify(three_commits).ok
    log_entry(three_commits, "episodes", 2).unlink()
    report = verify(three_commits)
    assert not report.ok
    assert any("missing from the log chain" in p for p in report.problems), report.problems


def test_a_deleted_newest_log_entry_fails_verify_by_default(three_commits) -> None:
    newest = three_commits.versions()["episodes"]
    log_entry(three_commits, "episodes", newest).unlink()
    report = verify(three_commits)
    assert not report.ok
    assert any("gone from the log" in p for p in report.problems), report.problems


def _edit_stats(lake: Lake, version: int, edit: dict[str, object]) -> None:
    path = log_entry(lake, "episodes", version)
    lines = []
    for line in path.read_text().splitlines():
        action = json.loads(line)
        if "add" in action and action["add"].get("stats"):
            stats = json.loads(action["add"]["stats"])
            for key, value in edit.items():
                kind, col = key.split(".")
                stats[kind][col] = value
            action["add"]["stats"] = json.dumps(stats)
        lines.append(json.dumps(action))
    path.write_text("\n".join(lines) + "\n")


def test_edited_statistics_are_recomputed_and_flagged(three_commits) -> None:
    version = three_commits.versions()["episodes"]
    _edit_stats(three_commits, version, {"minValues.episode_id": "zzz", "maxValues.episode_id": "zzzz"})
    report = verify(three_commits)
    assert not report.ok
    assert any("statistics do not match" in p and "episode_id" in p for p in report.problems), report.problems
    assert any("changed after it was committed" in p for p in report.problems), report.problems


def test_edited_count_statistics_are_flagged(three_commits) -> None:
    version = three_commits.versions()["episodes"]
    path = log_entry(three_commits, "episodes", version)
    text = path.read_text().replace('\\"numRecords\\": 1,', '\\"numRecords\\": 7,')
    assert text != path.read_text()
    path.write_text(text)
    report = verify(three_commits)
    assert any("the Delta log says 7 rows" in p for p in report.problems), report.problems


def test_duplicate_check_is_not_defeated_by_edited_statistics(tmp_path) -> None:
    lake = open_lake(tmp_path / "lake", create=True)
    write(lake, "ep-1")
    _edit_stats(lake, lake.versions()["episodes"], {"minValues.episode_id": "zzz", "maxValues.episode_id": "zzzz"})
    write(lake, "ep-1")  # the same episode again: must be recognised as already stored
    assert stored_ids(lake) == ["ep-1"]


def test_delta_errors_print_one_line_with_rust_backtrace(three_commits) -> None:
    log_entry(three_commits, "episodes", 1).write_text("garbage\n")
    env = {**os.environ, "RUST_BACKTRACE": "1"}
    for args in (["verify"], ["info"], ["sql", "select count(*) from episodes"]):
        proc = subprocess.run([sys.executable, "-m", "trajlake", "--lake", str(three_commits.root), *args],
                              capture_output=True, text=True, env=env, timeout=120, check=False)
        assert proc.returncode != 0
        lines = proc.stderr.strip().splitlines()
        # one line per problem (verify lists each), never a Rust backtrace
        assert all(line.startswith(("error:", "problem:")) for line in lines), proc.stderr
        assert len(lines) == (2 if args == ["verify"] else 1), proc.stderr


# -- round 3 (issue 26): forged commits ------------------------------------------------------------------------
def forge_removal_of_every_episode(lake: Lake) -> Path:
    """What `EXPLAIN ANALYZE COPY ... TO '<lake>/episodes/_delta_log/N.json'` did before round 3: a next log entry
    that removes every episodes file, written by something other than trajlake."""
    version = lake.versions()["episodes"]
    live = [f.path for f in lake.files("episodes")]
    lines = [{"commitInfo": {"timestamp": 1, "operation": "DELETE"}},
             *({"remove": {"path": p, "deletionTimestamp": 1, "dataChange": True}} for p in live)]
    entry = log_entry(lake, "episodes", version + 1)
    entry.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return entry


def test_a_forged_commit_fails_verify_and_compact_does_not_vacuum_on_it(three_commits, capsys) -> None:
    from tests.conftest import run_cli

    lake = three_commits
    before = sorted(stored_ids(lake))
    entry = forge_removal_of_every_episode(lake)
    assert open_lake(lake.root).versions()["episodes"] == int(entry.stem)  # readers follow the forged entry
    report = verify(open_lake(lake.root), strict=True)
    assert not report.ok and report.unrecorded_entries == [f"episodes/{DELTA_LOG}/{entry.name}"]
    forged = [p for p in report.problems if entry.name in p and "no trajlake commit record" in p]
    assert forged and "removes 3 file(s), hiding the rows of 3 committed file(s)" in forged[0], report.problems
    assert any("hidden by those entries, not lost by a writer" in p for p in report.problems), report.problems
    code, _, err = run_cli(capsys, "--lake", str(lake.root), "verify")
    assert code != 0 and entry.name in err
    code, _, err = run_cli(capsys, "--lake", str(lake.root), "compact", "--retention-hours", "0")
    assert code != 0 and len(err.strip().splitlines()) == 1 and "no trajlake commit record" in err, err
    assert sorted(stored_ids(lake)) == before  # nothing vacuumed: deleting the entry restores every episode
    entry.unlink()
    assert verify(open_lake(lake.root)).ok


def test_compaction_records_its_own_log_entries_vacuum_included(three_commits) -> None:
    from trajlake.lake.maintenance import compact

    lake = three_commits
    report = compact(lake, retention_hours=0, orphan_grace_hours=0)
    assert report.vacuumed_files > 0  # the merged small files were deleted, and delta-rs logged the vacuum
    result = verify(open_lake(lake.root))
    assert result.ok and not result.unrecorded_entries, result.problems


# -- round 3 (issue 26): a writer killed between its commit and its record is not a forger -------------------
def commit_killed_before_its_record(lake: Lake, monkeypatch: pytest.MonkeyPatch, episode_id: str) -> int:
    """Commit one episode as a writer killed right after its episodes commit would: the entry is on the log, its
    commit record and the deletion of its commit intent never happen. Returns the entry's version."""
    from trajlake.lake.storage import LakeStorage
    from trajlake.lake.store import COMMIT_INTENTS

    remove = LakeStorage.remove
    with monkeypatch.context() as m:
        m.setattr(Lake, "record_commits", lambda self, name, first, last: None)
        m.setattr(LakeStorage, "remove", lambda self, *parts: None if COMMIT_INTENTS in parts
                  else remove(self, *parts))
        write(open_lake(lake.root), episode_id)
    return open_lake(lake.root).versions()["episodes"]


def test_an_entry_whose_writer_died_before_its_record_is_recognised_then_recorded(three_commits, monkeypatch) -> None:
    from trajlake.lake.store import COMMIT_RECORDS, META_DIR

    lake = three_commits
    version = commit_killed_before_its_record(lake, monkeypatch, "ep-d")
    assert not (lake.root / META_DIR / COMMIT_RECORDS / "episodes" / f"{version:020d}").exists()
    report = verify(open_lake(lake.root), strict=True)
    assert report.ok, report.problems  # its commit intent vouches for it
    assert any(log_entry_name(version) in n and "stopped before recording it" in n for n in report.notes)
    write(open_lake(lake.root), "ep-e")  # the next writer's first commit records it
    assert (lake.root / META_DIR / COMMIT_RECORDS / "episodes" / f"{version:020d}").exists()
    report = verify(open_lake(lake.root), strict=True)
    assert report.ok and not any("stopped before recording" in n for n in report.notes), report


def test_a_forged_entry_cannot_borrow_a_commit_intent(three_commits, monkeypatch) -> None:
    """A forger who names a leftover intent (or copies the key of a recorded entry) gains nothing: the entry
    may only add and remove what its intent lists."""
    from trajlake.lake.delta_log import INTENT_KEY
    from trajlake.lake.maintenance import compact

    lake = three_commits
    version = commit_killed_before_its_record(lake, monkeypatch, "ep-d")
    nonce = json.loads(log_entry(lake, "episodes", version).read_text().splitlines()[0])["commitInfo"][INTENT_KEY]
    live = [f.path for f in lake.files("episodes")]
    lines = [{"commitInfo": {"timestamp": 1, "operation": "DELETE", INTENT_KEY: nonce}},
             *({"remove": {"path": p, "deletionTimestamp": 1, "dataChange": True}} for p in live)]
    forged = log_entry(lake, "episodes", version + 1)
    forged.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    report = verify(open_lake(lake.root))
    assert report.unrecorded_entries == [f"episodes/{DELTA_LOG}/{forged.name}"], report.problems
    with pytest.raises(Exception, match="no trajlake commit record"):
        compact(open_lake(lake.root), retention_hours=0, orphan_grace_hours=0)
    # the killed writer's own entry was recorded by that compact attempt; the forged one still stands out
    report = verify(open_lake(lake.root))
    assert report.unrecorded_entries == [f"episodes/{DELTA_LOG}/{forged.name}"]
    assert not any("stopped before recording" in n for n in report.notes)


def test_compact_records_an_interrupted_commit_and_drops_stale_intents(three_commits, monkeypatch) -> None:
    from trajlake.lake.maintenance import compact
    from trajlake.lake.store import COMMIT_INTENTS, META_DIR

    lake = three_commits
    commit_killed_before_its_record(lake, monkeypatch, "ep-d")
    stale = lake.root / META_DIR / COMMIT_INTENTS / "turns" / "0123abcd"  # a writer killed before its commit
    stale.write_text(json.dumps({"adds": [], "removes": [], "pid": 1, "at": 0}), encoding="utf-8")
    compact(open_lake(lake.root), retention_hours=0, orphan_grace_hours=0)
    report = verify(open_lake(lake.root), strict=True)
    assert report.ok and not report.notes, (report.problems, report.notes)
    assert not any((lake.root / META_DIR / COMMIT_INTENTS).rglob("*")) or \
        all(p.is_dir() for p in (lake.root / META_DIR / COMMIT_INTENTS).rglob("*"))


# -- round 3 (issue 26): numbers no policy can produce -------------------------------------------------------
@pytest.mark.parametrize(("field", "value", "message"), [
    ("behavior_logprobs", float("nan"), "NaN, infinite or above 0"),
    ("behavior_logprobs", float("inf"), "NaN, infinite or above 0"),
    ("behavior_logprobs", 0.7, "NaN, infinite or above 0"),
    ("token_ids", -3, "negative"),
])
def test_impossible_token_numbers_are_refused_naming_episode_turn_and_field(tmp_path, field, value, message) -> None:
    lake = open_lake(tmp_path / "lake", create=True)
    ep, turns = make_episode("ep-bad")
    policy_turn = next(t for t in turns if t["actor"] == "policy")
    policy_turn[field] = [*policy_turn[field][:-1], value]
    ok_ep, ok_turns = make_episode("ep-ok")
    next(t for t in ok_turns if t["actor"] == "policy")["behavior_logprobs"][0] = 0.0  # probability 1 is fine
    with LakeWriter(lake, handle_signals=False) as w:
        result = w.write_batch([ep, ok_ep], turns + ok_turns)
    (issue,) = [i for i in result.rejected["ep-bad"] if i.field == field]
    assert issue.episode_id == "ep-bad" and issue.turn_idx == policy_turn["turn_idx"] and message in issue.message
    assert list(result.rejected) == ["ep-bad"]
    rows = trajlake_ids(lake)
    assert rows == ["ep-ok"]  # nothing of the bad episode landed
    assert verify(open_lake(lake.root)).ok


@pytest.mark.parametrize(("change", "message"), [
    ({"token_ids": [5, 99, 100]}, "at or above the vocabulary size"),
    ({"token_ids": [5, 6, 7], "raw_content": "x" * 75}, "longer than its token ids can encode"),
])
def test_ids_a_stated_vocabulary_cannot_give_are_refused(tmp_path, change, message) -> None:
    """A tokenizer id that states its vocabulary (hf:, tokenizer-mode openai:, --tokenizer imports) bounds the
    ids: 100 is outside a 100-token vocabulary, and 3 ids of at most 8 bytes cannot encode 75 characters."""
    lake = open_lake(tmp_path / "lake", create=True)
    ep, turns = make_episode("ep-bad")
    policy_turn = next(t for t in turns if t["actor"] == "policy")
    policy_turn.update(change, tokenizer_id="tiny|tok:ab|tmpl:cd|vocab:100|maxbytes:7",
                       loss_mask=[1] * len(change["token_ids"]), behavior_logprobs=[-0.5] * len(change["token_ids"]),
                       tokens=len(change["token_ids"]))
    ok_ep, ok_turns = make_episode("ep-ok")
    ok_turn = next(t for t in ok_turns if t["actor"] == "policy")
    ok_turn.update(token_ids=[5, 99], raw_content="x" * 16, tokenizer_id="tiny|tok:ab|tmpl:cd|vocab:100|maxbytes:7",
                   loss_mask=[1, 1], behavior_logprobs=[-0.5] * 2, tokens=2)  # 16 bytes = 2 x (7 + 1): possible
    with LakeWriter(lake, handle_signals=False) as w:
        result = w.write_batch([ep, ok_ep], turns + ok_turns)
    assert list(result.rejected) == ["ep-bad"], result.rejected
    (issue,) = [i for i in result.rejected["ep-bad"] if message in i.message]
    assert issue.field == "token_ids" and issue.turn_idx == policy_turn["turn_idx"]
    assert trajlake_ids(lake) == ["ep-ok"]


def test_policy_tokenizer_ids_state_their_vocabulary_and_real_turns_pass(tmp_path) -> None:
    from trajlake.lake.values import tokenizer_limits
    from trajlake.policies.tiny import build_tiny_model
    from trajlake.render.chat import ChatRenderer

    transformers = pytest.importorskip("transformers")
    build_tiny_model(tmp_path / "tiny", layers=1)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "tiny")
    renderer = ChatRenderer(tok, "tiny")
    vocab, longest = tokenizer_limits(renderer.tokenizer_id)  # type: ignore[misc]
    assert vocab == len(tok) and longest == max(len(tok.decode([i]).encode()) for i in range(len(tok)))
    text = "\n" + " " * 40 + "<|im_end|>" * 3  # the longest tokens: the bound must hold for every real encoding
    ids = tok.encode(text, add_special_tokens=False)
    assert len(text.encode()) <= len(ids) * (longest + 1)


def trajlake_ids(lake: Lake) -> list[str]:
    from trajlake.query import connect

    return [r[0] for r in connect(open_lake(lake.root)).execute("select episode_id from episodes").fetchall()]


def test_verify_reports_impossible_numbers_written_before_the_check(tmp_path, monkeypatch) -> None:
    import trajlake.record.validate as validate

    lake = open_lake(tmp_path / "lake", create=True)
    ep, turns = make_episode("ep-old")
    policy_turn = next(t for t in turns if t["actor"] == "policy")
    policy_turn["behavior_logprobs"] = [*policy_turn["behavior_logprobs"][:-1], float("nan")]
    with monkeypatch.context() as m:  # a writer from before the check
        m.setattr(validate, "impossible_token_values", lambda turns: [])
        with LakeWriter(lake, handle_signals=False) as w:
            assert not w.write_batch([ep], turns).rejected
    report = verify(open_lake(lake.root))
    assert not report.ok
    assert any(f"episode ep-old turn {policy_turn['turn_idx']}: behavior_logprobs: a log-probability is NaN" in p
               for p in report.problems), report.problems
