"""``--format inspect`` on logs that inspect_ai itself writes (issue 27): a ``.eval`` (its zip members are
Zstandard-compressed, zip method 93, which Python 3.11's ``zipfile`` cannot read) and a ``.json`` log of the same
eval, played by inspect's ``mockllm`` model with scripted outputs and a tool call. The importer's episodes are
checked against inspect's own reading of the same files (``read_eval_log``): samples, messages, tool calls,
scores and token usage.

inspect_ai runs in a subprocess (it loads ``.env`` files and sets up its own event loop and logging): it writes the
two logs, then reads them back and writes the counts it sees to ``counts.json``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

import trajlake
from trajlake import LakeWriter
from trajlake.io.importers import import_file

pytestmark = pytest.mark.slow

WRITE_LOGS = r'''
import json, sys
from pathlib import Path

from inspect_ai import Task, eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.log import read_eval_log
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes, value_to_float
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import tool


@tool
def add():
    async def execute(x: int, y: int) -> int:
        """Add two numbers.

        Args:
            x: the first number
            y: the second number
        """
        return x + y

    return execute


def scripted(output, input_tokens, output_tokens):
    # explicit usage: mockllm would otherwise count tokens with tiktoken, which downloads its encoding
    output.usage = ModelUsage(input_tokens=input_tokens, output_tokens=output_tokens,
                              total_tokens=input_tokens + output_tokens)
    return output


out = Path(sys.argv[1])
counts = {}
for fmt in ("eval", "json"):
    outputs = [  # sample s1: a tool call, then the answer; sample s2: a wrong answer
        scripted(ModelOutput.for_tool_call("mockllm/model", "add", {"x": 2, "y": 2}), 30, 7),
        scripted(ModelOutput.from_content("mockllm/model", "The answer is 4."), 45, 5),
        scripted(ModelOutput.from_content("mockllm/model", "I think it is 6."), 20, 6),
    ]
    task = Task(dataset=[Sample(id="s1", input="What is 2+2?", target="4"),
                         Sample(id="s2", input="What is 2+3?", target="5")],
                solver=[use_tools(add()), generate()], scorer=includes(), name="adder")
    (log,) = inspect_eval(task, model=get_model("mockllm/model", custom_outputs=outputs), log_dir=str(out / fmt),
                          log_format=fmt, display="none", max_samples=1)
    assert log.status == "success", log.error
    path = Path(log.location)
    log = read_eval_log(str(path))  # inspect's own reading of the file it wrote
    to_float = value_to_float()
    counts[fmt] = {"path": str(path), "samples": {}, "total_samples": log.results.total_samples,
                   "usage": {m: [u.input_tokens, u.output_tokens] for m, u in log.stats.model_usage.items()}}
    for s in log.samples:
        counts[fmt]["samples"][str(s.id)] = {
            "epoch": s.epoch,
            "messages": len(s.messages),
            "roles": [m.role for m in s.messages],
            "tool_calls": sum(len(m.tool_calls or []) for m in s.messages if m.role == "assistant"),
            "tool_call_names": [c.function for m in s.messages if m.role == "assistant" for c in m.tool_calls or []],
            "tool_messages": sum(1 for m in s.messages if m.role == "tool"),
            "scores": {k: to_float(v.value) for k, v in (s.scores or {}).items()},
            "usage": {m: [u.input_tokens, u.output_tokens] for m, u in s.model_usage.items()},
        }
(out / "counts.json").write_text(json.dumps(counts))
'''


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # find_spec, not importorskip: importing inspect_ai here would load zipfile-zstd, which patches this process's
    # zipfile to read method 93, and the test would no longer see what a plain Python reads
    if importlib.util.find_spec("inspect_ai") is None:
        pytest.skip("inspect_ai is not installed (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("inspect")
    proc = subprocess.run([sys.executable, "-c", WRITE_LOGS, str(out)], cwd=out, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts: dict[str, Any] = json.loads((out / "counts.json").read_text())
    return counts


@pytest.mark.parametrize("fmt", ["eval", "json"])
def test_inspect_written_logs_match_inspects_own_counts(written: dict[str, Any], fmt: str, tmp_path: Path) -> None:
    assert "zipfile_zstd" not in sys.modules  # this process's zipfile is Python's own
    want = written[fmt]
    path = Path(want["path"])
    if fmt == "eval":  # what the issue is about: current inspect_ai compresses the members with Zstandard
        with zipfile.ZipFile(path) as z:
            methods = {i.filename: i.compress_type for i in z.infolist()}
        assert methods["header.json"] == 93 and all(methods[f"samples/{s}_epoch_1.json"] == 93 for s in ("s1", "s2"))
    lake = trajlake.open_lake(tmp_path / "lake", create=True)
    with LakeWriter(lake, handle_signals=False) as w:
        summary = import_file(w, path, "inspect")
    assert summary.episodes_written == want["total_samples"] == len(want["samples"]) == 2
    assert summary.rejected == []
    con = trajlake.connect(lake)
    rel = con.sql("select * from episodes order by task_id")
    eps = [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
    assert [e["task_id"] for e in eps] == ["adder/s1", "adder/s2"]
    for ep in eps:
        s = want["samples"][ep["task_id"].split("/", 1)[1]]
        rel = con.sql(f"select * from turns where episode_id = '{ep['episode_id']}' order by turn_idx")
        turns = [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
        # one turn per message, in order and with its role
        assert ep["n_turns"] == len(turns) == s["messages"]
        assert [t["role"] for t in turns] == s["roles"]
        calls = [t for t in turns if t["actor"] == "policy" and t["tool_call_id"] is not None]
        assert len(calls) == s["tool_calls"] and [t["action_schema"] for t in calls] == s["tool_call_names"]
        assert sum(t["role"] == "tool" for t in turns) == s["tool_messages"]
        if s["tool_calls"]:
            assert json.loads(calls[0]["tool_args"]) == {"x": 2, "y": 2}
            assert next(t for t in turns if t["role"] == "tool")["raw_content"] == "4"
        # scores as inspect's own value_to_float reads them
        assert ep["reward_components"] == pytest.approx(s["scores"])
        assert ep["success"] is (all(v >= 1 for v in s["scores"].values()))
        assert ep["verification_source"] == "scorer:includes"
        # usage: the sample's model_usage (only the policy model ran) is what the model events sum to
        ((model, (tokens_in, tokens_out)),) = s["usage"].items()
        assert model == "mockllm/model" == ep["policy_version_start"]
        assert (ep["tokens_in"], ep["tokens_out"]) == (tokens_in, tokens_out)
        assert sum(t["tokens"] for t in turns if t["actor"] == "policy") == tokens_out
    assert [e["success"] for e in eps] == [True, False]
    assert sum(e["tokens_in"] for e in eps) == sum(u[0] for u in want["usage"].values())
    assert sum(e["tokens_out"] for e in eps) == sum(u[1] for u in want["usage"].values())
    assert trajlake.verify(lake, strict=True).ok


def test_inspect_eval_zstd_member_damage_is_one_line(written: dict[str, Any], tmp_path: Path) -> None:
    """A damaged Zstandard member is one error naming the file, the sample and the member, not a traceback."""
    from trajlake.errors import ValidationError

    src = Path(written["eval"]["path"])
    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as z:
        info = z.getinfo("samples/s2_epoch_1.json")
    local = data[info.header_offset:info.header_offset + 30]  # the local header: its name and extra lengths
    start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
    data[start + info.compress_size // 2] ^= 0xFF  # flip one compressed byte in the middle of the member
    bad = tmp_path / "damaged.eval"
    bad.write_bytes(bytes(data))
    lake = trajlake.open_lake(tmp_path / "lake", create=True)
    with pytest.raises(ValidationError) as ei, LakeWriter(lake, handle_signals=False) as w:
        import_file(w, bad, "inspect")
    (issue,) = ei.value.issues
    assert issue.source == f"{bad}:sample s2 epoch 1"
    assert "cannot read samples/s2_epoch_1.json from the zip" in issue.message and "\n" not in str(ei.value)
