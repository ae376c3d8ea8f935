"""``inspect``: inspect_ai evaluation logs, ``.eval`` (zip) or ``.json`` (mapping in docs/importers.md).

A ``.eval`` file is a zip with ``header.json`` (``_journal/start.json`` while the eval is still running),
``samples/<id>_epoch_<n>.json`` (one per sample and epoch), ``summaries.json``, ``reductions.json`` and
``_journal/``. A ``.json`` log holds the header fields and ``samples`` in one document. Every sample x epoch
becomes an episode: its ``messages`` become turns, ``events`` give times, latencies and per-call usage,
``scores`` become reward components, ``limit`` a truncation reason and ``error`` an error class.
"""

from __future__ import annotations

import datetime as dt
import json
import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trajlake.io.importers._common import (
    SYNTHETIC_EPOCH,
    EpisodeSpec,
    Loc,
    Record,
    RunInfo,
    Source,
    TaskSpec,
    TurnSpec,
    as_obj,
    canonical_json,
    decode_arguments,
    id_str,
    opt_int,
    opt_list,
    opt_num,
    opt_obj,
    opt_str,
    opt_time,
    req_str,
    short_hash,
    text_of,
    tool_action_name,
)
from trajlake.io.jsonl import json_error_text
from trajlake.schemas.vocab import ErrorClass, Status

FORMAT = "inspect"

# EvalSampleLimit.type -> (termination_reason, error_class); every limit is a truncation.
LIMITS: dict[str, tuple[str, str | None]] = {
    "message": ("budget_steps", ErrorClass.BUDGET_EXHAUSTED),
    "token": ("budget_tokens", ErrorClass.BUDGET_EXHAUSTED),
    "context": ("budget_tokens", ErrorClass.BUDGET_EXHAUSTED),
    "cost": ("budget_cost", ErrorClass.BUDGET_EXHAUSTED),
    "time": ("timeout", ErrorClass.BUDGET_EXHAUSTED),
    "working": ("timeout", ErrorClass.BUDGET_EXHAUSTED),
    "operator": ("safety_stop", None),
    "custom": ("budget_steps", ErrorClass.BUDGET_EXHAUSTED),
}

# ToolCallError.type of a tool message -> turn status.
TOOL_ERRORS: dict[str, str] = {
    "parsing": Status.MODEL_INVALID_ACTION,
    "permission": Status.MODEL_INVALID_ACTION,
    "file_not_found": Status.MODEL_INVALID_ACTION,
    "is_a_directory": Status.MODEL_INVALID_ACTION,
    "timeout": Status.ENV_TRANSIENT,
    "limit": Status.BUDGET_EXHAUSTED,
    "output_limit": Status.BUDGET_EXHAUSTED,
    "approval": Status.SAFETY_BLOCK,
    "unicode_decode": Status.ENV_BUG,
    "unknown": Status.ENV_BUG,
}

_LETTER_SCORES = {"C": 1.0, "I": 0.0, "P": 0.5, "N": 0.0}
_WORD_SCORES = {"yes": 1.0, "true": 1.0, "correct": 1.0, "no": 0.0, "false": 0.0, "incorrect": 0.0}


def score_value(v: Any) -> float | None:
    """A score value as a float, like inspect_ai's ``value_to_float``: C/I/P/N are 1/0/0.5/0, yes/true are 1,
    no/false 0, numbers and numeric strings their value; anything else (and non-finite numbers) is None."""
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, int | float):
        f = float(v)
        return f if f == f and abs(f) != float("inf") else None
    if isinstance(v, str):
        s = v.strip()
        if s in _LETTER_SCORES:
            return _LETTER_SCORES[s]
        if s.lower() in _WORD_SCORES:
            return _WORD_SCORES[s.lower()]
        try:
            return score_value(float(s))
        except ValueError:
            return None
    return None


def reward_components(scores: dict[str, Any], loc: Loc) -> dict[str, float]:
    """Reward components of a sample's ``scores``: one per scorer (``name``), or per key of a dict-valued
    score (``name.key``) and per item of a list-valued one (``name.i``); values that are not numeric are
    left out."""
    comps: dict[str, float] = {}
    for name, score in scores.items():
        sc = as_obj(score, loc, f"scores.{name}")
        value = sc.get("value")
        if isinstance(value, dict):
            items = [(f"{name}.{k}", v) for k, v in value.items()]
        elif isinstance(value, list):
            items = [(f"{name}.{i}", v) for i, v in enumerate(value)]
        else:
            items = [(name, value)]
        for k, v in items:
            f = score_value(v)
            if f is not None:
                comps[k] = f
    return comps


class _Header:
    """The eval-level facts of a log (``header.json``, ``_journal/start.json`` or the ``.json`` document)."""

    def __init__(self, doc: Any, where: str):
        loc = Loc(where)
        h = as_obj(doc, loc, "header")
        version = h.get("version")
        self.version = str(version) if isinstance(version, int | str) and not isinstance(version, bool) else "unknown"
        ev = as_obj(h.get("eval"), loc, "eval")
        self.task = req_str(ev, "task", loc, "eval.task")
        tv = ev.get("task_version")
        self.task_version = str(tv) if isinstance(tv, int | str) and not isinstance(tv, bool) else "unknown"
        self.model = opt_str(ev, "model", loc, "eval.model")
        self.created = opt_time(ev, "created", loc, "eval.created")
        self.status = opt_str(h, "status", loc, "status")
        revision = opt_obj(ev, "revision", loc, "eval.revision") or {}
        self.commit = opt_str(revision, "commit", loc, "eval.revision.commit")
        packages = opt_obj(ev, "packages", loc, "eval.packages") or {}
        inspect_version = packages.get("inspect_ai")
        self.inspect_version = inspect_version if isinstance(inspect_version, str) else None
        dataset = opt_obj(ev, "dataset", loc, "eval.dataset") or {}
        self.dataset = opt_str(dataset, "name", loc, "eval.dataset.name") or opt_str(
            dataset, "location", loc, "eval.dataset.location")
        self.sandbox = _sandbox_type(ev.get("sandbox"))
        config = opt_obj(ev, "config", loc, "eval.config") or {}
        self.message_limit = opt_int(config, "message_limit", loc, "eval.config.message_limit")
        self.token_limit = opt_int(config, "token_limit", loc, "eval.config.token_limit")
        self.cost_limit = opt_num(config, "cost_limit", loc, "eval.config.cost_limit")
        self.run_id = opt_str(ev, "run_id", loc, "eval.run_id")
        self.eval_id = opt_str(ev, "eval_id", loc, "eval.eval_id")
        self.task_file = opt_str(ev, "task_file", loc, "eval.task_file")
        # per sample (episode key): the scorers' model usage, which is not the policy's (see _usage)
        self.grader_usage: dict[str, dict[str, dict[str, float]]] = {}

    def run_info(self) -> RunInfo:
        info = RunInfo(policy_name=self.model, code_version=self.commit,
                       config={"task": self.task, "task_file": self.task_file, "inspect_run_id": self.run_id,
                               "eval_id": self.eval_id, "inspect_ai": self.inspect_version},
                       late_config=self._grader_config)
        if self.created is not None:
            info.created_at = self.created
        return info

    def _grader_config(self) -> dict[str, Any]:
        """``grader_usage``: the scorers' model calls summed over the imported samples, per model (episodes'
        tokens and cost are the policy's only)."""
        total: dict[str, dict[str, float]] = {}
        for per_model in self.grader_usage.values():
            for model, u in per_model.items():
                acc = total.setdefault(model, {})
                for k, v in u.items():
                    acc[k] = acc.get(k, 0) + v
        return {"grader_usage": total} if total else {}


def _sandbox_type(v: Any) -> str | None:
    """``eval.sandbox`` is ``{"type": ..., "config": ...}``, ``[type, config]`` (older logs) or a string."""
    if isinstance(v, str):
        return v or None
    if isinstance(v, dict) and isinstance(v.get("type"), str):
        return str(v["type"]) or None
    if isinstance(v, list) and v and isinstance(v[0], str):
        return v[0] or None
    return None


def _event_times(e: dict[str, Any], loc: Loc, f: str) -> tuple[Any, Any, float | None]:
    start = opt_time(e, "timestamp", loc, f"{f}.timestamp")
    end = opt_time(e, "completed", loc, f"{f}.completed")
    working = opt_num(e, "working_time", loc, f"{f}.working_time")
    return start, end, working


SCORER_SPANS = frozenset({"scorer", "scorers"})
"""Span (and older ``step``) types inside which model calls are the scorers', not the policy's."""


class _ScorerScope:
    """Tells whether an event belongs to a scorer: newer logs nest events in spans (``span_begin`` with
    ``id``, ``parent_id``, ``type``; every event has ``span_id``), older ones bracket them with ``step``
    events (``action`` begin/end, ``type``)."""

    def __init__(self) -> None:
        self.parent: dict[str, str | None] = {}
        self.kind: dict[str, str | None] = {}
        self.open_steps = 0

    def see(self, e: dict[str, Any]) -> None:
        kind = e.get("event")
        if kind == "span_begin" and isinstance(e.get("id"), str):
            parent = e.get("parent_id")
            self.parent[e["id"]] = parent if isinstance(parent, str) else None
            self.kind[e["id"]] = e.get("type") if isinstance(e.get("type"), str) else None
        elif kind == "step" and e.get("type") in SCORER_SPANS:
            if e.get("action") == "begin":
                self.open_steps += 1
            elif e.get("action") == "end":
                self.open_steps = max(0, self.open_steps - 1)

    def is_scorer(self, e: dict[str, Any]) -> bool:
        if self.open_steps:
            return True
        span = e.get("span_id")
        for _ in range(64):  # spans nest a few levels; the bound guards against a cycle in a broken log
            if not isinstance(span, str):
                return False
            if self.kind.get(span) in SCORER_SPANS:
                return True
            span = self.parent.get(span)
        return False


def _usage(events: list[dict[str, Any]], loc: Loc, where: str) -> dict[str, float]:
    """``input_tokens``, ``output_tokens`` and ``total_cost`` (when any call has one) summed over model events."""
    out: dict[str, float] = {"input_tokens": 0, "output_tokens": 0}
    for e in events:
        usage = opt_obj(opt_obj(e, "output", loc, f"{where}.output") or {}, "usage", loc, f"{where}.output.usage")
        for k in ("input_tokens", "output_tokens"):
            out[k] += opt_int(usage or {}, k, loc, f"{where}.output.usage.{k}") or 0
        c = opt_num(usage or {}, "total_cost", loc, f"{where}.output.usage.total_cost")
        if c is not None:
            out["total_cost"] = out.get("total_cost", 0.0) + max(0.0, c)
    return out


def _has_usage(e: dict[str, Any]) -> bool:
    out = e.get("output")
    return isinstance(out, dict) and isinstance(out.get("usage"), dict)


def parse_sample(s: Any, h: _Header, loc: Loc) -> EpisodeSpec:
    """One sample (one epoch) as an episode."""
    s = as_obj(s, loc, "sample")
    sid = id_str(s.get("id"), loc, "id")
    epoch = opt_int(s, "epoch", loc, "epoch") or 1
    key = f"sample {canonical_json(s.get('id'))} epoch {epoch}"
    raw_att = opt_obj(s, "attachments", loc, "attachments") or {}
    att = {k: v for k, v in raw_att.items() if isinstance(v, str)}
    # --- events: the policy's model calls (in order, and by output message id), the scorers' model calls
    # (usage kept apart) and tool calls (by call id)
    model_events: list[dict[str, Any]] = []
    grader_events: list[dict[str, Any]] = []
    scope = _ScorerScope()
    tool_events: dict[str, dict[str, Any]] = {}
    limit_event: str | None = None
    first_ts = last_ts = None
    events = opt_list(s, "events", loc, "events")
    for i, e in enumerate(events or []):
        f = f"events[{i}]"
        e = as_obj(e, loc, f)
        kind = e.get("event")
        scope.see(e)
        start, end, _ = _event_times(e, loc, f)
        for t in (start, end):
            if t is not None:
                first_ts = t if first_ts is None else min(first_ts, t)
                last_ts = t if last_ts is None else max(last_ts, t)
        if kind == "model":
            (grader_events if scope.is_scorer(e) else model_events).append(e)
        elif kind == "tool" and e.get("id") is not None:
            tool_events[id_str(e["id"], loc, f"{f}.id")] = e
        elif kind == "sample_limit":
            limit_event = opt_str(e, "type", loc, f"{f}.type")
    by_msg_id: dict[str, tuple[int, dict[str, Any]]] = {}
    for k, e in enumerate(model_events):
        out = e.get("output")
        choices = out.get("choices") if isinstance(out, dict) else None
        msg = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
            else None
        if isinstance(msg, dict) and isinstance(msg.get("id"), str):
            by_msg_id[msg["id"]] = (k, e)
    messages = opt_list(s, "messages", loc, "messages") or []
    n_assistant = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    turns: list[TurnSpec] = []
    call_names: dict[str, str] = {}
    k_assistant = 0
    for i, m in enumerate(messages):
        f = f"messages[{i}]"
        m = as_obj(m, loc, f)
        role = req_str(m, "role", loc, f"{f}.role")
        content = text_of(m.get("content"), loc, f"{f}.content", att)
        if role == "system":
            turns.append(TurnSpec("system", "system", content))
        elif role == "user":
            turns.append(TurnSpec("user", "user", content))
        elif role == "assistant":
            event = _model_event_of(m, k_assistant, n_assistant, model_events, by_msg_id)
            k_assistant += 1
            turns += _assistant_turns(m, content, event, h, call_names, loc, f)
        elif role == "tool":
            turns.append(_tool_turn(m, content, tool_events, call_names, loc, f))
        else:
            loc.fail(f"{f}.role", f"unknown role {role!r} (system, user, assistant or tool)")
    # --- outcome
    scores = opt_obj(s, "scores", loc, "scores")
    if scores is None and s.get("score") is not None:  # logs older than multi-scorer support
        scores = {"score": s["score"]}
    comps = reward_components(scores or {}, loc)
    # no numeric score: the sample was never graded (no scorer, or it errored before scoring)
    success = all(v >= 1.0 for v in comps.values()) if comps else None
    graders = [n for n in (scores or {}) if any(k == n or k.startswith(f"{n}.") for k in comps)]
    verification = f"scorer:{','.join(graders)}" if graders else None
    error = s.get("error")
    limit = opt_obj(s, "limit", loc, "limit")
    limit_type = opt_str(limit, "type", loc, "limit.type") if limit is not None else limit_event
    error_class: str | None
    if error is not None:
        if not isinstance(error, dict | str):
            loc.fail("error", f"expected an object, got {type(error).__name__}")
        terminated, truncated, reason, error_class = False, True, "env_failure", ErrorClass.ENV_BUG
    elif limit_type is not None:
        if limit_type not in LIMITS:
            loc.fail("limit.type", f"unknown limit type {limit_type[:60]!r} (known: {', '.join(LIMITS)})")
        reason, error_class = LIMITS[limit_type]
        terminated, truncated = False, True
    else:
        terminated, truncated, error_class = True, False, None
        reason = "success" if success else "submitted"
    # --- usage and time: the policy's calls only. ``model_usage`` sums every model the sample called, a
    # model-graded scorer's included, so it is used only when no model event reports its usage.
    tokens_in: int | None
    tokens_out: int | None
    if any(_has_usage(e) for e in (*model_events, *grader_events)):
        pu = _usage(model_events, loc, "model event")
        tokens_in, tokens_out = int(pu["input_tokens"]), int(pu["output_tokens"])
        cost = pu.get("total_cost")
        graded: dict[str, dict[str, float]] = {}
        for e in grader_events:
            gm = e.get("model")
            acc = graded.setdefault(gm if isinstance(gm, str) else "unknown", {})
            for name, value in _usage([e], loc, "scorer model event").items():
                acc[name] = acc.get(name, 0) + value
        if graded:
            h.grader_usage[key] = graded
    else:
        mu = opt_obj(s, "model_usage", loc, "model_usage") or {}
        u = as_obj(mu[h.model], loc, f"model_usage.{h.model}") if h.model in mu else None
        if u is None and len(mu) == 1:  # one model and no scorer calls to tell apart: the policy's
            name = next(iter(mu))
            u = as_obj(mu[name], loc, f"model_usage.{name}")
        tokens_in = opt_int(u, "input_tokens", loc, "model_usage.input_tokens") if u is not None else None
        tokens_out = opt_int(u, "output_tokens", loc, "model_usage.output_tokens") if u is not None else None
        c = opt_num(u, "total_cost", loc, "model_usage.total_cost") if u is not None else None
        cost = max(0.0, c) if c is not None else None
    started = opt_time(s, "started_at", loc, "started_at") or first_ts
    ended = opt_time(s, "completed_at", loc, "completed_at") or last_ts
    total_time = opt_num(s, "total_time", loc, "total_time")
    if ended is None and started is not None and total_time is not None and total_time >= 0:
        ended = started + dt.timedelta(seconds=min(total_time, 1e9))
    base = started or h.created
    target = s.get("target")
    sample_input = s.get("input")
    statement = _statement(sample_input, loc, att)
    served = list(dict.fromkeys(t.served_model for t in turns if t.served_model))
    return EpisodeSpec(
        key=key, task_id=f"{h.task}/{sid}",
        task_version=short_hash(canonical_json([sample_input, target])), env_version=h.task_version,
        terminated=terminated, truncated=truncated, termination_reason=reason, error_class=error_class,
        success=success, turns=turns, reward_components=comps, tokens_in=tokens_in, tokens_out=tokens_out,
        cost_usd=cost, started_at=started, ended_at=ended, base_time=base or h.created or SYNTHETIC_EPOCH,
        policy_version=h.model or "unknown", attempt=max(0, epoch - 1),
        sandbox=_sandbox_type(s.get("sandbox")) or h.sandbox, verification_source=verification,
        served_model=",".join(served) or None,
        task=TaskSpec(statement=statement, family=h.task, created_at=h.created, source=h.dataset, commit=h.commit,
                      max_steps=h.message_limit, max_tokens=h.token_limit, max_cost=h.cost_limit),
    )


def _statement(sample_input: Any, loc: Loc, att: dict[str, str]) -> str:
    if isinstance(sample_input, str):
        return text_of(sample_input, loc, "input", att) or ""
    parts = []
    for i, m in enumerate(opt_list({"input": sample_input}, "input", loc, "input") or []):
        m = as_obj(m, loc, f"input[{i}]")
        parts.append(text_of(m.get("content"), loc, f"input[{i}].content", att) or "")
    return "\n".join(parts)


def _model_event_of(m: dict[str, Any], k: int, n_assistant: int, model_events: list[dict[str, Any]],
                    by_msg_id: dict[str, tuple[int, dict[str, Any]]]) -> dict[str, Any] | None:
    """The model event that produced assistant message ``m`` (the ``k``-th): matched by message id, else by
    position when the sample has as many model calls as assistant messages."""
    mid = m.get("id")
    if isinstance(mid, str) and mid in by_msg_id:
        return by_msg_id[mid][1]
    if len(model_events) == n_assistant and k < len(model_events):
        return model_events[k]
    return None


def _assistant_turns(m: dict[str, Any], content: str | None, event: dict[str, Any] | None, h: _Header,
                     call_names: dict[str, str], loc: Loc, f: str) -> list[TurnSpec]:
    # The policy is the model that was requested (the event's, else the eval's); the message's ``model`` and
    # the output's are the version the provider served (``openai/gpt-4o-mini`` -> ``gpt-4o-mini-2024-07-18``).
    served = opt_str(m, "model", loc, f"{f}.model")
    requested = opt_str(event, "model", loc, "model event.model") if event is not None else None
    t = TurnSpec("assistant", "policy", content, policy_version=requested or h.model)
    if event is not None:
        start, end, working = _event_times(event, loc, "model event")
        out = opt_obj(event, "output", loc, "model event.output") or {}
        usage = opt_obj(out, "usage", loc, "model event.output.usage") or {}
        call_time = opt_num(out, "time", loc, "model event.output.time")
        served = served or opt_str(out, "model", loc, "model event.output.model")
        t.started_at, t.ended_at = start, end
        secs = call_time if call_time is not None else working
        if secs is not None and secs >= 0:
            t.duration_s = secs
            t.latency_ms = secs * 1000.0
        t.tokens = opt_int(usage, "output_tokens", loc, "model event.output.usage.output_tokens") or 0
        t.prompt_tokens = opt_int(usage, "input_tokens", loc, "model event.output.usage.input_tokens")
        call_cost = opt_num(usage, "total_cost", loc, "model event.output.usage.total_cost")
        t.cost_usd = max(0.0, call_cost) if call_cost is not None else None
    t.served_model = served if served != t.policy_version else None
    calls = opt_list(m, "tool_calls", loc, f"{f}.tool_calls") or []
    if not calls:
        return [t]
    out_turns = []
    for j, c in enumerate(calls):
        cf = f"{f}.tool_calls[{j}]"
        c = as_obj(c, loc, cf)
        args, ok = decode_arguments(c.get("arguments"))
        name = tool_action_name(req_str(c, "function", loc, f"{cf}.function"), args)
        if c.get("parse_error") is not None:
            ok = False
        cid = id_str(c["id"], loc, f"{cf}.id") if c.get("id") is not None else None
        if cid is not None:
            call_names[cid] = name
        if j == 0:
            turn = t
        else:  # further calls of the same message: no text of their own, at the same time
            turn = TurnSpec("assistant", "policy", None, policy_version=t.policy_version, started_at=t.ended_at,
                            ended_at=t.ended_at, latency_ms=0.0, served_model=served)
        turn.action_schema, turn.tool_call_id, turn.tool_args = name, cid, args
        turn.status = "OK" if ok else Status.MODEL_INVALID_ACTION
        out_turns.append(turn)
    return out_turns


def _tool_turn(m: dict[str, Any], content: str | None, tool_events: dict[str, dict[str, Any]],
               call_names: dict[str, str], loc: Loc, f: str) -> TurnSpec:
    tcid = m.get("tool_call_id")
    cid = id_str(tcid, loc, f"{f}.tool_call_id") if tcid is not None else None
    raw_name = opt_str(m, "function", loc, f"{f}.function")
    name = (call_names.get(cid) if cid is not None else None) or raw_name
    t = TurnSpec("tool", "env", content, action_schema=name, tool_call_id=cid)
    err = opt_obj(m, "error", loc, f"{f}.error")
    if err is not None:
        kind = opt_str(err, "type", loc, f"{f}.error.type") or "unknown"
        t.status = TOOL_ERRORS.get(kind, Status.ENV_BUG)
        if t.content is None:
            t.content = opt_str(err, "message", loc, f"{f}.error.message")
    event = tool_events.get(cid) if cid is not None else None
    if event is not None:
        start, end, working = _event_times(event, loc, f"tool event {cid}")
        t.started_at, t.ended_at = start, end
        if working is not None and working >= 0:
            t.tool_seconds = working
            t.duration_s = working
        elif start is not None and end is not None and end >= start:
            t.tool_seconds = (end - start).total_seconds()
    return t


def _open_eval(path: Path) -> Source:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        Loc(str(path)).fail("*", f"not a readable .eval zip: {e}")
    with zf:
        names = zf.namelist()
        header_name = "header.json" if "header.json" in names else "_journal/start.json"
        if header_name not in names:
            Loc(str(path)).fail("header", "not an inspect .eval log: header.json and _journal/start.json missing")
        h = _Header(_read_json(zf, header_name, path), f"{path}:{header_name}")
        sample_names = sorted(n for n in names if n.startswith("samples/") and n.endswith(".json"))

    def records() -> Iterator[Record]:
        with zipfile.ZipFile(path) as z:
            for name in sample_names:
                stem = name[len("samples/"):-len(".json")]
                sid, _, ep = stem.rpartition("_epoch_")
                where = f"{path}:sample {sid} epoch {ep}" if sid else f"{path}:{name}"
                loc = Loc(where)

                def parse(name: str = name, loc: Loc = loc) -> EpisodeSpec:
                    return parse_sample(_read_json(z, name, path, loc), h, loc)

                yield Record(where, parse)

    return Source(format_version=h.version, run=h.run_info(), records=records)


ZIP_ZSTD = 93
"""The zip compression method of Zstandard (APPNOTE 4.4.5). inspect_ai writes the members of ``.eval`` logs with it
(``zipfile-zstd``); Python's ``zipfile`` reads it only from 3.14 on (``zipfile.ZIP_ZSTANDARD``)."""

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # the zip local file header, as zipfile's own structFileHeader


def read_member(zf: zipfile.ZipFile, name: str, path: Path) -> bytes:
    """The bytes of one member of a ``.eval`` zip: stored and deflated members through ``zipfile``, Zstandard ones
    (method 93) through the ``zstandard`` package where ``zipfile`` cannot read them; the size and CRC-32 are
    checked either way. Raises ValueError (with what to install) or zipfile.BadZipFile."""
    info = zf.getinfo(name)
    if info.compress_type != ZIP_ZSTD or hasattr(zipfile, "ZIP_ZSTANDARD"):
        return zf.read(name)
    try:
        import zstandard
    except ImportError:
        raise ValueError(f"{name} is Zstandard-compressed (zip method 93, as current inspect_ai writes .eval "
                         f"logs): install the zstandard package (pip install 'trajlake[inspect]')") from None
    if info.flag_bits & 0x1:
        raise ValueError(f"{name} is encrypted")
    with open(path, "rb") as fh:  # a handle of our own: zipfile's is positioned by its own readers
        fh.seek(info.header_offset)
        header = fh.read(_LOCAL_HEADER.size)
        if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile(f"{name}: bad local file header")
        fields = _LOCAL_HEADER.unpack(header)
        fh.seek(fields[10] + fields[11], 1)  # the file name and extra field of the local header
        compressed = fh.read(info.compress_size)
    if len(compressed) != info.compress_size:
        raise zipfile.BadZipFile(f"{name}: truncated ({len(compressed)} of {info.compress_size} compressed bytes)")
    chunks: list[bytes] = []
    size = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(compressed) as reader:
            # read at most one byte past the declared size: a member that inflates further is refused, not held
            while size <= info.file_size:
                chunk = reader.read(min(1 << 20, info.file_size + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except zstandard.ZstdError as e:
        raise zipfile.BadZipFile(f"{name}: invalid Zstandard data: {e}") from None
    data = b"".join(chunks)
    if len(data) != info.file_size:
        raise zipfile.BadZipFile(f"{name}: {'more' if len(data) > info.file_size else 'fewer'} bytes than the "
                                 f"{info.file_size} the zip declares")
    if zlib.crc32(data) != info.CRC:
        raise zipfile.BadZipFile(f"{name}: bad CRC-32")
    return data


def _read_json(zf: zipfile.ZipFile, name: str, path: Path, loc: Loc | None = None) -> Any:
    loc = loc or Loc(f"{path}:{name}")
    try:
        data = read_member(zf, name, path)
    except (zipfile.BadZipFile, OSError, KeyError, EOFError, ValueError, RuntimeError) as e:
        loc.fail("*", f"cannot read {name} from the zip: {e}")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        loc.fail("*", f"{name} is not valid UTF-8 (byte {e.start})")
    except json.JSONDecodeError as e:
        loc.fail("*", f"{name}: {json_error_text(e)}")
    except RecursionError:
        loc.fail("*", f"{name}: invalid JSON: nested too deeply")


def _open_json(path: Path) -> Source:
    loc = Loc(str(path))
    try:
        doc = json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        loc.fail("*", f"file is not valid UTF-8 (byte {e.start})")
    except json.JSONDecodeError as e:
        Loc(f"{path}:{e.lineno}").fail("*", json_error_text(e, with_line=False))
    except RecursionError:
        loc.fail("*", "invalid JSON: nested too deeply")
    h = _Header(doc, str(path))
    samples = opt_list(doc, "samples", loc, "samples") or []

    def records() -> Iterator[Record]:
        for i, s in enumerate(samples):
            sid = s.get("id") if isinstance(s, dict) else None
            ep = s.get("epoch") if isinstance(s, dict) else None
            where = f"{path}:sample {sid} epoch {ep}" if isinstance(sid, str | int) else f"{path}:samples[{i}]"
            sloc = Loc(where)

            def parse(s: Any = s, sloc: Loc = sloc) -> EpisodeSpec:
                return parse_sample(s, h, sloc)

            yield Record(where, parse)

    return Source(format_version=h.version, run=h.run_info(), records=records)


def open_source(path: Path) -> Source:
    """An inspect log: a ``.eval`` zip (detected by content) or a ``.json`` document."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    return _open_eval(path) if magic == b"PK\x03\x04" else _open_json(path)
