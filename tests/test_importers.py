"""Importers (docs/importers.md): every real sample file, synthetic edge cases, and --tokenizer.

Expected values are computed in the tests by reading the source files independently, never from the
importers' own code paths.
"""

from __future__ import annotations

import datetime as dt
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import trajlake
from trajlake import LakeWriter, TrajlakeError, ValidationError
from trajlake.io.importers import FORMATS, default_run_id, import_file
from trajlake.io.importers.swe_agent import EXIT_STATUS, map_exit_status
from trajlake.io.jsonl import IngestSummary

# ../shared/samples next to the checkout (worktrees sit one level deeper: the nearest one up the tree)
SAMPLES = next((p / "shared" / "samples" for p in Path(__file__).parents[1:] if (p / "shared" / "samples").is_dir()),
               Path(__file__).parents[2] / "shared" / "samples")
needs_samples = pytest.mark.skipif(not SAMPLES.is_dir(), reason=f"sample files not found at {SAMPLES}")

# Every file in ../shared/samples and its importer (None: no importer; AgentLab summaries are not trajectories).
SAMPLE_FORMATS: dict[str, str | None] = {
    "swe_agent_function_calling_simple.traj": "swe-agent",
    "swe_agent_pydicom-1458.traj": "swe-agent",
    "inspect_log_streaming.eval": "inspect",
    "inspect_browser.json": "inspect",
    "openhands_output_1.jsonl": "openhands",
    "agentlab_summary_info.json": None,
}


def _import(lake: trajlake.Lake, path: Path, fmt: str, **kw: Any) -> IngestSummary:
    with LakeWriter(lake, handle_signals=False) as w:
        return import_file(w, path, fmt, **kw)


def _q(lake: trajlake.Lake, sql: str) -> list[tuple[Any, ...]]:
    return trajlake.connect(lake).sql(sql).fetchall()


def _records(lake: trajlake.Lake, sql: str) -> list[dict[str, Any]]:
    rel = trajlake.connect(lake).sql(sql)
    return [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]


def _episodes(lake: trajlake.Lake, where: str = "true") -> list[dict[str, Any]]:
    return _records(lake, f"select * from episodes where {where} order by episode_id")


def _turns(lake: trajlake.Lake, episode_id: str) -> list[dict[str, Any]]:
    return _records(lake, f"select * from turns where episode_id = '{episode_id}' order by turn_idx")


def _n(lake: trajlake.Lake, table: str) -> int:
    return int(_q(lake, f"select count(*) from {table}")[0][0])


def _utc(s: str) -> dt.datetime:
    ts = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    return (ts if ts.tzinfo else ts.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


def _file_episode(lake: trajlake.Lake, name: str) -> list[dict[str, Any]]:
    import hashlib

    h = hashlib.sha256((SAMPLES / name).read_bytes()).hexdigest()
    return _episodes(lake, f"source_file_hash = '{h}'")


# --- the real samples ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sample_lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[trajlake.Lake, dict[str, IngestSummary]]]:
    if not SAMPLES.is_dir():
        pytest.skip(f"sample files not found at {SAMPLES}")
    lake = trajlake.open_lake(tmp_path_factory.mktemp("samples") / "lake", create=True)
    summaries = {}
    with LakeWriter(lake, handle_signals=False) as w:
        for name, fmt in SAMPLE_FORMATS.items():
            if fmt is not None:
                summaries[name] = import_file(w, SAMPLES / name, fmt)
    yield lake, summaries


@needs_samples
def test_every_sample_file_has_a_format() -> None:
    present = {p.name for p in SAMPLES.iterdir() if p.is_file() and p.name != "README.md"}
    assert present == set(SAMPLE_FORMATS), "a new sample file needs an entry (and a test) here"
    assert {f for f in SAMPLE_FORMATS.values() if f} <= set(FORMATS)


@needs_samples
def test_samples_verify_and_reimport_is_a_noop(sample_lake: tuple[trajlake.Lake, dict[str, IngestSummary]]) -> None:
    lake, summaries = sample_lake
    assert all(not s.rejected for s in summaries.values())
    total = sum(s.episodes_written for s in summaries.values())
    assert _n(lake, "episodes") == total == 1 + 1 + 4 + 1 + 1
    assert _n(lake, "runs") == 5
    rep = trajlake.verify(lake, strict=True)
    assert rep.ok, rep.problems
    versions = lake.versions()
    for name, fmt in SAMPLE_FORMATS.items():
        if fmt is None:
            continue
        again = _import(lake, SAMPLES / name, fmt)
        assert again.episodes_written == 0 and again.duplicates == summaries[name].episodes_written, name
        assert again.runs_written == 0 and again.tasks_written == 0 and not again.rejected
    assert lake.versions() == versions  # nothing was committed
    assert trajlake.verify(lake, strict=True).ok


def _tool_calls_in(messages: list[dict[str, Any]]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages)


@needs_samples
def test_swe_agent_history_only_layout(sample_lake: tuple[trajlake.Lake, dict[str, IngestSummary]]) -> None:
    lake, _ = sample_lake
    doc = json.loads((SAMPLES / "swe_agent_function_calling_simple.traj").read_text())
    history = doc["history"]
    (ep,) = _file_episode(lake, "swe_agent_function_calling_simple.traj")
    turns = _turns(lake, ep["episode_id"])
    calls = _tool_calls_in(history)
    assert ep["n_turns"] == len(turns) == len(history) + sum(max(0, len(m.get("tool_calls") or []) - 1)
                                                                for m in history)
    assert ep["source_format"] == "swe-agent" and ep["source_format_version"] == "history"
    # no info.exit_status: the last action is `submit`, so the run finished by submitting
    assert history[-2]["action"] == "submit" and "info" not in doc
    assert (ep["terminated"], ep["truncated"], ep["termination_reason"]) == (True, False, "submitted")
    assert ep["cost_usd"] is None and ep["tokens_in"] == 0  # no model_stats: no cost data
    policy = [t for t in turns if t["actor"] == "policy"]
    tool = [t for t in turns if t["role"] == "tool"]
    assert sum(1 for t in policy if t["tool_call_id"]) == calls == 5
    assert len(tool) == sum(1 for m in history if m["role"] == "tool")
    for t, m in zip(policy, [m for m in history if m["role"] == "assistant"], strict=True):
        call = m["tool_calls"][0]
        assert t["tool_call_id"] == call["id"] and t["action_schema"] == call["function"]["name"]
        assert json.loads(t["tool_args"]) == json.loads(call["function"]["arguments"])
        assert t["raw_content"] == m["content"] and t["loss_mask"] is None and t["token_ids"] is None
    for t, m in zip(tool, [m for m in history if m["role"] == "tool"], strict=True):
        assert t["actor"] == "env" and t["tool_call_id"] == m["tool_call_ids"][0] and t["raw_content"] == m["content"]
    assert [t["role"] for t in turns[:2]] == ["system", "user"]


@needs_samples
def test_swe_agent_trajectory_layout(sample_lake: tuple[trajlake.Lake, dict[str, IngestSummary]]) -> None:
    lake, _ = sample_lake
    doc = json.loads((SAMPLES / "swe_agent_pydicom-1458.traj").read_text())
    history, trajectory, info = doc["history"], doc["trajectory"], doc["info"]
    (ep,) = _file_episode(lake, "swe_agent_pydicom-1458.traj")
    turns = _turns(lake, ep["episode_id"])
    steps = [m for m in history if m["role"] == "assistant" and not m.get("is_demo")]
    # the history was saved before the last observation: it is taken from the trajectory
    missing = 1 if history[-1]["role"] == "assistant" else 0
    assert ep["n_turns"] == len(turns) == len(history) + missing
    assert turns[-1]["role"] == "tool" and turns[-1]["raw_content"] == trajectory[-1]["observation"]
    assert len(steps) == len(trajectory) == info["model_stats"]["api_calls"]
    assert sum(1 for t in turns if t["actor"] == "policy") == len(steps)
    assert sum(1 for t in turns if t["role"] == "tool") == len(trajectory)
    assert info["exit_status"] == "submitted"
    assert (ep["terminated"], ep["truncated"], ep["termination_reason"], ep["error_class"]) == (
        True, False, "submitted", None)
    assert ep["cost_usd"] == pytest.approx(info["model_stats"]["instance_cost"])
    assert ep["tokens_in"] == info["model_stats"]["tokens_sent"]
    assert ep["tokens_out"] == info["model_stats"]["tokens_received"]
    assert ep["success"] is None and ep["reward_components"] in ([], {})  # .traj files are not graded
    assert ep["verification_source"] is None
    demo = [t for t, m in zip(turns, history, strict=False) if m.get("is_demo")]
    assert demo and all(t["actor"] == "system" for t in demo)
    for t, m in zip([t for t in turns if t["actor"] == "policy"], steps, strict=True):
        assert t["action_schema"] == m["action"].split()[0] and json.loads(t["tool_args"]) == {"command": m["action"]}


@needs_samples
def test_inspect_eval_zip(sample_lake: tuple[trajlake.Lake, dict[str, IngestSummary]]) -> None:
    lake, _ = sample_lake
    path = SAMPLES / "inspect_log_streaming.eval"
    with zipfile.ZipFile(path) as z:
        header = json.loads(z.read("header.json"))
        samples = [json.loads(z.read(n)) for n in z.namelist() if n.startswith("samples/")]
    eps = {(e["task_id"], e["attempt"]): e for e in _file_episode(lake, "inspect_log_streaming.eval")}
    assert len(eps) == len(samples) == header["results"]["total_samples"] == 4
    letter = {"C": 1.0, "I": 0.0}
    for s in samples:
        ep = eps[(f"{header['eval']['task']}/{s['id']}", s["epoch"] - 1)]
        turns = _turns(lake, ep["episode_id"])
        assert len(turns) == ep["n_turns"] == len(s["messages"]) + sum(
            max(0, len(m.get("tool_calls") or []) - 1) for m in s["messages"])
        assert [t["role"] for t in turns] == [m["role"] for m in s["messages"]]
        assert [t["raw_content"] for t in turns] == [m["content"] for m in s["messages"]]
        value = letter[s["scores"]["match"]["value"]]
        assert dict(ep["reward_components"]) == {"match": value} and ep["reward_total"] == value
        assert ep["success"] == (value == 1.0)
        assert ep["termination_reason"] == ("success" if value == 1.0 else "submitted") and ep["terminated"]
        usage = next(iter(s["model_usage"].values()))
        assert (ep["tokens_in"], ep["tokens_out"]) == (usage["input_tokens"], usage["output_tokens"])
        assert ep["env_version"] == str(header["eval"]["task_version"])
        assert ep["policy_version_start"] == header["eval"]["model"]
        assert ep["started_at"] == _utc(s["events"][0]["timestamp"])
    # the header's accuracy is the mean of the episodes' rewards
    acc = header["results"]["scores"][0]["metrics"]["accuracy"]["value"]
    assert sum(e["reward_total"] for e in eps.values()) / len(eps) == pytest.approx(acc)


@needs_samples
def test_inspect_json_log(sample_lake: tuple[trajlake.Lake, dict[str, IngestSummary]]) -> None:
    lake, _ = sample_lake
    doc = json.loads((SAMPLES / "inspect_browser.json").read_text())
    (s,) = doc["samples"]
    (ep,) = _file_episode(lake, "inspect_browser.json")
    turns = _turns(lake, ep["episode_id"])
    calls = [c for m in s["messages"] for c in (m.get("tool_calls") or [])]
    assert len(turns) == len(s["messages"]) and len(calls) == 4
    call_turns = [t for t in turns if t["actor"] == "policy" and t["tool_call_id"]]
    assert [t["tool_call_id"] for t in call_turns] == [c["id"] for c in calls]
    assert all(json.loads(t["tool_args"]) == c["arguments"] for t, c in
               zip([t for t in turns if t["tool_call_id"] and t["actor"] == "policy"], calls, strict=True))
    # assistant messages with tool calls and empty content keep their (empty) text
    assert [t["raw_content"] for t in turns if t["actor"] == "policy"][:4] == ["", "", "", ""]
    tool_events = {e["id"]: e for e in s["events"] if e["event"] == "tool"}
    for t in turns:
        if t["role"] == "tool":
            ev = tool_events[t["tool_call_id"]]
            assert t["tool_seconds"] == pytest.approx(ev["working_time"])
            assert t["started_at"] == _utc(ev["timestamp"]) and t["ended_at"] == _utc(ev["completed"])
            assert t["action_schema"] == ev["function"] and t["actor"] == "env"
    model_events = [e for e in s["events"] if e["event"] == "model"]
    policy = [t for t in turns if t["actor"] == "policy"]
    assert [t["tokens"] for t in policy] == [e["output"]["usage"]["output_tokens"] for e in model_events]
    assert [t["latency_ms"] for t in policy] == pytest.approx([e["output"]["time"] * 1000 for e in model_events])
    usage = s["model_usage"]["openai/gpt-4o-mini"]
    assert (ep["tokens_in"], ep["tokens_out"]) == (usage["input_tokens"], usage["output_tokens"])
    assert dict(ep["reward_components"]) == {"includes": 1.0} and ep["success"] is True
    assert (ep["terminated"], ep["termination_reason"], ep["sandbox"]) == (True, "success", "docker")
    assert ep["started_at"] == _utc(s["events"][0]["timestamp"])
    assert ep["tool_seconds"] == pytest.approx(sum(e["working_time"] for e in tool_events.values()))
    assert ep["source_format_version"] == str(doc["version"])
    run = _q(lake, f"select created_at, policy_name, code_version from runs where run_id = '{ep['run_id']}'")[0]
    assert run == (_utc(doc["eval"]["created"]), doc["eval"]["model"], doc["eval"]["revision"]["commit"])


@needs_samples
def test_openhands_output(sample_lake: tuple[trajlake.Lake, dict[str, IngestSummary]]) -> None:
    lake, _ = sample_lake
    line = json.loads((SAMPLES / "openhands_output_1.jsonl").read_text().splitlines()[0])
    history, metrics = line["history"], line["metrics"]
    (ep,) = _file_episode(lake, "openhands_output_1.jsonl")
    turns = _turns(lake, ep["episode_id"])
    kept = [e for e in history if e.get("action") not in ("recall", "change_agent_state")
            and e.get("observation") not in ("agent_state_changed", "null")]
    actions = [e for e in kept if "action" in e and e["source"] == "agent" and e["action"] != "system"]
    observations = [e for e in kept if "observation" in e and "tool_call_metadata" in e]
    assert len(turns) == ep["n_turns"] == len(kept) == 48
    assert sum(1 for t in turns if t["actor"] == "policy") == len(actions)
    assert sum(1 for t in turns if t["actor"] == "policy" and t["tool_call_id"]) == len(
        [a for a in actions if "tool_call_metadata" in a]) == 23
    assert sum(1 for t in turns if t["role"] == "tool") == len(observations)
    assert ep["task_id"] == line["instance_id"] and ep["error_class"] is None and line["error"] is None
    assert (ep["terminated"], ep["termination_reason"]) == (True, "submitted")
    assert ep["cost_usd"] == metrics["accumulated_cost"]
    assert ep["tokens_in"] == metrics["accumulated_token_usage"]["prompt_tokens"]
    assert ep["tokens_out"] == metrics["accumulated_token_usage"]["completion_tokens"]
    policy = [t for t in turns if t["actor"] == "policy"]
    assert sum(t["tokens"] for t in policy) == sum(u["completion_tokens"] for u in metrics["token_usages"])
    assert sum(t["prompt_tokens"] or 0 for t in policy) == sum(u["prompt_tokens"] for u in metrics["token_usages"])
    assert sum(t["latency_ms"] for t in policy) == pytest.approx(
        sum(r["latency"] for r in metrics["response_latencies"]) * 1000)
    assert ep["started_at"] == _utc(history[0]["timestamp"]) and ep["ended_at"] == _utc(history[-1]["timestamp"])
    system = next(e for e in history if e.get("action") == "system")
    assert ep["env_version"] == system["args"]["openhands_version"]
    assert ep["policy_version_start"] == line["metadata"]["llm_config"]["model"]
    for t in turns:  # every observation links to the call it answers
        if t["role"] == "tool":
            assert t["tool_call_id"] in {p["tool_call_id"] for p in policy}
    call = next(a for a in actions if "tool_call_metadata" in a)
    raw_args = call["tool_call_metadata"]["model_response"]["choices"][0]["message"]["tool_calls"][0]
    first_call = next(t for t in policy if t["tool_call_id"])
    assert json.loads(first_call["tool_args"]) == json.loads(raw_args["function"]["arguments"])
    task = _q(lake, f"select statement, provenance from tasks where task_id = '{line['instance_id']}'")[0]
    assert task[0] == line["instance"]["problem_statement"] and task[1]["commit"] == line["instance"]["base_commit"]


# --- openai-chat and synthetic edge cases ---------------------------------------------------------------------

def _jsonl(path: Path, *objs: Any, raw: list[str] | None = None) -> Path:
    lines = [json.dumps(o) for o in objs] + (raw or [])
    path.write_text("\n".join(lines) + "\n")
    return path


def _chat(**extra: Any) -> dict[str, Any]:
    args = json.dumps({"expr": "2+2"})
    return {"model": "gpt-test", "messages": [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "tool_calls": [  # no content key at all, arguments encoded twice
            {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "assistant", "content": None, "tool_calls": [  # parallel calls, null content, bad JSON
            {"id": "c2", "type": "function", "function": {"name": "calc", "arguments": "{\"expr\": 1"}},
            {"id": "c3", "type": "function", "function": {"name": "note", "arguments": {"text": "done"}}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "error"},
        {"role": "tool", "tool_call_id": "c3", "content": "ok"},
        {"role": "assistant", "content": "It is four.", "weight": 1},
    ], **extra}


def test_openai_chat_edge_cases(lake: trajlake.Lake, tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "chat.jsonl", _chat(), {"messages": [{"role": "user", "content": "hi"},
                                                                  {"role": "assistant", "content": "hello"},
                                                                  {"role": "user", "content": "bye"}]})
    s = _import(lake, path, "openai-chat")
    assert s.episodes_written == 2 and s.runs_written == 1 and s.tasks_written == 2
    e1, e2 = sorted(_episodes(lake), key=lambda e: e["n_turns"], reverse=True)
    turns = _turns(lake, e1["episode_id"])
    msgs = _chat()["messages"]
    assert len(turns) == len(msgs) + 1 == 9  # the message with two calls becomes two turns
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "tool", "assistant", "assistant", "tool",
                                          "tool", "assistant"]
    call = turns[2]
    assert call["raw_content"] is None and call["tool_args"] == '{"expr":"2+2"}' and call["status"] == "OK"
    assert (call["action_schema"], call["tool_call_id"], call["actor"]) == ("calc", "c1", "policy")
    assert turns[3]["action_schema"] == "calc" and turns[3]["actor"] == "env" and turns[3]["raw_content"] == "4"
    bad, second = turns[4], turns[5]
    assert bad["status"] == "MODEL_INVALID_ACTION" and json.loads(bad["tool_args"]) == "{\"expr\": 1"
    assert second["tool_args"] == '{"text":"done"}' and second["raw_content"] is None
    assert turns[7]["action_schema"] == "note" and turns[7]["tool_call_id"] == "c3"
    assert e1["policy_version_start"] == "gpt-test" and e1["n_policy_tokens"] == 0
    assert all(t["token_ids"] is None and t["loss_mask"] is None for t in turns)
    assert (e1["terminated"], e1["termination_reason"]) == (True, "submitted")
    # a conversation that stops after a user turn was cut, not finished
    assert (e2["truncated"], e2["termination_reason"]) == (True, "budget_steps")
    assert all(e["split"] == "unknown" and e["env_id"] == "import/openai-chat" for e in (e1, e2))
    assert trajlake.verify(lake, strict=True).ok


def test_episode_ids_are_deterministic(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "chat.jsonl", _chat())
    ids = []
    for name in ("a", "b"):
        lk = trajlake.open_lake(tmp_path / name, create=True)
        _import(lk, path, "openai-chat")
        ids.append([e["episode_id"] for e in _episodes(lk)])
        assert _q(lk, "select run_id from runs") == [(default_run_id("openai-chat", _sha(path)),)]
    assert ids[0] == ids[1] and len(ids[0]) == 1


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_broken_json_line_names_file_and_line_and_writes_nothing(lake: trajlake.Lake, tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", _chat(), raw=['{"messages": [', json.dumps(_chat())])
    before = lake.versions()
    with pytest.raises(ValidationError) as ei:
        _import(lake, path, "openai-chat")
    assert f"{path}:2" in str(ei.value) and "invalid JSON" in str(ei.value)
    assert lake.versions() == before and _n(lake, "episodes") == 0
    s = _import(lake, path, "openai-chat", skip_invalid=True)
    assert s.episodes_written == 2 and [i.source for i in s.rejected] == [f"{path}:2"]


def test_invalid_field_names_line_and_field(lake: trajlake.Lake, tmp_path: Path) -> None:
    bad = _chat()
    bad["messages"][1]["role"] = "robot"
    path = _jsonl(tmp_path / "bad.jsonl", _chat(), bad)
    with pytest.raises(ValidationError) as ei:
        _import(lake, path, "openai-chat")
    issue = ei.value.issues[0]
    assert issue.source == f"{path}:2" and issue.field == "messages[1].role" and "robot" in issue.message
    assert _n(lake, "episodes") == 0


def test_unknown_format_and_missing_file(lake: trajlake.Lake, tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "chat.jsonl", _chat())
    with pytest.raises(ValidationError, match="unknown import format 'langsmith'") as ei:
        _import(lake, path, "langsmith")
    assert str(path) in str(ei.value)
    with pytest.raises(ValidationError, match="no such file"):
        _import(lake, tmp_path / "nope.jsonl", "openai-chat")


def test_explicit_run_id_groups_files(lake: trajlake.Lake, tmp_path: Path) -> None:
    a = _jsonl(tmp_path / "a.jsonl", _chat())
    b = _jsonl(tmp_path / "b.jsonl", _chat(model="other-model"))
    assert _import(lake, a, "openai-chat", run_id="R").episodes_written == 1
    assert _import(lake, b, "openai-chat", run_id="R").episodes_written == 1
    assert _q(lake, "select run_id, label from runs") == [("R", None)]  # the first definition is kept
    assert _q(lake, "select distinct run_id from episodes") == [("R",)]
    assert _import(lake, b, "openai-chat", run_id="R").duplicates == 1


# --- inspect edge cases ---------------------------------------------------------------------------------------

def _inspect_header(**extra: Any) -> dict[str, Any]:
    return {"version": 2, "status": "success",
            "eval": {"task": "t", "task_version": 3, "model": "m/x", "created": "2025-01-02T03:04:05+00:00",
                     "config": {"message_limit": 10}},
            "plan": {}, "results": {"total_samples": 0, "completed_samples": 0}, **extra}


def _inspect_sample(sid: Any = 1, epoch: int = 1, **extra: Any) -> dict[str, Any]:
    return {"id": sid, "epoch": epoch, "input": "q?", "target": "a",
            "messages": [{"role": "user", "content": "q?"}, {"role": "assistant", "content": "a"}],
            "scores": {"s": {"value": "C"}}, "model_usage": {}, **extra}


def test_inspect_zero_samples_is_no_episodes(lake: trajlake.Lake, tmp_path: Path) -> None:
    js = tmp_path / "empty.json"
    js.write_text(json.dumps(_inspect_header(samples=[])))
    ev = tmp_path / "empty.eval"
    with zipfile.ZipFile(ev, "w") as z:
        z.writestr("header.json", json.dumps(_inspect_header()))
        z.writestr("_journal/start.json", json.dumps(_inspect_header()))
    no_samples_key = tmp_path / "nokey.json"
    no_samples_key.write_text(json.dumps(_inspect_header()))
    before = lake.versions()
    for p in (js, ev, no_samples_key):  # the same rule as an empty file of any format
        with pytest.raises(ValidationError, match="no episodes: the log has no samples") as ei:
            _import(lake, p, "inspect")
        assert ei.value.issues[0].source == str(p)
    assert lake.versions() == before


def test_inspect_error_limits_and_scores(lake: trajlake.Lake, tmp_path: Path) -> None:
    samples = [
        _inspect_sample(1, scores=None, error={"message": "sandbox died", "traceback": "..."}),
        _inspect_sample(2, limit={"type": "message", "limit": 10}, scores={"s": {"value": "I"}}),
        _inspect_sample(3, limit={"type": "operator", "limit": 1}),
        _inspect_sample(4, limit={"type": "cost", "limit": 1}),
        _inspect_sample(5, scores={"s": {"value": {"a": 1, "b": "P"}}, "t": {"value": "not a number"}}),
        _inspect_sample("x", epoch=2, scores={"s": {"value": 0.25}},
                        model_usage={"m/x": {"input_tokens": 7, "output_tokens": 3, "total_cost": 0.5}}),
    ]
    path = tmp_path / "log.json"
    path.write_text(json.dumps(_inspect_header(samples=samples)))
    assert _import(lake, path, "inspect").episodes_written == 6
    eps = {e["task_id"]: e for e in _episodes(lake)}
    e = eps["t/1"]
    assert (e["truncated"], e["termination_reason"], e["error_class"], e["success"]) == (
        True, "env_failure", "ENV_BUG", None)  # halted before any scorer ran: never graded
    assert dict(e["reward_components"]) == {} and e["reward_total"] == 0.0
    e = eps["t/2"]
    assert (e["truncated"], e["termination_reason"], e["error_class"]) == (True, "budget_steps", "BUDGET_EXHAUSTED")
    assert (eps["t/3"]["termination_reason"], eps["t/3"]["error_class"]) == ("safety_stop", None)
    assert eps["t/4"]["termination_reason"] == "budget_cost"
    assert dict(eps["t/5"]["reward_components"]) == {"s.a": 1.0, "s.b": 0.5} and eps["t/5"]["success"] is False
    e = eps["t/x"]
    assert (e["attempt"], e["reward_total"], e["tokens_in"], e["tokens_out"], e["cost_usd"]) == (1, 0.25, 7, 3, 0.5)
    assert e["env_version"] == "3" and e["started_at"] == _utc("2025-01-02T03:04:05Z")
    budget = _q(lake, "select budget from tasks where task_id = 't/1'")[0][0]
    assert budget["max_steps"] == 10
    assert trajlake.verify(lake, strict=True).ok


def test_inspect_unknown_limit_names_sample(lake: trajlake.Lake, tmp_path: Path) -> None:
    path = tmp_path / "log.eval"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("header.json", json.dumps(_inspect_header()))
        z.writestr("samples/1_epoch_1.json", json.dumps(_inspect_sample(1)))
        z.writestr("samples/7_epoch_1.json", json.dumps(_inspect_sample(7, limit={"type": "moon", "limit": 1})))
    with pytest.raises(ValidationError) as ei:
        _import(lake, path, "inspect")
    assert ei.value.issues[0].source == f"{path}:sample 7 epoch 1" and ei.value.issues[0].field == "limit.type"
    assert _n(lake, "episodes") == 0


def test_inspect_running_eval_uses_the_journal(lake: trajlake.Lake, tmp_path: Path) -> None:
    path = tmp_path / "running.eval"  # an eval still in progress has no header.json yet
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("_journal/start.json", json.dumps({k: v for k, v in _inspect_header().items() if k != "status"}))
        z.writestr("samples/a_b_epoch_2.json", json.dumps(_inspect_sample("a_b", epoch=2)))
    assert _import(lake, path, "inspect").episodes_written == 1
    (e,) = _episodes(lake)
    assert (e["task_id"], e["attempt"], e["success"], e["source_format_version"]) == ("t/a_b", 1, True, "2")


def test_inspect_not_a_log(lake: trajlake.Lake, tmp_path: Path) -> None:
    path = tmp_path / "x.eval"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("other.txt", "hi")
    with pytest.raises(ValidationError, match=r"header\.json"):
        _import(lake, path, "inspect")
    (tmp_path / "y.json").write_text("[1, 2]")
    with pytest.raises(ValidationError, match=r"y\.json"):
        _import(lake, tmp_path / "y.json", "inspect")


# --- swe-agent and openhands outcomes -------------------------------------------------------------------------

def test_swe_agent_exit_status_table() -> None:
    from trajlake.io.importers._common import Loc

    loc = Loc("f.traj")
    for status, outcome in EXIT_STATUS.items():
        assert map_exit_status(status, None, loc) == outcome
        assert map_exit_status(f"submitted ({status})", None, loc) == outcome
        term, trunc, reason, _ = outcome
        assert term != trunc and reason in ({"success", "submitted", "gave_up", "safety_stop"} if term else
                                            {"budget_steps", "budget_tokens", "budget_cost", "timeout",
                                             "env_failure", "safety_stop"})
    assert map_exit_status("exit_cost", None, loc)[2:] == ("budget_cost", "BUDGET_EXHAUSTED")
    assert map_exit_status("exit_context", None, loc)[2:] == ("budget_tokens", "BUDGET_EXHAUSTED")
    assert map_exit_status("exit_format", None, loc) == (True, False, "gave_up", "MODEL_INVALID_ACTION")
    assert map_exit_status(None, "submit", loc)[2] == "submitted"
    assert map_exit_status(None, "ls", loc)[:3] == (False, True, "env_failure")
    with pytest.raises(ValidationError, match=r"info\.exit_status"):
        map_exit_status("exit_moon", None, loc)


def _traj(exit_status: str | None) -> dict[str, Any]:
    return {"environment": "swe_main",
            "trajectory": [{"action": "ls\n", "observation": "a.py", "response": "look\n```\nls\n```",
                            "thought": "look", "state": "{}", "execution_time": 1.5}],
            "history": [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"},
                        {"role": "assistant", "content": "look\n```\nls\n```", "thought": "look", "action": "ls\n"},
                        {"role": "user", "content": "a.py"}],
            "info": {"exit_status": exit_status, "model_stats": {"instance_cost": 0.25, "tokens_sent": 10,
                                                                 "tokens_received": 2, "api_calls": 1}}}


def test_swe_agent_budget_exit_and_unknown_status(lake: trajlake.Lake, tmp_path: Path) -> None:
    path = tmp_path / "inst-1.traj"
    path.write_text(json.dumps(_traj("submitted (exit_cost)")))
    assert _import(lake, path, "swe-agent").episodes_written == 1
    (e,) = _episodes(lake)
    assert (e["truncated"], e["termination_reason"], e["error_class"]) == (True, "budget_cost", "BUDGET_EXHAUSTED")
    assert (e["task_id"], e["cost_usd"], e["n_turns"], e["tool_seconds"]) == ("inst-1", 0.25, 4, 1.5)
    bad = tmp_path / "bad.traj"
    bad.write_text(json.dumps(_traj("exit_moon")))
    with pytest.raises(ValidationError) as ei:
        _import(lake, bad, "swe-agent")
    assert str(bad) in str(ei.value) and "info.exit_status" in str(ei.value)
    (tmp_path / "x.traj").write_text('{"history": [')
    with pytest.raises(ValidationError, match="invalid JSON"):
        _import(lake, tmp_path / "x.traj", "swe-agent")


def test_openhands_error_and_resolved(lake: trajlake.Lake, tmp_path: Path) -> None:
    base = {"instance_id": "i-1", "instruction": "fix", "instance": {"problem_statement": "fix"},
            "metadata": {"llm_config": {"model": "m"}, "start_time": "2025-01-01 00:00:00", "max_iterations": 5},
            "history": [
                {"id": 0, "timestamp": "2025-01-01T00:00:01", "source": "user", "action": "message",
                 "args": {"content": "fix"}, "message": "fix"},
                {"id": 1, "timestamp": "2025-01-01T00:00:03", "source": "agent", "action": "run",
                 "args": {"command": "ls", "thought": "look"}, "message": "Running command: ls"},
                {"id": 2, "timestamp": "2025-01-01T00:00:04", "source": "agent", "observation": "run",
                 "cause": 1, "content": "a.py", "extras": {}, "message": "ran"}],
            "metrics": {"accumulated_cost": 0.5}, "error": None, "test_result": {"git_patch": ""}}
    cut = dict(base, instance_id="i-2",
               error="RuntimeError: Agent reached maximum iteration in headless mode. Current iteration: 5")
    solved = dict(base, instance_id="i-3", test_result={"git_patch": "x", "report": {"resolved": True}})
    path = _jsonl(tmp_path / "output.jsonl", base, cut, solved)
    assert _import(lake, path, "openhands").episodes_written == 3
    eps = {e["task_id"]: e for e in _episodes(lake)}
    assert (eps["i-1"]["terminated"], eps["i-1"]["termination_reason"]) == (True, "submitted")
    assert (eps["i-2"]["truncated"], eps["i-2"]["termination_reason"], eps["i-2"]["error_class"]) == (
        True, "budget_steps", "BUDGET_EXHAUSTED")
    assert (eps["i-3"]["termination_reason"], eps["i-3"]["success"]) == ("success", True)
    assert dict(eps["i-3"]["reward_components"]) == {"resolved": 1.0} and dict(eps["i-1"]["reward_components"]) == {}
    turns = _turns(lake, eps["i-1"]["episode_id"])
    assert [(t["role"], t["actor"]) for t in turns] == [("user", "user"), ("assistant", "policy"), ("tool", "env")]
    assert turns[1]["raw_content"] == "look" and json.loads(turns[1]["tool_args"]) == {"command": "ls"}
    assert turns[2]["action_schema"] == "run" and turns[2]["tool_seconds"] == 1.0
    assert eps["i-1"]["started_at"] == _utc("2025-01-01T00:00:01Z") and eps["i-1"]["cost_usd"] == 0.5


# --- --tokenizer ----------------------------------------------------------------------------------------------

def _train_tokenizer(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = ["You are a calculator.", "What is two plus two?", "It is four.", "hello world", "hel lo",
              '{"name":"calc","arguments":{"expr":"2+2"}} calc expr note text done error ok 4']
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_tokenizer_fills_token_ids_and_loss_masks(lake: trajlake.Lake, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    tok_path = _train_tokenizer(tmp_path)
    chat = _chat()
    chat["messages"][-1]["content"] = "It is four."
    chat["messages"].insert(2, {"role": "assistant", "content": "Let me see.", "weight": 0})
    path = _jsonl(tmp_path / "chat.jsonl", chat)
    assert _import(lake, path, "openai-chat", tokenizer=tok_path).episodes_written == 1
    (ep,) = _episodes(lake)
    turns = _turns(lake, ep["episode_id"])
    tok = Tokenizer.from_file(str(tok_path))
    assert all(t["token_ids"] is not None and len(t["token_ids"]) == len(t["loss_mask"]) == t["tokens"]
               for t in turns)
    assert all(t["tokenizer_id"].startswith("hf-tokenizers:") for t in turns)
    for t in turns:
        trainable = t["actor"] == "policy" and t["raw_content"] != "Let me see."
        assert set(t["loss_mask"]) <= ({1} if trainable else {0})
    assert ep["n_policy_tokens"] == sum(sum(t["loss_mask"]) for t in turns) > 0
    # prefix consistency: the concatenation of the turns' ids is the tokenization of the whole conversation
    texts = []
    for t in turns:
        text = t["raw_content"] or ""
        if t["role"] == "assistant" and t["tool_args"] is not None:
            call = f'{{"name":{json.dumps(t["action_schema"])},"arguments":{t["tool_args"]}}}'
            text = f"{text}\n{call}" if text else call
        texts.append(text)
        assert list(t["token_ids"]) == tok.encode(text, add_special_tokens=False).ids
    assert [i for t in turns for i in t["token_ids"]] == tok.encode("".join(texts), add_special_tokens=False).ids
    assert trajlake.verify(lake, strict=True).ok


def test_tokenizer_prefix_break_is_reported(lake: trajlake.Lake, tmp_path: Path) -> None:
    tok_path = _train_tokenizer(tmp_path)
    merged = {"messages": [{"role": "user", "content": "hel"}, {"role": "assistant", "content": "lo world"}]}
    path = _jsonl(tmp_path / "chat.jsonl", {"messages": [{"role": "user", "content": "hello "},
                                                         {"role": "assistant", "content": "world"}]}, merged)
    with pytest.raises(ValidationError) as ei:
        _import(lake, path, "openai-chat", tokenizer=tok_path)
    issue = ei.value.issues[0]
    assert issue.source == f"{path}:2" and issue.field == "token_ids" and issue.turn_idx == 0
    assert "prefix-consistency" in issue.message
    assert _n(lake, "episodes") == 0
    s = _import(lake, path, "openai-chat", tokenizer=tok_path, skip_invalid=True)
    assert s.episodes_written == 1 and len(s.rejected) == 1
    with pytest.raises(ValidationError, match="tokenizer"):
        _import(lake, path, "openai-chat", tokenizer=tmp_path / "missing.json")


def test_tokenizer_accepts_a_model_folder_or_says_what_it_expected(lake: trajlake.Lake, tmp_path: Path) -> None:
    # issue 27: a model folder (config.json, tokenizer.json, ...) used to fail with "tokenizer file does not exist"
    model = tmp_path / "model"
    model.mkdir()
    tok_path = _train_tokenizer(model)
    (model / "config.json").write_text("{}")
    path = _jsonl(tmp_path / "chat.jsonl", _chat())
    assert _import(lake, path, "openai-chat", tokenizer=model, run_id="folder").episodes_written == 1
    assert _import(lake, path, "openai-chat", tokenizer=tok_path, run_id="file").episodes_written == 1
    by_run = {e["run_id"]: _turns(lake, e["episode_id"]) for e in _episodes(lake)}
    assert [t["token_ids"] for t in by_run["folder"]] == [t["token_ids"] for t in by_run["file"]]
    assert {t["tokenizer_id"] for t in by_run["folder"]} == {t["tokenizer_id"] for t in by_run["file"]}
    empty = tmp_path / "empty"
    empty.mkdir()
    for bad, what in [(empty, "the folder has no tokenizer.json"), (tmp_path / "nope", "no such file or folder")]:
        with pytest.raises(ValidationError) as ei:
            _import(lake, path, "openai-chat", tokenizer=bad)
        (issue,) = ei.value.issues
        assert issue.source == str(bad) and issue.field == "token_ids"
        assert what in issue.message and "expected a tokenizer.json file" in issue.message
        assert "\n" not in str(ei.value)


# --- issue 8 section 3: shapes seen on real public logs -------------------------------------------------------

def _policy_model_events(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """The sample's model events outside scorer spans/steps, found by walking the log itself."""
    spans = {e["id"]: e for e in sample.get("events", []) if e["event"] == "span_begin"}
    out, in_step = [], 0
    for e in sample.get("events", []):
        if e["event"] == "step" and e.get("type") in ("scorer", "scorers"):
            in_step += 1 if e.get("action") == "begin" else -1
        if e["event"] != "model" or in_step:
            continue
        span, scorer = e.get("span_id"), False
        while span in spans:
            scorer = scorer or spans[span].get("type") in ("scorer", "scorers")
            span = spans[span].get("parent_id")
        if not scorer:
            out.append(e)
    return out


def _model_event(span: str | None, model: str, usage: tuple[int, int], msg_id: str | None = None,
                 served: str = "gpt-4o-mini-2024-07-18", cost: float | None = None) -> dict[str, Any]:
    u: dict[str, Any] = {"input_tokens": usage[0], "output_tokens": usage[1], "total_tokens": sum(usage)}
    if cost is not None:
        u["total_cost"] = cost
    e: dict[str, Any] = {"timestamp": "2025-01-02T03:04:06+00:00", "event": "model", "model": model,
                         "completed": "2025-01-02T03:04:07+00:00", "working_time": 1.0,
                         "output": {"model": served, "usage": u, "time": 1.0, "choices": [
                             {"message": {"id": msg_id, "role": "assistant", "content": "x"}}]}}
    if span is not None:
        e["span_id"] = span
    return e


def _graded_sample(sid: int, *, steps: bool = False) -> dict[str, Any]:
    """A sample of a model-graded eval as inspect writes it: the answer call (61/17 tokens), then the grader's
    call inside the scorer span (or between scorer step events in older logs); ``model_usage`` sums both."""
    policy = _model_event(None if steps else "gen", "openai/gpt-4o-mini", (61, 17), "m1", cost=0.001)
    grader = _model_event(None if steps else "sc", "openai/gpt-4o-mini", (259, 292), "g1", cost=0.01)
    if steps:
        events = [{"event": "step", "action": "begin", "type": "solver", "name": "generate"}, policy,
                  {"event": "step", "action": "end", "type": "solver", "name": "generate"},
                  {"event": "step", "action": "begin", "type": "scorer", "name": "model_graded_qa"}, grader,
                  {"event": "score", "score": {"value": "C"}},
                  {"event": "step", "action": "end", "type": "scorer", "name": "model_graded_qa"}]
    else:
        events = [{"event": "span_begin", "id": "gen", "span_id": "gen", "type": "solver", "name": "generate"},
                  policy, {"event": "span_end", "id": "gen", "span_id": "gen"},
                  {"event": "span_begin", "id": "sc", "span_id": "sc", "type": "scorer", "name": "model_graded_qa"},
                  {"event": "span_begin", "id": "inner", "span_id": "inner", "parent_id": "sc", "type": "model"},
                  dict(grader, span_id="inner"), {"event": "span_end", "id": "inner", "span_id": "inner"},
                  {"event": "score", "span_id": "sc", "score": {"value": "C"}},
                  {"event": "span_end", "id": "sc", "span_id": "sc"}]
    for e in events:
        e.setdefault("timestamp", "2025-01-02T03:04:06+00:00")
    return _inspect_sample(sid, messages=[
        {"role": "user", "content": "q?"},
        {"id": "m1", "role": "assistant", "content": "a", "model": "gpt-4o-mini-2024-07-18"}],
        events=events, scores={"model_graded_qa": {"value": "C"}},
        model_usage={"openai/gpt-4o-mini": {"input_tokens": 320, "output_tokens": 309, "total_tokens": 629,
                                            "total_cost": 0.011}})


def test_inspect_tokens_are_the_policy_models_not_the_graders(lake: trajlake.Lake, tmp_path: Path) -> None:
    header = _inspect_header()
    header["eval"]["model"] = "openai/gpt-4o-mini"
    samples = [_graded_sample(1), _graded_sample(2, steps=True)]
    path = tmp_path / "graded.json"
    path.write_text(json.dumps(dict(header, samples=samples)))
    assert _import(lake, path, "inspect").episodes_written == 2
    eps = {e["task_id"]: e for e in _episodes(lake)}
    grader_total = {"input_tokens": 0, "output_tokens": 0, "total_cost": 0.0}
    for s in samples:
        e = eps[f"t/{s['id']}"]
        policy = _policy_model_events(s)
        assert len(policy) == 1 and (sum(s["model_usage"]["openai/gpt-4o-mini"][k] for k in ("input_tokens",
                                                                                             "output_tokens"))
                                     == 629)
        assert (e["tokens_in"], e["tokens_out"]) == (
            sum(p["output"]["usage"]["input_tokens"] for p in policy),
            sum(p["output"]["usage"]["output_tokens"] for p in policy)) == (61, 17)
        assert e["cost_usd"] == pytest.approx(sum(p["output"]["usage"]["total_cost"] for p in policy))
        grader = [ev for ev in s["events"] if ev["event"] == "model" and ev not in policy]
        for k in grader_total:
            grader_total[k] += sum(g["output"]["usage"][k] for g in grader)
        turns = _turns(lake, e["episode_id"])
        # matched to the answer call: its output tokens and the context it was given
        assert [(t["tokens"], t["prompt_tokens"]) for t in turns if t["actor"] == "policy"] == [(17, 61)]
        assert e["verification_source"] == "scorer:model_graded_qa" and e["success"] is True
    (config,) = _q(lake, "select config from runs")[0]
    assert json.loads(config)["grader_usage"] == {"openai/gpt-4o-mini": pytest.approx(grader_total)}


def test_inspect_requested_model_is_the_policy_served_version_apart(lake: trajlake.Lake, tmp_path: Path) -> None:
    header = _inspect_header()
    header["eval"]["model"] = "openai/gpt-4o-mini"
    path = tmp_path / "log.json"
    path.write_text(json.dumps(dict(header, samples=[_graded_sample(1)])))
    _import(lake, path, "inspect")
    (e,) = _episodes(lake)
    (run,) = _records(lake, "select policy_name, policy_version from runs")
    assert run == {"policy_name": "openai/gpt-4o-mini", "policy_version": "openai/gpt-4o-mini"}
    assert e["policy_version_start"] == e["policy_version_end"] == run["policy_name"]
    assert e["served_model"] == "gpt-4o-mini-2024-07-18"
    assert {t["policy_version"] for t in _turns(lake, e["episode_id"]) if t["actor"] == "policy"} == {
        "openai/gpt-4o-mini"}


@needs_samples
def test_inspect_sample_model_names(sample_lake: tuple[trajlake.Lake, dict[str, IngestSummary]]) -> None:
    lake, _ = sample_lake
    doc = json.loads((SAMPLES / "inspect_browser.json").read_text())
    (s,) = doc["samples"]
    (ep,) = _file_episode(lake, "inspect_browser.json")
    served = {m["model"] for m in s["messages"] if m["role"] == "assistant"}
    assert served == {"gpt-4o-mini-2024-07-18"} and doc["eval"]["model"] == "openai/gpt-4o-mini"
    assert ep["policy_version_start"] == ep["policy_version_end"] == doc["eval"]["model"]
    assert ep["served_model"] == next(iter(served))
    policy = _policy_model_events(s)
    assert (ep["tokens_in"], ep["tokens_out"]) == (sum(e["output"]["usage"]["input_tokens"] for e in policy),
                                                   sum(e["output"]["usage"]["output_tokens"] for e in policy))
    assert ep["verification_source"] == "scorer:includes"
    # no total_cost anywhere in the log: no cost data, not a cost of 0
    assert "total_cost" not in json.dumps(s["model_usage"]) and ep["cost_usd"] is None
    with zipfile.ZipFile(SAMPLES / "inspect_log_streaming.eval") as z:
        header = json.loads(z.read("header.json"))
        sample = json.loads(z.read("samples/1_epoch_1.json"))
    for e in _file_episode(lake, "inspect_log_streaming.eval"):
        assert e["policy_version_start"] == header["eval"]["model"]
        (call,) = _policy_model_events(sample)
        assert e["served_model"] == call["output"]["model"] == "Meta-Llama-3-405B-Instruct"


def _tool_results(line: dict[str, Any]) -> list[dict[str, Any]]:
    """Observations answering an action of the agent (by tool call metadata or ``cause``)."""
    actions = {e["id"] for e in line["history"] if "action" in e}
    return [e for e in line["history"] if "observation" in e
            and ("tool_call_metadata" in e or e.get("cause") in actions)
            and e["observation"] not in ("agent_state_changed", "null", "recall")]


@needs_samples
def test_openhands_sample_error_results_and_editor_views(
        sample_lake: tuple[trajlake.Lake, dict[str, IngestSummary]]) -> None:
    lake, _ = sample_lake
    line = json.loads((SAMPLES / "openhands_output_1.jsonl").read_text().splitlines()[0])
    (ep,) = _file_episode(lake, "openhands_output_1.jsonl")
    turns = _turns(lake, ep["episode_id"])
    errors = [o for o in _tool_results(line) if o["content"].startswith("ERROR:")]
    assert len(errors) == 1  # the source's own count: one failed str_replace
    bad = [t for t in turns if t["role"] == "tool" and t["status"] != "OK"]
    assert [t["raw_content"] for t in bad] == [o["content"] for o in errors]
    assert {t["status"] for t in bad} == {"MODEL_INVALID_ACTION"}
    # str_replace_editor calls are named by their command: views are reads, str_replace an edit
    commands = []
    for e in line["history"]:
        tcm = e.get("tool_call_metadata")
        if "action" in e and tcm and tcm["function_name"] == "str_replace_editor":
            (call,) = tcm["model_response"]["choices"][0]["message"]["tool_calls"]
            commands.append((call["id"], json.loads(call["function"]["arguments"])["command"]))
    assert [c for _, c in commands].count("view") == 6 and [c for _, c in commands].count("str_replace") == 2
    by_call = {t["tool_call_id"]: t for t in turns if t["actor"] == "policy" and t["tool_call_id"]}
    assert [by_call[cid]["action_schema"] for cid, _ in commands] == [c for _, c in commands]
    for t in turns:  # the observation carries the action name of the call it answers
        if t["role"] == "tool" and t["tool_call_id"] in dict(commands):
            assert t["action_schema"] == dict(commands)[t["tool_call_id"]]
    # no test_result report: never graded, no verification source
    assert "report" not in line["test_result"] and ep["success"] is None and ep["verification_source"] is None


def _oh_call(eid: int, name: str, args: dict[str, Any], action: str, ts: int) -> dict[str, Any]:
    cid = f"call_{eid}"
    return {"id": eid, "timestamp": f"2025-01-01T00:00:{ts:02d}", "source": "agent", "action": action,
            "args": dict(args, thought=""), "message": action,
            "tool_call_metadata": {"function_name": name, "tool_call_id": cid, "model_response": {
                "id": f"r{eid}", "choices": [{"message": {"content": "", "tool_calls": [
                    {"id": cid, "function": {"name": name, "arguments": json.dumps(args)}}]}}]}}}


def _oh_obs(eid: int, cause: int, name: str, content: str, observation: str, ts: int) -> dict[str, Any]:
    return {"id": eid, "timestamp": f"2025-01-01T00:00:{ts:02d}", "source": "agent", "observation": observation,
            "cause": cause, "content": content, "message": "",
            "tool_call_metadata": {"function_name": name, "tool_call_id": f"call_{cause}"}}


def _oh_line(iid: str, history: list[dict[str, Any]], resolved: bool | None = False) -> dict[str, Any]:
    line: dict[str, Any] = {
        "instance_id": iid, "instruction": "Fix the parser.", "instance": {"problem_statement": "Fix the parser."},
        "metadata": {"llm_config": {"model": "m"}, "start_time": "2025-01-01 00:00:00"},
        "history": [{"id": 0, "timestamp": "2025-01-01T00:00:00", "source": "user", "action": "message",
                     "args": {"content": "Fix the parser."}, "message": "Fix the parser."}, *history],
        "metrics": {"accumulated_cost": 0.25}, "error": None, "test_result": {"git_patch": ""}}
    if resolved is not None:
        line["test_result"]["report"] = {"resolved": resolved}
    return line


def test_openhands_error_results_and_invalid_parameters(lake: trajlake.Lake, tmp_path: Path) -> None:
    path_a = "/repo/src/parser.c"
    editor = "str_replace_editor"
    first = [
        _oh_call(1, editor, {"command": "view", "path": "/repo/nope.c"}, "read", 1),
        _oh_obs(2, 1, editor, "ERROR:\nInvalid `path` parameter: /repo/nope.c. The path does not exist.", "read", 2),
        _oh_call(3, editor, {"command": "str_replace", "path": path_a, "old_str": "x", "new_str": "y"}, "edit", 3),
        _oh_obs(4, 3, editor, "ERROR:\nNo replacement was performed, old_str `x` did not appear verbatim.", "edit", 4),
        _oh_call(5, "execute_bash", {"command": "make"}, "run", 5),
        _oh_obs(6, 5, "execute_bash", "ERROR: Cannot execute multiple commands at once.", "run", 6),
        _oh_call(7, "execute_bash", {"command": "ls"}, "run", 7),
        _oh_obs(8, 7, "execute_bash", "parser.c  ERROR: not at the start", "run", 8),
        # OpenHands could not turn the model's call into an action: an error observation tied to no action
        {"id": 9, "timestamp": "2025-01-01T00:00:09", "source": "agent", "observation": "error", "message": "",
         "content": "Parameter 'command' is expected to be one of ['view', 'create', 'str_replace', 'insert', "
                    "'undo_edit']."},
        {"id": 10, "timestamp": "2025-01-01T00:00:10", "source": "environment", "observation": "error",
         "message": "", "content": "Runtime disconnected: the sandbox container exited."},
    ]
    second = [
        _oh_call(1, editor, {"command": "create", "path": "/repo/x.c", "file_text": ""}, "edit", 1),
        _oh_obs(2, 1, editor, "ERROR:\nInvalid `path` parameter: /repo/x.c. File already exists.", "edit", 2),
    ]
    lines = [_oh_line("i-1", first), _oh_line("i-2", second)]
    path = _jsonl(tmp_path / "output.jsonl", *lines)
    assert _import(lake, path, "openhands").episodes_written == 2
    for line in lines:
        (ep,) = _episodes(lake, f"task_id = '{line['instance_id']}'")
        turns = _turns(lake, ep["episode_id"])
        results = _tool_results(line)
        errors = [o["content"] for o in results if o["content"].startswith("ERROR:")]
        tool_turns = [t for t in turns if t["role"] == "tool"]
        assert len(tool_turns) == len(results)
        assert [t["raw_content"] for t in tool_turns if t["status"] == "MODEL_INVALID_ACTION"] == errors
        assert all(t["status"] == "OK" for t in tool_turns if t["raw_content"] not in errors)
    (ep,) = _episodes(lake, "task_id = 'i-1'")
    env = [t for t in _turns(lake, ep["episode_id"]) if t["role"] == "env"]
    assert [(t["raw_content"][:9], t["status"]) for t in env] == [
        ("Parameter", "MODEL_INVALID_ACTION"), ("Runtime d", "ENV_BUG")]
    n_errors = sum(1 for line in lines for o in _tool_results(line) if o["content"].startswith("ERROR:"))
    (n,) = _q(lake, "select count(*) from turns where role = 'tool' and status = 'MODEL_INVALID_ACTION'")[0]
    assert n == n_errors == 4


def test_openhands_editor_view_is_not_an_unobserved_edit(lake: trajlake.Lake, tmp_path: Path) -> None:
    from trajlake.evaluators.data import load

    editor, path_a = "str_replace_editor", "/repo/src/parser.c"
    tested = [_oh_call(1, "execute_bash", {"command": "python -m pytest"}, "run", 1),
              _oh_obs(2, 1, "execute_bash", "1 failed", "run", 2)]
    viewed_first = [*tested,
                    _oh_call(3, editor, {"command": "view", "path": path_a}, "read", 3),
                    _oh_obs(4, 3, editor, "     1\tint main;", "read", 4),
                    _oh_call(5, editor, {"command": "str_replace", "path": path_a, "old_str": "int", "new_str": "long"},
                             "edit", 5),
                    _oh_obs(6, 5, editor, "The file has been edited.", "edit", 6)]
    blind = [*tested, _oh_call(3, editor, {"command": "str_replace", "path": path_a, "old_str": "int",
                                           "new_str": "long"}, "edit", 3),
             _oh_obs(4, 3, editor, "The file has been edited.", "edit", 4)]
    path = _jsonl(tmp_path / "output.jsonl", _oh_line("viewed", viewed_first), _oh_line("blind", blind))
    _import(lake, path, "openhands", run_id="R")
    ids = {e["task_id"]: e["episode_id"] for e in _episodes(lake)}
    data = load(lake)
    try:
        data.materialise("t", "taxonomy", {"runs": "('R')"}, what="taxonomy")
        got = {e: (c, r) for e, c, r in data.con.execute("SELECT episode_id, failure_class, rule FROM t").fetchall()}
    finally:
        data.close()
    # viewing a file is reading it: the edit that follows is of an observed path
    assert got[ids["viewed"]][0] == "planning"
    assert got[ids["blind"]] == ("perception", "edited a path never observed")


def test_group_id_never_says_none(lake: trajlake.Lake, tmp_path: Path) -> None:
    chat = _jsonl(tmp_path / "chat.jsonl", _chat())
    traj = tmp_path / "inst-1.traj"
    traj.write_text(json.dumps(_traj("submitted")))
    log = tmp_path / "log.json"
    log.write_text(json.dumps(_inspect_header(samples=[_inspect_sample(1)])))
    oh = _jsonl(tmp_path / "output.jsonl", _oh_line("i-1", []))
    for p, fmt in ((chat, "openai-chat"), (traj, "swe-agent"), (log, "inspect"), (oh, "openhands")):
        _import(lake, p, fmt)
    eps = _episodes(lake)
    assert len(eps) == 4 and all(e["env_seed"] is None for e in eps)
    for e in eps:  # the native writer's key (trajlake.record.episode.group_id_for): an unseeded group
        assert "None" not in e["group_id"]
        assert e["group_id"] == f"{e['task_id']}:{e['task_version']}:unseeded:{e['env_version']}"


def test_swe_agent_replay_config_fills_commit_and_budget(lake: trajlake.Lake, tmp_path: Path) -> None:
    rc = {"env": {"repo": {"github_url": "https://github.com/o/r", "base_commit": "0123abcd"}},
          "agent": {"model": {"name": "gpt-4o", "per_instance_cost_limit": 3.0, "per_instance_call_limit": 0}},
          "problem_statement": {"id": "o__r-1", "text": "fix it"}}
    doc = dict(_traj("submitted"), replay_config=json.dumps(rc))  # SWE-agent writes it as a JSON string
    path = tmp_path / "o__r-1.traj"
    path.write_text(json.dumps(doc))
    assert _import(lake, path, "swe-agent").tasks_written == 1
    (task,) = _records(lake, "select task_id, provenance, budget from tasks")
    assert task["task_id"] == rc["problem_statement"]["id"]
    assert task["provenance"]["commit"] == rc["env"]["repo"]["base_commit"]
    assert task["provenance"]["source"] == rc["env"]["repo"]["github_url"]
    assert task["budget"]["max_cost"] == rc["agent"]["model"]["per_instance_cost_limit"]
    assert task["budget"]["max_steps"] is None  # a call limit of 0 means no limit in SWE-agent


def test_ungraded_episodes_have_unknown_success(lake: trajlake.Lake, tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    log.write_text(json.dumps(_inspect_header(samples=[_inspect_sample(1, scores=None),
                                                       _inspect_sample(2, scores={"match": {"value": "I"}})])))
    chat = _jsonl(tmp_path / "chat.jsonl", {"messages": [{"role": "user", "content": "hi"},
                                                          {"role": "assistant", "content": "hello", "weight": 1}]})
    oh = _jsonl(tmp_path / "output.jsonl", _oh_line("graded", [], resolved=False), _oh_line("ungraded", [], None))
    for p, fmt in ((log, "inspect"), (chat, "openai-chat"), (oh, "openhands")):
        _import(lake, p, fmt)
    got = {(e["source_format"], e["task_id"]): (e["success"], e["verification_source"]) for e in _episodes(lake)}
    assert got == {
        ("inspect", "t/1"): (None, None),  # no scorer ran
        ("inspect", "t/2"): (False, "scorer:match"),
        ("openai-chat", next(k[1] for k in got if k[0] == "openai-chat")): (None, None),  # a fine-tuning line
        ("openhands", "graded"): (False, "test_report:test_result.report.resolved"),
        ("openhands", "ungraded"): (None, None),
    }


def test_no_cost_data_is_null_not_zero(lake: trajlake.Lake, tmp_path: Path) -> None:
    chat = _jsonl(tmp_path / "chat.jsonl", _chat())
    log = tmp_path / "log.json"
    log.write_text(json.dumps(_inspect_header(samples=[
        _inspect_sample(1), _inspect_sample(2, model_usage={"m/x": {"input_tokens": 7, "output_tokens": 3,
                                                                    "total_cost": 0.5}})])))
    traj = tmp_path / "new.traj"
    traj.write_text(json.dumps({"history": _traj(None)["history"]}))
    for p, fmt in ((chat, "openai-chat"), (log, "inspect"), (traj, "swe-agent")):
        _import(lake, p, fmt)
    got = {(e["source_format"], e["task_id"]): e["cost_usd"] for e in _episodes(lake)}
    assert got.pop(("inspect", "t/2")) == 0.5
    assert set(got.values()) == {None}
    assert _q(lake, "select count(*) from turns where cost_usd is not null")[0][0] == 0


# --- file-level errors: one line naming the file, the same rule for every format --------------------------------

def _ingest(lake: trajlake.Lake, path: Path, fmt: str, **kw: Any) -> IngestSummary:
    from trajlake.io.ingest import ingest_file

    with LakeWriter(lake, handle_signals=False) as w:
        return ingest_file(w, path, fmt, **kw)


def _one_line_error(lake: trajlake.Lake, path: Path, fmt: str) -> str:
    before = lake.versions()
    with pytest.raises(ValidationError) as ei:
        _ingest(lake, path, fmt)
    assert len(ei.value.issues) == 1, ei.value.issues
    msg = str(ei.value)
    assert str(path) in msg and "\n" not in msg
    assert lake.versions() == before
    return msg


def test_json_errors_do_not_double_at(lake: trajlake.Lake, tmp_path: Path) -> None:
    broken = '{"messages": [{"role": "user", "content": "unterminated'
    for fmt, name, text in (("openai-chat", "a.jsonl", broken), ("openhands", "b.jsonl", broken),
                            ("trajlake-jsonl", "c.jsonl", broken), ("swe-agent", "d.traj", broken),
                            ("inspect", "e.json", broken)):
        p = tmp_path / name
        p.write_text(text)  # no newline: the string runs to the end of the input
        msg = _one_line_error(lake, p, fmt)
        assert "Unterminated string starting at" in msg and "at at" not in msg, msg
        assert "column" in msg


@pytest.mark.parametrize("fmt", ["trajlake-jsonl", *FORMATS])
def test_file_level_errors_are_one_line_for_every_format(lake: trajlake.Lake, tmp_path: Path, fmt: str) -> None:
    d = tmp_path / "logs"
    d.mkdir()
    assert "is a directory" in _one_line_error(lake, d, fmt)
    assert "no such file" in _one_line_error(lake, tmp_path / "missing.jsonl", fmt)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert "empty file: no episodes" in _one_line_error(lake, empty, fmt)
    blank = tmp_path / "blank.jsonl"
    blank.write_bytes(b"\n  \n\n")
    assert "no episodes" in _one_line_error(lake, blank, fmt)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 40 + b"\n" + bytes(range(255, -1, -1)) * 40 + b"\n" * 30)
    assert "not UTF-8 text" in _one_line_error(lake, garbage, fmt)


@pytest.mark.parametrize("fmt", ["trajlake-jsonl", "openai-chat", "openhands", "swe-agent"])
def test_eval_zip_given_to_a_text_format(lake: trajlake.Lake, tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "log.eval"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("header.json", json.dumps(_inspect_header()))
        z.writestr("samples/1_epoch_1.json", json.dumps(_inspect_sample(1)))
    msg = _one_line_error(lake, path, fmt)
    assert "zip archive" in msg and "--format inspect" in msg and "UnicodeDecodeError" not in msg
    assert _ingest(lake, path, "inspect").episodes_written == 1


def test_binary_line_past_the_sniffed_head_names_the_line(lake: trajlake.Lake, tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"  # text for the first 64 KiB, then a binary line
    path.write_bytes(b" " * 70_000 + b"\n\xff\xfe\x00garbage\n")
    for fmt in ("trajlake-jsonl", "openai-chat", "openhands"):
        with pytest.raises(ValidationError) as ei:
            _ingest(lake, path, fmt)
        assert [i.source for i in ei.value.issues] == [f"{path}:2"], fmt
        assert "UTF-8" in ei.value.issues[0].message


def test_ingest_file_rejects_importer_options_for_trajlake_jsonl(lake: trajlake.Lake, tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "chat.jsonl", _chat())
    with pytest.raises(TrajlakeError, match="--run-id and --tokenizer"):
        _ingest(lake, path, "trajlake-jsonl", run_id="R")
    with pytest.raises(TrajlakeError, match="not supported"):
        _ingest(lake, path, "langsmith")


def test_trajlake_jsonl_empty_file_is_an_error_through_ingest_jsonl_too(lake: trajlake.Lake, tmp_path: Path) -> None:
    from trajlake.io.jsonl import ingest_jsonl

    path = tmp_path / "blank.jsonl"
    path.write_text("\n\n")
    with LakeWriter(lake, handle_signals=False) as w, pytest.raises(ValidationError, match="empty file: no episodes"):
        ingest_jsonl(w, path)


def test_cli_empty_file_exits_1_for_every_format(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from tests.conftest import run_cli

    lake_dir = tmp_path / "lake"
    assert run_cli(capsys, "--lake", str(lake_dir), "init")[0] == 0
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    for fmt in ("trajlake-jsonl", *FORMATS):
        code, _, err = run_cli(capsys, "--lake", str(lake_dir), "ingest", str(empty), "--format", fmt)
        assert code == 1 and str(empty) in err and "no episodes" in err, (fmt, err)
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("text, invalid", [
    ("Parameter 'command' is expected to be one of ['view', 'create', 'str_replace', 'insert', 'undo_edit'].", True),
    ("Missing required parameters for function 'str_replace_editor': {'path'}", True),
    ("Function 'browse' not found in available tools: ['execute_bash']", True),
    ("FunctionCallValidationError: Unsupported parameter 'cmd'", True),
    ("Runtime disconnected: the sandbox container exited.", False),
    ("Invalid JSON response from the runtime server", False),
    ("", False),
])
def test_openhands_invalid_call_errors(text: str, invalid: bool) -> None:
    from trajlake.io.importers.openhands import invalid_call_error

    assert invalid_call_error(text) is invalid


def test_editor_calls_are_named_by_command_in_every_format(lake: trajlake.Lake, tmp_path: Path) -> None:
    view = {"command": "view", "path": "/repo/a.py"}
    edit = {"command": "str_replace", "path": "/repo/a.py", "old_str": "a", "new_str": "b"}
    chat = _jsonl(tmp_path / "chat.jsonl", {"messages": [
        {"role": "user", "content": "fix"},
        {"role": "assistant", "tool_calls": [
            {"id": "v", "type": "function", "function": {"name": "str_replace_editor", "arguments": json.dumps(view)}},
            {"id": "e", "type": "function", "function": {"name": "str_replace_editor", "arguments": json.dumps(edit)}},
            {"id": "d", "type": "function", "function": {"name": "docker", "arguments": json.dumps(
                {"command": "create", "path": "/x"})}}]},
        {"role": "tool", "tool_call_id": "v", "content": "1\ta"},
        {"role": "tool", "tool_call_id": "e", "content": "edited"},
        {"role": "tool", "tool_call_id": "d", "content": "ok"}]})
    sample = _inspect_sample(1, messages=[
        {"role": "user", "content": "fix"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "v", "function": "text_editor", "arguments": view}]},
        {"role": "tool", "tool_call_id": "v", "function": "text_editor", "content": "1\ta"}])
    log = tmp_path / "log.json"
    log.write_text(json.dumps(_inspect_header(samples=[sample])))
    traj = tmp_path / "t.traj"
    traj.write_text(json.dumps({"history": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "fix"},
        {"role": "assistant", "content": "look", "action": "str_replace_editor view /repo/a.py"},
        {"role": "user", "content": "1\ta"}]}))
    for p, fmt in ((chat, "openai-chat"), (log, "inspect"), (traj, "swe-agent")):
        _import(lake, p, fmt)
    names = {}
    for e in _episodes(lake):
        names[e["source_format"]] = [(t["role"], t["action_schema"]) for t in _turns(lake, e["episode_id"])
                                     if t["action_schema"]]
    assert names["openai-chat"] == [("assistant", "view"), ("assistant", "str_replace"), ("assistant", "docker"),
                                    ("tool", "view"), ("tool", "str_replace"), ("tool", "docker")]
    assert names["inspect"] == [("assistant", "view"), ("tool", "view")]
    assert names["swe-agent"] == [("assistant", "view"), ("tool", "view")]


def test_inspect_usage_without_event_usage_falls_back_to_model_usage(lake: trajlake.Lake, tmp_path: Path) -> None:
    event = _model_event(None, "m/x", (1, 1), "m1")
    del event["output"]["usage"]
    sample = _inspect_sample(1, events=[event], messages=[{"role": "user", "content": "q?"},
                                                          {"id": "m1", "role": "assistant", "content": "a"}],
                             model_usage={"m/x": {"input_tokens": 7, "output_tokens": 3}})
    path = tmp_path / "log.json"
    path.write_text(json.dumps(_inspect_header(samples=[sample])))
    _import(lake, path, "inspect")
    (e,) = _episodes(lake)
    assert (e["tokens_in"], e["tokens_out"]) == (7, 3) and e["cost_usd"] is None


def test_openhands_call_without_function_name_keeps_its_usage(lake: trajlake.Lake, tmp_path: Path) -> None:
    call = _oh_call(1, "execute_bash", {"command": "ls"}, "run", 1)
    del call["tool_call_metadata"]["function_name"]
    line = _oh_line("i-1", [call, _oh_obs(2, 1, "execute_bash", "a.py", "run", 2)])
    line["metrics"].update(response_latencies=[{"latency": 1.5, "response_id": "r1"}],
                           token_usages=[{"prompt_tokens": 10, "completion_tokens": 2, "response_id": "r1"}])
    _import(lake, _jsonl(tmp_path / "output.jsonl", line), "openhands")
    (e,) = _episodes(lake)
    (t,) = [t for t in _turns(lake, e["episode_id"]) if t["actor"] == "policy"]
    assert (t["action_schema"], t["tokens"], t["prompt_tokens"], t["latency_ms"]) == ("run", 2, 10, 1500.0)
