"""``--policy openai:MODEL --base-url URL``: any OpenAI-compatible server through the ``openai`` client.

Two ways to talk to the server:

- **token in, token out** (``--policy-arg tokenizer=PATH``, a local copy of the served model's tokenizer): the
  policy renders the context itself exactly like ``hf:`` and sends the token ids to ``/v1/completions``; the
  server's ``token_ids`` (vLLM's ``return_token_ids``) and ``logprobs`` are recorded as they come.
- **chat** (no tokenizer): messages go to ``/v1/chat/completions`` with ``return_token_ids`` and ``logprobs``
  requested. When the server returns ``prompt_token_ids`` and ``token_ids`` they are recorded exactly; each
  observation turn gets the part of the server's prompt ids after the previous context. If the server's rendering
  of the history is not an extension of the previous context (it re-tokenized an earlier reply), the turn's
  context is recorded whole on the observation turn with ``context_strategy`` ``rerendered`` and the earlier turns
  named by ``context_dropped_hash``. When the server returns no token ids, turns are text only
  (``tokenizer_id`` null) and a warning says so once per worker. The history sent is bounded
  (``--policy-arg max_request_bytes``, 4 MiB): the context strategy drops the oldest action/observation pairs to
  fit, naming them by ``context_dropped_hash``.

Under ``--policy-arg grammar=tools`` every request carries the episode's tool-call grammar (Lark, see
``trajlake.render.grammar``) as vLLM's structured outputs, ``extra_body={"structured_outputs": {"grammar": ...}}``;
a server that refuses the field fails the episode with one line saying so. Which log-probs the server returns
(``--policy-arg server_logprobs``: ``raw`` or ``processed``, vLLM's ``--logprobs-mode``) is recorded in the run's
config.

Timeouts, connection errors, 429 and 5xx are retried with exponential backoff; a turn that needed a retry has
status ``ENV_TRANSIENT`` (infrastructure, never a model error); when every retry fails the episode fails and is
played again when the run resumes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from trajlake.envs.policy import PolicyOutput, TaskView
from trajlake.errors import TrajlakeError
from trajlake.policies.lm import ContextOverflowError, Generation, LMPolicy, ModelServerError, dropped_hash
from trajlake.policies.settings import LMSettings
from trajlake.render.chat import TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN, ChatRenderer
from trajlake.render.toolcall import parse_tool_call

_warned_text_only = False

OPTIONAL_EXTENSIONS = ("return_token_ids",)
"""vLLM/SGLang request fields the chat mode can do without: a server that refuses them (``transformers serve``
answers HTTP 422 "Unexpected fields in the request") is asked again without them and the turns are text only.
``structured_outputs`` (``--policy-arg grammar``) is not among them: the grammar is what the run asked for."""

_refused: dict[str, str] = {}
"""base URL -> why that server refused the optional extensions (``HTTP 422: ...``): remembered for the run (this
process), so each server is asked with them once."""


def server_detail(e: Any) -> str:
    """The server's own explanation of an HTTP error, on one line: FastAPI's ``detail`` (``transformers serve``),
    OpenAI's and vLLM's ``error.message``, else the body's text (the ``openai`` client's message for a body it does not
    know is only "Error code: 422")."""
    body = getattr(e, "body", None)
    text: Any = None
    if isinstance(body, dict):
        err = body.get("error")
        text = body.get("detail") or (err.get("message") if isinstance(err, dict) else err) or body.get("message")
    if not text:
        response = getattr(e, "response", None)
        try:
            text = response.text if response is not None else None
        except Exception:  # a streamed body that was not read: fall back to the client's message
            text = None
    if not text:
        text = getattr(e, "message", None) or str(e)
    if not isinstance(text, str):
        text = json.dumps(text, default=str)
    line = " ".join(text.split())
    return line if len(line) <= 500 else line[:500] + "..."


def _extra(obj: Any, key: str) -> Any:
    """A field the openai client does not model (vLLM's token ids): attribute, then ``model_extra``."""
    v = getattr(obj, key, None)
    if v is None:
        v = (getattr(obj, "model_extra", None) or {}).get(key)
    return v


class OpenAIPolicy(LMPolicy):
    """A model behind an OpenAI-compatible HTTP API."""

    name = "openai"

    def __init__(self, policy_version: str, model: str, settings: LMSettings):
        try:
            import openai
        except ImportError as e:
            raise TrajlakeError("the openai: policy needs the openai client: pip install 'trajlake[lm]'") from e
        if not settings.base_url:
            raise TrajlakeError(f"openai:{model}: give the server with --base-url URL")
        renderer = None
        if settings.tokenizer:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(settings.tokenizer, local_files_only=True)
            renderer = ChatRenderer(tok, f"openai:{model}")
        super().__init__(policy_version, settings, renderer, None)
        self.model = model
        self._openai = openai
        self.client = openai.OpenAI(base_url=settings.base_url, api_key=os.environ.get(settings.api_key_env) or "EMPTY",
                                    timeout=settings.timeout_s, max_retries=0,
                                    http_client=bounded_http_client(openai, settings.timeout_s, settings.deadline_s,
                                                                    settings.max_reply_bytes))
        self.messages: list[dict[str, str]] = []
        self.server_context: list[int] | None = None
        self.history: list[tuple[int, str]] = []
        self.rerendered_upto = 0

    # -- transport ---------------------------------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], **kw: Any) -> tuple[Any, int]:
        """Call the server; retry transient failures with backoff. Returns (response, retries).

        A chat request that a server refuses with HTTP 400/422 while it carries the optional vLLM extensions
        (``OPTIONAL_EXTENSIONS``) is sent once more without them; when that succeeds the server is remembered for
        the run (``_refused``) and every later request goes without them (text-only turns)."""
        o = self._openai
        where = f"openai:{self.model} at {self.settings.base_url}"
        retries = 0
        refused: str | None = None
        while True:
            try:
                resp = fn(**kw)
                if refused is not None:
                    self._remember_refusal(refused)
                return resp, retries
            except _ReplyTooLarge as e:  # a hostile or broken server: retrying gains nothing
                raise ModelServerError(f"{where}: {e}") from e
            except (o.APITimeoutError, o.APIConnectionError, o.InternalServerError, o.RateLimitError) as e:
                if isinstance(e.__cause__, _ReplyTooLarge):  # (openai 1.x wraps what the transport raises)
                    raise ModelServerError(f"{where}: {e.__cause__}") from e
                err: Exception = e
            except o.APIStatusError as e:
                detail = f"HTTP {e.status_code}: {server_detail(e)}"
                extra = kw.get("extra_body") or {}
                optional = [k for k in OPTIONAL_EXTENSIONS if k in extra]
                if e.status_code in (400, 422) and optional and "messages" in kw and refused is None:
                    # maybe only the vLLM extensions are refused (transformers serve: 422 "Unexpected fields"):
                    # ask once more without them; not a retry (the server is up, nothing transient happened)
                    refused = detail
                    kw = {**kw, "extra_body": {k: v for k, v in extra.items() if k not in optional}}
                    continue
                if e.status_code < 500 and "structured_outputs" in extra:
                    raise ModelServerError(
                        f"{where} refused the request with the tool-call grammar (structured_outputs.grammar, "
                        f"Lark): {detail}; it needs a server that takes vLLM's structured outputs (vLLM >= 0.12), "
                        f"or drop --policy-arg grammar") from e
                if e.status_code < 500 and "prompt" in kw:
                    raise ModelServerError(
                        f"{where} refused a token-id prompt with return_token_ids: {detail}; --policy-arg "
                        f"tokenizer (token in, token out) needs a server that takes token-id prompts and vLLM's "
                        f"return_token_ids (vLLM >= 0.10.2); without it the policy talks chat") from e
                if e.status_code < 500:
                    if refused is not None and refused != detail:  # both answers: the first names the extension
                        detail = f"{detail} (with {', '.join(OPTIONAL_EXTENSIONS)}: {refused})"
                    raise ModelServerError(f"{where}: {detail}") from e
                err = e
            if retries >= self.settings.max_retries:
                raise ModelServerError(f"{where}: {retries + 1} attempt(s) failed; last: {type(err).__name__}: "
                                       f"{_one_line(err)}") from err
            time.sleep(min(30.0, self.settings.backoff_s * 2 ** retries))
            retries += 1

    def _remember_refusal(self, detail: str) -> None:
        global _warned_text_only
        url = str(self.settings.base_url)
        if url not in _refused:
            _refused[url] = detail
            print(f"note: openai:{self.model} at {url} refused vLLM's {', '.join(OPTIONAL_EXTENSIONS)} ({detail}): "
                  f"this run asks it without them; turns are recorded as text only (tokenizer_id null)",
                  file=sys.stderr)
            _warned_text_only = True  # this note says it: not the generic "returns no token ids" one as well

    def _sampling(self) -> dict[str, Any]:
        s = self.settings
        # a server that refused the vLLM extensions this run is asked without them (chat mode only: token-id
        # prompts need return_token_ids)
        extra: dict[str, Any] = {} if self.renderer is None and str(s.base_url) in _refused \
            else {"return_token_ids": True}
        if self.grammar is not None:
            extra["structured_outputs"] = {"grammar": self.grammar.text}
        return {"model": self.model, "max_tokens": s.max_new_tokens, "temperature": s.temperature,
                "top_p": s.top_p, "seed": self.seed + self.n_turns, "extra_body": extra}

    # -- token in, token out -----------------------------------------------------------------------------------
    def generate(self, context_ids: list[int], max_new_tokens: int) -> Generation:
        assert self.renderer is not None
        resp, retries = self._call(self.client.completions.create, prompt=context_ids, logprobs=1,
                                   **self._sampling())
        choice = resp.choices[0]
        ids = _extra(choice, "token_ids")
        if ids is None:
            raise ModelServerError(f"openai:{self.model} at {self.settings.base_url} returned no token_ids for a "
                                   f"token-id prompt (vLLM >= 0.10.2 returns them); without "
                                   f"--policy-arg tokenizer the policy uses chat mode instead")
        ids = [int(i) for i in ids]
        lp = getattr(getattr(choice, "logprobs", None), "token_logprobs", None)
        logprobs = [float(v) for v in lp] if lp is not None and len(lp) == len(ids) else None
        usage = resp.usage
        eos = bool(ids) and ids[-1] == self.renderer.eos_id
        text = self.renderer.decode(ids[:-1] if eos else ids)
        return Generation(ids, logprobs, text, usage.prompt_tokens if usage else len(context_ids),
                          usage.completion_tokens if usage else len(ids), ended_with_eos=eos, retries=retries)

    # -- chat --------------------------------------------------------------------------------------------------
    def reset(self, task: TaskView, seed: int) -> None:
        super().reset(task, seed)
        self.messages = [{"role": "system", "content": self.system}]
        self.server_context = None
        self.history = []
        self.rerendered_upto = 0
        self.trimmed = 0  # history entries (from the first action on) dropped from the messages sent

    def _trim_messages(self) -> None:
        """Keep the messages sent within ``max_request_bytes``: drop the oldest (assistant, observation) pairs
        after the task (strategy ``drop_oldest``); raise ContextOverflowError when even the system prompt, the
        task, the last reply and the newest observation do not fit."""
        limit = self.settings.max_request_bytes

        def size() -> int:
            return sum(len(m["content"].encode("utf-8", "surrogatepass")) for m in self.messages)

        if self.settings.context_strategy == "drop_oldest":
            # as hf:'s drop_oldest: the system prompt, the task, the last reply and the newest observation stay
            while size() > limit and len(self.messages) > 4:
                del self.messages[2:4]
                self.trimmed += 2
        if size() > limit:
            raise ContextOverflowError(
                f"turn {2 * self.n_turns}: the messages to send take {size()} bytes, over max_request_bytes "
                f"{limit}, after context strategy {self.settings.context_strategy!r} (--policy-arg "
                f"max_request_bytes)")

    def observation_tokens(self, observation: str) -> Any:
        return super().observation_tokens(observation) if self.renderer is not None else None

    def act(self, observation: str) -> PolicyOutput:
        if self.renderer is not None:
            return super().act(observation)
        global _warned_text_only
        obs_idx = 2 * self.n_turns
        first = self.n_turns == 0
        self.messages.append({"role": "user", "content": observation if first else
                              TOOL_RESPONSE_OPEN + observation + TOOL_RESPONSE_CLOSE})
        self._trim_messages()
        trimmed = dropped_hash(self.history[1:1 + self.trimmed]) if self.trimmed else None
        resp, retries = self._call(self.client.chat.completions.create, messages=self.messages, logprobs=True,
                                   **self._sampling())
        choice = resp.choices[0]
        text = choice.message.content or ""
        self.messages.append({"role": "assistant", "content": text})
        parsed = parse_tool_call(text)
        usage = resp.usage
        prompt_tokens = usage.prompt_tokens if usage else None
        completion_tokens = usage.completion_tokens if usage else None
        self.history.append((obs_idx, observation))
        prompt_ids = _extra(resp, "prompt_token_ids") or _extra(choice, "prompt_token_ids")
        gen_ids = _extra(choice, "token_ids")
        common: dict[str, Any] = {"action": parsed.action, "policy_version": self.policy_version, "prompt_tokens": prompt_tokens,
                  "status": self.status_of(parsed.ok, retries), "context_strategy": "server_chat"}
        self.n_turns += 1
        if prompt_ids is None or gen_ids is None:
            if not _warned_text_only:
                print(f"note: openai:{self.model} at {self.settings.base_url} returns no token ids: turns are "
                      f"recorded as text only (tokenizer_id null)", file=sys.stderr)
                _warned_text_only = True
            self.history.append((obs_idx + 1, parsed.action))
            if trimmed is not None:
                common["context_strategy"] = self.settings.context_strategy
            return PolicyOutput(**common, completion_tokens=completion_tokens, context_dropped_hash=trimmed)
        prompt_ids = [int(i) for i in prompt_ids]
        gen_ids = [int(i) for i in gen_ids]
        strategy = "server_chat"
        if self.server_context is not None and prompt_ids[:len(self.server_context)] == self.server_context:
            context = prompt_ids[len(self.server_context):]
        else:
            context = prompt_ids
            if self.server_context is not None:  # the server re-rendered the history: record the whole context
                self.rerendered_upto = len(self.history) - 1
        if self.rerendered_upto:
            strategy = "rerendered"
        dropped = dropped_hash(self.history[:self.rerendered_upto]) if self.rerendered_upto else None
        self.history.append((obs_idx + 1, parsed.action))
        self.server_context = prompt_ids + gen_ids
        content = getattr(getattr(choice, "logprobs", None), "content", None)
        logprobs = [float(c.logprob) for c in content] if content and len(content) == len(gen_ids) else None
        tokenizer_id = f"served:{self.model}"
        ids = np.asarray(gen_ids, dtype=np.int32)
        return PolicyOutput(**{**common, "context_strategy": strategy}, token_ids=ids,
                            loss_mask=np.ones(ids.shape[0], dtype=np.int8),
                            behavior_logprobs=None if logprobs is None else np.asarray(logprobs, dtype=np.float32),
                            tokenizer_id=tokenizer_id, context_token_ids=np.asarray(context, dtype=np.int32),
                            context_tokenizer_id=tokenizer_id, context_dropped_hash=dropped)


__all__ = ["OpenAIPolicy"]


def _one_line(e: Exception) -> str:
    """An exception's text on one line, with the server's explanation for an HTTP error."""
    code = getattr(e, "status_code", None)
    text = f"HTTP {code}: {server_detail(e)}" if code is not None else str(e)
    return " ".join(text.split())


class _ReplyTooLarge(Exception):
    """A reply over ``max_reply_bytes`` (raised in the transport, turned into ModelServerError by ``_call``)."""


def bounded_http_client(openai: Any, timeout_s: float, deadline_s: float, max_reply_bytes: int) -> Any:
    """An HTTP client for ``openai``'s client whose every request ends within ``deadline_s`` seconds in all
    (httpx's own timeouts bound each read, so a server trickling a byte a second would hold a worker forever) and
    whose reply is at most ``max_reply_bytes`` bytes on the wire (a 16 MB reply was accepted and re-sent every
    turn). Built on the HTTP library that client is built on (``httpx``, or ``httpx2`` in openai 3)."""
    import sys

    client_class = next(c for c in openai.DefaultHttpxClient.__mro__[1:] if c.__name__ == "Client")
    httpx: Any = sys.modules[client_class.__module__.split(".")[0]]
    transport: Any = httpx.HTTPTransport

    class BoundedTransport(transport):
        def handle_request(self, request: Any) -> Any:
            start = time.monotonic()
            response = super().handle_request(request)
            chunks: list[bytes] = []
            size = 0
            try:
                for chunk in response.stream:
                    size += len(chunk)
                    if size > max_reply_bytes:
                        raise _ReplyTooLarge(f"the reply is larger than {max_reply_bytes} bytes "
                                            f"(--policy-arg max_reply_bytes)")
                    if time.monotonic() - start > deadline_s:
                        raise httpx.ReadTimeout(f"the reply took longer than {deadline_s:g} s in all "
                                                f"(--policy-arg deadline_s)", request=request)
                    chunks.append(chunk)
            finally:
                response.close()
            return httpx.Response(response.status_code, headers=response.headers, content=b"".join(chunks),
                                  request=request, extensions=response.extensions)

    return httpx.Client(transport=BoundedTransport(), timeout=timeout_s)
