"""``openhands``: OpenHands evaluation ``output.jsonl``, one instance per line (mapping in docs/importers.md).

A line has ``instance_id``, ``instruction``, ``instance`` (the benchmark row), ``metadata`` (``llm_config``,
``agent_class``, ``max_iterations``, ``start_time``, ``git_commit``, ``dataset``), ``history`` (events:
actions with ``action``/``args``/``tool_call_metadata``, observations with ``observation``/``cause``/
``content``), ``metrics`` (``accumulated_cost``, ``accumulated_token_usage``, ``response_latencies``,
``token_usages``), ``error`` and ``test_result`` (``git_patch``; ``report.resolved`` once evaluated).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

from trajlake.io.importers._common import (
    EDITOR_TOOLS,
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
    opt_bool,
    opt_int,
    opt_list,
    opt_num,
    opt_obj,
    opt_str,
    opt_time,
    short_hash,
    text_of,
    tool_action_name,
)
from trajlake.schemas.vocab import ErrorClass, Status

FORMAT = "openhands"

SKIPPED_ACTIONS = frozenset({"recall", "change_agent_state"})
"""Runtime bookkeeping actions the model never sees (a recall *query*, agent state changes)."""
SKIPPED_OBSERVATIONS = frozenset({"agent_state_changed", "null"})
"""Observations that are bookkeeping, not text for the model."""

# ``error`` substrings (lower case) -> (terminated, truncated, termination_reason, error_class); first match wins.
ERROR_PATTERNS: tuple[tuple[tuple[str, ...], tuple[bool, bool, str, str | None]], ...] = (
    (("maximum iteration", "max iteration", "max_iterations"), (False, True, "budget_steps", ErrorClass.BUDGET_EXHAUSTED)),
    (("maximum budget", "budget exceeded", "max_budget"), (False, True, "budget_cost", ErrorClass.BUDGET_EXHAUSTED)),
    (("contextwindowexceeded", "context window", "context length", "maximum context"),
     (False, True, "budget_tokens", ErrorClass.BUDGET_EXHAUSTED)),
    (("stuck in a loop", "stuckinloop"), (True, False, "gave_up", ErrorClass.MODEL_BAD_PLAN)),
    (("timeout", "timed out"), (False, True, "timeout", ErrorClass.ENV_TRANSIENT)),
    (("ratelimit", "rate limit", "apiconnection", "serviceunavailable", "internalservererror", "connection"),
     (False, True, "env_failure", ErrorClass.ENV_TRANSIENT)),
)
_OTHER_ERROR = (False, True, "env_failure", ErrorClass.ENV_BUG)


def map_error(error: str) -> tuple[bool, bool, str, str | None]:
    """(terminated, truncated, termination_reason, error_class) of an instance's ``error`` text."""
    low = error.lower()
    for needles, outcome in ERROR_PATTERNS:
        if any(n in low for n in needles):
            return outcome
    return _OTHER_ERROR


def _resolved(obj: dict[str, Any], loc: Loc) -> tuple[bool | None, str | None]:
    """Whether the evaluation harness marked the instance resolved, and the field that says so; (None, None)
    when the line is not graded."""
    tr = opt_obj(obj, "test_result", loc, "test_result") or {}
    for holder, prefix in ((tr, "test_result"), (obj, "")):
        field = f"{prefix}.resolved".lstrip(".")
        r = opt_bool(holder, "resolved", loc, field)
        if r is not None:
            return r, field
        report = opt_obj(holder, "report", loc, f"{prefix}.report".lstrip("."))
        if report is not None:
            field = f"{prefix}.report.resolved".lstrip(".")
            r = opt_bool(report, "resolved", loc, field)
            if r is not None:
                return r, field
    return None, None


TOOL_ERROR_PREFIX = "ERROR:"
"""OpenHands tools (the file editor, the shell) report a failed call as a normal observation whose text
starts with this: the call was wrong (a path that does not exist, an ``old_str`` that does not match)."""

# Error observations not tied to an action that are the model's fault: OpenHands could not turn the model's
# tool call into an action (FunctionCallValidationError, FunctionCallNotExistsError, malformed responses).
_INVALID_CALL_PATTERNS = re.compile(
    r"Parameter '[^']*' is expected to be|Missing required (?:parameters?|argument)|Unsupported parameter|"
    r"not found in available tools|Tool \S+ is not registered|FunctionCall(?:Validation|NotExists)Error|"
    r"Failed to parse tool call arguments|Invalid (?:parameter|`\w+` parameter)|LLMMalformedActionError|"
    r"LLMNoActionError", re.IGNORECASE)


def invalid_call_error(text: str | None) -> bool:
    """Whether an error observation not tied to an action reports a tool call the model got wrong."""
    return bool(text) and _INVALID_CALL_PATTERNS.search(text or "") is not None


def _per_response(metrics: dict[str, Any], key: str, loc: Loc) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for i, r in enumerate(opt_list(metrics, key, loc, f"metrics.{key}") or []):
        r = as_obj(r, loc, f"metrics.{key}[{i}]")
        rid = opt_str(r, "response_id", loc, f"metrics.{key}[{i}].response_id")
        if rid:
            out.setdefault(rid, r)
    return out


def _llm_message(tcm: dict[str, Any], loc: Loc, f: str) -> tuple[str | None, dict[str, Any] | None]:
    """(response id, first choice's message) of an action's ``tool_call_metadata.model_response``."""
    resp = opt_obj(tcm, "model_response", loc, f"{f}.tool_call_metadata.model_response")
    if resp is None:
        return None, None
    rid = resp.get("id")
    rid = id_str(rid, loc, f"{f}.tool_call_metadata.model_response.id") if rid is not None else None
    choices = opt_list(resp, "choices", loc, f"{f}.tool_call_metadata.model_response.choices") or []
    if not choices:
        return rid, None
    c0 = as_obj(choices[0], loc, f"{f}.tool_call_metadata.model_response.choices[0]")
    return rid, opt_obj(c0, "message", loc, f"{f}.tool_call_metadata.model_response.choices[0].message")


def parse_instance(obj: dict[str, Any], loc: Loc, key: str) -> EpisodeSpec:
    """One evaluated instance (a parsed line) as an episode."""
    instance_id = id_str(obj.get("instance_id"), loc, "instance_id")
    history = as_list(obj.get("history"), loc, "history")
    metrics = opt_obj(obj, "metrics", loc, "metrics") or {}
    metadata = opt_obj(obj, "metadata", loc, "metadata") or {}
    llm = opt_obj(metadata, "llm_config", loc, "metadata.llm_config") or {}
    model = opt_str(llm, "model", loc, "metadata.llm_config.model")
    instance = opt_obj(obj, "instance", loc, "instance") or {}
    error = obj.get("error")
    if error is not None and not isinstance(error, str):
        loc.fail("error", f"expected a string, got {type(error).__name__}")
    latencies = _per_response(metrics, "response_latencies", loc)
    usages = _per_response(metrics, "token_usages", loc)
    turns: list[TurnSpec] = []
    calls_of_event: dict[int, tuple[str | None, str | None, dt.datetime | None]] = {}
    action_of_call: dict[str, str] = {}  # tool call id -> the policy turn's action name
    seen_responses: set[str] = set()
    version: str | None = None
    times: list[dt.datetime] = []
    for i, e in enumerate(history):
        f = f"history[{i}]"
        e = as_obj(e, loc, f)
        ts = opt_time(e, "timestamp", loc, f"{f}.timestamp")
        if ts is not None:
            times.append(ts)
        source = opt_str(e, "source", loc, f"{f}.source")
        action = opt_str(e, "action", loc, f"{f}.action")
        observation = opt_str(e, "observation", loc, f"{f}.observation")
        eid = e.get("id")
        eid = eid if isinstance(eid, int) and not isinstance(eid, bool) else None
        if action is not None:
            if action in SKIPPED_ACTIONS:
                continue
            args = opt_obj(e, "args", loc, f"{f}.args") or {}
            message = opt_str(e, "message", loc, f"{f}.message")
            if action == "system":
                version = opt_str(args, "openhands_version", loc, f"{f}.args.openhands_version") or version
                content = text_of(args.get("content"), loc, f"{f}.args.content") or message
                turns.append(TurnSpec("system", "system", content, started_at=ts, ended_at=ts))
            elif source == "agent":
                new = _agent_turns(e, action, args, message, ts, model, latencies, usages, seen_responses, loc, f)
                if eid is not None and new[0].action_schema is not None:
                    calls_of_event[eid] = (new[0].action_schema, new[0].tool_call_id, ts)
                for t in new:
                    if t.tool_call_id is not None and t.action_schema is not None:
                        action_of_call[t.tool_call_id] = t.action_schema
                turns += new
            else:  # the user (or the evaluation harness speaking as the user)
                content = text_of(args.get("content"), loc, f"{f}.args.content") if action == "message" else None
                turns.append(TurnSpec("user", "user", content if content is not None else message,
                                      action_schema=None if action == "message" else action,
                                      started_at=ts, ended_at=ts))
        elif observation is not None:
            if observation in SKIPPED_OBSERVATIONS:
                continue
            content = opt_str(e, "content", loc, f"{f}.content")
            if content is None:
                content = opt_str(e, "message", loc, f"{f}.message")
            cause = e.get("cause")
            tcm = opt_obj(e, "tool_call_metadata", loc, f"{f}.tool_call_metadata")
            linked = calls_of_event.get(cause) if isinstance(cause, int) and not isinstance(cause, bool) else None
            if tcm is not None or linked is not None:
                name = (opt_str(tcm, "function_name", loc, f"{f}.tool_call_metadata.function_name") if tcm else None)
                cid = tcm.get("tool_call_id") if tcm else None
                cid = id_str(cid, loc, f"{f}.tool_call_metadata.tool_call_id") if cid is not None else None
                started = linked[2] if linked else None
                cid = cid or (linked[1] if linked else None)
                # the answered call's action name (an editor call is named by its command), else the tool's
                name = action_of_call.get(cid or "") or (linked[0] if linked else None) or name
                t = TurnSpec("tool", "env", content, action_schema=name, tool_call_id=cid, started_at=started,
                             ended_at=ts)
                if started is not None and ts is not None and ts >= started:
                    t.tool_seconds = (ts - started).total_seconds()
                if observation == "error" or (content or "").startswith(TOOL_ERROR_PREFIX):
                    t.status = Status.MODEL_INVALID_ACTION
                elif observation == "user_rejected":
                    t.status = Status.SAFETY_BLOCK
                turns.append(t)
            else:
                t = TurnSpec("env", "env", content, started_at=ts, ended_at=ts)
                if observation == "error":
                    t.status = Status.MODEL_INVALID_ACTION if invalid_call_error(content) else Status.ENV_BUG
                turns.append(t)
        else:
            loc.fail(f"{f}", "event is neither an action nor an observation")
    if not turns:
        loc.fail("history", "no events to import")
    resolved, resolved_field = _resolved(obj, loc)
    comps = {"resolved": 1.0 if resolved else 0.0} if resolved is not None else {}
    success = resolved  # None: the line was never evaluated
    if error:
        terminated, truncated, reason, error_class = map_error(error)
    else:
        terminated, truncated, error_class = True, False, None
        reason = "success" if success else "submitted"
    acc = opt_obj(metrics, "accumulated_token_usage", loc, "metrics.accumulated_token_usage")
    if acc is not None:
        tokens_in = opt_int(acc, "prompt_tokens", loc, "metrics.accumulated_token_usage.prompt_tokens")
        tokens_out = opt_int(acc, "completion_tokens", loc, "metrics.accumulated_token_usage.completion_tokens")
    else:
        tokens_in = sum(opt_int(u, "prompt_tokens", loc, "metrics.token_usages.prompt_tokens") or 0
                        for u in usages.values())
        tokens_out = sum(opt_int(u, "completion_tokens", loc, "metrics.token_usages.completion_tokens") or 0
                         for u in usages.values())
    cost = opt_num(metrics, "accumulated_cost", loc, "metrics.accumulated_cost")
    start_time = opt_time(metadata, "start_time", loc, "metadata.start_time")
    statement = (opt_str(instance, "problem_statement", loc, "instance.problem_statement")
                 or opt_str(obj, "instruction", loc, "instruction") or "")
    max_iter = opt_int(metadata, "max_iterations", loc, "metadata.max_iterations")
    return EpisodeSpec(
        key=key, task_id=instance_id, task_version=short_hash(statement), env_version=version or "unknown",
        terminated=terminated, truncated=truncated, termination_reason=reason, error_class=error_class,
        success=success, turns=turns, reward_components=comps, tokens_in=tokens_in, tokens_out=tokens_out,
        cost_usd=max(0.0, cost) if cost is not None else None,
        verification_source=f"test_report:{resolved_field}" if resolved_field else None,
        started_at=min(times) if times else None, ended_at=max(times) if times else None,
        base_time=start_time or SYNTHETIC_EPOCH, policy_version=model or "unknown",
        task=TaskSpec(statement=statement,
                      family=opt_str(metadata, "dataset", loc, "metadata.dataset") or FORMAT, created_at=start_time,
                      source=opt_str(instance, "repo", loc, "instance.repo"),
                      commit=opt_str(instance, "base_commit", loc, "instance.base_commit"), max_steps=max_iter),
    )


def _agent_turns(e: dict[str, Any], action: str, args: dict[str, Any], message: str | None,
                 ts: dt.datetime | None, model: str | None, latencies: dict[str, dict[str, Any]],
                 usages: dict[str, dict[str, Any]], seen: set[str], loc: Loc, f: str) -> list[TurnSpec]:
    """The policy turn of one agent action: its LLM text (once per response), tool call, tokens and latency."""
    tcm = opt_obj(e, "tool_call_metadata", loc, f"{f}.tool_call_metadata")
    t = TurnSpec("assistant", "policy", None, policy_version=model, ended_at=ts)
    if action == "message":
        t.content = text_of(args.get("content"), loc, f"{f}.args.content") or message
    else:
        t.action_schema = action
        rest = {k: v for k, v in args.items() if k != "thought"}
        t.tool_args = canonical_json(rest)
        thought = args.get("thought")
        t.content = thought if isinstance(thought, str) and thought else None
    if tcm is None:
        return [t]
    name = opt_str(tcm, "function_name", loc, f"{f}.tool_call_metadata.function_name")
    cid = tcm.get("tool_call_id")
    cid = id_str(cid, loc, f"{f}.tool_call_metadata.tool_call_id") if cid is not None else None
    t.tool_call_id = cid
    rid, msg = _llm_message(tcm, loc, f)
    if msg is not None:
        first = rid is None or rid not in seen
        t.content = text_of(msg.get("content"), loc, f"{f}...message.content") if first else None
        for j, c in enumerate(opt_list(msg, "tool_calls", loc, f"{f}...message.tool_calls") or []):
            c = as_obj(c, loc, f"{f}...message.tool_calls[{j}]")
            if c.get("id") == cid and cid is not None:
                fn = as_obj(c.get("function"), loc, f"{f}...message.tool_calls[{j}].function")
                args_json, ok = decode_arguments(fn.get("arguments"))
                t.tool_args = args_json
                t.status = "OK" if ok else Status.MODEL_INVALID_ACTION
        if rid is not None and first:
            seen.add(rid)
            lat = opt_num(latencies.get(rid, {}), "latency", loc, "metrics.response_latencies.latency")
            if lat is not None and lat >= 0:
                t.duration_s = lat
                t.latency_ms = lat * 1000.0
            t.tokens = opt_int(usages.get(rid, {}), "completion_tokens", loc,
                               "metrics.token_usages.completion_tokens") or 0
            t.prompt_tokens = opt_int(usages.get(rid, {}), "prompt_tokens", loc, "metrics.token_usages.prompt_tokens")
    # a file-editor call is named by its command (``view`` is a read, ``str_replace`` an edit); without the
    # call's own arguments OpenHands' action says which it was (a ``read`` action is a view)
    if name:
        t.action_schema = tool_action_name(name, t.tool_args)
        if t.action_schema == name and name in EDITOR_TOOLS and action == "read":
            t.action_schema = "view"
    return [t]


def open_source(path: Path) -> Source:
    """The instances of an ``output.jsonl``, one record per non-empty line."""
    run = RunInfo()
    version = "unknown"
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if raw.strip():
                try:  # run-level facts come from the first line; its problems are reported with its record
                    loc = Loc(f"{path}:{lineno}")
                    obj = load_json_line(raw, loc)
                    md = opt_obj(obj, "metadata", loc, "metadata") or {}
                    llm = opt_obj(md, "llm_config", loc, "metadata.llm_config") or {}
                    run.created_at = opt_time(md, "start_time", loc, "metadata.start_time") or SYNTHETIC_EPOCH
                    run.policy_name = opt_str(llm, "model", loc, "model")
                    run.code_version = opt_str(md, "git_commit", loc, "git_commit")
                    run.config = {k: md.get(k) for k in ("agent_class", "dataset", "max_iterations")
                                  if isinstance(md.get(k), str | int) and not isinstance(md.get(k), bool)}
                    for ev in obj.get("history") or []:
                        if isinstance(ev, dict) and ev.get("action") == "system" and isinstance(ev.get("args"), dict):
                            v = ev["args"].get("openhands_version")
                            version = v if isinstance(v, str) and v else version
                            break
                except Exception:
                    pass
                break

    records = jsonl_records(path, parse_instance)

    return Source(format_version=version, run=run, records=records)
