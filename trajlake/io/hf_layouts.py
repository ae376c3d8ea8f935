"""Training layouts of ``trajlake export hf`` (``--layout sft`` and ``--layout rl``; see docs/export.md).

``sft``: a conversational dataset that TRL's ``SFTTrainer`` loads, one row per episode::

    README.md                                   card (YAML configs: one ``default`` config, one split per lake split)
    data/<split>-00000-of-0000N.parquet         messages, tools, episode_id, task_id, success, reward_total, ...

``messages`` follow the OpenAI chat format: the system prompt (the environment's tools), the user task, assistant
turns with their calls as ``tool_calls`` ``[{id, type: "function", function: {name, arguments}}]`` (``arguments``
is the lake's ``tool_args`` JSON text, as the OpenAI API sends it) and ``tool`` messages with the observations and
the ``tool_call_id`` they answer. ``tools`` is the tool list as JSON text (TRL's ``SFTTrainer`` parses a string
``tools`` column and hands it to the chat template).

``rl``: the prompt Parquet layout of verl's data preparation, one row per task of the lake's ``tasks`` table::

    README.md
    data/train.parquet, data/test.parquet       data_source, prompt, ability, reward_model, extra_info

The prompt holds only what a policy may see (the public statement and the tool list); ``reward_model.ground_truth``
is a reference (env, task id and version) that a reward function resolves by grading in the environment, never the
hidden tests or the known fix.

Rows stream from DuckDB over pinned views; the sft export holds one episode's turns at a time in Python.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from trajlake._version import __version__
from trajlake.errors import TrajlakeError
from trajlake.io.hf import (
    CARD,
    DATA_DIR,
    DEFAULT_MAX_SHARD_BYTES,
    DEFAULT_SHARD_ROWS,
    HIDDEN_SPLIT,
    ExportSummary,
    SplitExport,
    TableExport,
    _arrow_reader,
    _hidden_episode,
    _md,
    _parquet_writer,
    _ShardWriter,
    _yaml_str,
    contamination_card,
    contamination_summary,
    not_checked_card,
    prepare_export,
    push_export,
    set_temp_directory,
    write_staged,
)
from trajlake.lake.store import LakeArg
from trajlake.schema import SCHEMA_VERSION
from trajlake.schemas.vocab import Role, Split

__all__ = [
    "AGENT_INSTRUCTION",
    "MESSAGE_TYPE",
    "RL_SCHEMA",
    "RL_SPLITS",
    "SFT_SCHEMA",
    "ToolCatalog",
    "agent_system_prompt",
    "episode_messages",
    "export_layout",
    "ground_truth_reference",
    "tool_schemas",
]

AGENT_INSTRUCTION = "You are an agent that solves the task by calling tools, one call per turn."
"""First line of the system prompt the training layouts add (followed by the tool list)."""

RL_SPLITS: dict[str, str] = {Split.TRAIN: Split.TRAIN, Split.DEV: Split.TEST, Split.TEST: Split.TEST}
"""Lake task split -> verl file (``data/train.parquet``, ``data/test.parquet``). ``hidden`` goes to ``test`` only
with ``include_hidden``; ``unknown`` (and any other split) is left out: nothing says it is safe to train on."""

_FUNCTION = pa.struct([pa.field("name", pa.string()), pa.field("arguments", pa.string())])
_TOOL_CALL = pa.struct([pa.field("id", pa.string()), pa.field("type", pa.string()),
                        pa.field("function", _FUNCTION)])
MESSAGE_TYPE = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string()),
                          pa.field("tool_calls", pa.list_(_TOOL_CALL)), pa.field("tool_call_id", pa.string()),
                          pa.field("name", pa.string())])
"""One chat message. Keys a message does not use are null (``datasets`` gives every message every key)."""

SFT_SCHEMA = pa.schema([
    pa.field("messages", pa.list_(MESSAGE_TYPE), False),
    pa.field("tools", pa.string()),
    pa.field("episode_id", pa.string(), False),
    pa.field("run_id", pa.string(), False),
    pa.field("task_id", pa.string(), False),
    pa.field("task_version", pa.string(), False),
    pa.field("env_id", pa.string(), False),
    pa.field("env_version", pa.string(), False),
    pa.field("success", pa.bool_()),
    pa.field("reward_total", pa.float64(), False),
    pa.field("policy_version", pa.string()),
    pa.field("termination_reason", pa.string(), False),
])
"""Columns of ``--layout sft`` (docs/export.md)."""

_PROMPT_MESSAGE = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])
RL_SCHEMA = pa.schema([
    pa.field("data_source", pa.string(), False),
    pa.field("prompt", pa.list_(_PROMPT_MESSAGE), False),
    pa.field("ability", pa.string(), False),
    pa.field("reward_model", pa.struct([pa.field("style", pa.string()), pa.field("ground_truth", pa.string())]),
             False),
    pa.field("extra_info", pa.struct([
        pa.field("split", pa.string()), pa.field("index", pa.int64()), pa.field("task_id", pa.string()),
        pa.field("task_version", pa.string()), pa.field("env_id", pa.string()), pa.field("lake_split", pa.string()),
        pa.field("family", pa.string()), pa.field("difficulty", pa.string()), pa.field("tools", pa.string()),
    ]), False),
])
"""Columns of ``--layout rl``: verl's prompt layout (``data_source``, ``prompt``, ``ability``, ``reward_model``,
``extra_info``)."""

_ROWS_PER_WRITE = 1_000  # sft rows buffered before they go to the shard writer


# ------------------------------------------------------------------------------------------------- tools
def tool_schemas(tools: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The environment's tools (``TaskView.tools``: name -> {description, args}) as a JSON-schema function list
    ``[{type: "function", function: {name, description, parameters}}]``, sorted by name.

    An argument given as a JSON schema (a mapping) is kept; one documented only by a description string is
    declared ``{"type": "string", "description": ...}`` (the contract gives no type; Mini SWE's and Mini Web's
    arguments are all strings). ``required`` is not emitted: the contract does not say which arguments are."""
    out = []
    for name in sorted(tools):
        doc = tools[name]
        args = doc.get("args") or {}
        props = {a: (dict(v) if isinstance(v, Mapping) else {"type": "string", "description": str(v)})
                 for a, v in args.items()}
        out.append({"type": "function", "function": {"name": name, "description": str(doc.get("description", "")),
                                                      "parameters": {"type": "object", "properties": props}}})
    return out


def agent_system_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system prompt the layouts add: the instruction and one JSON tool schema per line."""
    lines = [AGENT_INSTRUCTION, "Tools (JSON schema, one per line):"]
    lines += [json.dumps(t, sort_keys=True, ensure_ascii=False) for t in tools]
    return "\n".join(lines)


class ToolCatalog:
    """Tool lists of the environments the lake's episodes and tasks came from, built through the registry.

    Only the public task view is asked for (``task_view(..., oracle=False)``). An environment that is not
    installed, cannot be built, has another version than the episode's, or does not know the task version gives
    no tools (None) and a note saying why."""

    def __init__(self) -> None:
        self._envs: dict[str, Any] = {}
        self._cache: dict[tuple[str, str, str], str | None] = {}
        self.notes: dict[str, str] = {}

    def _env(self, env_id: str) -> Any:
        if env_id not in self._envs:
            import trajlake.envs as envs  # registers the built-in environments

            try:
                self._envs[env_id] = envs.make(env_id, split=None)
            except Exception as e:  # any environment's constructor: an unknown or broken one just has no tools
                self._envs[env_id] = None
                self.notes[env_id] = f"environment {env_id!r} is not available here ({type(e).__name__}: " \
                                     f"{(str(e).splitlines() or [''])[0]}); its rows have no tool list"
        return self._envs[env_id]

    def tools_json(self, env_id: str, task_id: str, task_version: str, env_version: str | None = None) -> str | None:
        """The tool list of a task as JSON text, or None when it cannot be had."""
        key = (env_id, task_id, task_version)
        if key not in self._cache:
            env = self._env(env_id)
            tools: str | None = None
            if env is not None:
                try:
                    view = env.task_view(task_id, task_version, oracle=False)
                    tools = json.dumps(tool_schemas(view.tools), sort_keys=True, ensure_ascii=False)
                except Exception as e:  # the installed environment lacks this task version, or gives no views
                    self.notes.setdefault(f"{env_id}:view", f"environment {env_id!r} gave no task view for some "
                                          f"rows ({type(e).__name__}); those rows have no tool list")
            self._cache[key] = tools
        if env_version is not None and self._cache[key] is not None:
            env = self._envs.get(env_id)
            if env is not None and str(env.env_version) != env_version:
                self.notes.setdefault(f"{env_id}:version", f"environment {env_id!r} here is version "
                                      f"{env.env_version}; episodes of other versions have no tool list")
                return None
        return self._cache[key]

    def close(self) -> None:
        for env in self._envs.values():
            if env is not None:
                env.close()


# ------------------------------------------------------------------------------------------------- sft
def _call_args(turn: Mapping[str, Any]) -> str | None:
    """The arguments JSON text of an assistant turn's tool call, or None when the turn is no parsable call."""
    if not turn.get("action_schema"):
        return None
    args = turn.get("tool_args")
    if args is None:
        return "{}"  # a parsed call without "args": environments call the tool with no arguments
    try:
        return args if isinstance(json.loads(args), dict) else None
    except ValueError:
        return None


def _text_is_the_call(text: str | None, name: str, args: str) -> bool:
    """Whether an assistant turn's text is nothing but its call (native rollouts record the action JSON)."""
    if not text:
        return True
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    if not isinstance(obj, dict):
        return False
    called = obj.get("tool", obj.get("name"))
    given = obj.get("args", obj.get("arguments", {}))
    return bool(called == name and given == json.loads(args))


def _message(role: str, content: str | None, *, tool_calls: list[dict[str, Any]] | None = None,
             tool_call_id: str | None = None, name: str | None = None) -> dict[str, Any]:
    return {"role": role, "content": content or "", "tool_calls": tool_calls, "tool_call_id": tool_call_id,
            "name": name}


def episode_messages(turns: Sequence[Mapping[str, Any]], system: str | None = None) -> list[dict[str, Any]]:
    """An episode's turns (ordered by turn_idx) as OpenAI-style chat messages.

    - ``system`` turns stay system messages; when the episode has none, ``system`` (if given) is put first.
    - ``user`` turns, and ``env`` turns (environment messages that answer no call), become user messages.
    - An ``assistant`` turn with a parsable call (``action_schema`` set, ``tool_args`` a JSON object or null)
      gets ``tool_calls = [{id: tool_call_id, type: "function", function: {name: action_schema, arguments:
      tool_args}}]``; its content is its text unless the text is just the call. Consecutive call turns without
      text (one message with several calls, as importers split them) become one message with several calls.
      An assistant turn without a parsable call stays assistant text with no tool_calls.
    - A ``tool`` turn answering a call becomes a ``tool`` message with that call's id and the tool name; a tool
      turn answering no call (the action did not parse) becomes a user message, since chat formats allow a tool
      message only after a call."""
    msgs: list[dict[str, Any]] = []
    if system is not None and not any(t["role"] == "system" for t in turns):
        msgs.append(_message("system", system))
    pending: list[str] = []  # ids of the latest calls not answered yet
    for t in turns:
        role, text, idx = t["role"], t.get("raw_content"), t["turn_idx"]
        if role == "assistant":
            args = _call_args(t)
            if args is None:
                msgs.append(_message("assistant", text))
                pending = []
                continue
            name = str(t["action_schema"])
            call_id = str(t.get("tool_call_id") or f"call-{idx}")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            content = "" if _text_is_the_call(text, name, args) else text
            prev = msgs[-1] if msgs else None
            if prev is not None and prev["role"] == "assistant" and prev["tool_calls"] and not content:
                prev["tool_calls"].append(call)
                pending.append(call_id)
            else:
                msgs.append(_message("assistant", content, tool_calls=[call]))
                pending = [call_id]
        elif role == "tool":
            cid = t.get("tool_call_id")
            answered = cid if cid in pending else (pending[0] if cid is None and pending else None)
            if answered is None:
                msgs.append(_message("user", text))
                continue
            pending.remove(answered)
            msgs.append(_message("tool", text, tool_call_id=answered, name=t.get("action_schema")))
        elif role == "system":
            msgs.append(_message("system", text))
        elif role in (Role.USER, Role.ENV):
            msgs.append(_message("user", text))
        else:
            raise TrajlakeError(f"episode {t.get('episode_id')}, turn {idx}: role {role!r} has no chat role")
    return msgs


_SFT_EPISODE_COLS = ("episode_id", "run_id", "task_id", "task_version", "env_id", "env_version", "success",
                     "reward_total", "policy_version_start", "termination_reason")
_SFT_TURN_COLS = ("turn_idx", "role", "raw_content", "action_schema", "tool_call_id", "tool_args")


def _sql_list(values: Sequence[str]) -> str:
    return "(" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + ")"


def _episode_filter(include_hidden: bool, success_only: bool, runs: Sequence[str]) -> str:
    preds = ["TRUE"]
    if not include_hidden:
        preds.append(f"NOT {_hidden_episode('e')}")
    if success_only:
        preds.append("e.success IS TRUE")
    if runs:
        preds.append(f"e.run_id IN {_sql_list(runs)}")
    return " AND ".join(preds)


def _sft_rows(con: duckdb.DuckDBPyConnection, where: str, catalog: ToolCatalog, system_prompt: bool
              ) -> Iterator[tuple[str, dict[str, Any]]]:
    """(split, row) per selected episode with at least one assistant message, in split and episode order."""
    cols = ", ".join([*(f"e.{c}" for c in _SFT_EPISODE_COLS), *(f"t.{c}" for c in _SFT_TURN_COLS)])
    sql = (f"SELECT e.split AS __split, {cols} FROM episodes e JOIN turns t ON t.episode_id = e.episode_id "
           f"WHERE {where} ORDER BY __split, e.episode_id, t.turn_idx")
    current: list[dict[str, Any]] = []

    def finish() -> tuple[str, dict[str, Any]] | None:
        first = current[0]
        tools = catalog.tools_json(first["env_id"], first["task_id"], first["task_version"], first["env_version"])
        system = agent_system_prompt(json.loads(tools)) if (tools is not None and system_prompt) else None
        msgs = episode_messages(current, system)
        if not any(m["role"] == "assistant" for m in msgs):
            return None
        row = {c: first[c] for c in _SFT_EPISODE_COLS if c != "policy_version_start"}
        row.update(messages=msgs, tools=tools, policy_version=first["policy_version_start"])
        return str(first["__split"]), row

    for batch in _arrow_reader(con, sql):
        for r in batch.to_pylist():
            if current and r["episode_id"] != current[0]["episode_id"]:
                done = finish()
                if done is not None:
                    yield done
                current = []
            current.append(r)
    if current:
        done = finish()
        if done is not None:
            yield done


def _count(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    row = con.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _export_sft(con: duckdb.DuckDBPyConnection, staging: Path, *, include_hidden: bool, success_only: bool,
                runs: Sequence[str], system_prompt: bool, shard_rows: int, max_shard_bytes: int,
                metadata: dict[str, str], catalog: ToolCatalog) -> TableExport:
    folder = staging / DATA_DIR
    folder.mkdir(parents=True, exist_ok=True)
    schema = SFT_SCHEMA.with_metadata({"trajlake.layout": "sft", "trajlake.schema_version": SCHEMA_VERSION,
                                       **metadata})
    sw = _ShardWriter("sft", folder, DATA_DIR, schema, shard_rows, max_shard_bytes)
    written = 0
    try:
        buf: list[dict[str, Any]] = []
        buf_split: str | None = None
        for split, row in _sft_rows(con, _episode_filter(include_hidden, success_only, runs), catalog,
                                    system_prompt):
            if buf and (split != buf_split or len(buf) >= _ROWS_PER_WRITE):
                sw.write(str(buf_split), pa.Table.from_pylist(buf, schema=schema))
                buf = []
            buf.append(row)
            buf_split = split
            written += 1
        if buf:
            sw.write(str(buf_split), pa.Table.from_pylist(buf, schema=schema))
    except duckdb.Error as e:
        raise TrajlakeError(f"export of episodes as sft: {str(e).splitlines()[0]}") from e
    finally:
        sw.close_shard()
    splits = sw.finish()
    run_pred = f" AND e.run_id IN {_sql_list(runs)}" if runs else ""
    hidden = 0 if include_hidden else _count(con, f"SELECT count(*) FROM episodes e WHERE {_hidden_episode('e')}"
                                                  f"{run_pred}")
    selected = _count(con, "SELECT count(*) FROM episodes e WHERE "
                           + _episode_filter(include_hidden, success_only, runs))
    left_out: list[tuple[str, int]] = []
    if success_only:
        not_ok = _count(con, "SELECT count(*) FROM episodes e WHERE "
                             + _episode_filter(include_hidden, False, runs) + " AND e.success IS NOT TRUE")
        left_out.append(("not successful (success false or null)", not_ok))
    if selected - written:
        left_out.append(("no assistant turn", selected - written))
    return TableExport("sft", tuple(splits), hidden, tuple(left_out))


# ------------------------------------------------------------------------------------------------- rl
def ground_truth_reference(env_id: str, task_id: str, task_version: str) -> str:
    """``reward_model.ground_truth`` of an rl row: which task to grade (canonical JSON), not how."""
    return json.dumps({"env_id": env_id, "task_id": task_id, "task_version": task_version}, sort_keys=True,
                      separators=(",", ":"))


def _export_rl(con: duckdb.DuckDBPyConnection, staging: Path, *, include_hidden: bool, system_prompt: bool,
               metadata: dict[str, str], catalog: ToolCatalog) -> TableExport:
    folder = staging / DATA_DIR
    folder.mkdir(parents=True, exist_ok=True)
    schema = RL_SCHEMA.with_metadata({"trajlake.layout": "rl", "trajlake.schema_version": SCHEMA_VERSION,
                                      **metadata})
    files = {**RL_SPLITS, **({HIDDEN_SPLIT: Split.TEST} if include_hidden else {})}
    rows: dict[str, list[dict[str, Any]]] = {str(f): [] for f in dict.fromkeys(RL_SPLITS.values())}
    left: dict[str, int] = {}
    sql = ("SELECT split, task_id, task_version, env_id, family, difficulty, statement FROM tasks "
           "ORDER BY task_id, task_version")
    try:
        tasks = con.execute(sql).fetchall()
    except duckdb.Error as e:
        raise TrajlakeError(f"export of tasks as rl: {str(e).splitlines()[0]}") from e
    for split, task_id, task_version, env_id, family, difficulty, statement in tasks:
        target = str(files[split]) if split in files else None
        if target is None:
            left[split] = left.get(split, 0) + 1
            continue
        tools = catalog.tools_json(env_id, task_id, task_version)
        prompt = []
        if tools is not None and system_prompt:
            prompt.append({"role": "system", "content": agent_system_prompt(json.loads(tools))})
        prompt.append({"role": "user", "content": statement})
        rows[target].append({
            "data_source": f"trajlake/{env_id}", "prompt": prompt, "ability": env_id,
            "reward_model": {"style": "rule", "ground_truth": ground_truth_reference(env_id, task_id, task_version)},
            "extra_info": {"split": target, "index": len(rows[target]), "task_id": task_id,
                           "task_version": task_version, "env_id": env_id, "lake_split": split, "family": family,
                           "difficulty": difficulty, "tools": tools},
        })
    splits = []
    for name, part in rows.items():
        if not part:  # datasets cannot load an empty split; verl needs no empty file either
            continue
        rel = f"{DATA_DIR}/{name}.parquet"
        with open(staging / rel, "wb") as sink:
            writer = _parquet_writer(sink, schema)
            writer.write_table(pa.Table.from_pylist(part, schema=schema))
            writer.close()
        splits.append(SplitExport(name, len(part), (rel,)))
    hidden = left.pop(HIDDEN_SPLIT, 0)
    left_out = tuple((f"task split {s!r} (not mapped to train or test)", n) for s, n in sorted(left.items()))
    return TableExport("rl", tuple(splits), hidden, left_out)


# ------------------------------------------------------------------------------------------------- card
def render_layout_card(summary: ExportSummary, lake_name: str, *, success_only: bool, runs: Sequence[str],
                       system_prompt: bool) -> str:
    """The dataset card of a training layout: one ``default`` config, how to train on it, what was left out."""
    te = summary.tables[summary.layout]
    y = ["---", f"license: {_yaml_str(summary.license)}",
         f"pretty_name: {_yaml_str(f'trajlake {summary.layout}: ' + lake_name)}",
         "tags:", "- \"trajlake\"", "- \"agentic-rl\"", f"- \"{summary.layout}\"",
         "task_categories:", "- \"reinforcement-learning\"" if summary.layout == "rl" else "- \"text-generation\"",
         "configs:", "- config_name: \"default\"", "  default: true", "  data_files:"]
    for s in te.splits:
        path = s.files[0] if summary.layout == "rl" else f"{DATA_DIR}/{s.split}-*.parquet"
        y += [f"  - split: {_yaml_str(s.split)}", f"    path: {_yaml_str(path)}"]
    y.append("---")
    b = ["", f"# trajlake {summary.layout}: {lake_name}", ""]
    names = [s.split for s in te.splits]
    first_split = Split.TRAIN.value if Split.TRAIN in names else names[0]
    if summary.layout == "sft":
        b += ["Episodes of a trajlake lake as a conversational dataset for supervised fine-tuning (TRL's "
              "`SFTTrainer`), written by `trajlake export hf --layout sft` "
              f"(trajlake {__version__}, schema v{SCHEMA_VERSION}) at {summary.exported_at}. One row per episode: "
              "`messages` (OpenAI chat format with `tool_calls` and `tool` messages), `tools` (JSON text), and "
              "episode metadata.", "",
              "```python", "from datasets import load_dataset", "from trl import SFTConfig, SFTTrainer", "",
              f'ds = load_dataset("<this repo or folder>", split="{first_split}")',
              'trainer = SFTTrainer(model=..., train_dataset=ds, args=SFTConfig(assistant_only_loss=True))',
              "```", "",
              "`assistant_only_loss=True` trains on the assistant messages (the policy's turns) only; system, user "
              "and tool messages are context. Messages carry every key (`datasets` fills unused ones with null); "
              "templates that test for a key's presence need the nulls removed first "
              "(`ds.with_transform(trl.trainer.utils.remove_none_values)` or the same in a few lines).", ""]
    else:
        b += ["Tasks of a trajlake lake in the prompt Parquet layout of verl "
              f"(`data_source`, `prompt`, `ability`, `reward_model`, `extra_info`), written by "
              f"`trajlake export hf --layout rl` (trajlake {__version__}) at {summary.exported_at}. One row per "
              "task; `data/train.parquet` and `data/test.parquet` are verl's `data.train_files` and "
              "`data.val_files`.", "",
              "The prompt holds only what the agent may see (the public statement and the tool list). "
              "`reward_model.ground_truth` is a reference, `{\"env_id\", \"task_id\", \"task_version\"}`: a reward "
              "function resolves it by grading the agent's work in the environment. The hidden tests and the known "
              "fix are never in the file: whatever is in a training file can leak into the model (and into logs "
              "and prompts), which would make every later evaluation on these tasks meaningless.", "",
              "| lake task split | file |", "| --- | --- |", "| `train` | `train.parquet` |",
              "| `dev`, `test` | `test.parquet` |",
              "| `hidden` | " + ("`test.parquet` (`--include-hidden`)" if summary.include_hidden else "left out")
              + " |", "| `unknown` | left out |", ""]
    b += ["## Rows", "", "| split | rows | files |", "| --- | ---: | ---: |"]
    b += [f"| `{s.split}` | {s.rows} | {len(s.files)} |" for s in te.splits]
    b.append("")
    left = [(f"{HIDDEN_SPLIT} split", te.excluded_hidden)] if not summary.include_hidden else []
    left += list(te.left_out)
    left = [(why, n) for why, n in left if n]
    if left:
        b += ["Left out: " + "; ".join(f"{why}: {n}" for why, n in left) + ".", ""]
    sel = [f"--layout {summary.layout}", f"--as-of {summary.as_of}"]
    if summary.layout == "sft":
        sel.append("--success-only" if success_only else "--all-episodes")
        if runs:
            sel.append(f"--runs {','.join(runs)}")
    if not system_prompt:
        sel.append("--no-system-prompt")
    if summary.include_hidden:
        sel.append("--include-hidden")
    b += ["Reproduce (same rows, same order, while the lake keeps these versions):", "", "```bash",
          f"trajlake --lake LAKE export hf --out DIR {' '.join(sel)} --license {summary.license}", "```", ""]
    if summary.notes:
        b += ["Notes:", "", *(f"- {_md(n)}" for n in summary.notes), ""]
    b += ["## Contamination", ""]
    if summary.include_hidden:
        b += ["> **WARNING: this export includes the `hidden` split** (`--include-hidden`). Training on it "
              "contaminates every later evaluation on those tasks.", ""]
    else:
        b += ["Rows of the `hidden` split are excluded (an episode is hidden when its split is `hidden` or its task "
              "is a hidden task).", ""]
    b += contamination_card(summary, lake_name)
    b += not_checked_card(summary)
    return "\n".join(y + b)


# ------------------------------------------------------------------------------------------------- export
def _parse_runs(runs: str | Sequence[str] | None) -> list[str]:
    if runs is None:
        return []
    items = runs.split(",") if isinstance(runs, str) else list(runs)
    names = list(dict.fromkeys(r.strip() for r in items if r.strip()))
    if not names:
        raise TrajlakeError("--runs: no run named")
    return names


@dataclass(frozen=True)
class _Options:
    layout: str
    success_only: bool
    runs: list[str] = field(default_factory=list)
    system_prompt: bool = True


def export_layout(lake: LakeArg, out: str | os.PathLike[str], *, layout: str,
                  as_of: str | dict[str, int] | None = None, license: str = "other", include_hidden: bool = False,
                  shard_rows: int = DEFAULT_SHARD_ROWS, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                  push: str | None = None, overwrite: bool = False, private: bool = True,
                  memory_limit: str | None = None, threads: int | None = None, api: Any = None,
                  contamination: bool = True, success_only: bool | None = None,
                  runs: str | Sequence[str] | None = None, system_prompt: bool | None = None) -> ExportSummary:
    """Write the ``sft`` or ``rl`` training layout of the lake into ``out`` (and push it when ``push``).

    ``sft``: one row per episode of the selection: not hidden (unless ``include_hidden``), successful when
    ``success_only`` (the default for sft; ``success`` null counts as not successful), of ``runs`` when given.
    ``rl``: one row per row of ``tasks``, in ``train``/``test`` files by split (``RL_SPLITS``); ``success_only``
    and ``runs`` do not apply (tasks have neither). ``system_prompt`` (default on): put the environment's tools
    in a system message. The other options are :func:`trajlake.io.hf.export_hf`'s."""
    from trajlake.query import connect

    if layout not in ("sft", "rl"):
        raise TrajlakeError(f"--layout {layout!r}: training layouts are sft and rl")
    if layout == "rl":
        if success_only is not None:
            raise TrajlakeError("--success-only/--all-episodes applies to --layout sft (rl rows are tasks)")
        if runs is not None:
            raise TrajlakeError("--runs applies to --layout sft (rl rows are tasks, which belong to no run)")
    opts = _Options(layout, True if success_only is None else success_only, _parse_runs(runs),
                    True if system_prompt is None else system_prompt)
    target = prepare_export(lake, out, as_of=as_of, license=license, push=push, overwrite=overwrite, api=api,
                            shard_rows=shard_rows, max_shard_bytes=max_shard_bytes)
    lk, versions = target.lake, target.versions

    def build(staging: Path) -> ExportSummary:
        catalog = ToolCatalog()
        con = connect(lk, versions, memory_limit=memory_limit, threads=threads)
        try:
            set_temp_directory(con, staging)
            pins = ",".join(f"{t}={v}" for t, v in versions.items())
            meta = {"trajlake.as_of": pins, "trajlake.include_hidden": str(include_hidden).lower()}
            if opts.layout == "sft":
                te = _export_sft(con, staging, include_hidden=include_hidden, success_only=opts.success_only,
                                 runs=opts.runs, system_prompt=opts.system_prompt, shard_rows=shard_rows,
                                 max_shard_bytes=max_shard_bytes, metadata=meta, catalog=catalog)
            else:
                te = _export_rl(con, staging, include_hidden=include_hidden, system_prompt=opts.system_prompt,
                                metadata=meta, catalog=catalog)
        finally:
            con.close()
            catalog.close()
        if not te.splits:
            what = "episodes" if opts.layout == "sft" else "tasks"
            left = ([] if include_hidden else [("hidden", te.excluded_hidden)]) + list(te.left_out)
            why = "; ".join(f"{r}: {n}" for r, n in left)
            raise TrajlakeError(f"nothing to export: no {what} selected for --layout {opts.layout} at --as-of "
                                f"{pins}" + (f" (left out: {why})" if why else ""))
        summary = ExportSummary(out=target.out, tables={opts.layout: te}, versions=dict(versions),
                                include_hidden=include_hidden, license=license,
                                exported_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                                contamination=contamination_summary(lk, dict(versions), include_hidden)
                                if contamination else (), layout=opts.layout,
                                notes=tuple(catalog.notes.values()))
        (staging / CARD).write_text(render_layout_card(summary, lk.name, success_only=opts.success_only,
                                                       runs=opts.runs, system_prompt=opts.system_prompt),
                                    encoding="utf-8")
        return summary

    summary = write_staged(target.out, build, overwrite=target.overwrite)
    return push_export(summary, push, private=private, api=target.api)
