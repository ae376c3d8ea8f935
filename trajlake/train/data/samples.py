"""The three ways one episode's turns become training samples (``SampleBuilder``), given the trainer's tokenizer:

- exact: the stored token ids as recorded (token in, token out), when every turn was recorded with the trainer's
  tokenizer and chat template (or, without one, with a single real tokenizer);
- trimmed: one sample per policy turn of an episode whose context was trimmed (``context_dropped_hash``): the
  context that turn's model saw (with the ``summarizer`` turn standing for the dropped turns under ``summarize``)
  and what it sampled; only the sampled tokens carry loss mask 1;
- re-rendered: the episode as an ``hf:`` policy with the trainer's tokenizer would have seen it, from
  ``raw_content``, with the prefix check (the per-turn pieces must concatenate to the tokenization of the whole
  text; ``RetokenizationError`` names the first turn that breaks it).

Also the turn row they read (``Turn``), their errors and the tokenizer fingerprints. The builders read no file:
the reader (``stream.py``) reads ``raw_content`` before it asks for a trimmed or re-rendered episode.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from trajlake.envs import registry
from trajlake.envs.policy import BYTE_TOKENIZER_ID
from trajlake.errors import RetokenizationError, TrainDataError, TrajlakeError
from trajlake.render.chat import (
    ChatRenderer,
    TemplateError,
    joined_cuts,
    split_fingerprint,
    system_prompt,
    tokenizer_fingerprint,
)
from trajlake.render.exactness import model_contexts
from trajlake.render.toolcall import format_call, parse_tool_call
from trajlake.schemas.vocab import Actor, Role

# -- one episode's turns ---------------------------------------------------------------------------------------

@dataclass
class Turn:
    """One row of the ``turns`` table as the builders read it (arrays as numpy slices of the record batch)."""

    idx: int
    actor: str
    role: str
    tokenizer_id: str | None
    dropped_hash: str | None
    strategy: str | None
    action_schema: str | None
    raw: str | None
    ids: npt.NDArray[np.int32] | None
    mask: npt.NDArray[np.int8] | None
    logprobs: npt.NDArray[np.float32] | None
    raw_read: bool
    """Whether ``raw_content`` was read with the row (see ``LakeTrajectories._needs_raw``; ``_fill_raw`` reads it
    later)."""
    source: tuple[str, int]
    """(file, row group) the row came from."""
    owned: bool = False
    filesystem: Any = None
    """The lake's ``pyarrow.fs`` filesystem for ``source`` (None: a local path)."""

    def own(self) -> None:
        """Copy the array slices, so an episode still open at the end of a batch does not keep the batch."""
        if self.owned:
            return
        self.owned = True
        if self.ids is not None:
            self.ids = self.ids.copy()
        if self.mask is not None:
            self.mask = self.mask.copy()
        if self.logprobs is not None:
            self.logprobs = self.logprobs.copy()


Piece = tuple[Any, Any, Any, Any, "int | None", Any]
"""(input_ids, loss_mask, behavior_logprobs, token_turn, policy_turn, generated_turn) of one sample.
``generated_turn`` is k on every token the k-th policy turn generated (sampled or forced by a grammar), -1
elsewhere: the stretch a grammar matcher replays (``trajlake.train.data.masks``)."""


def where(episode_id: str, turn: int | None, column: str | None = None) -> str:
    """Where an error is: ``episode E turn T: turns.COLUMN``."""
    out = f"episode {episode_id}"
    if turn is not None:
        out += f" turn {turn}"
    return out + (f": turns.{column}" if column else "")


# -- the trainer's tokenizer -----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=256)
def fingerprint_key(tokenizer_id: str) -> tuple[str, str] | None:
    """(tok, tmpl) hashes of a policy-recorded fingerprint; None for other ids (byte tokens, imports, demo)."""
    if "|tok:" not in tokenizer_id:
        return None
    parts = split_fingerprint(tokenizer_id)
    return parts.get("tok", ""), parts.get("tmpl", "")


@functools.lru_cache(maxsize=256)
def tok_key(tokenizer_id: str | None) -> Any:
    """What makes two tokenizer ids the same vocabulary: the tok/tmpl hashes of a fingerprint (the name is the
    model folder's and changes between checkpoints), else the id itself."""
    if tokenizer_id is None:
        return None
    return fingerprint_key(tokenizer_id) or tokenizer_id


def load_tokenizer(tokenizer: Any) -> tuple[Any, str]:
    """(tokenizer, name) of a loaded tokenizer or of a model or tokenizer folder."""
    if not isinstance(tokenizer, (str, Path)):
        return tokenizer, str(getattr(tokenizer, "name_or_path", "") or "tokenizer")
    try:
        from transformers import AutoTokenizer  # optional and heavy: only a folder needs it
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise TrajlakeError("re-rendering episodes needs transformers: pip install 'trajlake[lm]'") from e
    path = Path(tokenizer)
    if not path.exists():
        raise TrajlakeError(f"tokenizer {path}: no such folder (give the trainer's model or tokenizer folder)")
    try:
        return AutoTokenizer.from_pretrained(str(path)), path.name
    except Exception as e:  # transformers raises OSError, ValueError, ... for unreadable folders
        raise TrajlakeError(f"tokenizer {path}: cannot load: {str(e).splitlines()[0] if str(e) else e!r}") from e


# -- the builders ---------------------------------------------------------------------------------------------

def check_alignment(eid: str, turns: Sequence[Turn]) -> None:
    """Each turn's loss_mask and behavior_logprobs have one value per token id; the mask is 0/1."""
    for t in turns:
        n = None if t.ids is None else t.ids.shape[0]
        for col, arr in (("loss_mask", t.mask), ("behavior_logprobs", t.logprobs)):
            if arr is None:
                continue
            if n is None:
                raise TrainDataError(f"{where(eid, t.idx, col)}: has {arr.shape[0]} values but token_ids "
                                     f"is null")
            if arr.shape[0] != n:
                raise TrainDataError(f"{where(eid, t.idx, col)}: has {arr.shape[0]} values, token_ids {n}")
        if t.mask is not None and t.mask.size and (t.mask.max() > 1 or t.mask.min() < 0):
            raise TrainDataError(f"{where(eid, t.idx, 'loss_mask')}: values other than 0 and 1")


def whole_exact(turns: Sequence[Turn]) -> Piece:
    """The episode as one sample from its stored ids (``SampleBuilder.exact`` said they are usable)."""
    ids_parts, mask_parts, lp_parts, turn_parts, gen_parts = [], [], [], [], []
    k = 0
    for t in turns:
        assert t.ids is not None
        n = t.ids.shape[0]
        ids_parts.append(t.ids)
        m = t.mask if t.mask is not None else np.zeros(n, np.int8)
        mask_parts.append(m)
        lp_parts.append(t.logprobs if t.logprobs is not None else np.full(n, np.nan, np.float32))
        if t.actor == Actor.POLICY:
            turn_parts.append(np.where(m == 1, np.int32(k), np.int32(-1)).astype(np.int32))
            gen_parts.append(np.full(n, k, np.int32))
            k += 1
        else:
            turn_parts.append(np.full(n, -1, np.int32))
            gen_parts.append(np.full(n, -1, np.int32))
    ids = np.concatenate(ids_parts).astype(np.int64) if ids_parts else np.zeros(0, np.int64)
    mask = np.concatenate(mask_parts).astype(np.int8, copy=False) if mask_parts else np.zeros(0, np.int8)
    lp = np.concatenate(lp_parts).astype(np.float32, copy=True) if lp_parts else np.zeros(0, np.float32)
    lp[mask != 1] = np.nan
    tturn = np.concatenate(turn_parts) if turn_parts else np.zeros(0, np.int32)
    gturn = np.concatenate(gen_parts) if gen_parts else np.zeros(0, np.int32)
    return ids, mask, lp, tturn, None, gturn


class SampleBuilder:
    """Builds an episode's samples for the trainer's tokenizer (None: use stored ids from one real tokenizer).

    ``tokenizer``: a model or tokenizer folder, or a loaded Hugging Face tokenizer. ``exact`` remembers the
    vocabulary of the first episode it accepted without a tokenizer (``new_pass`` forgets it), so that every
    episode of a pass is in one vocabulary.
    """

    def __init__(self, tokenizer: str | Path | Any | None = None):
        self.tokenizer: Any = None
        self.tokenizer_name = ""
        self.tokenizer_key: tuple[str, str] | None = None
        if tokenizer is not None:
            self.tokenizer, self.tokenizer_name = load_tokenizer(tokenizer)
            self.tokenizer_key = fingerprint_key(tokenizer_fingerprint(self.tokenizer, self.tokenizer_name))
        self._renderer: Any = None
        self._seen_tokenizer: tuple[str, Any] | None = None
        self._tools: dict[tuple[str, str], Mapping[str, Mapping[str, Any]] | None] = {}

    def new_pass(self) -> None:
        """Forget the vocabulary of earlier episodes (a new iteration over the data)."""
        self._seen_tokenizer = None

    def exact(self, eid: str, turns: Sequence[Turn]) -> bool:
        """Whether the stored ids are used as they are; raises for a text-only episode without a tokenizer."""
        if self.tokenizer_key is not None:
            return all(t.ids is not None and t.tokenizer_id is not None
                       and fingerprint_key(t.tokenizer_id) == self.tokenizer_key for t in turns)
        first = turns[0].tokenizer_id if turns else None
        for t in turns:
            if t.ids is None or t.tokenizer_id is None or t.tokenizer_id == BYTE_TOKENIZER_ID:
                what = "no token ids" if t.ids is None or t.tokenizer_id is None else "byte tokens"
                raise TrainDataError(f"text-only episode {eid} (turn {t.idx} has {what}): pass the trainer's "
                                     f"tokenizer (LakeTrajectories(..., tokenizer=MODEL_DIR)) to re-render it")
            if tok_key(t.tokenizer_id) != tok_key(first):
                raise TrainDataError(f"{where(eid, t.idx, 'tokenizer_id')}: {t.tokenizer_id!r} differs from turn "
                                     f"0's {first!r}: pass the trainer's tokenizer to re-render the episode")
        assert first is not None
        seen = self._seen_tokenizer
        if seen is None:
            self._seen_tokenizer = (first, tok_key(first))
        elif seen[1] != tok_key(first):
            raise TrainDataError(f"{where(eid, 0, 'tokenizer_id')}: {first!r} differs from {seen[0]!r} of an "
                                 f"earlier episode: pass the trainer's tokenizer so that every episode is in its "
                                 f"vocabulary")
        return True

    # -- trimmed contexts ----------------------------------------------------------------------------------------
    def trimmed(self, eid: str, turns: Sequence[Turn]) -> list[Piece]:
        """One sample per policy turn with token ids: the context its model saw and what it sampled (the turns'
        ``raw_content`` read)."""
        rows = [{"turn_idx": t.idx, "actor": t.actor, "token_ids": t.ids, "tokenizer_id": t.tokenizer_id,
                 "context_dropped_hash": t.dropped_hash, "raw_content": t.raw, "behavior_logprobs": t.logprobs,
                 "context_strategy": t.strategy}
                for t in turns]
        try:
            contexts = model_contexts(rows)
        except ValueError as e:
            raise TrainDataError(f"episode {eid}: turns.context_dropped_hash: {e}") from None
        policy_k = {t.idx: k for k, t in enumerate(tt for tt in turns if tt.actor == Actor.POLICY)}
        out: list[Piece] = []
        for c in contexts:
            t = turns[c.turn_idx]
            # the context's turns (a summary, loss mask 0, among them): context tokens are never in the loss
            for i in [*c.kept, c.turn_idx]:
                tid = turns[i].tokenizer_id
                ok = tid is not None and (fingerprint_key(tid) == self.tokenizer_key if self.tokenizer_key
                                          else tok_key(tid) == tok_key(t.tokenizer_id))
                if not ok or turns[i].ids is None:
                    raise RetokenizationError(
                        f"{where(eid, i, 'tokenizer_id')}: the trimmed context of turn {c.turn_idx} was recorded "
                        f"with {tid!r}, not the trainer's tokenizer; a trimmed context is not re-rendered")
            ctx = np.asarray(c.context_ids, np.int64)
            gen = t.ids.astype(np.int64) if t.ids is not None else np.zeros(0, np.int64)
            gmask = t.mask if t.mask is not None else np.zeros(gen.shape[0], np.int8)
            ids = np.concatenate([ctx, gen])
            mask = np.concatenate([np.zeros(ctx.shape[0], np.int8), gmask.astype(np.int8)])
            glp = t.logprobs.astype(np.float32) if t.logprobs is not None else np.full(gen.shape[0], np.nan,
                                                                                        np.float32)
            lp = np.concatenate([np.full(ctx.shape[0], np.nan, np.float32), glp])
            lp[mask != 1] = np.nan
            k = policy_k[c.turn_idx]
            tturn = np.where(mask == 1, np.int32(k), np.int32(-1)).astype(np.int32)
            gturn = np.concatenate([np.full(ctx.shape[0], -1, np.int32), np.full(gen.shape[0], k, np.int32)])
            out.append((ids, mask, lp, tturn, k, gturn))
        return out

    # -- re-rendering ------------------------------------------------------------------------------------------
    def _tool_docs(self, env_id: str, env_kwargs: Mapping[str, Any] | None = None
                   ) -> Mapping[str, Mapping[str, Any]] | None:
        """The tools the episode's policy was shown: the environment class's ``tool_docs_for`` its run's
        ``env_kwargs`` (``runs.config``; memory adds its tools), else its ``tool_docs`` (None: not a registered
        environment, e.g. an import)."""
        kwargs = dict(env_kwargs or {})
        key = (env_id, json.dumps(kwargs, sort_keys=True, default=str))
        if key not in self._tools:
            try:
                spec = registry.spec(env_id)
                target, env_class = spec.load(), spec.env_class()
            except TrajlakeError:
                self._tools[key] = None
            else:
                docs = env_class.tool_docs_for(kwargs) if env_class is not None else getattr(target, "tool_docs", {})
                self._tools[key] = dict(docs or {})
        return self._tools[key]

    def renderer(self) -> Any:
        """The ``ChatRenderer`` of the trainer's tokenizer (built on first use)."""
        if self._renderer is None:
            try:
                self._renderer = ChatRenderer(self.tokenizer, self.tokenizer_name)
            except TemplateError as e:
                raise TrajlakeError(f"the trainer's tokenizer cannot re-render episodes: {e}") from None
        return self._renderer

    def rerender(self, eid: str, env_id: str, turns: Sequence[Turn], env_kwargs: Mapping[str, Any] | None = None
                 ) -> Piece:
        """The episode as an ``hf:`` policy with the trainer's tokenizer would have seen it, with the prefix check
        (the turns' ``raw_content`` read); ``env_kwargs``: its run's (the tools its policy was shown)."""
        assert self.tokenizer is not None, "exact raised the text-only error"
        r = self.renderer()
        first_pol = next((i for i, t in enumerate(turns) if t.actor == Actor.POLICY), len(turns))
        lead = turns[:first_pol]
        tools = self._tool_docs(env_id, env_kwargs)
        system_parts = ([system_prompt(tools)] if tools is not None else []) + \
            [t.raw or "" for t in lead if t.role == Role.SYSTEM]
        users = [t for t in lead if t.role != Role.SYSTEM]
        texts: list[str] = []
        cuts: list[list[int]] = []  # per piece: where untrusted text is cut so it yields no special token
        pieces: list[list[int]] = []
        owners: list[int] = []
        masks: list[int] = []
        policy_k: list[int] = []
        if lead:
            user = "\n\n".join(t.raw or "" for t in users)
            text = r.initial_text("\n\n".join(system_parts) or None, user)
            texts.append(text)
            cuts.append(r.initial_cuts(text, user))
            pieces.append(r.encode_cut(text, cuts[-1]))
            owners.append((users[0] if users else lead[0]).idx)
            masks.append(0)
            policy_k.append(-1)
        k = 0
        for t in turns[first_pol:]:
            if t.actor == Actor.POLICY:
                if t.raw is None:
                    raise TrainDataError(f"{where(eid, t.idx, 'raw_content')}: null on a policy turn of an episode "
                                         f"to re-render")
                parsed = parse_tool_call(t.raw)
                body = format_call(parsed.tool, json.loads(parsed.action)["args"]) if parsed.ok and parsed.tool \
                    else t.raw
                texts.append(body + r.eos_text)
                cuts.append([])
                pieces.append([*r.encode(body), r.eos_id])
                # a turn recorded as not trainable (its stored mask all 0) stays so
                masks.append(0 if t.mask is not None and t.mask.size and not t.mask.any() else 1)
                policy_k.append(k)
                k += 1
            else:
                text = r.observation_text(t.raw or "", True)
                texts.append(text)
                cuts.append(r.observation_cuts(t.raw or "", True))
                pieces.append(r.encode_cut(text, cuts[-1]))
                masks.append(0)
                policy_k.append(-1)
            owners.append(t.idx)
        flat = [i for p in pieces for i in p]
        whole = r.encode_cut("".join(texts), joined_cuts(texts, cuts))
        if whole != flat:
            self._prefix_error(eid, texts, cuts, pieces, owners, flat, whole)
        lens = [len(p) for p in pieces]
        ids = np.asarray(flat, np.int64)
        mask = np.repeat(np.asarray(masks, np.int8), lens)
        gturn = np.repeat(np.asarray(policy_k, np.int32), lens)
        tturn = np.where(mask == 1, gturn, np.int32(-1)).astype(np.int32)
        return ids, mask, np.full(ids.shape[0], np.nan, np.float32), tturn, None, gturn

    def _prefix_error(self, eid: str, texts: Sequence[str], cuts: Sequence[Sequence[int]],
                      pieces: Sequence[Sequence[int]], owners: Sequence[int], flat: Sequence[int],
                      whole: Sequence[int]) -> None:
        """Raise naming the first turn whose tokens do not continue the previous turns: the smallest K for which
        the tokenization of texts[0..K] is not pieces[0..K] (bisection: only failing episodes pay for it)."""
        r = self.renderer()
        ends = np.cumsum([len(p) for p in pieces]).tolist()

        def upto(k: int) -> list[int]:
            return r.encode_cut("".join(texts[:k + 1]), joined_cuts(texts[:k + 1], cuts[:k + 1]))

        def breaks(k: int) -> bool:
            return bool(upto(k) != list(flat[:ends[k]]))

        lo, hi = 0, len(pieces) - 1  # breaks(hi) holds: the whole text
        while lo < hi:
            mid = (lo + hi) // 2
            if breaks(mid):
                hi = mid
            else:
                lo = mid + 1
        mine = upto(lo)
        got = list(flat[:ends[lo]])
        i = next((j for j, (a, b) in enumerate(zip(got, mine, strict=False)) if a != b), min(len(got), len(mine)))
        a = got[i] if i < len(got) else None
        b = mine[i] if i < len(mine) else None
        show_a = repr(r.decode([a])) if a is not None else "end"
        show_b = repr(r.decode([b])) if b is not None else "end"
        raise RetokenizationError(
            f"episode {eid} turn {owners[lo]}: re-rendered with the trainer's tokenizer, the turn's tokens do not "
            f"continue the previous turns exactly: token {i} is {a} ({show_a}) turn by turn but {b} ({show_b}) when "
            f"the text up to this turn is tokenized whole")
