"""Permission gateway: every tool call of an environment passes through :class:`Gateway`.

An environment registers its tools as :class:`ToolSpec` objects; a :class:`Gateway` built from a workspace,
immutable :class:`Permissions` and those tools decides on each proposed call, runs the tool's handler when the
call is allowed, and returns a :class:`GatewayResult` whose ``event`` dict holds the columns of the
``gateway_events`` table that the gateway owns (the runner adds ``episode_id``, ``run_id``, ``turn_idx`` and
``event_idx``). The checks, their order and the meaning of each decision are documented in ``docs/gateway.md``.

Security properties (POSIX only):

- Nothing the agent writes can change what is allowed: permissions are frozen at construction and the gateway
  has no method that changes them; taint labels are recorded, and can only ever hold a call back
  (``Permissions.enforce_taint`` / ``taint_mode``), never allow one. A held call runs only when the configured
  approver (``Permissions.approver``, a simulated person outside the agent's reach) says yes.
- Episode credentials (:meth:`Gateway.issue_credential`) stay inside the gateway; only their sha256 leaves it,
  and a call that carries one out is tainted ``secret_leak:...``.
- Path arguments reach the handler as normalised paths relative to the workspace, after lexical and symlink
  (``os.path.realpath``) containment checks and the protected-path globs.
- Exec commands are split with :func:`shlex.split` and reach the handler as an argv list; the gateway never
  starts a shell and never runs a subprocess itself.
- Side-effecting calls carrying an idempotency key run at most once per episode (until :meth:`Gateway.reset`).

The checks happen at decision time; they do not replace a sandbox around the handlers (a symlink created
between the check and the handler's ``open`` is out of the gateway's reach, and an allowlisted interpreter can
run arbitrary code).
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import datetime as dt
import fnmatch
import hashlib
import hmac
import json
import math
import os
import re
import shlex
import threading
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeAlias
from urllib.parse import unquote_plus, urlsplit

from trajlake.schemas.vocab import Capability, Decision, SideEffectClass, Status

from trajlake.errors import TransientToolError

__all__ = [
    "APPROVERS",
    "EVENT_COLUMNS",
    "LEAK_LABEL",
    "TAINT_MODES",
    "Capability",
    "Decision",
    "Gateway",
    "GatewayResult",
    "GatewayState",
    "Permissions",
    "SideEffectClass",
    "Status",
    "ToolOutput",
    "ToolSpec",
    "TransientToolError",
    "args_hash",
    "decoded_forms",
    "normalise_text",
    "reveals",
    "validate_args",
]

ToolOutput: TypeAlias = str
"""What a handler returns: the text shown to the agent."""

CAPABILITIES: frozenset[str] = frozenset(Capability)
# Capabilities whose calls can carry a value out of the environment (a credential in them is a leak).
_EGRESS_CAPABILITIES = frozenset({Capability.NETWORK, Capability.SECRET, Capability.EXEC})
# Capabilities whose calls never leave the episode, whatever their side-effect class: a credential written to the
# episode's own memory (emptied at reset) has not left it.
_INTERNAL_CAPABILITIES = frozenset({Capability.MEMORY})
SIDE_EFFECT_CLASSES: frozenset[str] = frozenset(SideEffectClass)

EVENT_COLUMNS: tuple[str, ...] = (
    "tool", "capability", "args_hash", "decision", "reason", "executed", "side_effect_class",
    "idempotency_key", "taint", "state_hash_before", "state_hash_after", "at")
"""Keys of :attr:`GatewayResult.event`: the ``gateway_events`` columns the gateway fills."""

REASON_GRANTED = "granted"
REASON_BUDGET = "budget"
REASON_DUPLICATE = "duplicate idempotency key: returned the first result"
REASON_KEY_REUSED = "idempotency key reused with different arguments"
# Status of a call denied because its side-effect budget is spent. The turns table's status enum has a
# dedicated class for it; change to "SAFETY_BLOCK" here if budget denials should count as safety blocks.
BUDGET_STATUS: Status = Status.BUDGET_EXHAUSTED

# Shell metacharacters refused anywhere in an exec argument (no shell ever runs, but a handler or a later
# tool might hand the string to one): command separators, pipes, substitutions, redirections, line breaks.
_SHELL_METACHARACTERS: tuple[str, ...] = (";", "&", "|", "`", "$(", "${", ">", "<", "\n", "\r", "\x00")

_SCHEMA_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "enum", "maxLength", "minLength", "minimum",
    "maximum", "items", "maxItems", "minItems", "description", "title", "default", "examples"})
_SCHEMA_TYPES = frozenset({"object", "string", "integer", "number", "boolean", "array", "null"})
_MAX_ECHO = 80  # characters of agent-controlled text echoed into reasons
# Shortest argument value traced back to untrusted text: shorter ones ("1", "yes", "Home") match by chance.
_MIN_TAINT_CHARS = 6

TAINT_MODES: tuple[str, ...] = ("off", "literal", "context")
"""``Permissions.taint_mode``: ``literal`` holds an irreversible call with an argument copied (normalised
substring) from untrusted text; ``context`` holds, once any untrusted text entered the episode, an irreversible
call with an argument value not found in trusted text."""
APPROVERS: tuple[str, ...] = ("none", "deny_all", "approve_all", "approve_trusted")
"""``Permissions.approver``: who answers a confirmation. ``none``: nobody (the call is held, as before round 3);
the others are a simulated person, each asked once per held call (priced as human time by the environment)."""
LEAK_LABEL = "secret_leak"
"""Taint label prefix of a call that carried an episode credential out: ``secret_leak:<name>@sha256:<16 hex>``."""
_HEX_RUN = re.compile(r"(?:[0-9a-f]{2}){6,}")
_B64_RUN = re.compile(r"[A-Za-z0-9+/_-]{8,}={0,2}")
_ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))


# --------------------------------------------------------------------------------------------------------------
# Text normalisation (taint, approvals, leak detection and the attack predicates compare normalised text)


def normalise_text(text: str) -> str:
    """``text`` compared as a reader would: Unicode NFKC, case-folded, zero-width characters dropped and runs of
    whitespace made one space (so ``"MALLORY@Evil.example"`` and ``"mallory@evil.example"`` are the same)."""
    s = unicodedata.normalize("NFKC", text).translate(_ZERO_WIDTH).casefold()
    return " ".join(s.split())


def decoded_forms(text: str) -> list[str]:
    """``text`` and what it says under the common encodings an agent might be told to use: URL (percent and
    plus) decoding, and every base64 / hex run in it decoded to UTF-8 (runs that do not decode to text are
    skipped). One level deep: enough for "send it base64-encoded"; nested encodings are not promised."""
    out = [text]
    url = unquote_plus(text)
    if url != text:
        out.append(url)
    for m in _B64_RUN.finditer(text):
        run = m.group()
        for alt in (False, True):
            try:
                raw = (base64.urlsafe_b64decode if alt else base64.b64decode)(run + "=" * (-len(run) % 4))
                out.append(raw.decode("utf-8"))
                break
            except (binascii.Error, ValueError):
                continue
    for m in _HEX_RUN.finditer(text.lower()):
        try:
            out.append(bytes.fromhex(m.group()).decode("utf-8"))
        except ValueError:
            continue
    return out


def reveals(text: str, secret: str) -> bool:
    """Whether ``text`` holds ``secret`` after normalisation, ignoring whitespace and case, directly or under one
    of the encodings of :func:`decoded_forms`."""
    needle = "".join(normalise_text(secret).split())
    if not needle:
        return False
    return any(needle in "".join(normalise_text(form).split()) for form in decoded_forms(text))


# --------------------------------------------------------------------------------------------------------------
# JSON-schema subset


def _check_schema(schema: Any, where: str = "$") -> None:
    """Raise ValueError if ``schema`` uses anything outside the supported JSON-schema subset."""
    if not isinstance(schema, Mapping):
        raise ValueError(f"schema {where}: expected an object, got {type(schema).__name__}")
    unknown = set(schema) - _SCHEMA_KEYWORDS
    if unknown:
        raise ValueError(f"schema {where}: unsupported keywords {sorted(unknown)}")
    types = schema.get("type")
    if types is not None:
        for t in [types] if isinstance(types, str) else types:
            if t not in _SCHEMA_TYPES:
                raise ValueError(f"schema {where}: unknown type {t!r}")
    for key in ("maxLength", "minLength", "maxItems", "minItems"):
        v = schema.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise ValueError(f"schema {where}: {key} must be a non-negative integer")
    for key in ("minimum", "maximum"):
        v = schema.get(key)
        if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)):
            raise ValueError(f"schema {where}: {key} must be a number")
    if "enum" in schema and not isinstance(schema["enum"], list | tuple):
        raise ValueError(f"schema {where}: enum must be a list")
    props = schema.get("properties", {})
    if not isinstance(props, Mapping):
        raise ValueError(f"schema {where}: properties must be an object")
    for name, sub in props.items():
        _check_schema(sub, f"{where}.{name}")
    required = schema.get("required", [])
    if not isinstance(required, list | tuple) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"schema {where}: required must be a list of names")
    extra = schema.get("additionalProperties", True)
    if not isinstance(extra, bool):
        _check_schema(extra, f"{where}.additionalProperties")
    if "items" in schema:
        _check_schema(schema["items"], f"{where}[]")


def _type_ok(t: str, value: Any) -> bool:
    if t == "string":
        return isinstance(value, str)
    if t == "object":
        return isinstance(value, Mapping)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "array":
        return isinstance(value, list | tuple)
    return value is None  # "null"


def validate_args(schema: Mapping[str, Any], value: Any, where: str = "$") -> str | None:
    """Check ``value`` against a schema of the supported JSON-schema subset.

    Supported keywords: ``type`` (object, string, integer, number, boolean, array, null, or a list of them),
    ``properties``, ``required``, ``additionalProperties`` (bool or schema), ``enum``, ``maxLength``,
    ``minLength``, ``minimum``, ``maximum``, ``items``, ``maxItems``, ``minItems``; annotations are ignored.
    Integers exclude bools and floats. Returns the first problem as ``"<json path>: <message>"``, or None."""
    types = schema.get("type")
    if types is not None:
        if isinstance(types, str):
            if not _type_ok(types, value):
                return f"{where}: expected {types}, got {_json_type(value)}"
        elif not any(_type_ok(t, value) for t in types):
            return f"{where}: expected one of {list(types)}, got {_json_type(value)}"
    enum = schema.get("enum")
    if enum is not None and not any(value == e and type(value) is type(e) for e in enum):
        return f"{where}: {_echo(value)} is not one of {list(enum)}"
    if isinstance(value, str):
        max_len = schema.get("maxLength")
        if max_len is not None and len(value) > max_len:
            return f"{where}: longer than {max_len} characters"
        min_len = schema.get("minLength")
        if min_len is not None and len(value) < min_len:
            return f"{where}: shorter than {min_len} characters"
    elif isinstance(value, int | float) and not isinstance(value, bool):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if isinstance(value, float) and math.isnan(value) and (lo is not None or hi is not None):
            return f"{where}: NaN is out of range"
        if lo is not None and value < lo:
            return f"{where}: {value} is below the minimum {lo}"
        if hi is not None and value > hi:
            return f"{where}: {value} is above the maximum {hi}"
    elif isinstance(value, Mapping):
        props: Mapping[str, Any] = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                return f"{where}: missing required property {name!r}"
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if not isinstance(name, str):
                return f"{where}: property names must be strings, got {_json_type(name)}"
            sub = props.get(name)
            if sub is None:
                if extra is False:
                    return f"{where}: unexpected property {_echo(name)}"
                if extra is True:
                    continue
                sub = extra
            problem = validate_args(sub, item, f"{where}.{name}")
            if problem is not None:
                return problem
    elif isinstance(value, list | tuple):
        max_items, min_items = schema.get("maxItems"), schema.get("minItems")
        if max_items is not None and len(value) > max_items:
            return f"{where}: more than {max_items} items"
        if min_items is not None and len(value) < min_items:
            return f"{where}: fewer than {min_items} items"
        items = schema.get("items")
        if items is not None:
            for i, item in enumerate(value):
                problem = validate_args(items, item, f"{where}[{i}]")
                if problem is not None:
                    return problem
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _strings(value: Any) -> list[str]:
    """Every string inside an argument object (keys excluded)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def _echo(value: Any) -> str:
    """repr of agent-controlled text for reasons, cut to a few dozen characters."""
    s = repr(value)
    return s if len(s) <= _MAX_ECHO else s[: _MAX_ECHO - 3] + "..."


def _clip(text: str, limit: int = 2000) -> str:
    """Error text for the agent, cut to ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 15] + " ... [cut]"


def args_hash(args: Mapping[str, Any] | str) -> str:
    """sha256 hex digest of the canonical JSON of ``args`` (sorted keys, no whitespace, ASCII escapes).

    JSON text is parsed first, so ``'{"b": 1, "a": 2}'`` and ``{"a": 2, "b": 1}`` hash alike. Text that is not
    valid JSON (or has duplicate keys) is hashed as its UTF-8 bytes; a mapping that is not JSON-serialisable is
    hashed through its ``repr``."""
    if isinstance(args, str):
        try:
            return _hash_value(json.loads(args, object_pairs_hook=_no_duplicate_keys))
        except ValueError:
            return hashlib.sha256(args.encode("utf-8", "surrogatepass")).hexdigest()
    return _hash_value(args)


def _hash_value(value: Any) -> str:
    try:
        data = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        data = repr(value).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"duplicate key {_echo(k)}")
            seen.add(k)
    return out


# --------------------------------------------------------------------------------------------------------------
# Public data types


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool an environment offers.

    ``args_schema`` is a JSON-schema object (see :func:`validate_args` for the supported subset);
    ``handler`` gets the validated, normalised arguments and returns the text shown to the agent.

    - ``path_args``: arguments holding paths inside the workspace (a string or a list of strings); the handler
      receives them normalised and relative to the workspace (``"."`` for the workspace itself).
    - ``exec_arg`` (``exec`` tools, required there): the argument holding the command, a string split with
      :func:`shlex.split` or a list of strings; the handler receives it as an argv ``list[str]`` and must run it
      without a shell.
    - ``host_arg`` (``network`` tools, required there): the argument holding a URL or a host name.
    - ``secret_arg`` (``secret`` tools, required there): the argument holding the secret's name.
    - ``exec_check`` (``exec`` tools, optional): gets the argv after the generic command checks and returns why
      the command is refused (the call is denied with that reason, status ``SAFETY_BLOCK``), or None.
    - ``egress``: the arguments leave the environment even though the call has no side effect (an answer to the
      user): an episode credential in them is a leak (``secret_leak``), as in any side-effecting call.
    """

    name: str
    capability: Capability
    side_effect_class: SideEffectClass
    args_schema: Mapping[str, Any]
    handler: Callable[[dict[str, Any]], ToolOutput]
    path_args: tuple[str, ...] = ()
    exec_arg: str | None = None
    host_arg: str | None = None
    secret_arg: str | None = None
    exec_check: Callable[[list[str]], str | None] | None = None
    egress: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("ToolSpec.name must be a non-empty string")
        if self.capability not in CAPABILITIES:
            raise ValueError(f"tool {self.name!r}: capability must be one of {sorted(CAPABILITIES)}")
        if self.side_effect_class not in SIDE_EFFECT_CLASSES:
            raise ValueError(f"tool {self.name!r}: side_effect_class must be one of {sorted(SIDE_EFFECT_CLASSES)}")
        if not callable(self.handler):
            raise ValueError(f"tool {self.name!r}: handler must be callable")
        if isinstance(self.path_args, str):
            raise ValueError(f"tool {self.name!r}: path_args must be a sequence of names, not a string")
        object.__setattr__(self, "path_args", tuple(self.path_args))
        _check_schema(self.args_schema)
        if self.args_schema.get("type") != "object":
            raise ValueError(f"tool {self.name!r}: args_schema must have type 'object'")
        props = self.args_schema.get("properties", {})
        named = {"exec_arg": self.exec_arg, "host_arg": self.host_arg, "secret_arg": self.secret_arg}
        for role, arg in [*(("path_args", a) for a in self.path_args), *named.items()]:
            if arg is not None and arg not in props:
                raise ValueError(f"tool {self.name!r}: {role} {arg!r} is not a property of args_schema")
        needed = {Capability.EXEC: "exec_arg", Capability.NETWORK: "host_arg",
                  Capability.SECRET: "secret_arg"}.get(self.capability)
        if needed is not None and named[needed] is None:
            raise ValueError(f"tool {self.name!r}: a {self.capability} tool needs {needed}")


@dataclass(frozen=True, slots=True)
class Permissions:
    """What an episode may do. Immutable: every collection is stored as a frozenset or tuple.

    - ``capabilities``: granted capabilities.
    - ``exec_allowlist``: program names allowed as argv[0] of exec tools (exact match, e.g. ``{"python"}``).
    - ``write_budget`` / ``irreversible_budget``: most executed calls of that side-effect class per episode
      (None = unlimited).
    - ``network_allowlist``: host names network tools may reach (exact, case-insensitive; empty = none).
    - ``readable_secrets``: secret names secret tools may read (empty = none).
    - ``protected_paths``: globs relative to the workspace (e.g. ``"tests/hidden"``, ``"*.grader"``) that no
      path argument may touch; a path is protected when it or one of its ancestors matches (``*`` also
      matches ``/``).
    - ``confirm_side_effects``: side-effect classes that need a confirmation the gateway never grants by itself
      (decision ``confirm``, not executed).
    - ``enforce_taint``: an ``irreversible`` call with an argument copied from untrusted text (see
      :meth:`Gateway.note_untrusted`) needs a confirmation too (decision ``confirm``, not executed). Off by
      default, so its cost in utility and its effect on attack success can be measured by a paired comparison.
    - ``taint_mode``: which rule ``enforce_taint`` applies (:data:`TAINT_MODES`). ``literal`` (the default when
      ``enforce_taint`` is set): an argument value of 6+ characters found, normalised, in untrusted text.
      ``context``: once any untrusted text has entered the episode, an irreversible call with an argument value
      (the environment's ``data_values``, else every string of the arguments) that is not found, normalised, in
      trusted text (the user's task statement). Setting ``literal`` or ``context`` turns ``enforce_taint`` on;
      ``off`` (the default without it) turns it off.
    - ``approver``: who answers a confirmation (:data:`APPROVERS`). ``none`` (default): nobody, the call is held
      and not executed. ``deny_all`` / ``approve_all``: a person who always refuses / accepts. ``approve_trusted``:
      a person who accepts when every target of the call (the environment's ``target_values``, else its data
      values: recipients, amounts, what is deleted or refunded) is found, normalised, in trusted text, and no
      episode credential is in the arguments. Each answer is recorded on the call's gateway event.
    """

    capabilities: frozenset[Capability]
    exec_allowlist: frozenset[str] = frozenset()
    write_budget: int | None = None
    irreversible_budget: int | None = None
    network_allowlist: frozenset[str] = frozenset()
    readable_secrets: frozenset[str] = frozenset()
    protected_paths: tuple[str, ...] = ()
    confirm_side_effects: frozenset[SideEffectClass] = frozenset()
    enforce_taint: bool = False
    taint_mode: str | None = None
    approver: str = "none"

    def __post_init__(self) -> None:
        def frozen(name: str, values: Iterable[str]) -> frozenset[str]:
            if isinstance(values, str):
                raise ValueError(f"Permissions.{name} must be a collection of strings, not a string")
            out = frozenset(values)
            if not all(isinstance(v, str) for v in out):
                raise ValueError(f"Permissions.{name} must hold strings")
            return out

        caps = frozen("capabilities", self.capabilities)
        if caps - CAPABILITIES:
            raise ValueError(f"unknown capabilities {sorted(caps - CAPABILITIES)}")
        confirm = frozen("confirm_side_effects", self.confirm_side_effects)
        if confirm - SIDE_EFFECT_CLASSES:
            raise ValueError(f"unknown side-effect classes {sorted(confirm - SIDE_EFFECT_CLASSES)}")
        for name in ("write_budget", "irreversible_budget"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"Permissions.{name} must be None or a non-negative integer")
        if not isinstance(self.enforce_taint, bool):
            raise ValueError("Permissions.enforce_taint must be a bool")
        mode = self.taint_mode if self.taint_mode is not None else ("literal" if self.enforce_taint else "off")
        if mode not in TAINT_MODES:
            raise ValueError(f"Permissions.taint_mode must be one of {', '.join(TAINT_MODES)}, not {mode!r}")
        if self.taint_mode == "off" and self.enforce_taint:
            raise ValueError("Permissions: enforce_taint=True contradicts taint_mode='off'")
        if self.approver not in APPROVERS:
            raise ValueError(f"Permissions.approver must be one of {', '.join(APPROVERS)}, not {self.approver!r}")
        # One source of truth from here on: a taint mode other than off is enforcement.
        object.__setattr__(self, "taint_mode", mode)
        object.__setattr__(self, "enforce_taint", mode != "off")
        if isinstance(self.protected_paths, str):
            raise ValueError("Permissions.protected_paths must be a sequence of globs, not a string")
        globs = tuple(self.protected_paths)
        for g in globs:
            if not isinstance(g, str) or not g or g.startswith("/") or "\x00" in g:
                raise ValueError(f"protected path glob {g!r} must be a non-empty relative glob")
        object.__setattr__(self, "capabilities", caps)
        object.__setattr__(self, "exec_allowlist", frozen("exec_allowlist", self.exec_allowlist))
        object.__setattr__(self, "network_allowlist",
                           frozenset(h.lower() for h in frozen("network_allowlist", self.network_allowlist)))
        object.__setattr__(self, "readable_secrets", frozen("readable_secrets", self.readable_secrets))
        object.__setattr__(self, "protected_paths", globs)
        object.__setattr__(self, "confirm_side_effects", confirm)

    def budget(self, side_effect_class: SideEffectClass) -> int | None:
        """Most executed calls of ``side_effect_class`` per episode (None = unlimited; reads are unlimited)."""
        if side_effect_class == "write":
            return self.write_budget
        if side_effect_class == "irreversible":
            return self.irreversible_budget
        return None


@dataclass(frozen=True, slots=True)
class GatewayResult:
    """Outcome of one proposed call.

    ``output`` is the tool's text or the error text shown to the agent; ``status`` is ``"OK"`` or the error
    class (``MODEL_INVALID_ACTION``, ``SAFETY_BLOCK``, ``BUDGET_EXHAUSTED``, ``ENV_BUG``, ``ENV_TRANSIENT``);
    ``event`` holds the :data:`EVENT_COLUMNS` of the ``gateway_events`` row (``at`` is an aware UTC datetime).
    """

    decision: Decision
    reason: str
    executed: bool
    output: str
    status: Status
    event: dict[str, Any]
    approval: str | None = None
    """``approved`` / ``denied`` when the call needed a confirmation and an approver answered it (a person's
    time, which the environment prices), else None."""


@dataclass(frozen=True, slots=True)
class GatewayState:
    """Per-episode state of a gateway (for environment snapshots): immutable and picklable.

    ``spent`` holds ``(side_effect_class, executed calls)`` pairs; ``done`` holds
    ``(idempotency_key, tool, args_hash, output, status)`` for every executed side-effecting call with a key;
    ``untrusted`` the ``(label, text)`` pairs and ``trusted`` the texts noted in the episode; ``credentials``
    ``(name, seed, task_key, expired)`` of each credential issued (the value is derived again, never stored)."""

    spent: tuple[tuple[str, int], ...] = ()
    done: tuple[tuple[str, str, str, str, str], ...] = ()
    untrusted: tuple[tuple[str, str], ...] = ()
    trusted: tuple[str, ...] = ()
    credentials: tuple[tuple[str, int, str, bool], ...] = ()


_STATUSES: frozenset[str] = frozenset(Status)


class _Denied(Exception):
    """A check refused the call."""

    def __init__(self, reason: str, status: Status = Status.SAFETY_BLOCK, decision: Decision = "deny",
                 approval: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status: Status = status
        self.decision: Decision = decision
        self.approval = approval


@dataclass(frozen=True, slots=True)
class Credential:
    """An episode credential as the lake may see it: its name, the capabilities it is scoped to, and the sha256
    of its value (the value itself stays inside the gateway)."""

    name: str
    scope: frozenset[str]
    sha256: str
    expired: bool


@dataclass(slots=True)
class _Issued:
    name: str
    seed: int
    task_key: str
    value: str
    scope: frozenset[str]
    expired: bool = False


# Key of the credential derivation: fixed, so a credential is a function of (seed, task, name) and a replay
# re-issues the same one. Its secrecy is not what protects it: expiry at the episode's end is.
_CREDENTIAL_KEY = b"trajlake:episode-credential:v1"


def credential_value(name: str, seed: int, task_key: str) -> str:
    """The value of an episode credential (deterministic: the same seed and task give the same value)."""
    mac = hmac.new(_CREDENTIAL_KEY, f"{seed}\0{task_key}\0{name}".encode(), hashlib.sha256).hexdigest()
    return "sk-eph-" + mac[:32]


@dataclass(frozen=True, slots=True)
class _Done:
    """An executed side-effecting call, remembered under its idempotency key."""

    tool: str
    args_hash: str
    output: str
    status: Status


# --------------------------------------------------------------------------------------------------------------
# The gateway


class Gateway:
    """Decides on, runs and audits every tool call of one environment instance.

    ``state_hash`` returns the environment's state hash; it is called before and after each executed call and
    once for calls that do not execute (then ``state_hash_after == state_hash_before``). Calls are serialised
    by a lock, so state hashes bracket exactly one handler. Handlers must not call the gateway.

    There is deliberately no method that changes permissions or tools after construction; the gateway keeps its
    own copies of both.
    """

    __slots__ = ("_credentials", "_done", "_lock", "_permissions", "_protected_re", "_schemas", "_spent",
                 "_state_hash", "_tools", "_trusted", "_untrusted", "_ws_abs", "_ws_real")

    def __init__(self, workspace: Path, permissions: Permissions, tools: Sequence[ToolSpec],
                 state_hash: Callable[[], str]) -> None:
        ws = os.fspath(workspace)
        if not os.path.isdir(ws):
            raise ValueError(f"workspace {ws!r} is not a directory")
        if not isinstance(permissions, Permissions):
            raise TypeError("permissions must be a Permissions instance")
        self._ws_abs = os.path.abspath(ws)
        self._ws_real = os.path.realpath(ws)
        self._permissions = dataclasses.replace(permissions)
        tool_map: dict[str, ToolSpec] = {}
        schemas: dict[str, Mapping[str, Any]] = {}
        for spec in tools:
            if not isinstance(spec, ToolSpec):
                raise TypeError(f"tools must be ToolSpec instances, got {type(spec).__name__}")
            if spec.name in tool_map:
                raise ValueError(f"duplicate tool name {spec.name!r}")
            tool_map[spec.name] = spec
            schemas[spec.name] = copy.deepcopy(dict(spec.args_schema))  # later edits of the spec do not count
        self._tools: Mapping[str, ToolSpec] = MappingProxyType(tool_map)
        self._schemas: Mapping[str, Mapping[str, Any]] = MappingProxyType(schemas)
        self._state_hash = state_hash
        globs = [g.strip("/").removeprefix("./") or "." for g in self._permissions.protected_paths]
        self._protected_re: re.Pattern[str] | None = (
            re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs)) if globs else None)
        self._lock = threading.RLock()
        self._done: dict[str, _Done] = {}
        self._spent: dict[str, int] = {}
        self._untrusted: list[tuple[str, str]] = []
        self._trusted: list[str] = []
        self._credentials: dict[str, _Issued] = {}

    # -- read-only views ---------------------------------------------------------------------------------------

    @property
    def workspace(self) -> Path:
        """The workspace (as given, made absolute)."""
        return Path(self._ws_abs)

    @property
    def permissions(self) -> Permissions:
        """The (immutable) permissions of this gateway."""
        return self._permissions

    @property
    def tools(self) -> Mapping[str, ToolSpec]:
        """Registered tools by name (read-only)."""
        return self._tools

    def spent(self, side_effect_class: SideEffectClass) -> int:
        """Executed calls of ``side_effect_class`` counted against its budget since the last reset."""
        return self._spent.get(side_effect_class, 0)

    def export_state(self) -> GatewayState:
        """The per-episode state (idempotency results, budget counters), e.g. for an environment snapshot."""
        with self._lock:
            return GatewayState(tuple(sorted(self._spent.items())),
                                tuple((k, d.tool, d.args_hash, d.output, d.status) for k, d in self._done.items()),
                                tuple(self._untrusted), tuple(self._trusted),
                                tuple((c.name, c.seed, c.task_key, c.expired) for c in self._credentials.values()))

    def import_state(self, state: GatewayState) -> None:
        """Replace the per-episode state by one from :meth:`export_state` (permissions are not part of it)."""
        if not isinstance(state, GatewayState):
            raise TypeError("state must be a GatewayState")
        spent: dict[str, int] = {}
        for cls, n in state.spent:
            if cls not in SIDE_EFFECT_CLASSES or not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(f"invalid budget counter {(cls, n)!r}")
            spent[cls] = n
        done: dict[str, _Done] = {}
        for key, tool, h, output, status in state.done:
            if not all(isinstance(v, str) for v in (key, tool, h, output)) or status not in _STATUSES:
                raise ValueError(f"invalid idempotency record for key {key!r}")
            done[key] = _Done(tool, h, output, status)  # status checked above
        untrusted = [(str(label), str(text)) for label, text in state.untrusted]
        scope = frozenset(self._permissions.capabilities)
        credentials = {str(name): _Issued(str(name), int(seed), str(key), credential_value(str(name), int(seed),
                                          str(key)), scope, bool(expired))
                       for name, seed, key, expired in state.credentials}
        with self._lock:
            self._spent = spent
            self._done = done
            self._untrusted = untrusted
            self._trusted = [str(t) for t in state.trusted]
            self._credentials = credentials

    def reset(self) -> None:
        """Start a new episode: forget idempotency keys and budget counters (permissions stay as they are)."""
        with self._lock:
            self._done.clear()
            self._spent.clear()
            self._untrusted.clear()
            self._trusted.clear()
            self._credentials.clear()

    def note_untrusted(self, label: str, text: str) -> None:
        """Remember text of an untrusted observation (a web page's user-written text, a file the agent read)
        under a taint label, for the rest of the episode: a later call whose argument value (6 or more
        characters, not in a trusted text) occurs in it is tainted ``args_from:<label>``."""
        if not isinstance(label, str) or not isinstance(text, str):
            raise TypeError("label and text must be strings")
        with self._lock:
            if (label, text) not in self._untrusted:
                self._untrusted.append((label, text))

    def note_trusted(self, text: str) -> None:
        """Remember text from the user (the task statement): values it contains are not taint, even when
        untrusted text repeats them."""
        if not isinstance(text, str):
            raise TypeError("text must be a string")
        with self._lock:
            if text not in self._trusted:
                self._trusted.append(text)

    def derived_taint(self, args: Any) -> list[str]:
        """``args_from:<label>`` for every noted untrusted text that an argument value was copied from (compared
        normalised: a case-changed or re-spaced copy is still a copy)."""
        with self._lock:
            values = [normalise_text(v) for v in _strings(args)]
            trusted = [normalise_text(t) for t in self._trusted]
            values = [v for v in values if len(v) >= _MIN_TAINT_CHARS and not any(v in t for t in trusted)]
            if not values:
                return []
            return [f"args_from:{label}" for label, text in self._untrusted
                    if any(v in normalise_text(text) for v in values)]

    def _untrusted_values(self, values: Iterable[str]) -> list[str]:
        """The values not found, normalised, in any trusted text (empty values are trusted: they say nothing)."""
        with self._lock:
            trusted = [normalise_text(t) for t in self._trusted]
        out = []
        for v in values:
            n = normalise_text(v)
            if n and not any(n in t for t in trusted):
                out.append(v)
        return out

    # -- episode credentials -----------------------------------------------------------------------------------

    def issue_credential(self, name: str, seed: int, task_key: str) -> str:
        """Issue the episode's credential ``name`` (scoped to the granted capabilities, valid until
        :meth:`expire_credentials` or :meth:`reset`) and return its value for the environment to place where its
        tools use it. Deterministic in (``seed``, ``task_key``, ``name``), so a replay issues the same value; the
        gateway records only its sha256 (:meth:`credentials`, leak labels)."""
        if not isinstance(name, str) or not name or not isinstance(task_key, str):
            raise TypeError("name and task_key must be strings")
        value = credential_value(name, seed, task_key)
        with self._lock:
            self._credentials[name] = _Issued(name, seed, task_key, value,
                                              frozenset(self._permissions.capabilities))
        return value

    def credentials(self) -> list[Credential]:
        """The credentials issued in this episode, without their values."""
        with self._lock:
            return [Credential(c.name, c.scope, hashlib.sha256(c.value.encode()).hexdigest(), c.expired)
                    for c in self._credentials.values()]

    def expire_credentials(self) -> None:
        """End of the episode: every credential issued becomes invalid (calls made after it are refused)."""
        with self._lock:
            for c in self._credentials.values():
                c.expired = True

    def credential_valid(self, value: str, capability: str) -> bool:
        """Whether ``value`` is a live credential of this episode whose scope covers ``capability``."""
        with self._lock:
            return any(hmac.compare_digest(c.value, value) and not c.expired and capability in c.scope
                       for c in self._credentials.values())

    def leaked_credentials(self, args: Any) -> list[str]:
        """``secret_leak:<name>@sha256:<16 hex>`` for every credential of the episode found in the argument values
        (normalised, and under base64 / hex / URL encoding)."""
        with self._lock:
            issued = list(self._credentials.values())
        if not issued:
            return []
        texts = _strings(args)
        return [f"{LEAK_LABEL}:{c.name}@sha256:{hashlib.sha256(c.value.encode()).hexdigest()[:16]}"
                for c in issued if any(reveals(t, c.value) for t in texts)]

    # -- the call ----------------------------------------------------------------------------------------------

    def call(self, tool: str, args: Mapping[str, Any] | str, *, idempotency_key: str | None,
             taint: Sequence[str] = (), data_values: Sequence[str] | None = None,
             target_values: Sequence[str] | None = None) -> GatewayResult:
        """Decide on a proposed call, run it if allowed, and return the result with its audit event.

        ``args`` is the argument object or the raw JSON text the model produced. ``taint`` holds the taint
        labels of the observation that preceded the call; they are recorded, with ``args_from:<label>`` added for
        every noted untrusted text an argument was copied from (:meth:`note_untrusted`). Only those derived labels
        are ever acted on, and only to hold an irreversible call (``Permissions.enforce_taint``). Never raises
        for anything the agent or a handler does (only for caller bugs such as a string passed as ``taint``,
        and for exceptions raised by ``state_hash``).

        ``data_values`` are the values the call's effect is made of, as the environment understands it (a form's
        fields, the label of what is deleted), judged by ``taint_mode="context"``; ``target_values`` the subset
        that says whom or what the effect reaches, judged by the ``approve_trusted`` approver. Without them every
        string of the arguments counts. A call that carries an episode credential out (a side-effecting or
        ``egress`` call) is tainted ``secret_leak:<name>@sha256:<hash>``."""
        if isinstance(taint, str) or not all(isinstance(t, str) for t in taint):
            raise TypeError("taint must be a sequence of strings")
        if idempotency_key is not None and not isinstance(idempotency_key, str):
            raise TypeError("idempotency_key must be a string or None")
        at = dt.datetime.now(dt.UTC)
        taint_list = list(taint)
        parsed: Any = args
        parse_error: str | None = None
        if isinstance(args, str):
            try:
                parsed = json.loads(args, object_pairs_hook=_no_duplicate_keys)
            except ValueError as e:
                parse_error = f"arguments are not valid JSON: {e}"
        h = _hash_value(parsed) if parse_error is None else args_hash(args)
        # Taint the call with the untrusted texts its arguments were copied from (recorded on every event,
        # executed or not, so the audit shows which untrusted text preceded each call).
        derived = self.derived_taint(parsed) if parse_error is None else []
        spec = self._tools.get(tool) if isinstance(tool, str) else None
        # A credential in the arguments of a call that takes them out of the environment is a leak.
        leaves = spec is not None and spec.capability not in _INTERNAL_CAPABILITIES and (
            spec.side_effect_class != SideEffectClass.READ or spec.egress or spec.capability in _EGRESS_CAPABILITIES)
        leaks = self.leaked_credentials(parsed if parse_error is None else args) if leaves else []
        taint_list = list(dict.fromkeys([*taint_list, *derived, *leaks]))
        tool_name = tool if isinstance(tool, str) else repr(tool)
        approved = ""
        with self._lock:
            try:
                if spec is None:
                    raise _Denied(f"unknown tool {_echo(tool_name)}", Status.MODEL_INVALID_ACTION)
                if parse_error is not None:
                    raise _Denied(parse_error, Status.MODEL_INVALID_ACTION)
                if not isinstance(parsed, Mapping):
                    raise _Denied(f"arguments must be a JSON object, got {_json_type(parsed)}",
                                  Status.MODEL_INVALID_ACTION)
                problem = validate_args(self._schemas[spec.name], parsed)
                if problem is not None:
                    raise _Denied(f"invalid arguments: {problem}", Status.MODEL_INVALID_ACTION)
                if spec.capability not in self._permissions.capabilities:
                    raise _Denied(f"capability not granted: {spec.capability}")
                if self._credentials and all(c.expired for c in self._credentials.values()):
                    raise _Denied("the episode's credentials have expired")
                side_effecting = spec.side_effect_class != "read"
                if side_effecting and idempotency_key is not None:
                    done = self._done.get(idempotency_key)
                    if done is not None:
                        if done.tool != spec.name or done.args_hash != h:
                            raise _Denied(REASON_KEY_REUSED, Status.MODEL_INVALID_ACTION)
                        return self._result(spec, tool_name, h, "allow", REASON_DUPLICATE, False, done.output,
                                            done.status, idempotency_key, taint_list, at, None, None)
                handler_args, changes = self._check_arguments(spec, parsed)
                held = self._hold_reason(spec, parsed, derived, data_values)
                if held is not None:
                    approval = self._ask_approver(parsed, data_values, target_values, leaks)
                    if approval != "approved":
                        suffix = "" if approval is None else f"; denied by approver {self._permissions.approver}"
                        raise _Denied(held + suffix, decision="confirm", approval=approval)
                    approved = f"confirmed by approver {self._permissions.approver}: {held}"
                limit = self._permissions.budget(spec.side_effect_class)
                if limit is not None and self._spent.get(spec.side_effect_class, 0) >= limit:
                    raise _Denied(REASON_BUDGET, BUDGET_STATUS)
            except _Denied as d:
                return self._result(spec, tool_name, h, d.decision, d.reason, False, _denial_text(d), d.status,
                                    idempotency_key, taint_list, at, None, None, d.approval)
            decision: Decision = "modify" if changes else "allow"
            reason = ("normalised " + ", ".join(changes)) if changes else REASON_GRANTED
            if approved:  # the approver's answer is part of the recorded reason ("confirmed" marks a grant)
                reason = approved if not changes else f"{reason}; {approved}"
            before = self._state_hash()
            status: Status = "OK"
            try:
                out = spec.handler(handler_args)
                if not isinstance(out, str):
                    status = Status.ENV_BUG
                    out = f"error: tool {spec.name!r} returned {type(out).__name__}, expected text"
            except TransientToolError as e:
                status, out = Status.ENV_TRANSIENT, _clip(f"error: tool {spec.name!r} is temporarily unavailable: {e}")
            except Exception as e:
                status, out = Status.ENV_BUG, _clip(f"error: tool {spec.name!r} failed: {type(e).__name__}: {e}")
            after = self._state_hash()
            if status != Status.ENV_TRANSIENT and side_effecting:
                self._spent[spec.side_effect_class] = self._spent.get(spec.side_effect_class, 0) + 1
                if idempotency_key is not None:
                    self._done[idempotency_key] = _Done(spec.name, h, out, status)
            return self._result(spec, tool_name, h, decision, reason, True, out, status, idempotency_key,
                                taint_list, at, before, after, "approved" if approved else None)

    # -- helpers -----------------------------------------------------------------------------------------------

    def _hold_reason(self, spec: ToolSpec, args: Mapping[str, Any], derived: Sequence[str],
                     data_values: Sequence[str] | None) -> str | None:
        """Why the call needs a confirmation (the checks of ``confirm_side_effects`` and ``taint_mode``), or None."""
        perms = self._permissions
        if spec.side_effect_class in perms.confirm_side_effects:
            return f"confirmation required: {spec.side_effect_class} call"
        if spec.side_effect_class != "irreversible":
            return None
        if perms.taint_mode == "literal" and derived:
            return ("confirmation required: irreversible call with arguments from untrusted text ("
                    + ", ".join(d.removeprefix("args_from:") for d in derived) + ")")
        if perms.taint_mode == "context":
            with self._lock:
                exposed = [label for label, _ in self._untrusted]
            # Before any untrusted text the context holds only the user's words and the environment's own.
            if exposed:
                values = list(data_values) if data_values is not None else _strings(args)
                foreign = self._untrusted_values(values)
                if foreign:
                    return ("confirmation required: irreversible call after untrusted text ("
                            + ", ".join(dict.fromkeys(exposed)) + ") with values not from the user: "
                            + ", ".join(_echo(v) for v in foreign[:3]))
        return None

    def _ask_approver(self, args: Mapping[str, Any], data_values: Sequence[str] | None,
                      target_values: Sequence[str] | None, leaks: Sequence[str]) -> str | None:
        """The configured approver's answer to a held call: ``approved``, ``denied``, or None (nobody asked)."""
        mode = self._permissions.approver
        if mode == "none":
            return None
        if mode == "approve_all":
            return "approved"
        if mode == "deny_all":
            return "denied"
        # approve_trusted: a person who checks where the effect goes (recipients, amounts, targets) against what
        # they asked for, and never lets a credential out.
        targets = target_values if target_values is not None else (
            data_values if data_values is not None else _strings(args))
        return "denied" if leaks or self._untrusted_values(targets) else "approved"

    def _result(self, spec: ToolSpec | None, tool: str, h: str, decision: Decision, reason: str, executed: bool,
                output: str, status: Status, key: str | None, taint: list[str], at: dt.datetime,
                before: str | None, after: str | None, approval: str | None = None) -> GatewayResult:
        if not executed:
            before = after = self._state_hash()
        # An unknown tool needs and touches nothing: it is recorded with the least capability.
        event = {
            "tool": tool, "capability": spec.capability if spec else "read", "args_hash": h,
            "decision": decision, "reason": reason, "executed": executed,
            "side_effect_class": spec.side_effect_class if spec else "read", "idempotency_key": key,
            "taint": taint, "state_hash_before": before, "state_hash_after": after, "at": at,
        }
        return GatewayResult(decision, reason, executed, output, status, event, approval)

    def _check_arguments(self, spec: ToolSpec, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Apply the per-argument policies; return the handler's arguments and the normalisations made."""
        out = dict(args)
        changes: list[str] = []
        for name in spec.path_args:
            if name not in out:
                continue
            raw = out[name]
            if isinstance(raw, str):
                norm = self._normalise_path(raw)
                if norm != raw:
                    changes.append(f"{name} {_echo(raw)} -> {_echo(norm)}")
                    out[name] = norm
            elif isinstance(raw, list | tuple) and all(isinstance(p, str) for p in raw):
                norms = [self._normalise_path(p) for p in raw]
                if norms != list(raw):
                    changes.append(f"{name} {_echo(list(raw))} -> {_echo(norms)}")
                out[name] = norms
            else:
                raise _Denied(f"path argument {name!r} must be a string or a list of strings",
                              Status.MODEL_INVALID_ACTION)
        if spec.exec_arg is not None:
            argv = self._check_command(out.get(spec.exec_arg))
            if spec.exec_check is not None:
                problem = spec.exec_check(argv)
                if problem is not None:
                    raise _Denied(f"command refused: {_clip(problem, 300)}")
            out[spec.exec_arg] = argv
        if spec.host_arg is not None:
            self._check_host(out.get(spec.host_arg))
        if spec.secret_arg is not None:
            secret = out.get(spec.secret_arg)
            if not isinstance(secret, str) or secret not in self._permissions.readable_secrets:
                raise _Denied(f"secret not readable: {_echo(secret)}")
        return out, changes

    def _inside(self, path: str, base: str) -> str | None:
        """``path`` relative to ``base`` (POSIX, ``"."`` for base itself) if lexically inside, else None."""
        if path == base:
            return "."
        prefix = base if base.endswith("/") else base + "/"
        return path[len(prefix):] if path.startswith(prefix) else None

    def _normalise_path(self, raw: str) -> str:
        """Normalised workspace-relative form of a path argument, or raise _Denied."""
        if not raw:
            raise _Denied("empty path", Status.MODEL_INVALID_ACTION)
        if "\x00" in raw:
            raise _Denied("NUL byte in path")
        if raw.startswith("~"):
            raise _Denied(f"home-relative path {_echo(raw)}")
        norm = os.path.normpath(raw)
        if os.path.isabs(norm):
            rel = self._inside(norm, self._ws_abs)
            if rel is None:
                rel = self._inside(norm, self._ws_real)
            if rel is None:
                raise _Denied(f"path outside workspace: {_echo(raw)}")
        elif norm == ".." or norm.startswith("../"):
            raise _Denied(f"path escapes workspace: {_echo(raw)}")
        else:
            rel = norm
        # Resolves every symlink on the way, including a dangling one at the end; components that do not
        # exist yet are kept as they are (realpath of the deepest existing ancestor + the rest).
        real = os.path.realpath(os.path.join(self._ws_real, rel))
        real_rel = self._inside(real, self._ws_real)
        if real_rel is None:
            raise _Denied(f"symlink escapes workspace: {_echo(raw)}")
        if self._protected_re is not None and (self._protected(rel) or self._protected(real_rel)):
            raise _Denied(f"protected path: {_echo(raw)}")
        return rel

    def _protected(self, rel: str) -> bool:
        assert self._protected_re is not None
        if self._protected_re.match(rel):
            return True
        i = rel.find("/")
        while i != -1:
            if self._protected_re.match(rel[:i]):
                return True
            i = rel.find("/", i + 1)
        return False

    def _check_command(self, command: Any) -> list[str]:
        """argv of an exec argument (string split by shlex, or list of strings), or raise _Denied."""
        if isinstance(command, str):
            if "\x00" in command:
                raise _Denied("NUL byte in command")
            try:
                argv = shlex.split(command)
            except ValueError as e:
                raise _Denied(f"command cannot be parsed: {e}", Status.MODEL_INVALID_ACTION) from None
        elif isinstance(command, list | tuple) and all(isinstance(a, str) for a in command):
            argv = list(command)
        else:
            raise _Denied("command must be a string or a list of strings", Status.MODEL_INVALID_ACTION)
        if not argv:
            raise _Denied("empty command", Status.MODEL_INVALID_ACTION)
        for arg in argv:
            for meta in _SHELL_METACHARACTERS:
                if meta in arg:
                    raise _Denied(f"shell metacharacter {meta!r} in command argument {_echo(arg)}")
        if argv[0] not in self._permissions.exec_allowlist:
            raise _Denied(f"program not allowlisted: {_echo(argv[0])}")
        for arg in argv[1:]:
            value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
            # Path-like words, and bare words naming an entry of the workspace (which may be a symlink).
            if (value.startswith(("/", "~", ".")) or "/" in value
                    or (value and os.path.lexists(os.path.join(self._ws_real, value)))):
                try:
                    self._normalise_path(value)
                except _Denied as d:
                    raise _Denied(f"command argument: {d.reason}", d.status) from None
        return argv

    def _check_host(self, target: Any) -> None:
        if not isinstance(target, str) or not target:
            raise _Denied("network target must be a non-empty string", Status.MODEL_INVALID_ACTION)
        if any(c.isspace() or c == "\\" or ord(c) < 32 or ord(c) == 127 for c in target):
            raise _Denied(f"malformed network target {_echo(target)}")
        try:
            host = urlsplit(target if "://" in target else "//" + target).hostname
        except ValueError:
            host = None
        if not host:
            raise _Denied(f"no host in network target {_echo(target)}")
        if host not in self._permissions.network_allowlist:
            raise _Denied(f"host not allowlisted: {_echo(host)}")


def _denial_text(d: _Denied) -> str:
    """The error text the agent sees for a refused call."""
    if d.decision == "confirm":
        if d.approval == "denied":
            return f"error: not executed, {d.reason} (the person asked to confirm it said no)"
        return f"error: not executed, {d.reason} (no confirmation is available in this environment)"
    if d.status == Status.MODEL_INVALID_ACTION:
        return f"error: invalid action: {d.reason}"
    if d.status == BUDGET_STATUS and d.reason == REASON_BUDGET:
        return "error: budget for this kind of call is spent"
    return f"error: permission denied: {d.reason}"
