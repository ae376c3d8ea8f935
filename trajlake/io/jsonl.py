"""The ``trajlake-jsonl`` interchange format (documented in docs/interchange.md).

One JSON object per line. A line is an episode unless its ``"type"`` says otherwise:

- ``{"type": "episode", <episodes columns>, "turns": [<turns columns>...], "gateway_events": [...]}``:
  turns may omit ``episode_id``, ``run_id`` and ``turn_idx`` (taken from the episode and the position); the
  episode may omit ``n_turns``, ``n_policy_tokens`` and hashes (derived; checked when given).
- ``{"type": "task", <tasks columns>}`` and ``{"type": "run", <runs columns>}``.

Timestamps are ISO-8601 strings with an offset (``2025-01-31T12:00:00Z``); naive times are rejected.
Any language can write it; ``trajlake ingest FILE --format trajlake-jsonl`` reads it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajlake.errors import Issue, ValidationError
from trajlake.record.writer import LakeWriter, WriteResult
from trajlake.schema import table_def

CHUNK_EPISODES = 500


class _FieldError(Exception):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def _coerce(value: Any, t: Any, name: str) -> Any:
    """Check and convert one JSON value to the Python value for schema type ``t``."""
    if value is None:
        return None
    if isinstance(t, str):
        if t == "string":
            if not isinstance(value, str):
                raise _FieldError(name, f"expected a string, got {type(value).__name__}")
            return value
        if t == "bool":
            if not isinstance(value, bool):
                raise _FieldError(name, f"expected true/false, got {value!r}")
            return value
        if t in ("int8", "int32", "int64"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise _FieldError(name, f"expected an integer, got {value!r}")
            bits = {"int8": 7, "int32": 31, "int64": 63}[t]
            if not -(1 << bits) <= value < (1 << bits):
                raise _FieldError(name, f"{value} does not fit in {t}")
            return value
        if t in ("float32", "float64"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise _FieldError(name, f"expected a number, got {value!r}")
            return float(value)
        if t == "timestamp":
            if not isinstance(value, str):
                raise _FieldError(name, "expected an ISO-8601 timestamp string")
            try:
                ts = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError as e:
                raise _FieldError(name, f"not an ISO-8601 timestamp: {value!r}") from e
            if ts.tzinfo is None:
                raise _FieldError(name, f"timestamp {value!r} has no UTC offset")
            return ts.astimezone(dt.UTC)
    kind, arg = next(iter(t.items()))
    if kind == "list":
        if not isinstance(value, list):
            raise _FieldError(name, f"expected a list, got {type(value).__name__}")
        return [_coerce(v, arg, f"{name}[{i}]") for i, v in enumerate(value)]
    if kind == "map":
        if not isinstance(value, dict):
            raise _FieldError(name, "expected an object")
        return [(_coerce(k, arg[0], name), _coerce(v, arg[1], f"{name}.{k}")) for k, v in value.items()]
    if kind == "struct":
        if not isinstance(value, dict):
            raise _FieldError(name, "expected an object")
        known = {c["name"]: c for c in arg}
        for k in value:
            if k not in known:
                raise _FieldError(f"{name}.{k}", "unknown field")
        return {k: _coerce(value.get(k), c["type"], f"{name}.{k}") for k, c in known.items()}
    raise _FieldError(name, f"unsupported type {t}")


def _row(obj: dict[str, Any], table: str, where: str, ep: str | None, turn: int | None) -> dict[str, Any]:
    td = table_def(table)
    cols = {c.name: c for c in td.columns}
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if k not in cols:
            raise ValidationError([Issue(table, ep, turn, k, "unknown column (see `trajlake schema`)", where)])
        try:
            out[k] = _coerce(v, cols[k].type, k)
        except _FieldError as e:
            raise ValidationError([Issue(table, ep, turn, e.field, e.message, where)]) from None
    return out


@dataclass
class Parsed:
    """Episodes (with turns and events), tasks and runs parsed from a chunk of lines."""

    episodes: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    tasks: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    line_of: dict[str, int] = field(default_factory=dict)


def parse_line(obj: Any, where: str, out: Parsed, lineno: int) -> None:
    if not isinstance(obj, dict):
        raise ValidationError([Issue("episodes", None, None, "*", "each line must be a JSON object", where)])
    obj = dict(obj)
    kind = obj.pop("type", "episode")
    if kind == "task":
        out.tasks.append(_row(obj, "tasks", where, None, None))
        return
    if kind == "run":
        out.runs.append(_row(obj, "runs", where, None, None))
        return
    if kind != "episode":
        raise ValidationError([Issue("episodes", None, None, "type", f"unknown line type {kind!r} "
                                     "(episode, task or run)", where)])
    turns = obj.pop("turns", None)
    events = obj.pop("gateway_events", None) or []
    ep_id = obj.get("episode_id")
    if not isinstance(ep_id, str) or not ep_id:
        raise ValidationError([Issue("episodes", None, None, "episode_id", "required string is missing", where)])
    if not isinstance(turns, list):
        raise ValidationError([Issue("episodes", ep_id, None, "turns", "required list of turns is missing", where)])
    ep = _row(obj, "episodes", where, ep_id, None)
    parsed_turns = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise ValidationError([Issue("turns", ep_id, i, "*", "turn must be a JSON object", where)])
        t = {"episode_id": ep_id, "run_id": ep.get("run_id"), "turn_idx": i, **t}
        parsed_turns.append(_row(t, "turns", where, ep_id, i))
    masks = [sum(t["loss_mask"]) for t in parsed_turns if t.get("loss_mask") is not None]
    ep.setdefault("n_turns", len(parsed_turns))
    ep.setdefault("n_policy_tokens", int(sum(masks)))
    for e in events:
        if not isinstance(e, dict):
            raise ValidationError([Issue("gateway_events", ep_id, None, "*", "event must be a JSON object", where)])
        out.events.append(_row({"episode_id": ep_id, "run_id": ep.get("run_id"), **e}, "gateway_events", where,
                               ep_id, e.get("turn_idx")))
    out.episodes.append(ep)
    out.turns += parsed_turns
    out.line_of[ep_id] = lineno


def json_error_text(e: json.JSONDecodeError, *, with_line: bool = True) -> str:
    """``invalid JSON: <what> at line L column C``. Some of json's messages already end in "at" ("Unterminated
    string starting at"): the position follows them directly instead of a second "at"."""
    pos = f"line {e.lineno} column {e.colno}" if with_line else f"column {e.colno}"
    return f"invalid JSON: {e.msg} {pos}" if e.msg.endswith(" at") else f"invalid JSON: {e.msg} at {pos}"


def iter_chunks(path: Path, chunk: int = CHUNK_EPISODES) -> Iterator[Parsed]:
    """Parse ``path`` in chunks; raises ValidationError naming file:line and field on the first bad line."""
    cur = Parsed()
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValidationError([Issue("episodes", None, None, "*", f"line is not UTF-8 text (byte "
                                             f"{e.start}): not a trajlake-jsonl file", where)]) from None
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValidationError([Issue("episodes", None, None, "*", json_error_text(e, with_line=False),
                                             where)]) from None
            except RecursionError:
                raise ValidationError([Issue("episodes", None, None, "*", "invalid JSON: nested too deeply",
                                             where)]) from None
            parse_line(obj, where, cur, lineno)
            if len(cur.episodes) >= chunk:
                yield cur
                cur = Parsed()
    if cur.episodes or cur.tasks or cur.runs:
        yield cur


def _locate(result: WriteResult, parsed: Parsed, path: Path) -> list[Issue]:
    issues = []
    for e, errs in result.rejected.items():
        for i in errs:
            line = parsed.line_of.get(e)
            src = f"{path}:{line}" if line else str(path)
            issues.append(Issue(i.table, i.episode_id, i.turn_idx, i.field, i.message, src))
    return issues


@dataclass
class IngestSummary:
    """What an ingest did."""

    episodes_written: int = 0
    duplicates: int = 0
    rejected: list[Issue] = field(default_factory=list)
    tasks_written: int = 0
    runs_written: int = 0


def ingest_jsonl(writer: LakeWriter, path: Path, *, skip_invalid: bool = False) -> IngestSummary:
    """Validate the whole file first; unless ``skip_invalid``, any invalid episode means nothing is written."""
    summary = IngestSummary()
    # pass 1: parse and validate everything without writing
    empty = True
    for parsed in iter_chunks(path):
        empty = False
        if parsed.episodes:
            res = writer.write_batch(parsed.episodes, parsed.turns, parsed.events or None, dry_run=True)
            summary.rejected += _locate(res, parsed, path)
    if empty:  # the rule of every ingest format (trajlake.io.importers.check_input_file)
        raise ValidationError([Issue("episodes", None, None, "*", "empty file: no episodes", str(path))])
    if summary.rejected and not skip_invalid:
        raise ValidationError(summary.rejected)
    # pass 2: write (re-parsing keeps memory bounded by one chunk)
    for parsed in iter_chunks(path):
        if parsed.runs:
            summary.runs_written += writer.write_runs(parsed.runs)
        if parsed.tasks:
            summary.tasks_written += writer.write_tasks(parsed.tasks)
        if parsed.episodes:
            res = writer.write_batch(parsed.episodes, parsed.turns, parsed.events or None)
            summary.episodes_written += len(res.accepted)
            summary.duplicates += len(res.duplicates)
    writer.flush()
    return summary


def episode_to_json(ep: dict[str, Any], turns: list[dict[str, Any]], events: list[dict[str, Any]] | None = None) -> str:
    """Serialise one episode (rows as dicts) to a trajlake-jsonl line."""

    def enc(v: Any) -> Any:
        if isinstance(v, dt.datetime):
            return v.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
        if isinstance(v, list) and v and isinstance(v[0], tuple):
            return {k: x for k, x in v}
        if isinstance(v, dict):
            return {k: enc(x) for k, x in v.items()}
        if isinstance(v, list):
            return [enc(x) for x in v]
        return v

    obj: dict[str, Any] = {k: enc(v) for k, v in ep.items() if v is not None}
    obj["turns"] = [{k: enc(v) for k, v in t.items() if v is not None} for t in turns]
    if events:
        obj["gateway_events"] = [{k: enc(v) for k, v in e.items() if v is not None} for e in events]
    return json.dumps(obj, separators=(",", ":"))


__all__ = ["IngestSummary", "episode_to_json", "ingest_jsonl", "iter_chunks", "json_error_text"]
