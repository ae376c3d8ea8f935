"""The policy interface (bottom layer, beside the environment contract): an action plus (when the policy has
them) token ids, loss mask, behaviour log-probs."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

BYTE_TOKENIZER_ID = "trajlake-bytes-v1"
_BYTE_OFFSET = 3  # ids 0..2 are reserved (pad, bos, eos)


def byte_tokenize(text: str) -> npt.NDArray[np.int32]:
    """A fixed, dependency-free tokenizer for scripted policies: one id per UTF-8 byte (offset by 3).

    Returns an int32 array: the recorder turns arrays into Arrow list columns without a Python int per token."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32) + _BYTE_OFFSET


def byte_detokenize(ids: Sequence[int]) -> str:
    return bytes(i - _BYTE_OFFSET for i in ids if i >= _BYTE_OFFSET).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ContextSummary:
    """A summary that stands in the policy's context for the turns trimming dropped (context strategy
    ``summarize``). The runner records it as a ``summarizer`` turn just before the policy turn that first saw it:
    loss mask 0, no log-probs (the policy did not write it), ``summary_version`` naming the summariser."""

    text: str
    """The summary (``raw_content`` of the summarizer turn)."""
    token_ids: Sequence[int] | npt.NDArray[np.integer[Any]]
    """Its tokens as the model saw them (the summary rendered as a message, see ``ChatRenderer.summary``)."""
    tokenizer_id: str
    summary_version: str
    """The summariser that wrote it, name and version (``turns.summary_version``), e.g. ``extractive-v1``."""
    context_dropped_hash: str
    """Hash of the turns it replaces (``trajlake.render.chat.dropped_hash``): the same hash as the policy turn's."""
    seconds: float = 0.0
    """Time spent writing it."""


@dataclass(frozen=True)
class PolicyOutput:
    """One policy turn."""

    action: str
    """The action text sent to the environment."""
    policy_version: str
    """Version of the policy that produced it (episode-sticky)."""
    token_ids: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None
    """Token ids of the generated text, when the policy has them."""
    loss_mask: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None
    """1 on tokens the policy produced and may learn from (same length as token_ids)."""
    behavior_logprobs: Sequence[float] | npt.NDArray[np.floating[Any]] | None = None
    """Behaviour log-probabilities per token, when the policy has them."""
    tokenizer_id: str | None = None
    prompt_tokens: int | None = None
    """Tokens of context the model was given for this turn (``turns.prompt_tokens``); None: the whole history
    of the episode before the turn, which is what tokens_in then counts."""
    cost_usd: float | None = None
    """Cost the policy itself reports for this turn (e.g. an API's billed amount); None: the run's cost model
    prices the turn's tokens."""
    completion_tokens: int | None = None
    """Generated tokens when the policy has no token ids (a text-only server); None: len(token_ids)."""
    context_token_ids: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None
    """Token ids the policy appended to its context since its previous turn, before the generated ones (the
    rendered observation and chat template). The runner records them on the observation turn just before this
    turn, so the turns' token ids concatenate to the exact model context (the prefix property)."""
    context_tokenizer_id: str | None = None
    status: str | None = None
    """Status of the policy call itself: MODEL_INVALID_ACTION (unparsable output) or ENV_TRANSIENT (the model
    server needed retries: infrastructure, kept over the environment's model-error statuses); None: OK."""
    context_dropped_hash: str | None = None
    """Hash of the turns left out of this turn's context (context trimming), or None."""
    context_strategy: str | None = None
    """Name of the context strategy that built this turn's context (LM policies)."""
    summary: ContextSummary | None = None
    """A new summary of the dropped turns placed in this turn's context (strategy ``summarize``); None when the
    context holds no summary or the same one as the previous turn."""


@dataclass(frozen=True)
class TaskView:
    """What a policy may know about the task: the public statement and ids, never hidden tests or fixes.

    ``oracle`` carries privileged data only for the oracle policy (e.g. the known fix)."""

    task_id: str
    task_version: str
    statement: str
    tools: Mapping[str, Mapping[str, Any]]
    oracle: Mapping[str, Any] | None = None


class Policy(abc.ABC):
    """A policy acts on observations; scripted policies ignore the token-level fields they do not have."""

    name: str = "policy"
    needs_oracle: bool = False
    """True for a policy that reads the task's known solution (``TaskView.oracle``)."""
    checkpoint_hash: str | None = None
    """Hash of the weights the policy samples from (``runs.policy_checkpoint_hash``); None for scripted
    policies, which have none."""
    attempt: int = 0
    """Attempt index of the episode being played (set by the runner before ``reset``: sampling seeds differ
    between the attempts of a group)."""

    batch_episodes: int = 1
    """Episodes a rollout worker plays at once with this policy: above 1 it plays the policies of
    :meth:`concurrent` on as many threads (an ``hf:`` model decodes their turns together)."""

    def __init__(self, policy_version: str):
        self.policy_version = policy_version

    def concurrent(self, n: int) -> list[Policy]:
        """``n`` policies that play episodes at the same time, sharing what this one holds (a model)."""
        raise NotImplementedError(f"the {self.name} policy plays one episode at a time")

    @abc.abstractmethod
    def reset(self, task: TaskView, seed: int) -> None:
        """Start an episode."""

    @abc.abstractmethod
    def act(self, observation: str) -> PolicyOutput:
        """Return the next action."""

    def forget_context(self) -> bool:
        """Trim the context before the next turn as if the window were tiny (fault kind ``context_trim``): every
        earlier action/observation pair is dropped; the task, the newest action and the newest observation stay.
        Returns whether the policy had something to drop (scripted policies hold no context: False, and the fault
        is not recorded)."""
        return False

    def observation_tokens(self, observation: str) -> tuple[Sequence[int], str] | None:
        """Token ids (and tokenizer id) of an observation the policy will not act on (the episode's last); None:
        the runner records byte tokens."""
        return None

    def scripted_output(self, action: str) -> PolicyOutput:
        """Wrap an action of a scripted policy: byte tokens with loss mask 1 and no log-probs."""
        ids = byte_tokenize(action)
        return PolicyOutput(action=action, policy_version=self.policy_version, token_ids=ids,
                            loss_mask=np.ones(ids.shape[0], dtype=np.int8), behavior_logprobs=None,
                            tokenizer_id=BYTE_TOKENIZER_ID)
