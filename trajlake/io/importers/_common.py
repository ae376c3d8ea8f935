"""Shared pieces of the importers: checked JSON access, episode/turn specs, the timeline, ids and row building.

Every importer turns its source into ``EpisodeSpec`` objects (one per episode, with ``TurnSpec`` turns) plus
one ``RunInfo``; ``build_rows`` turns a spec into schema-v1 rows. Everything that reads the source goes
through the checked accessors below, so malformed input raises ``ValidationError`` naming the file, the line
or sample, and the field — never ``KeyError``/``TypeError``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from trajlake.errors import Issue, ValidationError
from trajlake.io.jsonl import json_error_text

SYNTHETIC_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MIN_TIME = dt.datetime(1900, 1, 1, tzinfo=dt.UTC)
MAX_TIME = dt.datetime(2999, 12, 31, tzinfo=dt.UTC)
MAX_SECONDS = 1e7  # longest duration the synthetic timeline gives one turn (about 115 days)
"""Base time of the synthetic timeline of sources that carry no time at all (documented in docs/importers.md)."""


# When True, unexpected exceptions raised while parsing one record (a bug, or a shape the checked accessors
# missed) are reported as a ValidationError naming the record instead of escaping. The fuzz tests turn it off
# so that such gaps fail loudly there.
SAFETY_NET = True


class Loc:
    """Where a record comes from (``file:line`` or ``file:sample ...``), for error messages."""

    def __init__(self, where: str, episode_id: str | None = None):
        self.where = where
        self.episode_id = episode_id

    def fail(self, field: str, message: str, *, turn: int | None = None, table: str = "episodes") -> NoReturn:
        """Raise a ValidationError for ``field`` of this record."""
        raise ValidationError([Issue(table, self.episode_id, turn, field, message, self.where)])


# --- checked JSON access --------------------------------------------------------------------------------------

def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(v), type(v).__name__)


def as_obj(v: Any, loc: Loc, field: str) -> dict[str, Any]:
    """``v`` as a JSON object, or fail."""
    if not isinstance(v, dict):
        loc.fail(field, f"expected an object, got {_type_name(v)}")
    return v


def as_list(v: Any, loc: Loc, field: str) -> list[Any]:
    """``v`` as a JSON array, or fail."""
    if not isinstance(v, list):
        loc.fail(field, f"expected an array, got {_type_name(v)}")
    return v


def opt_obj(d: Mapping[str, Any], key: str, loc: Loc, field: str) -> dict[str, Any] | None:
    """``d[key]`` as an object; None when missing or null."""
    v = d.get(key)
    return None if v is None else as_obj(v, loc, field)


def opt_list(d: Mapping[str, Any], key: str, loc: Loc, field: str) -> list[Any] | None:
    """``d[key]`` as an array; None when missing or null."""
    v = d.get(key)
    return None if v is None else as_list(v, loc, field)


def opt_str(d: Mapping[str, Any], key: str, loc: Loc, field: str) -> str | None:
    """``d[key]`` as a string; None when missing or null."""
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        loc.fail(field, f"expected a string, got {_type_name(v)}")
    return v


def req_str(d: Mapping[str, Any], key: str, loc: Loc, field: str) -> str:
    """``d[key]`` as a non-empty string, or fail."""
    v = opt_str(d, key, loc, field)
    if not v:
        loc.fail(field, "required string is missing")
    return v


def opt_num(d: Mapping[str, Any], key: str, loc: Loc, field: str) -> float | None:
    """``d[key]`` as a finite number; None when missing or null."""
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        loc.fail(field, f"expected a number, got {_type_name(v)}")
    f = float(v)
    if not math.isfinite(f):
        loc.fail(field, f"expected a finite number, got {v!r}")
    return f


def opt_int(d: Mapping[str, Any], key: str, loc: Loc, field: str) -> int | None:
    """``d[key]`` as a non-negative integer (int64); None when missing or null."""
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        loc.fail(field, f"expected an integer, got {_type_name(v)}")
    if not 0 <= v < 1 << 62:
        loc.fail(field, f"integer {v} is out of range")
    return v


def opt_bool(d: Mapping[str, Any], key: str, loc: Loc, field: str) -> bool | None:
    """``d[key]`` as a boolean; None when missing or null."""
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, bool):
        loc.fail(field, f"expected true/false, got {_type_name(v)}")
    return v


def id_str(v: Any, loc: Loc, field: str) -> str:
    """A sample/instance id (string or integer) as a non-empty string."""
    if isinstance(v, bool) or not isinstance(v, str | int):
        loc.fail(field, f"expected a string or integer id, got {_type_name(v)}")
    s = str(v)
    if not s:
        loc.fail(field, "id must not be empty")
    return s


def parse_time(v: Any, loc: Loc, field: str) -> dt.datetime:
    """An ISO-8601 string (naive times are taken as UTC) or Unix seconds, as an aware UTC datetime."""
    if isinstance(v, bool) or v is None:
        loc.fail(field, f"expected a timestamp, got {_type_name(v)}")
    if isinstance(v, int | float):
        if not math.isfinite(v) or not 0 <= v < 32503680000:
            loc.fail(field, f"Unix time {v!r} is out of range")
        return dt.datetime.fromtimestamp(float(v), dt.UTC)
    if not isinstance(v, str):
        loc.fail(field, f"expected an ISO-8601 timestamp, got {_type_name(v)}")
    try:
        ts = dt.datetime.fromisoformat(v.strip().replace("Z", "+00:00"))
    except ValueError:
        loc.fail(field, f"not an ISO-8601 timestamp: {v[:60]!r}")
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.UTC)
    try:
        ts = ts.astimezone(dt.UTC)
    except (OverflowError, ValueError):
        loc.fail(field, f"timestamp {v[:60]!r} is out of range")
    if not MIN_TIME <= ts <= MAX_TIME:
        loc.fail(field, f"timestamp {v[:60]!r} is out of range (1900..2999)")
    return ts


def opt_time(d: Mapping[str, Any], key: str, loc: Loc, field: str) -> dt.datetime | None:
    """``d[key]`` as a timestamp; None when missing or null."""
    v = d.get(key)
    return None if v is None else parse_time(v, loc, field)


def text_of(content: Any, loc: Loc, field: str, attachments: Mapping[str, str] | None = None) -> str | None:
    """Message content as text: a string, null, or a list of content parts (text/reasoning/refusal parts are
    kept; images, audio and other media become a ``[type]`` placeholder)."""
    if content is None:
        return None
    if isinstance(content, str):
        return resolve_attachment(content, attachments)
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        loc.fail(field, f"expected a string or a list of content parts, got {_type_name(content)}")
    out: list[str] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            out.append(resolve_attachment(part, attachments))
            continue
        p = as_obj(part, loc, f"{field}[{i}]")
        kind = p.get("type", "text")
        if not isinstance(kind, str):
            loc.fail(f"{field}[{i}].type", f"expected a string, got {_type_name(kind)}")
        if kind in ("text", "input_text", "output_text"):
            out.append(resolve_attachment(req_text(p, "text", loc, f"{field}[{i}].text"), attachments))
        elif kind == "reasoning":
            r = opt_str(p, "reasoning", loc, f"{field}[{i}].reasoning")
            if p.get("redacted") is True or not r:
                out.append("<think>[redacted]</think>")
            else:
                out.append(f"<think>\n{resolve_attachment(r, attachments)}\n</think>")
        elif kind == "refusal":
            out.append(req_text(p, "refusal", loc, f"{field}[{i}].refusal"))
        else:
            out.append(f"[{kind}]")
    return "\n".join(out)


def req_text(d: Mapping[str, Any], key: str, loc: Loc, field: str) -> str:
    """``d[key]`` as a string (may be empty), or fail."""
    v = d.get(key)
    if not isinstance(v, str):
        loc.fail(field, f"expected a string, got {_type_name(v)}")
    return v


def resolve_attachment(s: str, attachments: Mapping[str, str] | None) -> str:
    """inspect_ai stores long strings once as ``attachment://<hash>``; replace such a reference by its text."""
    if attachments and s.startswith("attachment://"):
        return attachments.get(s[len("attachment://"):], s)
    return s


def decode_arguments(raw: Any) -> tuple[str | None, bool]:
    """Tool-call arguments as canonical JSON text, and whether they form a valid argument object.

    Arguments may be an object, a JSON string, or a JSON string that itself holds a JSON string (encoded
    twice, seen in real logs): decoding repeats (up to 3 times) while the result is still a string. An empty
    string means no arguments (``{}``). Anything that does not end as an object is kept as JSON text of the
    original value and reported invalid (the call becomes a MODEL_INVALID_ACTION)."""
    if raw is None:
        return None, True
    if isinstance(raw, str) and not raw.strip():
        return "{}", True
    value: Any = raw
    for _ in range(3):
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except ValueError:
            break
    if isinstance(value, dict):
        return canonical_json(value), True
    return canonical_json(raw), False


def openai_tool_calls(m: Mapping[str, Any], loc: Loc, field: str) -> list[tuple[str | None, str, str | None, bool]]:
    """A message's OpenAI-style ``tool_calls`` as ``(call id, action name, arguments, arguments valid)``; the
    action name is the function name, or the command of a file-editor call (``tool_action_name``)."""
    calls: list[tuple[str | None, str, str | None, bool]] = []
    for j, c in enumerate(opt_list(m, "tool_calls", loc, f"{field}.tool_calls") or []):
        cf = f"{field}.tool_calls[{j}]"
        c = as_obj(c, loc, cf)
        fn = as_obj(c.get("function"), loc, f"{cf}.function")
        name = req_str(fn, "name", loc, f"{cf}.function.name")
        args, ok = decode_arguments(fn.get("arguments"))
        cid = id_str(c["id"], loc, f"{cf}.id") if c.get("id") is not None else None
        calls.append((cid, tool_action_name(name, args), args, ok))
    return calls


EDITOR_COMMANDS = frozenset({"view", "create", "str_replace", "insert", "undo_edit"})
"""Commands of the file-editor tools that multiplex operations through one ``command`` argument
(``str_replace_editor`` of SWE-agent and OpenHands, inspect's ``text_editor``, Anthropic's
``str_replace_based_edit_tool``)."""
EDITOR_TOOLS = frozenset({"str_replace_editor", "text_editor", "str_replace_based_edit_tool"})


def tool_action_name(name: str, args_json: str | None) -> str:
    """The ``action_schema`` of a call of tool ``name`` with arguments ``args_json`` (canonical JSON).

    A file-editor call (a tool in ``EDITOR_TOOLS`` or with "edit" in its name, arguments with a ``path`` and
    a ``command`` in ``EDITOR_COMMANDS``) is named by its command: ``view`` reads, ``str_replace``/``insert``/
    ``undo_edit`` edit, ``create`` writes a new file. Named by the tool alone, every call of
    ``str_replace_editor`` (words str, replace, editor) would be an edit to the failure taxonomy, a ``view``
    of a file never seen before included."""
    if not args_json or '"command"' not in args_json or not (name in EDITOR_TOOLS or "edit" in name.lower()):
        return name
    try:
        args = json.loads(args_json)
    except ValueError:
        return name
    command = args.get("command") if isinstance(args, dict) else None
    if isinstance(command, str) and command in EDITOR_COMMANDS and "path" in args:
        return command
    return name


def canonical_json(v: Any) -> str:
    """Deterministic JSON text (sorted keys, no ASCII escaping)."""
    return json.dumps(v, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def command_name(action: str | None) -> str | None:
    """First word of a shell-style action (``edit 1:1`` -> ``edit``), the tool name of text actions; a
    file-editor action is named by its command (``str_replace_editor view /a.py`` -> ``view``), as
    ``tool_action_name`` names editor calls."""
    if not action:
        return None
    parts = action.strip().split(None, 2)
    if not parts:
        return None
    if len(parts) > 1 and parts[0] in EDITOR_TOOLS and parts[1] in EDITOR_COMMANDS:
        return parts[1]
    return parts[0][:200]


def sha256_text(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8", "surrogatepass")).hexdigest()


def short_hash(*parts: str, n: int = 16) -> str:
    """A short deterministic hash of ``parts``."""
    return hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:n]


# --- specs ----------------------------------------------------------------------------------------------------

@dataclass
class TurnSpec:
    """One turn as read from the source; unset times are filled by the timeline."""

    role: str
    actor: str
    content: str | None
    policy_version: str | None = None
    action_schema: str | None = None
    tool_call_id: str | None = None
    tool_args: str | None = None
    status: str = "OK"
    tokens: int = 0
    prompt_tokens: int | None = None  # policy turns: the input tokens the source reports for this call
    cost_usd: float | None = None  # None: the source has no cost for this turn
    tool_seconds: float = 0.0
    latency_ms: float | None = None
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    duration_s: float | None = None  # used for unknown times: the turn lasts this long on the synthetic timeline
    trainable: bool = True  # policy turns only: loss mask 1 when tokenized (OpenAI "weight": 0 turns it off)
    reward_components: dict[str, float] | None = None
    served_model: str | None = None  # policy turns: the model version that answered (the episode's column)


@dataclass
class TaskSpec:
    """What a ``tasks`` row needs beyond the episode's ids."""

    statement: str
    family: str
    created_at: dt.datetime | None = None
    source: str | None = None
    commit: str | None = None
    max_steps: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None


@dataclass
class EpisodeSpec:
    """One episode as read from the source."""

    key: str  # identifies the record within the file (line number, sample id + epoch): part of the episode id
    task_id: str
    task_version: str
    env_version: str
    terminated: bool
    truncated: bool
    termination_reason: str
    success: bool | None  # None: never graded
    turns: list[TurnSpec]
    error_class: str | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    reward_total: float | None = None  # default: sum of the components
    tokens_in: int | None = None  # None: not in the source (tokenizer counts or 0)
    tokens_out: int | None = None
    cost_usd: float | None = None  # None: sum of the turns that have a cost, null when none has
    tool_seconds: float | None = None  # None: sum of the turns
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    base_time: dt.datetime = SYNTHETIC_EPOCH
    policy_version: str | None = None
    attempt: int = 0
    env_seed: int | None = None
    sandbox: str | None = None
    task: TaskSpec | None = None
    verification_source: str | None = None  # how ``success`` was verified; None when it was not
    served_model: str | None = None  # the model version that answered, when the source names it apart


@dataclass
class RunInfo:
    """What a ``runs`` row needs; ``created_at`` must come from the file so re-imports are no-ops."""

    created_at: dt.datetime = SYNTHETIC_EPOCH
    policy_name: str | None = None
    code_version: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    # config facts known only once every record was parsed (the run row is written after the check pass)
    late_config: Callable[[], dict[str, Any]] | None = None


@dataclass
class Record:
    """One record (line, sample, file) of a source; ``parse`` reads it into an episode or raises."""

    where: str
    parse: Callable[[], EpisodeSpec]


@dataclass
class Source:
    """A parsed source file: its format version, run information and records (parsed lazily, twice)."""

    format_version: str
    run: RunInfo
    records: Callable[[], Iterator[Record]]


# --- building rows --------------------------------------------------------------------------------------------

def episode_id_for(fmt: str, file_hash: str, run_id: str, key: str) -> str:
    """Deterministic episode id of record ``key`` of a file imported into ``run_id``."""
    return "imp-" + short_hash(fmt, file_hash, run_id, key, n=32)


def render_turn(t: TurnSpec) -> str:
    """The text of a turn that ``--tokenizer`` tokenizes: its content, and for a tool call the call itself as
    ``{"name": ..., "arguments": ...}`` JSON on its own line."""
    text = t.content or ""
    if t.role == "assistant" and t.action_schema is not None and t.tool_args is not None:
        call = '{"name":' + json.dumps(t.action_schema, ensure_ascii=False) + ',"arguments":' + t.tool_args + "}"
        text = f"{text}\n{call}" if text else call
    return text


def lay_out(spec: EpisodeSpec) -> tuple[dt.datetime, dt.datetime]:
    """Fill the turns' missing times and make them satisfy the writer's order rules; returns the episode's
    (started_at, ended_at).

    Known times are kept. A turn without times starts when the previous turn ended (the episode start for
    the first) and lasts ``duration_s`` (or its latency, else 0). Starts are clamped so that they never go
    back in time, ends so that they never precede their start; the episode spans all its turns."""
    known = [t.started_at for t in spec.turns if t.started_at is not None]
    start = spec.started_at or (min(known) if known else spec.base_time)
    if known:
        start = min(start, *known)
    prev_start = prev_end = start
    for t in spec.turns:
        dur = t.duration_s if t.duration_s is not None else (t.latency_ms / 1000.0 if t.latency_ms else 0.0)
        step = dt.timedelta(seconds=max(0.0, min(dur, MAX_SECONDS)))
        if t.started_at is not None:
            s = t.started_at
            e = t.ended_at if t.ended_at is not None else s + step
        elif t.ended_at is not None:
            e = t.ended_at
            s = max(prev_end, e - step)
        else:
            s = prev_end
            e = s + step
        s = max(s, prev_start)
        e = max(e, s)
        t.started_at, t.ended_at = s, e
        if t.latency_ms is None:
            t.latency_ms = (e - s).total_seconds() * 1000.0
        prev_start, prev_end = s, max(prev_end, e)
    end = max([spec.ended_at or start, start, *(t.ended_at for t in spec.turns if t.ended_at is not None)])
    return start, end


def clean_str(s: str) -> str:
    """Strings that cannot be UTF-8 encoded (lone surrogates from JSON escapes) get U+FFFD instead."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def clean_components(comps: Mapping[str, float]) -> dict[str, float]:
    """Reward components without non-finite values."""
    return {clean_str(k): float(v) for k, v in comps.items() if math.isfinite(v)}


def load_json_line(raw: bytes, loc: Loc) -> dict[str, Any]:
    """One line of a JSONL file as a JSON object; UTF-8 and JSON errors fail at ``loc``."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        loc.fail("*", f"line is not valid UTF-8 (byte {e.start})")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        loc.fail("*", json_error_text(e, with_line=False))
    except RecursionError:
        loc.fail("*", "invalid JSON: nested too deeply")
    return as_obj(obj, loc, "line")


def jsonl_records(path: Path, parse: Callable[[dict[str, Any], Loc, str], EpisodeSpec]
                  ) -> Callable[[], Iterator[Record]]:
    """Records of a JSONL file with one episode per non-empty line, parsed lazily by ``parse(obj, loc, label)``."""

    def records() -> Iterator[Record]:
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                loc = Loc(f"{path}:{lineno}")

                def one(raw: bytes = raw, loc: Loc = loc, lineno: int = lineno) -> EpisodeSpec:
                    return parse(load_json_line(raw, loc), loc, f"line {lineno}")

                yield Record(loc.where, one)

    return records
