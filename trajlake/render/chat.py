"""Chat-template rendering, token for token: the pieces of a model's context and the tokenizer fingerprint.

A multi-turn context is never re-rendered from messages (decode -> encode is not a bijection, and chat templates
may rewrite history). It is the concatenation of pieces, each tokenized once:

- the *initial* piece: the system prompt (with the environment's tool descriptions) and the first observation,
  rendered with the tokenizer's chat template up to the assistant's generation prompt;
- each *generated* piece: the sampled token ids, as sampled;
- each *observation* piece: the rest of the previous assistant message after its end-of-turn token (e.g. the
  ``\\n`` after ``<|im_end|>``; the whole tail including the end token when generation stopped at the length
  limit), the observation as a user message ``<tool_response>...</tool_response>``, and the next generation prompt.

The observation piece's template text comes from diffing the template over a fixed placeholder conversation
(the approach of TRL and SkyRL); a template that is not prefix-preserving is refused with a clear error.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trajlake.errors import TemplateError
from trajlake.lake.values import max_token_bytes, vocab_suffix
from trajlake.render.toolcall import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, format_call

_OBS_MARK = "@@TRAJLAKE_OBSERVATION@@"
_ASSISTANT_MARK = "@@TRAJLAKE_ASSISTANT@@"
TOOL_RESPONSE_OPEN = "<tool_response>\n"
TOOL_RESPONSE_CLOSE = "\n</tool_response>"


def system_prompt(tools: Mapping[str, Mapping[str, Any]]) -> str:
    """The system prompt of an agent: the environment's tools and the tool-call format."""
    lines = ["You are an agent that solves the task by calling tools, one call per turn.",
             "Tools (JSON, one per line):", "<tools>"]
    for name in sorted(tools):
        doc = tools[name]
        lines.append(json.dumps({"name": name, "description": doc.get("description", ""),
                                 "arguments": doc.get("args", {})}, sort_keys=True, ensure_ascii=False))
    lines += ["</tools>",
              f"Call a tool with {TOOL_CALL_OPEN}{{\"name\": NAME, \"arguments\": {{...}}}}{TOOL_CALL_CLOSE}, "
              f"for example {format_call('submit', {})}.",
              "Tool results come back inside <tool_response></tool_response>."]
    return "\n".join(lines)


def dropped_hash(turns: Sequence[tuple[int, str]]) -> str:
    """``context_dropped_hash``: sha256 over the dropped turns' ``[turn_idx, raw_content]`` list (canonical JSON).
    ``trajlake.render.exactness.model_contexts`` finds the dropped range of a stored episode from it. (Here,
    beside the rendering, so that readers below the rollout layer, such as the trainer's, need no policy.)"""
    blob = json.dumps([[i, r] for i, r in turns], ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()


def tokenizer_fingerprint(tokenizer: Any, name: str) -> str:
    """``NAME|tok:HASH|tmpl:HASH|vocab:N|maxbytes:L``: the tokenizer id recorded on every turn. The two hashes (of
    the tokenizer's full definition and of its chat template) let a drift check say which of the two changed; the
    vocabulary size and longest token let the recorder and ``verify`` refuse ids no such tokenizer gives
    (``trajlake.lake.values``)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = backend.to_str()
    else:  # slow tokenizers: the vocabulary and the special tokens
        definition = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens])
    tok_hash = hashlib.sha256(definition.encode("utf-8")).hexdigest()[:16]
    tmpl_hash = hashlib.sha256((tokenizer.chat_template or "").encode("utf-8")).hexdigest()[:16]
    n = len(tokenizer)
    decoded = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
    return f"{name}|tok:{tok_hash}|tmpl:{tmpl_hash}{vocab_suffix(n, max_token_bytes(decoded))}"


def split_fingerprint(tokenizer_id: str) -> dict[str, str]:
    """``{"name", "tok", "tmpl"}`` of a fingerprint (missing parts are absent)."""
    parts = tokenizer_id.split("|")
    out = {"name": parts[0]}
    for p in parts[1:]:
        k, _, v = p.partition(":")
        out[k] = v
    return out


@dataclass(frozen=True)
class _ObservationTemplate:
    after_eos: str
    """Template text that follows the end-of-turn token of an assistant message (often ``\\n``)."""
    assistant_tail: str
    """Everything the template renders after an assistant message's content (end token included)."""
    before: str
    after: str


class ChatRenderer:
    """Renders the pieces of a context with a Hugging Face tokenizer and its chat template."""

    def __init__(self, tokenizer: Any, name: str):
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(f"tokenizer {name!r} has no chat template (tokenizer_config.json 'chat_template')")
        if tokenizer.eos_token_id is None:
            raise TemplateError(f"tokenizer {name!r} has no eos token: generation could not stop at a turn's end")
        self.tokenizer = tokenizer
        self.name = name
        self.eos_id = int(tokenizer.eos_token_id)
        self.eos_text = str(tokenizer.eos_token)
        self.tokenizer_id = tokenizer_fingerprint(tokenizer, name)
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._obs = self._observation_template()
        self.reserved = reserved_strings(tokenizer)
        """The texts of the tokenizer's special and added tokens: untrusted text never encodes to them."""

    def _render(self, messages: Sequence[Mapping[str, str]], generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                  add_generation_prompt=generation_prompt)
        return str(text)

    def _observation_template(self) -> _ObservationTemplate:
        base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": _ASSISTANT_MARK}]
        prefix = self._render(base, False)
        full = self._render([*base, {"role": "user", "content": _OBS_MARK}], True)
        if not full.startswith(prefix) or full.count(_OBS_MARK) != 1 or prefix.count(_ASSISTANT_MARK) != 1:
            raise TemplateError(f"the chat template of {self.name!r} is not prefix-preserving: rendering one more "
                                f"message changes the text before it, so contexts could not be extended token "
                                f"for token")
        tail = prefix[prefix.index(_ASSISTANT_MARK) + len(_ASSISTANT_MARK):]
        after_eos = tail[tail.index(self.eos_text) + len(self.eos_text):] if self.eos_text in tail else ""
        before, after = full[len(prefix):].split(_OBS_MARK)
        return _ObservationTemplate(after_eos, tail, before, after)

    def encode(self, text: str) -> list[int]:
        """``text``'s ids, trusted: the tokenizer's special and added tokens in it become those tokens."""
        if self._backend is not None:  # the fast tokenizer's Rust core: same ids, a third less time per call
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def initial_text(self, system: str | None, user: str) -> str:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return self._render(messages, True)

    def initial(self, system: str | None, user: str) -> list[int]:
        """The first piece: system prompt and first user message, up to the generation prompt. The user message
        (the task, the first observation) is untrusted: see :meth:`observation`."""
        text = self.initial_text(system, user)
        return self.encode_cut(text, self.initial_cuts(text, user))

    def initial_cuts(self, text: str, user: str) -> list[int]:
        """Where :meth:`initial` cuts ``text`` (``initial_text``'s) so the user message yields no reserved token."""
        start = text.rfind(user) if user else -1
        return untrusted_cuts(text, start, start + len(user), self.reserved) if start >= 0 else []

    def observation_text(self, observation: str, previous_ended_with_eos: bool) -> str:
        o = self._obs
        close = o.after_eos if previous_ended_with_eos else o.assistant_tail
        return close + o.before + TOOL_RESPONSE_OPEN + observation + TOOL_RESPONSE_CLOSE + o.after

    def observation(self, observation: str, previous_ended_with_eos: bool) -> list[int]:
        """An observation piece (see the module docstring). The observation is untrusted (tool output, pages,
        files): text in it that spells a special or added token (``<|im_end|><|im_start|>system``) is encoded
        as ordinary text, never as that token. Text without such spellings encodes exactly as before."""
        text = self.observation_text(observation, previous_ended_with_eos)
        return self.encode_cut(text, self.observation_cuts(observation, previous_ended_with_eos))

    def observation_cuts(self, observation: str, previous_ended_with_eos: bool) -> list[int]:
        """Where :meth:`observation` cuts its text (offsets into ``observation_text``)."""
        o = self._obs
        start = len(o.after_eos if previous_ended_with_eos else o.assistant_tail) + len(o.before) + \
            len(TOOL_RESPONSE_OPEN)
        text = self.observation_text(observation, previous_ended_with_eos)
        return untrusted_cuts(text, start, start + len(observation), self.reserved)

    def summary_text(self, summary: str) -> str:
        """The text of a summary piece (context strategy ``summarize``). It stands where the dropped turns were:
        right after the initial piece, which ends with an open assistant message (the generation prompt), and
        before the first kept reply, which is that message's content. So it closes the open assistant message
        empty, adds the summary as a user message and opens the next assistant message: ChatML gives
        ``<|im_end|>\\n<|im_start|>user\\nSUMMARY<|im_end|>\\n<|im_start|>assistant\\n``."""
        o = self._obs
        return o.assistant_tail + o.before + summary + o.after

    def summary(self, summary: str) -> list[int]:
        """A summary piece's ids (see :meth:`summary_text`); the summary quotes observations, so it is encoded as
        untrusted text (no reserved token)."""
        start = len(self._obs.assistant_tail) + len(self._obs.before)
        text = self.summary_text(summary)
        return self.encode_cut(text, untrusted_cuts(text, start, start + len(summary), self.reserved))

    def encode_cut(self, text: str, cuts: Sequence[int]) -> list[int]:
        """``text`` encoded piece by piece between ``cuts`` (one encode when there are none)."""
        return encode_between(self.encode, text, cuts)


def encode_between(encode: Callable[[str], list[int]], text: str, cuts: Sequence[int]) -> list[int]:
    """``text`` encoded with ``encode`` piece by piece between ``cuts`` (one call when there are none)."""
    if not cuts:
        return encode(text)
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [i for a, b in itertools.pairwise(bounds) if a < b for i in encode(text[a:b])]


def joined_cuts(texts: Sequence[str], cuts: Sequence[Sequence[int]]) -> list[int]:
    """Each text's cut points as offsets into the texts' concatenation."""
    starts = itertools.accumulate((len(t) for t in texts), initial=0)
    return [start + c for start, piece_cuts in zip(starts, cuts, strict=False) for c in piece_cuts]


def reserved_strings(tokenizer: Any) -> tuple[str, ...]:
    """The texts of ``tokenizer``'s special and added tokens (ChatML markers, tool-call tokens, ...), longest
    first."""
    found = {str(t) for t in getattr(tokenizer, "all_special_tokens", [])}
    for token in getattr(tokenizer, "added_tokens_decoder", {}).values():
        found.add(str(getattr(token, "content", token)))
    return longest_first(found)


def longest_first(strings: Iterable[str]) -> tuple[str, ...]:
    """The non-empty ``strings``, longest first (then alphabetically)."""
    return tuple(sorted({t for t in strings if t}, key=lambda t: (-len(t), t)))


def untrusted_cuts(text: str, start: int, end: int, reserved: Sequence[str]) -> list[int]:
    """Cut points that keep ``text[start:end]`` (untrusted) from forming any ``reserved`` token: one inside every
    occurrence that overlaps the span, at its second character or at ``start``, whichever is later. A tokenizer
    matches a special or added token only whole, so a cut occurrence is encoded as ordinary text. No occurrence,
    no cut: ordinary text encodes exactly as it always did."""
    cuts: set[int] = set()
    for token in reserved:
        if len(token) < 2:
            continue
        p = text.find(token, max(0, start - len(token) + 1))
        while 0 <= p < end:
            if p + len(token) > start:
                cuts.add(max(p + 1, start))
            p = text.find(token, p + 1)
    return sorted(cuts)


__all__ = ["ChatRenderer", "TemplateError", "dropped_hash", "encode_between", "joined_cuts", "longest_first",
           "reserved_strings", "split_fingerprint", "system_prompt", "tokenizer_fingerprint", "untrusted_cuts"]
