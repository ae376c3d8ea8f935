"""The proxy's recording: one episode per agent session, a policy turn per call, observation turns for what the
agent added since its last call; written through ``LakeWriter`` only when the episode ends.

Sessions. A call names its session with the ``X-Trajlake-Session`` header or the request's ``user`` field. A call
that names none continues the open unnamed session whose recorded context (the messages it sent and the reply it
got, or the completion prompt and text) the call's own context extends, else it starts one.

Turns of a call. Chat: each message the agent added since its previous call (normally the tool results and user
messages after the reply it got) becomes an observation turn (system: ``system``/``system``; user:
``user``/``user``; tool: ``tool``/``env``, with the tool call's id and name; an assistant message the proxy did
not serve: ``assistant``/``user``, never trained on), then the reply is the policy turn (its text, its tool calls
in trajlake's ``<tool_call>`` format, ``action_schema``/``tool_call_id``/``tool_args`` of the first call).
Completions: the part of the prompt after the previous prompt and completion is one observation turn.

Tokens. When the upstream returns the prompt's and the reply's token ids (vLLM's ``return_token_ids``), the policy
turn holds the reply's ids, their log-probs and ``tokenizer_id`` ``served:MODEL``, and the call's observation
turns hold the prompt ids after the previous context (the previous prompt and reply): all of them on the first
added turn, the others empty (the server does not say where one message ends). So the episode's ids concatenate to
each call's prompt and reply exactly (the trainer's prefix check). When the prompt does not extend the previous
context (the agent rewrote its history, or the template re-rendered the earlier reply differently), the call's
observation turns hold its whole prompt, the policy turn says ``context_strategy`` ``rerendered`` and names every
earlier turn by ``context_dropped_hash`` (as ``openai:`` does). When the upstream returns no token ids the turns
are text only (``token_ids``/``tokenizer_id`` null, ``tokens`` the server's usage count) and a note says so once;
an episode that got ids on some calls and not on others is stored text only as a whole (one tokenizer per
episode).

Ends. ``finish`` (the outcome endpoint): success, reward components, termination reason and the task's ids;
``expire``: sessions idle longer than the idle timeout end *truncated* with reason ``timeout``, ungraded. Until
then nothing of the episode is written; ``close`` drops (and counts) the episodes still open, so an unfinished
episode never becomes a row. Nothing of a request but its messages (or prompt) is recorded: no header, no API key.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trajlake.errors import TrajlakeError
from trajlake.record.episode import utcnow
from trajlake.record.recorder import new_episode_id
from trajlake.render.chat import dropped_hash
from trajlake.render.toolcall import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, format_call
from trajlake.schemas.vocab import TERMINATED_REASONS, Actor, Role, Status, TerminationReason

if TYPE_CHECKING:
    from trajlake.record.writer import LakeWriter

SESSION_HEADER = "X-Trajlake-Session"
"""The request header naming the agent's session (else the request's ``user`` field)."""

DEFAULT_IDLE_TIMEOUT_S = 900.0

CHAT = "chat"
COMPLETIONS = "completions"


@dataclass
class Call:
    """One answered call of the agent, as the recorder reads it (``server.py`` builds it from the reply or from
    the streamed chunks)."""

    kind: str
    """``chat`` or ``completions``."""
    request: Mapping[str, Any]
    """The agent's request body (its messages or prompt are recorded; nothing else of it)."""
    model: str
    """The model the upstream says it served (else the one requested)."""
    text: str
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    """``{"id", "name", "arguments"}`` per tool call of the reply (arguments as the JSON text the server sent)."""
    prompt_ids: list[int] | None = None
    gen_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    started_at: dt.datetime = field(default_factory=utcnow)
    ended_at: dt.datetime = field(default_factory=utcnow)


_OUTCOME_TEXT = ("task_id", "task_version", "env_id", "env_version", "split")


@dataclass
class Outcome:
    """What the agent's harness posts when an episode ends (``POST /trajlake/outcome``)."""

    success: bool | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    reward_total: float | None = None
    termination_reason: str = TerminationReason.SUBMITTED
    task_id: str | None = None
    task_version: str | None = None
    env_id: str | None = None
    env_version: str | None = None
    split: str | None = None
    env_seed: int | None = None
    attempt: int = 0

    @classmethod
    def from_json(cls, obj: Any) -> Outcome:
        """Read a posted outcome; TrajlakeError naming the field for a bad one."""
        if not isinstance(obj, dict):
            raise TrajlakeError("the outcome is not a JSON object")
        known = {"session", *(f for f in cls.__dataclass_fields__)}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise TrajlakeError(f"unknown outcome field(s) {unknown}: expected {sorted(known)}")
        out = cls()
        success = obj.get("success")
        if success is not None and not isinstance(success, bool):
            raise TrajlakeError(f"outcome.success must be true, false or null, not {success!r}")
        out.success = success
        comps = obj.get("reward_components") or {}
        if not isinstance(comps, dict) or not all(isinstance(k, str) and _number(v) for k, v in comps.items()):
            raise TrajlakeError("outcome.reward_components must map names to numbers")
        out.reward_components = {k: float(v) for k, v in comps.items()}
        total = obj.get("reward_total")
        if total is not None and not _number(total):
            raise TrajlakeError(f"outcome.reward_total must be a number, not {total!r}")
        out.reward_total = None if total is None else float(total)
        reason = obj.get("termination_reason", TerminationReason.SUBMITTED)
        if reason not in set(TerminationReason):
            raise TrajlakeError(f"outcome.termination_reason {reason!r} is not one of "
                                f"{sorted(str(r) for r in TerminationReason)}")
        out.termination_reason = reason
        for name in _OUTCOME_TEXT:
            v = obj.get(name)
            if v is not None and (not isinstance(v, str) or not v):
                raise TrajlakeError(f"outcome.{name} must be a non-empty string")
            setattr(out, name, v)
        for name in ("env_seed", "attempt"):
            v = obj.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise TrajlakeError(f"outcome.{name} must be a non-negative integer")
            if v is not None:
                setattr(out, name, v)
        return out


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


# -- messages ---------------------------------------------------------------------------------------------------

def content_text(content: Any) -> str:
    """A message's content as text: a string as it is, the text parts of a list of parts joined (other parts as
    their JSON), null as empty."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) and p.get("type") == "text"
                       else json.dumps(p, sort_keys=True, ensure_ascii=False) for p in content)
    return json.dumps(content, sort_keys=True, ensure_ascii=False)


def tool_calls_of(message: Mapping[str, Any]) -> list[dict[str, str]]:
    """``{"id", "name", "arguments"}`` of each tool call of an assistant message (OpenAI's layout)."""
    out = []
    for c in message.get("tool_calls") or []:
        if not isinstance(c, dict):
            continue
        fn = c.get("function") or {}
        args = fn.get("arguments")
        out.append({"id": str(c.get("id") or ""), "name": str(fn.get("name") or ""),
                    "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)})
    return out


def reply_text(text: str, calls: Sequence[Mapping[str, str]]) -> str:
    """A reply as one text: its content, then each tool call in trajlake's format (``<tool_call>{"name": ...,
    "arguments": {...}}</tool_call>``; arguments that are not a JSON object stay the server's text)."""
    parts = [text]
    for c in calls:
        args = _json_object(c["arguments"])
        parts.append(format_call(c["name"], args) if args is not None else
                     TOOL_CALL_OPEN + json.dumps({"name": c["name"], "arguments": c["arguments"]},
                                                 ensure_ascii=False) + TOOL_CALL_CLOSE)
    return "".join(parts)


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        v = json.loads(text)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


Norm = tuple[str, str, str, tuple[tuple[str, str, str], ...]]


def _norm(m: Mapping[str, Any]) -> Norm:
    """What makes two messages the same for the continuation check (role, text, tool call id, tool calls):
    clients echo a reply back with fields of their own (``refusal``, ``annotations``, null content)."""
    calls = tuple((c["id"], c["name"], c["arguments"]) for c in tool_calls_of(m))
    return (str(m.get("role")), content_text(m.get("content")), str(m.get("tool_call_id") or ""), calls)


def _reply_norm(call: Call) -> Norm:
    return ("assistant", call.text, "", tuple((c["id"], c["name"], c["arguments"]) for c in call.tool_calls))


_ROLES: dict[str, tuple[str, str]] = {
    "system": (Role.SYSTEM, Actor.SYSTEM), "developer": (Role.SYSTEM, Actor.SYSTEM),
    "user": (Role.USER, Actor.USER), "tool": (Role.TOOL, Actor.ENV), "function": (Role.TOOL, Actor.ENV),
    # an assistant message the proxy did not serve (few-shot, edited history): the harness wrote it
    "assistant": (Role.ASSISTANT, Actor.USER),
}


# -- one episode ------------------------------------------------------------------------------------------------

@dataclass
class _Episode:
    key: str | None
    episode_id: str = field(default_factory=new_episode_id)
    started_at: dt.datetime = field(default_factory=utcnow)
    last_seen: float = 0.0
    turns: list[dict[str, Any]] = field(default_factory=list)
    sent: list[Norm] | None = None
    """Chat: the messages of the last call and its reply, normalised."""
    prev_text: str | None = None
    """Completions: the last prompt (text) and its completion."""
    ctx_ids: list[int] | None = None
    """The last call's prompt ids and reply ids (None: the last call had none)."""
    tool_names: dict[str, str] = field(default_factory=dict)
    models: list[str] = field(default_factory=list)
    with_ids: int = 0
    text_only: int = 0


class ProxyRecorder:
    """Sessions to episodes; thread-safe. ``record`` after each answered call, ``finish`` on the outcome,
    ``tick`` now and then (idle timeouts, the writer's age flush), ``close`` at the end."""

    def __init__(self, writer: LakeWriter, *, run_id: str, policy_version: str, env_id: str = "proxy",
                 idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S, clock: Callable[[], float] = time.monotonic,
                 notes: Callable[[str], None] | None = None):
        if idle_timeout_s <= 0:
            raise TrajlakeError(f"the idle timeout must be positive, not {idle_timeout_s}")
        self.writer = writer
        self.run_id = run_id
        self.policy_version = policy_version
        self.env_id = env_id
        self.idle_timeout_s = idle_timeout_s
        self.clock = clock
        self._print = notes or (lambda line: print(line, file=sys.stderr, flush=True))
        self._lock = threading.Lock()
        self._open: dict[str, _Episode] = {}  # session key (or auto:<episode id>) -> episode
        self._noted: set[str] = set()
        self._pending_since: float | None = None  # when the oldest episode not yet flushed was handed over
        self.finished: list[str] = []
        """Episode ids handed to the writer, in order."""
        self.expired: list[str] = []
        self.dropped = 0

    # -- notes ---------------------------------------------------------------------------------------------------
    def note(self, key: str, line: str) -> None:
        """Print ``note: LINE`` on standard error once per ``key``."""
        with self._lock:
            if key in self._noted:
                return
            self._noted.add(key)
        self._print(f"note: {line}")

    # -- calls ---------------------------------------------------------------------------------------------------
    def open_sessions(self) -> list[str]:
        with self._lock:
            return list(self._open)

    def _find(self, key: str | None, call: Call, norms: list[Norm] | None) -> _Episode:
        if key is not None:
            ep = self._open.get(key)
            if ep is None:
                ep = self._open[key] = _Episode(key)
            return ep
        best: _Episode | None = None
        best_len = -1
        for ep in self._open.values():  # the unnamed session whose context this call extends (the longest)
            if ep.key is not None:
                continue
            if norms is not None and ep.sent is not None and norms[:len(ep.sent)] == ep.sent \
                    and len(ep.sent) > best_len:
                best, best_len = ep, len(ep.sent)
            prompt = call.request.get("prompt")
            if norms is None and isinstance(prompt, str) and ep.prev_text is not None \
                    and prompt.startswith(ep.prev_text) and len(ep.prev_text) > best_len:
                best, best_len = ep, len(ep.prev_text)
        if best is None:
            best = _Episode(None)
            self._open[f"auto:{best.episode_id}"] = best
        return best

    def record(self, key: str | None, call: Call) -> str:
        """Record one answered call in its session's episode; returns the episode id."""
        chat = call.kind == CHAT
        messages = call.request.get("messages") if chat else None
        if chat and not isinstance(messages, list):
            raise TrajlakeError("a chat call without a list of messages")
        norms = [_norm(m) for m in messages if isinstance(m, dict)] if messages is not None else None
        with self._lock:
            ep = self._find(key, call, norms)
            ep.last_seen = self.clock()
            if not ep.turns:
                ep.started_at = call.started_at
            first_new = len(ep.turns)
            if chat:
                assert messages is not None and norms is not None
                extends = ep.sent is not None and norms[:len(ep.sent)] == ep.sent
                added = messages[len(ep.sent):] if extends and ep.sent is not None else messages
                obs = [self._message_turn(ep, m) for m in added if isinstance(m, dict)]
            else:
                obs, extends = self._prompt_turns(ep, call)
            rewritten = bool(ep.turns) and not extends
            ids = call.prompt_ids is not None and call.gen_ids is not None
            if ids:
                assert call.prompt_ids is not None
                ctx = ep.ctx_ids
                if not rewritten and ctx is not None and call.prompt_ids[:len(ctx)] == ctx:
                    obs_ids = call.prompt_ids[len(ctx):]
                else:
                    obs_ids = call.prompt_ids
                    rewritten = bool(ep.turns)  # the server rendered the history otherwise: the whole prompt
                if obs_ids and not obs:  # nothing added but the template's tokens between the calls
                    obs = [{"role": Role.USER, "content": "", "actor": Actor.USER}]
                for i, t in enumerate(obs):
                    t["token_ids"] = obs_ids if i == 0 else []
                    t["tokenizer_id"] = f"served:{call.model}"
                ep.with_ids += 1
            else:
                ep.text_only += 1
            for t in obs:
                t.setdefault("tokens", len(t.get("token_ids") or ()))
                t.update(started_at=call.started_at, ended_at=call.started_at, latency_ms=0.0)
                ep.turns.append(t)
            self._policy_turn(ep, call, ids, rewritten, first_new)
            if call.model not in ep.models:
                ep.models.append(call.model)
            if chat:
                assert norms is not None
                ep.sent = [*norms, _reply_norm(call)]
                ep.prev_text = None
            else:
                prompt = call.request.get("prompt")
                ep.prev_text = prompt + call.text if isinstance(prompt, str) else None
                ep.sent = None
            ep.ctx_ids = [*call.prompt_ids, *call.gen_ids] if ids else None  # type: ignore[misc]
            return ep.episode_id

    def _message_turn(self, ep: _Episode, m: Mapping[str, Any]) -> dict[str, Any]:
        role, actor = _ROLES.get(str(m.get("role")), (Role.USER, Actor.USER))
        calls = tool_calls_of(m)
        turn: dict[str, Any] = {"role": role, "actor": actor,
                                "content": reply_text(content_text(m.get("content")), calls)}
        if role == Role.TOOL:
            call_id = str(m.get("tool_call_id") or "") or None
            turn["tool_call_id"] = call_id
            turn["action_schema"] = ep.tool_names.get(call_id or "") or m.get("name")
        for c in calls:
            ep.tool_names[c["id"]] = c["name"]
        return turn

    @staticmethod
    def _prompt_turns(ep: _Episode, call: Call) -> tuple[list[dict[str, Any]], bool]:
        prompt = call.request.get("prompt")
        first = not ep.turns
        role, actor = (Role.USER, Actor.USER) if first else (Role.ENV, Actor.ENV)
        if isinstance(prompt, str):
            if ep.prev_text is not None and prompt.startswith(ep.prev_text):
                rest = prompt[len(ep.prev_text):]
                return ([{"role": role, "actor": actor, "content": rest}] if rest else []), True
            return [{"role": role, "actor": actor, "content": prompt}], False
        # a token-id prompt: its text is the model's to decode; the ids are the prompt ids
        if call.prompt_ids is None and isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
            call.prompt_ids = [int(i) for i in prompt]
        return [{"role": role, "actor": actor, "content": None}], ep.ctx_ids is not None and \
            call.prompt_ids is not None and call.prompt_ids[:len(ep.ctx_ids)] == ep.ctx_ids

    def _policy_turn(self, ep: _Episode, call: Call, ids: bool, rewritten: bool, first_new: int) -> None:
        first = call.tool_calls[0] if call.tool_calls else None
        args = _json_object(first["arguments"]) if first is not None else None
        turn: dict[str, Any] = {
            "role": Role.ASSISTANT, "actor": Actor.POLICY, "content": reply_text(call.text, call.tool_calls),
            "started_at": call.started_at, "ended_at": call.ended_at,
            "latency_ms": (call.ended_at - call.started_at).total_seconds() * 1000.0,
            "prompt_tokens": call.prompt_tokens if call.prompt_tokens is not None else
            (len(call.prompt_ids) if call.prompt_ids is not None else None),
            "action_schema": first["name"] if first else None, "tool_call_id": first["id"] if first else None,
            "tool_args": json.dumps(args, ensure_ascii=False, sort_keys=True) if args is not None else None,
            # a tool call whose arguments are not a JSON object: the model's error, recorded as the turn's
            "status": Status.MODEL_INVALID_ACTION if first is not None and args is None else Status.OK,
            "context_strategy": "rerendered" if rewritten else "server_chat" if call.kind == CHAT else None,
            "context_dropped_hash": dropped_hash([(i, t.get("content") or "")
                                                  for i, t in enumerate(ep.turns[:first_new])])
            if rewritten else None,
        }
        for c in call.tool_calls:
            ep.tool_names[c["id"]] = c["name"]
        if ids:
            assert call.gen_ids is not None
            turn.update(token_ids=call.gen_ids, tokenizer_id=f"served:{call.model}", tokens=len(call.gen_ids))
            lps = call.logprobs
            turn["behavior_logprobs"] = lps if lps is not None and len(lps) == len(call.gen_ids) else None
        else:
            turn["tokens"] = int(call.completion_tokens or 0)
        ep.turns.append(turn)

    # -- ends ----------------------------------------------------------------------------------------------------
    def finish(self, key: str, outcome: Outcome) -> dict[str, Any]:
        """End the open episode of session ``key`` with ``outcome`` and hand it to the writer. TrajlakeError
        when the session has no open episode; ValidationError when the episode is invalid (it is dropped)."""
        with self._lock:
            ep = self._open.pop(key, None)
        if ep is None:
            raise KeyError(key)
        reason = outcome.termination_reason
        terminated = reason in TERMINATED_REASONS
        return self._write(ep, outcome, terminated=terminated, truncated=not terminated)

    def expire(self, now: float | None = None) -> list[str]:
        """End every session idle for longer than the idle timeout: truncated, reason ``timeout``, ungraded."""
        now = self.clock() if now is None else now
        with self._lock:
            idle = [k for k, ep in self._open.items() if now - ep.last_seen > self.idle_timeout_s]
            eps = [self._open.pop(k) for k in idle]
        out = []
        for ep in eps:
            outcome = Outcome(success=None, termination_reason=TerminationReason.TIMEOUT)
            try:
                out.append(self._write(ep, outcome, terminated=False, truncated=True)["episode_id"])
            except TrajlakeError as e:
                self._print(f"error: episode {ep.episode_id} (session {ep.key}) ended by the idle timeout was "
                            f"not written: {e}")
        self.expired += out
        return out

    def _write(self, ep: _Episode, outcome: Outcome, *, terminated: bool, truncated: bool) -> dict[str, Any]:
        turns = ep.turns
        if ep.with_ids and ep.text_only:  # one tokenizer per episode: token ids on every call or on none
            self.note("mixed", "an episode got token ids on some calls and not on others: it is stored text only")
            for t in turns:
                t.update(token_ids=None, tokenizer_id=None, behavior_logprobs=None)
        rec = self.writer.start_episode(
            run_id=self.run_id, task_id=outcome.task_id or ep.key or "unknown",
            task_version=outcome.task_version or "unknown", env_id=outcome.env_id or self.env_id,
            env_version=outcome.env_version or "unknown", split=outcome.split or "unknown",
            env_seed=outcome.env_seed, attempt=outcome.attempt, policy_version=self.policy_version,
            episode_id=ep.episode_id, started_at=ep.started_at)
        for t in turns:
            row = dict(t)
            role, content = row.pop("role"), row.pop("content")
            rec.add_turn(role, content, **row)
        served = ", ".join(ep.models)
        res = rec.finish(terminated=terminated, truncated=truncated, termination_reason=outcome.termination_reason,
                         success=outcome.success, reward_components=outcome.reward_components,
                         reward_total=outcome.reward_total, served_model=served or None)
        with self._lock:
            self.finished.append(ep.episode_id)
            if self._pending_since is None:
                self._pending_since = self.clock()
        return {"episode_id": ep.episode_id, "turns": len(turns), "accepted": bool(res.accepted),
                "text_only": not ep.with_ids}

    def tick(self) -> None:
        """Idle timeouts, then the writer's age flush (``LakeWriter`` checks its buffer's age only when an episode
        is added: an idle proxy still commits within ``max_age_seconds``)."""
        self.expire()
        with self._lock:
            due = self._pending_since is not None and \
                self.clock() - self._pending_since >= self.writer.max_age_seconds
            if due:
                self._pending_since = None
        if due:
            self.writer.flush()

    def flush(self) -> list[str]:
        """Commit what the writer holds now."""
        with self._lock:
            self._pending_since = None
        return self.writer.flush()

    def close(self) -> int:
        """Drop the episodes still open (no outcome, not idle long enough) and flush; returns how many were
        dropped."""
        with self._lock:
            n = len(self._open)
            self._open.clear()
        self.dropped += n
        self.flush()
        return n


__all__ = ["CHAT", "COMPLETIONS", "SESSION_HEADER", "Call", "Outcome", "ProxyRecorder", "content_text",
           "reply_text", "tool_calls_of"]
