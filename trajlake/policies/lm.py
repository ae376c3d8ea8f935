"""The shared part of the language-model policies: a token-exact context built from pieces, trimming, parsing.

A subclass supplies ``generate(context_ids, max_new_tokens)``; this class renders the observations (see
``trajlake.render.chat``), keeps the context as one piece per turn of the episode, trims it by a named strategy
when it would overflow the window, parses the tool call and fills the ``PolicyOutput`` fields the runner records.
"""

from __future__ import annotations

import abc
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from trajlake.envs.policy import ContextSummary, Policy, PolicyOutput, TaskView
from trajlake.errors import ContextOverflowError, ModelServerError
from trajlake.policies.settings import LMSettings
from trajlake.policies.summarize import DroppedTurn, make_summarizer
from trajlake.render.chat import ChatRenderer, dropped_hash, system_prompt
from trajlake.render.grammar import Grammar
from trajlake.render.toolcall import parse_tool_call
from trajlake.schemas.vocab import Status


@dataclass
class Generation:
    """What one model call returned."""

    token_ids: list[int] | None
    """Sampled token ids (None: a text-only server)."""
    logprobs: list[float] | None
    """Sampling log-probability of each sampled token."""
    text: str
    prompt_tokens: int
    completion_tokens: int
    ended_with_eos: bool
    retries: int = 0
    prompt_token_ids: list[int] | None = None
    """The context as the server tokenized it (chat servers that return it)."""
    loss_mask: list[int] | None = None
    """Per sampled token: 1 where the policy chose it, 0 where a grammar forced it (None: all 1)."""


@dataclass
class _Piece:
    turn_idx: int
    raw: str
    ids: list[int]
    kind: str = "observation"
    """``observation``, ``policy`` (a reply) or ``summary`` (a summarizer turn)."""


@dataclass
class _Context:
    pieces: list[_Piece] = field(default_factory=list)
    """One piece per turn of the episode, in turn order (``pieces[i].turn_idx == i``)."""
    dropped_upto: int = 1
    """Pieces [1, dropped_upto) are out of the context (piece 0, the task prompt, always stays)."""
    summary: _Piece | None = None
    """The summary in the context (strategy ``summarize``): it stands for pieces [1, dropped_upto), right after
    piece 0. Summary pieces elsewhere (older summaries, and this one at its own turn) are not in the context."""

    def kept(self, summary: _Piece | None = None) -> list[_Piece]:
        """The pieces of the context, in context order (``summary``: the one to use instead of ``self.summary``)."""
        s = summary or self.summary
        rest = [p for p in self.pieces[self.dropped_upto:] if p.kind != "summary"]
        return self.pieces[:1] + ([s] if s is not None and self.dropped_upto > 1 else []) + rest

    def ids(self) -> list[int]:
        return [t for p in self.kept() for t in p.ids]

    def length(self, summary: _Piece | None = None) -> int:
        return sum(len(p.ids) for p in self.kept(summary))

    def next_drop(self) -> int | None:
        """``dropped_upto`` after dropping the oldest kept reply and the turns up to the next reply (None: the
        newest reply and observation always stay)."""
        return next((i for i in range(self.dropped_upto + 1, len(self.pieces)) if self.pieces[i].kind == "policy"),
                    None)


def sampling_seed(base: int, task_id: str, env_seed: int, attempt: int) -> int:
    """A distinct, reproducible sampling seed per (task, env seed, attempt)."""
    digest = hashlib.sha256(f"{base}:{task_id}:{env_seed}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


class LMPolicy(Policy):
    """A language model prompted with a chat template; one tool call per turn."""

    name = "lm"

    def __init__(self, policy_version: str, settings: LMSettings, renderer: ChatRenderer | None,
                 max_context: int | None):
        super().__init__(policy_version)
        self.settings = settings
        self.renderer = renderer
        self.max_context = settings.max_context or max_context
        self.ctx = _Context()
        self.n_turns = 0
        self.last_ended_with_eos = True
        self.seed = 0
        self.grammar: Grammar | None = None
        """The episode's tool-call grammar (``--policy-arg grammar``; None: unconstrained)."""
        self.summarizer = make_summarizer(settings.summarizer) if settings.context_strategy == "summarize" else None
        self._forget = False
        """Set by :meth:`forget_context` (fault kind ``context_trim``): the next turn trims all it can."""

    # -- the model ---------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def generate(self, context_ids: list[int], max_new_tokens: int) -> Generation:
        """Sample a reply to the context (token ids as rendered by ``self.renderer``)."""

    @property
    def tokenizer_id(self) -> str | None:
        return self.renderer.tokenizer_id if self.renderer else None

    # -- the episode -------------------------------------------------------------------------------------------
    def reset(self, task: TaskView, seed: int) -> None:
        self.task = task
        self.ctx = _Context()
        self.n_turns = 0
        self._forget = False
        self.last_ended_with_eos = True
        self.seed = sampling_seed(self.settings.seed, task.task_id, seed, self.attempt)
        self.system = system_prompt(task.tools)
        self.grammar = self.settings.tool_grammar(task.tools)

    def _observation_piece(self, observation: str) -> list[int]:
        assert self.renderer is not None
        if self.n_turns == 0:
            return self.renderer.initial(self.system, observation)
        return self.renderer.observation(observation, self.last_ended_with_eos)

    def observation_tokens(self, observation: str) -> tuple[Sequence[int], str] | None:
        if self.renderer is None:
            return None
        return self._observation_piece(observation), self.renderer.tokenizer_id

    def forget_context(self) -> bool:
        if self.renderer is None or self.settings.context_strategy == "none":
            return False  # "none" fails rather than trims; a text-only policy holds no token context
        last_reply = max((p.turn_idx for p in self.ctx.pieces if p.kind == "policy"), default=0)
        self._forget = last_reply > self.ctx.dropped_upto  # something before the last reply can still go
        return self._forget

    def act(self, observation: str) -> PolicyOutput:
        assert self.renderer is not None
        obs_ids = self._observation_piece(observation)
        self.ctx.pieces.append(_Piece(len(self.ctx.pieces), observation, obs_ids))
        dropped, summary = self._trim()
        context = self.ctx.ids()
        gen = self.generate(context, self.settings.max_new_tokens)
        assert gen.token_ids is not None
        parsed = parse_tool_call(gen.text)
        self.ctx.pieces.append(_Piece(len(self.ctx.pieces), parsed.action, list(gen.token_ids), "policy"))
        self.n_turns += 1
        self.last_ended_with_eos = gen.ended_with_eos
        ids = np.asarray(gen.token_ids, dtype=np.int32)
        return PolicyOutput(
            action=parsed.action, policy_version=self.policy_version, token_ids=ids,
            loss_mask=np.ones(ids.shape[0], dtype=np.int8) if gen.loss_mask is None
            else np.asarray(gen.loss_mask, dtype=np.int8),
            behavior_logprobs=None if gen.logprobs is None else np.asarray(gen.logprobs, dtype=np.float32),
            tokenizer_id=self.renderer.tokenizer_id, prompt_tokens=gen.prompt_tokens,
            context_token_ids=np.asarray(obs_ids, dtype=np.int32), context_tokenizer_id=self.renderer.tokenizer_id,
            status=self.status_of(parsed.ok, gen.retries), context_dropped_hash=dropped,
            context_strategy=self.settings.context_strategy, summary=summary)

    @staticmethod
    def status_of(parsed: bool, retries: int) -> str | None:
        # A model call that needed retries is recorded as infrastructure first: an unparsable reply stays
        # visible as MODEL_INVALID_ACTION on the environment's turn that answers it.
        if retries:
            return Status.ENV_TRANSIENT
        return None if parsed else Status.MODEL_INVALID_ACTION

    def _summary_for(self, upto: int) -> _Piece:
        """The summary of pieces [1, upto) as the piece it would be (its turn: the next one)."""
        assert self.renderer is not None and self.summarizer is not None
        renderer = self.renderer
        turns = [DroppedTurn(p.turn_idx, p.kind, p.raw) for p in self.ctx.pieces[1:upto]]
        text = self.summarizer.summarize(turns, lambda t: len(renderer.summary(t)), self.settings.summary_max_tokens)
        return _Piece(len(self.ctx.pieces), text, renderer.summary(text), "summary")

    def _trim(self) -> tuple[str | None, ContextSummary | None]:
        """Apply the context strategy; returns the hash of the dropped turns (None when none are dropped) and
        the new summary placed in the context (None: none, or the previous turn's)."""
        forced, self._forget = self._forget, False
        if self.max_context is None and not forced:
            return None, None
        budget = None if self.max_context is None else self.max_context - self.settings.max_new_tokens
        strategy = self.settings.context_strategy
        ctx = self.ctx
        start = ctx.dropped_upto
        written: dict[int, _Piece] = {}  # summaries of the candidate ranges, by dropped_upto (summarize)
        t0 = time.perf_counter()

        def summary() -> _Piece | None:
            if self.summarizer is None or ctx.dropped_upto == 1:
                return None
            if ctx.dropped_upto == start and ctx.summary is not None:
                return ctx.summary  # the range did not move: the summary in the context stays
            if ctx.dropped_upto not in written:
                written[ctx.dropped_upto] = self._summary_for(ctx.dropped_upto)
            return written[ctx.dropped_upto]

        if strategy in ("drop_oldest", "summarize"):
            # Drop whole replies with the turns up to the next reply, oldest first; the newest reply and
            # observation always stay. A forced trim (fault context_trim) drops all it can. A trim frees
            # trim_headroom tokens more than needed, so that the next turns extend this context (a reusable cache).
            limit = budget
            if budget is not None and ctx.length(summary()) > budget:
                limit = budget - self.settings.trim_headroom
            while forced or (limit is not None and ctx.length(summary()) > limit):
                nxt = ctx.next_drop()
                if nxt is None:
                    break
                ctx.dropped_upto = nxt
        current = summary()
        if budget is not None and ctx.length(current) > budget:
            raise ContextOverflowError(
                f"turn {len(ctx.pieces)}: the context needs {ctx.length(current)} tokens + max_new_tokens "
                f"{self.settings.max_new_tokens}, over the window of {self.max_context}, after context strategy "
                f"{strategy!r}")
        if ctx.dropped_upto == 1:
            return None, None
        dropped = dropped_hash([(p.turn_idx, p.raw) for p in ctx.pieces[1:ctx.dropped_upto]])
        if current is None or current is ctx.summary:
            return dropped, None
        assert self.renderer is not None and self.summarizer is not None
        ctx.pieces.append(current)  # its turn: just before this turn's reply
        ctx.summary = current
        return dropped, ContextSummary(current.raw, np.asarray(current.ids, dtype=np.int32),
                                       self.renderer.tokenizer_id, self.summarizer.version, dropped,
                                       time.perf_counter() - t0)


__all__ = ["ContextOverflowError", "Generation", "LMPolicy", "ModelServerError", "dropped_hash", "sampling_seed"]
