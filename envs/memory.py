"""Episodic memory: a small key-value notebook an agent reads and writes through the permission gateway.

The built-in environments (Mini SWE, Mini Web, tool-lookup) offer it when the run turns it on
(``--env-arg memory=true``, or a mapping of :class:`MemoryConfig` fields, e.g.
``--env-arg memory='{"max_entries": 4}'``; a training config's ``env_args`` likewise). Its three tools:

- ``memory_write {"key", "text"}``: store ``text`` under ``key`` (overwrites the key);
- ``memory_read {"key"}``: the text stored under ``key``;
- ``memory_list {}``: the keys, with their sizes.

Rules (docs/gateway.md, "Episodic memory"):

- **Capability.** Each tool needs the capability ``memory``, which the environment grants only when memory is on.
  The tools are registered with the gateway either way, so a call while memory is off is denied as an ungranted
  capability (``SAFETY_BLOCK``, ``capability not granted: memory``), the way any over-privileged call is; the tools
  are listed to the policy (tool docs, first observation, grammar) only when memory is on, so runs without memory
  see exactly the tools they saw before memory existed.
- **Cost.** A memory call is an action like any other: a policy turn (its output tokens count against
  ``max_tokens``, its step against ``max_steps``) and an observation turn (what it returns is context the policy
  pays for, at ``price_in``, on every later turn); the observation turn's ``tool_seconds`` is charged
  ``seconds_per_call`` (a store round trip; charged, not slept), priced at the run's ``price_tool_second``.
- **Limits.** At most ``max_entries`` keys of at most ``max_key_chars`` characters, each text at most
  ``max_entry_bytes`` bytes of UTF-8. A call over a limit changes nothing, says which limit in one line, and is
  a model mistake (``MODEL_INVALID_ACTION``).
- **Scope: one episode.** The store belongs to one environment instance and is emptied at every ``reset``, so
  nothing written in one episode can be read in another, whether a worker reuses the instance for its next
  episode or a training run and an evaluation run follow each other (each rollout also builds its environments
  anew). There is no persistent, cross-episode memory: episodes of a group must be independent samples of one
  task for the group baseline, a replay must depend on its own actions only, and nothing learned on a training
  task may reach an evaluation task except through the weights.
- **State.** The entries are part of the state: in the state hash (only when non-empty, so the hashes of episodes
  that never wrote are the ones they always were), in snapshots, restored by ``restore``.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trajlake.envs.core import EnvError
from trajlake.envs.gateway import ToolSpec
from trajlake.schemas.vocab import Capability, SideEffectClass, Status

MEMORY_CAPABILITY = Capability.MEMORY
"""The capability every memory tool needs (``gateway_events.capability`` of their events)."""
DEFAULT_SECONDS_PER_CALL = 0.05
"""Tool seconds charged per executed memory call: a round trip to a local key-value store."""

MEMORY_TOOL_DOCS: dict[str, dict[str, Any]] = {
    "memory_write": {"description": "Store a note under a key for the rest of this episode (replaces the key's "
                                    "note). Memory is empty at the start of every episode.",
                     "args": {"key": "short name", "text": "the note"}},
    "memory_read": {"description": "Read the note stored under a key in this episode.", "args": {"key": "short name"}},
    "memory_list": {"description": "List the keys stored in this episode, with their sizes.", "args": {}},
}
MEMORY_TOOLS: tuple[str, ...] = tuple(MEMORY_TOOL_DOCS)


@dataclass(frozen=True)
class MemoryConfig:
    """Limits and price of an environment's episodic memory."""

    max_entries: int = 16
    """Most keys the store holds at once (overwriting a key does not take another)."""
    max_entry_bytes: int = 1024
    """Most bytes (UTF-8) of one entry's text."""
    max_key_chars: int = 64
    """Most characters of a key."""
    seconds_per_call: float = DEFAULT_SECONDS_PER_CALL
    """Tool seconds charged to each executed memory call (``turns.tool_seconds``; priced by the run's cost model)."""

    def __post_init__(self) -> None:
        for name in ("max_entries", "max_entry_bytes", "max_key_chars"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise EnvError(f"memory: {name} must be a positive integer, got {v!r}")
        s = self.seconds_per_call
        if not isinstance(s, int | float) or isinstance(s, bool) or not 0 <= s < float("inf"):
            raise EnvError(f"memory: seconds_per_call must be a non-negative number, got {s!r}")

    @classmethod
    def parse(cls, value: Any) -> MemoryConfig | None:
        """The ``memory`` argument of an environment: None/False (off), True (on, default limits), a mapping of
        fields (on, those limits) or a MemoryConfig; anything else is one clear error."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, MemoryConfig):
            return value
        if isinstance(value, Mapping):
            keys = [f.name for f in dataclasses.fields(cls)]
            unknown = sorted(set(value) - set(keys))
            if unknown:
                raise EnvError(f"memory: unknown key(s) {', '.join(map(str, unknown))}; expected {', '.join(keys)}")
            return cls(**value)
        raise EnvError(f"memory: expected true, false or a mapping of {', '.join(f.name for f in dataclasses.fields(cls))}"
                       f", got {value!r}")


def memory_tool_docs(tool_docs: Mapping[str, Mapping[str, Any]], memory: Any) -> dict[str, Mapping[str, Any]]:
    """``tool_docs`` with the memory tools added when ``memory`` (an environment's ``memory`` argument) turns
    memory on; unchanged otherwise."""
    if MemoryConfig.parse(memory) is None:
        return dict(tool_docs)
    clash = sorted(set(tool_docs) & set(MEMORY_TOOLS))
    if clash:
        raise EnvError(f"memory: the environment already has tool(s) named {', '.join(clash)}")
    return {**tool_docs, **MEMORY_TOOL_DOCS}


class EpisodicMemory:
    """The memory store of one environment instance (one episode at a time). Off when ``config`` is None: the
    tools are still registered (and denied for want of the capability), nothing is listed or stored."""

    def __init__(self, config: MemoryConfig | None):
        self.config = config
        self.entries: dict[str, str] = {}
        """The stored notes, by key, in the order first written."""
        self._refused: str | None = None

    @property
    def enabled(self) -> bool:
        """Whether the run turned memory on (the capability is granted and the tools are listed)."""
        return self.config is not None

    # -- what the environment builds its gateway and tool docs from --------------------------------------------
    def tool_docs(self, tool_docs: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
        """The tools listed to the policy: ``tool_docs``, plus the memory tools when memory is on."""
        return memory_tool_docs(tool_docs, self.config)

    def capabilities(self, granted: Iterable[Capability]) -> frozenset[Capability]:
        """``granted`` plus ``memory`` when memory is on."""
        return frozenset(granted) | ({MEMORY_CAPABILITY} if self.enabled else set())

    def tools(self) -> list[ToolSpec]:
        """The gateway tools (always registered; only a granted ``memory`` capability lets them run)."""
        limits = self.config or MemoryConfig()
        key = {"type": "string", "minLength": 1, "maxLength": limits.max_key_chars}
        # maxLength counts characters; the byte limit (a character is 1-4 bytes) is the handler's
        text = {"type": "string", "maxLength": limits.max_entry_bytes}
        return [
            ToolSpec("memory_write", MEMORY_CAPABILITY, SideEffectClass.WRITE,
                     {"type": "object", "properties": {"key": key, "text": text}, "required": ["key", "text"],
                      "additionalProperties": False}, self._write),
            ToolSpec("memory_read", MEMORY_CAPABILITY, SideEffectClass.READ,
                     {"type": "object", "properties": {"key": key}, "required": ["key"],
                      "additionalProperties": False}, self._read),
            ToolSpec("memory_list", MEMORY_CAPABILITY, SideEffectClass.READ,
                     {"type": "object", "properties": {}, "additionalProperties": False}, self._list),
        ]

    # -- episode scope and state --------------------------------------------------------------------------------
    def clear(self) -> None:
        """Forget everything (every ``reset``: a new episode starts with an empty memory)."""
        self.entries = {}
        self._refused = None

    def hash_fields(self) -> dict[str, Any]:
        """What the state hash adds: ``{"memory": entries}`` when something is stored, else nothing (the hash of
        a state without notes is the one it was before memory existed)."""
        return {"memory": dict(self.entries)} if self.entries else {}

    def export_state(self) -> tuple[tuple[str, str], ...]:
        """The entries, immutable and picklable (for snapshots)."""
        return tuple(self.entries.items())

    def import_state(self, state: Iterable[tuple[str, str]]) -> None:
        """Replace the entries by those of :meth:`export_state`."""
        self.entries = {str(k): str(v) for k, v in state}
        self._refused = None

    # -- after a call ------------------------------------------------------------------------------------------
    def outcome(self, tool: str, executed: bool, status: Status) -> tuple[Status, float]:
        """The status of a step that called ``tool`` and the tool seconds to charge it: a memory call refused for
        a limit is ``MODEL_INVALID_ACTION``; an executed memory call costs ``seconds_per_call``."""
        refused, self._refused = self._refused, None
        if tool not in MEMORY_TOOLS or not executed:
            return status, 0.0
        if refused is not None and status == Status.OK:
            status = Status.MODEL_INVALID_ACTION
        return status, (self.config.seconds_per_call if self.config is not None else 0.0)

    # -- the handlers (run by the gateway once the capability and the schema passed) ----------------------------
    def _refuse(self, why: str) -> str:
        self._refused = why
        return f"error: {why}"

    def _key_problem(self, key: str) -> str | None:
        if not key.strip():
            return "a memory key must not be blank"
        if any(unicodedata.category(c) in ("Cc", "Cs") for c in key):
            return "a memory key must not hold control characters"
        return None

    def _write(self, args: dict[str, Any]) -> str:
        assert self.config is not None  # the capability is granted only when memory is on
        key, text = args["key"], args["text"]
        problem = self._key_problem(key)
        if problem is not None:
            return self._refuse(problem)
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.config.max_entry_bytes:
            return self._refuse(f"memory_write: the text is {size} bytes of UTF-8; an entry holds at most "
                                f"{self.config.max_entry_bytes} bytes (nothing was stored)")
        if key not in self.entries and len(self.entries) >= self.config.max_entries:
            return self._refuse(f"memory_write: memory is full ({self.config.max_entries} entries); replace an "
                                f"existing key (memory_list shows them) - nothing was stored")
        self.entries[key] = text
        return f"stored {key!r} ({size} bytes; {len(self.entries)} of {self.config.max_entries} entries used)"

    def _read(self, args: dict[str, Any]) -> str:
        key = args["key"]
        if key not in self.entries:
            # Not a mistake: asking is how an agent learns that nothing is stored (memory starts empty).
            return f"no memory entry named {key!r} in this episode ({len(self.entries)} stored; memory_list shows them)"
        return self.entries[key]

    def _list(self, args: dict[str, Any]) -> str:
        if not self.entries:
            return "memory is empty"
        cap = self.config.max_entries if self.config is not None else len(self.entries)
        lines = [f"{k!r}: {len(v.encode('utf-8', 'surrogatepass'))} bytes" for k, v in self.entries.items()]
        return f"{len(self.entries)} of {cap} entries:\n" + "\n".join(lines)


__all__ = ["DEFAULT_SECONDS_PER_CALL", "MEMORY_CAPABILITY", "MEMORY_TOOLS", "MEMORY_TOOL_DOCS", "EpisodicMemory",
           "MemoryConfig", "memory_tool_docs"]
