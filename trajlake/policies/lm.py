"""The shared part of the language-model policies: a token-exact context built from pieces, trimming, parsing.

A subclass supplies ``generate(context_ids, max_new_tokens)``; this class renders the observations (see
``trajlake.render.chat``), keeps the context as one piece per turn of the episode, trims it by a named strategy
when it would overflow the window, parses the tool call and fills the ``PolicyOutput`` fields the runner records.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from trajlake.envs.policy import Policy, PolicyOutput, TaskView
from trajlake.errors import ContextOverflowError, ModelServerError
from trajlake.policies.settings import LMSettings
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


@dataclass
class _Context:
    pieces: list[_Piece] = field(default_factory=list)
    dropped_upto: int = 1
    """Pieces [1, dropped_upto) are out of the context (piece 0, the task prompt, always stays)."""

    def ids(self) -> list[int]:
        kept = self.pieces[:1] + self.pieces[self.dropped_upto:]
        return [t for p in kept for t in p.ids]

    def length(self) -> int:
        return sum(len(p.ids) for p in self.pieces[:1] + self.pieces[self.dropped_upto:])


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

    def act(self, observation: str) -> PolicyOutput:
        assert self.renderer is not None
        obs_ids = self._observation_piece(observation)
        self.ctx.pieces.append(_Piece(2 * self.n_turns, observation, obs_ids))
        dropped = self._trim()
        context = self.ctx.ids()
        gen = self.generate(context, self.settings.max_new_tokens)
        assert gen.token_ids is not None
        parsed = parse_tool_call(gen.text)
        self.ctx.pieces.append(_Piece(2 * self.n_turns + 1, parsed.action, list(gen.token_ids)))
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
            context_strategy=self.settings.context_strategy)

    @staticmethod
    def status_of(parsed: bool, retries: int) -> str | None:
        # A model call that needed retries is recorded as infrastructure first: an unparsable reply stays
        # visible as MODEL_INVALID_ACTION on the environment's turn that answers it.
        if retries:
            return Status.ENV_TRANSIENT
        return None if parsed else Status.MODEL_INVALID_ACTION

    def _trim(self) -> str | None:
        """Apply the context strategy; returns the hash of the dropped turns (None when none are dropped)."""
        if self.max_context is None:
            return None
        budget = self.max_context - self.settings.max_new_tokens
        if self.settings.context_strategy == "drop_oldest":
            # Drop whole (action, observation) pairs, oldest first; the newest observation always stays.
            while self.ctx.length() > budget and self.ctx.dropped_upto + 2 < len(self.ctx.pieces):
                self.ctx.dropped_upto += 2
        if self.ctx.length() > budget:
            raise ContextOverflowError(
                f"turn {2 * self.n_turns + 1}: the context needs {self.ctx.length()} tokens + max_new_tokens "
                f"{self.settings.max_new_tokens}, over the window of {self.max_context}, after context strategy "
                f"{self.settings.context_strategy!r}")
        if self.ctx.dropped_upto == 1:
            return None
        return dropped_hash([(p.turn_idx, p.raw) for p in self.ctx.pieces[1:self.ctx.dropped_upto]])


__all__ = ["ContextOverflowError", "Generation", "LMPolicy", "ModelServerError", "dropped_hash", "sampling_seed"]
