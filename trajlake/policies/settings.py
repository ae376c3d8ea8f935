"""Settings of the language-model policies, from ``--policy-arg KEY=VALUE`` or a config file."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trajlake.errors import TrajlakeError
from trajlake.render.grammar import DEFAULT_MAX_ARG_CHARS, GRAMMAR_MODES, Grammar, tool_call_grammar

CONTEXT_STRATEGIES = ("drop_oldest", "summarize", "none")
SERVER_LOGPROBS = ("raw", "processed")


@dataclass(frozen=True)
class LMSettings:
    """Every key is a ``--policy-arg`` (``--policy-arg temperature=0.7``); the run's config records them."""

    temperature: float = 1.0
    """Sampling temperature; 0 samples greedily (log-probs are then those of the unscaled distribution)."""
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0
    """Base sampling seed; each (task, env seed, attempt) samples with its own seed derived from it."""
    max_context: int | None = None
    """Context window in tokens (default: the model's ``max_position_embeddings``; unlimited for servers)."""
    context_strategy: str = "drop_oldest"
    """What to do when the context would overflow: ``drop_oldest`` (drop the oldest action/observation pairs,
    keeping the task prompt), ``summarize`` (drop them likewise and put a summary of them, written by
    ``summarizer``, after the task prompt; recorded as a ``summarizer`` turn with loss mask 0) or ``none`` (fail
    the episode)."""
    trim_headroom: int = 0
    """drop_oldest / summarize: tokens to free beyond what the next reply needs once the context must be trimmed
    (dropping whole turns until the context fits with this many to spare). 0 trims to the limit, so a long episode
    trims again on almost every turn and each turn's context differs from the previous one's at its start; with
    headroom the next turns extend the kept context until it fills up again, which lets a batched policy
    (``batch_episodes``) reuse its key/value cache. The model then sees fewer old turns right after each trim."""
    summarizer: str = "extractive"
    """summarize: the summariser (``trajlake.policies.summarize``); its version (``extractive-v1``) is recorded
    on the summary turns as ``turns.summary_version``."""
    summary_max_tokens: int = 128
    """summarize: most tokens of a summary as the model sees it (the rendered message); the newest dropped calls
    are kept first."""
    price_in: float = 0.0
    """USD per million prompt tokens (the run's cost model, same as ``--price-in``): a turn costs the prompt
    tokens the model reports (``turns.prompt_tokens``) and its completion tokens."""
    price_out: float = 0.0
    """USD per million completion tokens (same as ``--price-out``)."""
    base_url: str | None = None
    """OpenAI-compatible server (``--base-url``)."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key (the key itself is never recorded)."""
    timeout_s: float = 60.0
    """openai: most seconds one read from the server may wait (connect, write and each read)."""
    deadline_s: float = 300.0
    """openai: most seconds one request may take in all, however the server trickles its reply."""
    max_reply_bytes: int = 8 * 1024 * 1024
    """openai: largest reply accepted (bytes on the wire); a larger one fails the request with one line."""
    max_request_bytes: int = 4 * 1024 * 1024
    """openai chat mode: most UTF-8 bytes of message contents one request may carry. The context strategy drops
    the oldest action/observation pairs (keeping the system prompt, the task and the newest observation) to fit;
    what still does not fit fails the episode with one line. Without it a chat history grows without bound and
    is re-sent whole every turn (the token window, ``max_context``, needs a tokenizer: use tokenizer mode)."""
    max_retries: int = 4
    """Retries of a timed-out or 5xx request (with exponential backoff) before the episode fails."""
    backoff_s: float = 1.0
    """First retry delay; doubles each retry, capped at 30 s."""
    tokenizer: str | None = None
    """openai: a local tokenizer folder. With it the policy renders the context itself and sends token ids to
    ``/v1/completions`` (token in, token out); without it, it sends messages to ``/v1/chat/completions``."""
    device: str = "cpu"
    """hf: torch device."""
    dtype: str = "float32"
    """hf: torch dtype of the weights."""
    threads: int = 0
    """hf: torch CPU threads of this process (0: torch's default). One per worker avoids oversubscription."""
    batch_episodes: int = 1
    """hf: episodes one rollout worker plays at once, their turns decoded together in shared forward passes
    (``trajlake.policies.batched``); recorded exactly as when played one at a time. 1: one at a time."""
    n_files: int = 4
    """single-turn: most files named in the task statement to show the model."""
    grammar: str = ""
    """``tools``: decode under a grammar built from the environment's tool docs (one Hermes tool call, then the
    end-of-turn token; see ``trajlake.render.grammar``); empty: unconstrained. hf: masks every step; openai: sends
    the grammar to the server (vLLM structured outputs). The run's config records it as ``grammar``."""
    grammar_max_chars: int = DEFAULT_MAX_ARG_CHARS
    """Most characters of one argument value under the grammar."""
    server_logprobs: str = "raw"
    """openai: which log-probs the server returns: ``raw`` (vLLM's default ``--logprobs-mode raw_logprobs``:
    before temperature and top-p) or ``processed`` (``processed_logprobs``: the distribution sampled from);
    recorded in the run's config as ``server_logprobs``."""

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> LMSettings:
        """Settings from ``KEY=VALUE`` strings (or typed values); unknown keys and bad values are one clear
        error naming the key."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {}
        for key, raw in args.items():
            if key not in fields:
                raise TrajlakeError(f"unknown --policy-arg {key!r}; keys: {', '.join(sorted(fields))}")
            default = getattr(cls, key)
            kind = type(default) if default is not None else (int if key == "max_context" else str)
            try:
                kw[key] = raw if not isinstance(raw, str) or kind is str else kind(raw)
            except ValueError as e:
                raise TrajlakeError(f"--policy-arg {key}={raw!r}: not a {kind.__name__}") from e
        s = cls(**kw)
        if s.context_strategy not in CONTEXT_STRATEGIES:
            raise TrajlakeError(f"--policy-arg context_strategy must be one of {', '.join(CONTEXT_STRATEGIES)}")
        if s.temperature < 0 or not 0 < s.top_p <= 1 or s.max_new_tokens < 1:
            raise TrajlakeError("--policy-arg: temperature >= 0, 0 < top_p <= 1 and max_new_tokens >= 1")
        if s.grammar and s.grammar not in GRAMMAR_MODES:
            raise TrajlakeError(f"--policy-arg grammar must be one of {', '.join(GRAMMAR_MODES)} (or empty: "
                                f"unconstrained), not {s.grammar!r}")
        if s.context_strategy == "summarize":
            from trajlake.policies.summarize import make_summarizer

            make_summarizer(s.summarizer)
        if s.trim_headroom < 0:
            raise TrajlakeError(f"--policy-arg trim_headroom must be >= 0 (tokens), not {s.trim_headroom}")
        if s.summary_max_tokens < 1:
            raise TrajlakeError("--policy-arg summary_max_tokens must be >= 1")
        if s.batch_episodes < 1:
            raise TrajlakeError("--policy-arg batch_episodes must be >= 1")
        if s.grammar_max_chars < 1:
            raise TrajlakeError("--policy-arg grammar_max_chars must be >= 1")
        if s.server_logprobs not in SERVER_LOGPROBS:
            raise TrajlakeError(f"--policy-arg server_logprobs must be one of {', '.join(SERVER_LOGPROBS)}")
        return s

    def tool_grammar(self, tool_docs: Mapping[str, Mapping[str, Any]]) -> Grammar | None:
        """The grammar of ``--policy-arg grammar`` over an environment's tool docs (None: unconstrained)."""
        if not self.grammar:
            return None
        return tool_call_grammar(tool_docs, self.grammar_max_chars)


def parse_policy_args(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["temperature=0.7", ...]`` -> ``{"temperature": "0.7"}``; a malformed item is one clear error."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TrajlakeError(f"--policy-arg {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


__all__ = ["CONTEXT_STRATEGIES", "SERVER_LOGPROBS", "LMSettings", "parse_policy_args"]
