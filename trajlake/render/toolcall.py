"""The tool-call format of trajlake's language-model policies, and its parser.

The model calls one tool per turn with a Hermes-style block (the format Qwen2.5's chat template and vLLM's
``hermes`` parser use)::

    <tool_call>{"name": "read_file", "arguments": {"path": "src/confparse.py"}}</tool_call>

``{"tool": ..., "args": ...}`` is accepted as a synonym of ``{"name": ..., "arguments": ...}``, and a reply that
is nothing but that JSON object (no tags) is accepted too. Text around the block (reasoning) is ignored; only the
first block counts. Anything else is *unparsable*: the turn gets status ``MODEL_INVALID_ACTION`` and the raw text
goes to the environment, which answers with its own error observation, so the episode goes on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    """Outcome of parsing one model reply."""

    action: str
    """What the environment receives: canonical ``{"tool", "args"}`` JSON, or the raw text when unparsable."""
    tool: str | None
    error: str | None
    """Why the reply did not parse (None when it did)."""

    @property
    def ok(self) -> bool:
        return self.error is None


def format_call(tool: str, args: dict[str, Any]) -> str:
    """The text a model should produce to call ``tool`` (used in prompts and tests)."""
    return TOOL_CALL_OPEN + json.dumps({"name": tool, "arguments": args}, ensure_ascii=False) + TOOL_CALL_CLOSE


def _call_of(obj: Any) -> tuple[str, dict[str, Any]] | str:
    if not isinstance(obj, dict):
        return "the tool call is not a JSON object"
    name = obj.get("name", obj.get("tool"))
    args = obj.get("arguments", obj.get("args", {}))
    if not isinstance(name, str) or not name:
        return "the tool call has no string field \"name\""
    if isinstance(args, str):  # OpenAI-style: arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return "\"arguments\" is a string that is not JSON"
    if not isinstance(args, dict):
        return "\"arguments\" is not a JSON object"
    return name, args


def _call_through_close_tags(text: str, start: int) -> Any:
    """The JSON value that starts after the opening tag at ``start``, when it runs past the first closing tag (a
    string argument with ``</tool_call>`` in it, which ``format_call`` writes and the grammar allows) and a closing
    tag follows it; None otherwise."""
    rest = text[start:]
    try:
        obj, end = json.JSONDecoder().raw_decode(rest, len(rest) - len(rest.lstrip()))
    except (ValueError, RecursionError):
        return None
    if TOOL_CALL_CLOSE not in rest[:end] or not rest[end:].lstrip().startswith(TOOL_CALL_CLOSE):
        return None
    return obj


def parse_tool_call(text: str) -> ParsedCall:
    """Parse one model reply; never raises."""
    m = _BLOCK.search(text)
    if m is not None:
        body = m.group(1).strip()
    elif TOOL_CALL_OPEN in text:
        return ParsedCall(text, None, f"{TOOL_CALL_OPEN} without {TOOL_CALL_CLOSE}")
    else:
        body = text.strip()
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        # the first block is not JSON: an argument may hold the closing tag's text, the block run past it
        obj = _call_through_close_tags(text, m.start(1)) if m is not None else None
        if obj is None:
            return ParsedCall(text, None, "no tool call: expected " + TOOL_CALL_OPEN + "{\"name\": ..., "
                              "\"arguments\": {...}}" + TOOL_CALL_CLOSE)
    call = _call_of(obj)
    if isinstance(call, str):
        return ParsedCall(text, None, call)
    name, args = call
    return ParsedCall(json.dumps({"tool": name, "args": args}, sort_keys=True, ensure_ascii=False), name, None)


__all__ = ["TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "ParsedCall", "format_call", "parse_tool_call"]
