"""``openai-chat``: JSONL with one chat-completions conversation per line (mapping in docs/importers.md).

A line is ``{"messages": [...], "tools": [...]?, "model": ...?, "created": ...?, "usage": {...}?}``. Messages
have roles system/developer, user, assistant (``content`` may be missing or null when ``tool_calls`` are
given; ``function_call`` is the legacy single call; ``weight`` 0 marks a turn not to train on), tool and the
legacy function. Tool-call ``arguments`` are JSON text, sometimes encoded twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trajlake.io.importers._common import (
    SYNTHETIC_EPOCH,
    EpisodeSpec,
    Loc,
    RunInfo,
    Source,
    TaskSpec,
    TurnSpec,
    as_list,
    as_obj,
    canonical_json,
    decode_arguments,
    id_str,
    jsonl_records,
    load_json_line,
    openai_tool_calls,
    opt_int,
    opt_list,
    opt_obj,
    opt_str,
    opt_time,
    parse_time,
    req_str,
    short_hash,
    text_of,
    tool_action_name,
)
from trajlake.schemas.vocab import Status

FORMAT = "openai-chat"


def _base_time(obj: dict[str, Any], loc: Loc) -> Any:
    if obj.get("created") is not None:
        return parse_time(obj["created"], loc, "created")
    return opt_time(obj, "created_at", loc, "created_at") or opt_time(obj, "timestamp", loc, "timestamp")


def parse_conversation(obj: dict[str, Any], loc: Loc, key: str) -> EpisodeSpec:
    """One conversation (a parsed line) as an episode."""
    messages = as_list(obj.get("messages"), loc, "messages")
    if not messages:
        loc.fail("messages", "conversation has no messages")
    opt_list(obj, "tools", loc, "tools")  # tool definitions: checked, not stored (schema v1 has no column)
    model = opt_str(obj, "model", loc, "model")
    base = _base_time(obj, loc) or SYNTHETIC_EPOCH
    usage = opt_obj(obj, "usage", loc, "usage") or {}
    turns: list[TurnSpec] = []
    call_names: dict[str, str] = {}
    pending_function: str | None = None
    first_user: str | None = None
    prompt: list[Any] = []
    seen_assistant = False
    for i, m in enumerate(messages):
        f = f"messages[{i}]"
        m = as_obj(m, loc, f)
        role = req_str(m, "role", loc, f"{f}.role")
        content = text_of(m.get("content"), loc, f"{f}.content")
        if role in ("system", "developer"):
            turns.append(TurnSpec("system", "system", content))
        elif role == "user":
            turns.append(TurnSpec("user", "user", content))
            if first_user is None:
                first_user = content or ""
        elif role == "assistant":
            seen_assistant = True
            if content is None:
                content = opt_str(m, "refusal", loc, f"{f}.refusal")
            weight = m.get("weight")
            if weight is not None and (isinstance(weight, bool) or weight not in (0, 1)):
                loc.fail(f"{f}.weight", f"expected 0 or 1, got {weight!r}")
            calls = openai_tool_calls(m, loc, f)
            call_names.update((cid, name) for cid, name, _, _ in calls if cid is not None)
            fc = opt_obj(m, "function_call", loc, f"{f}.function_call")
            if fc is not None:
                args, ok = decode_arguments(fc.get("arguments"))
                name = tool_action_name(req_str(fc, "name", loc, f"{f}.function_call.name"), args)
                calls.append((None, name, args, ok))
                pending_function = name
            if not calls:
                turns.append(TurnSpec("assistant", "policy", content, policy_version=model, trainable=weight != 0))
            for k, (cid, name, args, ok) in enumerate(calls):
                turns.append(TurnSpec("assistant", "policy", content if k == 0 else None, policy_version=model,
                                      action_schema=name, tool_call_id=cid, tool_args=args,
                                      status="OK" if ok else Status.MODEL_INVALID_ACTION, trainable=weight != 0))
        elif role == "tool":
            tcid = m.get("tool_call_id")
            cid = id_str(tcid, loc, f"{f}.tool_call_id") if tcid is not None else None
            tool = (call_names.get(cid) if cid is not None else None) or opt_str(m, "name", loc, f"{f}.name")
            turns.append(TurnSpec("tool", "env", content, action_schema=tool, tool_call_id=cid))
        elif role == "function":
            tool = opt_str(m, "name", loc, f"{f}.name") or pending_function
            turns.append(TurnSpec("tool", "env", content, action_schema=tool))
        else:
            loc.fail(f"{f}.role", f"unknown role {role!r} (system, developer, user, assistant, tool or function)")
        if not seen_assistant:
            prompt.append([role, content])
    last = turns[-1]
    final_answer = last.role == "assistant" and last.action_schema is None
    task_id = _task_id(obj, loc) or "prompt-" + short_hash(canonical_json(prompt))
    statement = first_user if first_user is not None else ""
    return EpisodeSpec(
        key=key, task_id=task_id, task_version=short_hash(canonical_json(prompt)), env_version="unknown",
        terminated=final_answer, truncated=not final_answer,
        termination_reason="submitted" if final_answer else "budget_steps",
        success=None,  # chat and fine-tuning files carry no grade
        turns=turns, tokens_in=opt_int(usage, "prompt_tokens", loc, "usage.prompt_tokens"),
        tokens_out=opt_int(usage, "completion_tokens", loc, "usage.completion_tokens"),
        base_time=base, started_at=base, policy_version=model or "unknown",
        task=TaskSpec(statement=statement, family=FORMAT, created_at=base),
    )


def _task_id(obj: dict[str, Any], loc: Loc) -> str | None:
    if obj.get("task_id") is not None:
        return id_str(obj["task_id"], loc, "task_id")
    meta = opt_obj(obj, "metadata", loc, "metadata") or {}
    if meta.get("task_id") is not None:
        return id_str(meta["task_id"], loc, "metadata.task_id")
    return None


def open_source(path: Path) -> Source:
    """The conversations of a JSONL file, one record per non-empty line."""
    run = RunInfo(config={})
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if raw.strip():
                try:  # run-level facts come from the first line; its problems are reported with its record
                    obj = load_json_line(raw, Loc(f"{path}:{lineno}"))
                    loc = Loc(f"{path}:{lineno}")
                    run.created_at = _base_time(obj, loc) or SYNTHETIC_EPOCH
                    model = obj.get("model")
                    run.policy_name = model if isinstance(model, str) else None
                except Exception:
                    pass
                break

    records = jsonl_records(path, parse_conversation)

    return Source(format_version="unknown", run=run, records=records)
