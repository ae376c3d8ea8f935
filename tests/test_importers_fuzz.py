"""Fuzzing the importers: mutated inputs import validly or fail with a TrajlakeError naming the file.

Each test starts from a small valid input of one format, drops keys, changes value types, truncates strings,
lists or the file itself, and imports the result. An import either succeeds without rejected episodes or
raises ``TrajlakeError`` (``ValidationError``) whose message names the file, and then nothing at all was
committed to the lake. The importers' safety net (which turns unforeseen exceptions into a ValidationError)
is switched off here, so a gap in the checked accessors fails the test as the raw exception it is.
"""

from __future__ import annotations

import copy
import io
import json
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trajlake
from trajlake import LakeWriter, TrajlakeError
from trajlake.io.importers import _common, import_file

EXAMPLES = 20

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12) | st.sampled_from(["\ud800", "2025-01-01T00:00:00Z", "C", "submitted", "exit_cost",
                                              "attachment://x", "0.5", ""]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _slots(node: Any) -> Iterator[tuple[Any, Any]]:
    """Every (container, key) of a JSON tree."""
    if isinstance(node, dict):
        for k in list(node):
            yield node, k
            yield from _slots(node[k])
    elif isinstance(node, list):
        for i in range(len(node)):
            yield node, i
            yield from _slots(node[i])


@st.composite
def mutated(draw: st.DrawFn, seed: Any) -> Any:
    """``seed`` with 1-3 mutations: a key dropped, a value replaced by one of another type, a value truncated."""
    doc = copy.deepcopy(seed)
    for _ in range(draw(st.integers(1, 3))):
        slots = list(_slots(doc))
        if not slots:
            break
        parent, key = draw(st.sampled_from(slots))
        op = draw(st.sampled_from(["drop", "replace", "truncate"]))
        value = parent[key]
        if op == "drop":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(json_values)
        elif isinstance(value, str | list):
            parent[key] = value[: draw(st.integers(0, max(0, len(value) - 1)))]
        elif isinstance(value, dict):
            keep = draw(st.integers(0, len(value)))
            parent[key] = dict(list(value.items())[:keep])
    return doc


@pytest.fixture(scope="module")
def fuzz_lake(tmp_path_factory: pytest.TempPathFactory) -> trajlake.Lake:
    return trajlake.open_lake(tmp_path_factory.mktemp("fuzz") / "lake", create=True)


@pytest.fixture(autouse=True)
def _no_safety_net(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "SAFETY_NET", False)


class _Files:
    def __init__(self, root: Path):
        self.root = root
        self.n = 0

    def new(self, suffix: str) -> Path:
        self.n += 1
        return self.root / f"input-{self.n}{suffix}"


def _check(lake: trajlake.Lake, path: Path, fmt: str) -> None:
    before = lake.versions()
    try:
        with LakeWriter(lake, handle_signals=False) as w:
            summary = import_file(w, path, fmt)
    except TrajlakeError as e:
        assert str(path) in str(e), f"error does not name the file: {e}"
        assert lake.versions() == before, f"partial write after: {e}"
    else:
        assert not summary.rejected


def _run_fuzz(lake: trajlake.Lake, tmp_path: Path, fmt: str, suffix: str, seeds: list[Any],
              write: Callable[[Path, Any, int | None], None]) -> None:
    files = _Files(tmp_path)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        seed = data.draw(st.sampled_from(seeds))
        doc = data.draw(mutated(seed))
        cut = data.draw(st.none() | st.integers(0, 400))
        path = files.new(suffix)
        write(path, doc, cut)
        _check(lake, path, fmt)

    run()
    rep = trajlake.verify(lake, strict=True)
    assert rep.ok, rep.problems


def _write_json(path: Path, doc: Any, cut: int | None) -> None:
    data = json.dumps(doc).encode()
    path.write_bytes(data if cut is None else data[:cut])


def _write_jsonl(path: Path, doc: Any, cut: int | None) -> None:
    lines = doc if isinstance(doc, list) else [doc]
    data = "\n".join(json.dumps(x) for x in lines).encode() + b"\n"
    path.write_bytes(data if cut is None else data[:cut])


# --- seeds: small valid inputs of each format -----------------------------------------------------------------

CHAT = [
    {"model": "m", "created": 1700000000, "messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "tool_calls": [{"id": "a", "type": "function",
                                              "function": {"name": "f", "arguments": json.dumps('{"x": 1}')}}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "assistant", "content": "done", "weight": 1}], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None,
                                                     "function_call": {"name": "g", "arguments": "{}"}},
                  {"role": "function", "name": "g", "content": "r"}]},
]

SWE_OLD = {
    "environment": "swe_main",
    "trajectory": [{"action": "ls\n", "observation": "a.py", "response": "r", "thought": "t", "state": "{}",
                    "execution_time": 0.5},
                   {"action": "submit\n", "observation": "diff", "response": "r2", "thought": "t2", "state": "{}"}],
    "history": [{"role": "system", "content": "sys", "agent": "primary"},
                {"role": "user", "content": "demo", "is_demo": True, "agent": "primary"},
                {"role": "user", "content": "issue", "agent": "primary"},
                {"role": "assistant", "content": "r", "thought": "t", "action": "ls\n", "agent": "primary"},
                {"role": "user", "content": "a.py", "agent": "primary"},
                {"role": "assistant", "content": "r2", "thought": "t2", "action": "submit\n", "agent": "primary"}],
    "info": {"exit_status": "submitted", "submission": "diff",
             "model_stats": {"instance_cost": 0.1, "tokens_sent": 10, "tokens_received": 3, "api_calls": 2}},
}
SWE_NEW = {"history": [
    {"role": "system", "content": "sys", "message_type": "system_prompt"},
    {"role": "user", "content": [{"type": "text", "text": "issue"}], "message_type": "observation"},
    {"role": "assistant", "content": "look", "thought": "look", "action": "find_file a.py", "message_type": "action",
     "tool_calls": [{"id": "c", "type": "function", "function": {"name": "find_file", "arguments": '{"f":"a.py"}'}}]},
    {"role": "tool", "content": "found", "message_type": "observation", "tool_call_ids": ["c"]}]}

_EVENTS = [
    {"timestamp": "2025-01-01T00:00:00+00:00", "event": "sample_init"},
    {"timestamp": "2025-01-01T00:00:01+00:00", "event": "model", "completed": "2025-01-01T00:00:02+00:00",
     "working_time": 1.0, "output": {"choices": [{"message": {"id": "m1", "role": "assistant", "content": ""}}],
                                     "usage": {"input_tokens": 5, "output_tokens": 2}, "time": 1.0}},
    {"timestamp": "2025-01-01T00:00:02+00:00", "event": "tool", "id": "t1", "function": "f",
     "completed": "2025-01-01T00:00:03+00:00", "working_time": 1.0},
    {"timestamp": "2025-01-01T00:00:03+00:00", "event": "model", "completed": "2025-01-01T00:00:04+00:00"},
    # a model-graded scorer: its call is inside a scorer span (usage kept apart from the policy's)
    {"timestamp": "2025-01-01T00:00:04+00:00", "event": "span_begin", "id": "sc", "span_id": "sc", "type": "scorer"},
    {"timestamp": "2025-01-01T00:00:04+00:00", "event": "span_begin", "id": "in", "span_id": "in", "parent_id": "sc"},
    {"timestamp": "2025-01-01T00:00:04+00:00", "event": "model", "span_id": "in", "model": "g/x",
     "output": {"model": "g-1", "usage": {"input_tokens": 9, "output_tokens": 4, "total_cost": 0.1}}},
    {"timestamp": "2025-01-01T00:00:05+00:00", "event": "step", "action": "begin", "type": "scorer"},
    {"timestamp": "2025-01-01T00:00:05+00:00", "event": "step", "action": "end", "type": "scorer"},
]
INSPECT = {
    "version": 2, "status": "success",
    "eval": {"task": "t", "task_version": 0, "model": "m/x", "created": "2025-01-01T00:00:00+00:00",
             "sandbox": {"type": "docker"}, "config": {"message_limit": 5}, "revision": {"commit": "abc"}},
    "results": {"total_samples": 2},
    "samples": [
        {"id": 1, "epoch": 1, "input": "q", "target": "a", "events": _EVENTS,
         "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "attachment://x"},
                      {"id": "m1", "role": "assistant", "content": "",
                       "tool_calls": [{"id": "t1", "function": "f", "arguments": {"a": 1}}]},
                      {"role": "tool", "tool_call_id": "t1", "function": "f", "content": "r"},
                      {"role": "assistant", "content": [{"type": "reasoning", "reasoning": "hm"},
                                                        {"type": "text", "text": "a"}]}],
         "scores": {"s": {"value": "C"}}, "attachments": {"x": "question"},
         "model_usage": {"m/x": {"input_tokens": 5, "output_tokens": 2}}, "total_time": 4.0},
        {"id": "b", "epoch": 2, "input": [{"role": "user", "content": "q"}], "target": ["a"],
         "messages": [{"role": "user", "content": "q"}], "error": {"message": "boom", "traceback": ""},
         "limit": {"type": "time", "limit": 1}},
    ],
}
OPENHANDS = {
    "instance_id": "i", "instruction": "fix", "instance": {"problem_statement": "fix", "repo": "r/r"},
    "metadata": {"llm_config": {"model": "m"}, "start_time": "2025-01-01 00:00:00", "max_iterations": 3,
                 "git_commit": "abc", "dataset": "d"},
    "history": [
        {"id": 0, "timestamp": "2025-01-01T00:00:00", "source": "agent", "action": "system",
         "args": {"content": "sys", "openhands_version": "0.1"}, "message": "sys"},
        {"id": 1, "timestamp": "2025-01-01T00:00:01", "source": "user", "action": "message",
         "args": {"content": "fix"}, "message": "fix"},
        {"id": 2, "timestamp": "2025-01-01T00:00:01", "source": "user", "action": "recall", "args": {}},
        {"id": 3, "timestamp": "2025-01-01T00:00:03", "source": "agent", "action": "run",
         "args": {"command": "ls", "thought": "t"}, "message": "run",
         "tool_call_metadata": {"function_name": "bash", "tool_call_id": "c1", "model_response": {
             "id": "r1", "choices": [{"message": {"content": "t", "tool_calls": [
                 {"id": "c1", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}}]}}},
        {"id": 4, "timestamp": "2025-01-01T00:00:04", "source": "agent", "observation": "run", "cause": 3,
         "content": "a.py", "tool_call_metadata": {"function_name": "bash", "tool_call_id": "c1"}},
        {"id": 5, "timestamp": "2025-01-01T00:00:05", "source": "agent", "observation": "error", "content": "x"},
        {"id": 7, "timestamp": "2025-01-01T00:00:05", "source": "agent", "action": "read",
         "args": {"path": "/a.py", "thought": ""},
         "tool_call_metadata": {"function_name": "str_replace_editor", "tool_call_id": "c2", "model_response": {
             "id": "r2", "choices": [{"message": {"content": "", "tool_calls": [
                 {"id": "c2", "function": {"name": "str_replace_editor",
                                           "arguments": '{"command": "view", "path": "/a.py"}'}}]}}]}}},
        {"id": 8, "timestamp": "2025-01-01T00:00:05", "source": "agent", "observation": "read", "cause": 7,
         "content": "ERROR:\nInvalid `path` parameter: /a.py.",
         "tool_call_metadata": {"function_name": "str_replace_editor", "tool_call_id": "c2"}},
        {"id": 9, "timestamp": "2025-01-01T00:00:05", "source": "agent", "observation": "error",
         "content": "Parameter 'command' is expected to be one of ['view', 'create']."},
        {"id": 6, "timestamp": "2025-01-01T00:00:06", "source": "agent", "action": "finish",
         "args": {"final_thought": "ok"}}],
    "metrics": {"accumulated_cost": 0.1, "accumulated_token_usage": {"prompt_tokens": 10, "completion_tokens": 2},
                "response_latencies": [{"latency": 1.5, "response_id": "r1"}],
                "token_usages": [{"completion_tokens": 2, "prompt_tokens": 10, "response_id": "r1"}]},
    "error": None, "test_result": {"git_patch": "", "report": {"resolved": False}},
}


def test_seeds_are_valid(fuzz_lake: trajlake.Lake, tmp_path: Path) -> None:
    for fmt, suffix, doc, write in (("openai-chat", ".jsonl", CHAT, _write_jsonl),
                                    ("swe-agent", ".traj", SWE_OLD, _write_json),
                                    ("swe-agent", ".traj", SWE_NEW, _write_json),
                                    ("inspect", ".json", INSPECT, _write_json),
                                    ("openhands", ".jsonl", [OPENHANDS], _write_jsonl)):
        path = tmp_path / f"seed-{fmt}{suffix}"
        write(path, doc, None)
        with LakeWriter(fuzz_lake, handle_signals=False) as w:
            s = import_file(w, path, fmt)
        assert s.episodes_written >= 1 and not s.rejected, fmt


def test_fuzz_openai_chat(fuzz_lake: trajlake.Lake, tmp_path: Path) -> None:
    _run_fuzz(fuzz_lake, tmp_path, "openai-chat", ".jsonl", [CHAT], _write_jsonl)


@pytest.mark.slow
def test_fuzz_swe_agent(fuzz_lake: trajlake.Lake, tmp_path: Path) -> None:
    _run_fuzz(fuzz_lake, tmp_path, "swe-agent", ".traj", [SWE_OLD, SWE_NEW], _write_json)


@pytest.mark.slow
def test_fuzz_inspect_json(fuzz_lake: trajlake.Lake, tmp_path: Path) -> None:
    _run_fuzz(fuzz_lake, tmp_path, "inspect", ".json", [INSPECT], _write_json)


@pytest.mark.slow
def test_fuzz_openhands(fuzz_lake: trajlake.Lake, tmp_path: Path) -> None:
    _run_fuzz(fuzz_lake, tmp_path, "openhands", ".jsonl", [[OPENHANDS, OPENHANDS]], _write_jsonl)


def _write_eval(path: Path, doc: Any, cut: int | None) -> None:
    """An .eval zip of the (mutated) log: header.json plus one samples/<id>_epoch_<n>.json per sample."""
    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as z:
        warnings.simplefilter("ignore")  # mutated ids may repeat an entry name
        header = {k: v for k, v in doc.items() if k != "samples"} if isinstance(doc, dict) else doc
        z.writestr("header.json", json.dumps(header))
        samples = doc.get("samples") if isinstance(doc, dict) else None
        for i, s in enumerate(samples if isinstance(samples, list) else []):
            sid = s.get("id", i) if isinstance(s, dict) else i
            epoch = s.get("epoch", 1) if isinstance(s, dict) else 1
            z.writestr(f"samples/{sid}_epoch_{epoch}.json", json.dumps(s))
    data = buf.getvalue()
    path.write_bytes(data if cut is None else data[: max(4, cut * 4)])


@pytest.mark.slow
def test_fuzz_inspect_eval_zip(fuzz_lake: trajlake.Lake, tmp_path: Path) -> None:
    _run_fuzz(fuzz_lake, tmp_path, "inspect", ".eval", [INSPECT], _write_eval)
