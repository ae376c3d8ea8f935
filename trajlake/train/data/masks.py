"""The grammar masks of constrained policy turns, rebuilt from a batch for the learner's re-score.

A run decoded under a grammar (``runs.config.grammar``) recorded, for each sampled token, the log-prob of the
masked, renormalised distribution it was drawn from; tokens the grammar forced have loss_mask 0. To compare like
with like, the learner masks its logits the same way before temperature and log-softmax
(``trajlake.train.math.masked_token_logprobs``). The masks are not stored: ``BatchGrammarMasks`` replays the
grammar's matcher over the stored tokens of each constrained policy turn (``generated_turn``, from the turn's
first generated token, as the sampler did) and keeps the masks of the loss tokens, packed 8 tokens per byte:
``[N, ceil(V / 8)]`` for the N loss tokens of constrained turns in the batch, never ``[B, T, V]``.

The replay also checks itself: a token is forced (one allowed token) in the replay exactly where the sampler
recorded loss_mask 0, else the masks differ from the sampler's (another grammar library version?) and the batch
is refused, naming the episode and turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trajlake.errors import GrammarError, TrainDataError
from trajlake.render.grammar import TokenMasker, forced_flags, replay_masks


@dataclass(frozen=True)
class GrammarMasks:
    """The allowed-token sets of a batch's constrained loss tokens."""

    positions: torch.Tensor
    """``[N, 2]`` long: (row, position) of each token scored under a grammar (position t: the token scored by
    the logits at t - 1, aligned like ``token_logprobs``)."""
    allowed: torch.Tensor
    """``[N, ceil(V / 8)]`` uint8: the tokens the grammar allowed there, little-endian bits."""
    vocab_size: int


class BatchGrammarMasks:
    """``masks = BatchGrammarMasks(tokenizer, dataset.grammars, vocab_size)(batch)``: the grammar masks of a
    ``pad_collate`` or ``pack`` batch (None when no sample of it is constrained).

    ``tokenizer``: the trainer's (``LakeTrajectories.tokenizer``; constrained samples use stored ids, so it is the
    one they were sampled with); ``grammars``: sha256 -> grammar text (``LakeTrajectories.grammars``);
    ``vocab_size``: the width of the model's logits."""

    def __init__(self, tokenizer: Any, grammars: Mapping[str, str], vocab_size: int):
        self.tokenizer = tokenizer
        self.grammars = dict(grammars)
        self.vocab_size = int(vocab_size)
        self._maskers: dict[str, TokenMasker] = {}

    def _masker(self, sha: str) -> TokenMasker:
        m = self._maskers.get(sha)
        if m is None:
            if sha not in self.grammars:
                raise TrainDataError(f"grammar {sha} of a sample is not among the dataset's grammars (read from "
                                     f"runs.config.grammar)")
            m = self._maskers[sha] = TokenMasker(self.grammars[sha], self.tokenizer, self.vocab_size)
        return m

    def __call__(self, batch: Mapping[str, Any]) -> GrammarMasks | None:
        shas = batch.get("grammar") or []
        if not any(shas):
            return None
        ids = batch["input_ids"].cpu().numpy()
        loss = batch["loss_mask"].cpu().numpy()
        gturn = batch["generated_turn"].cpu().numpy()
        segment = batch["segment"].cpu().numpy() if "segment" in batch else None
        rows: list[tuple[int, int]] = []
        packed: list[np.ndarray] = []
        for b in range(ids.shape[0]):
            # a sample's k-th policy turn: a maximal stretch of one (segment, generated_turn k >= 0)
            key = gturn[b] if segment is None else gturn[b] * (1 << 20) + segment[b]
            starts = np.flatnonzero((gturn[b] >= 0) & np.r_[True, key[1:] != key[:-1]])
            for s in starts:
                e = s + 1
                while e < key.shape[0] and key[e] == key[s]:
                    e += 1
                sample = b if segment is None else int(segment[b, s])
                sha = shas[sample]
                turn_loss = loss[b, s:e] == 1
                if sha is None or not turn_loss.any():
                    continue
                eid = batch["episode_id"][sample]
                k = int(gturn[b, s])
                try:
                    masks = replay_masks(self._masker(sha), ids[b, s:e].tolist())
                except GrammarError as err:
                    raise TrainDataError(f"episode {eid} policy turn {k}: the stored tokens do not replay under "
                                         f"the run's grammar: {err}") from None
                forced = forced_flags(masks)
                if (forced == turn_loss).any():
                    i = int(np.flatnonzero(forced == turn_loss)[0])
                    raise TrainDataError(
                        f"episode {eid} policy turn {k}: token {i} has loss_mask {int(turn_loss[i])} but the "
                        f"replayed grammar {'forced' if forced[i] else 'did not force'} it: the masks differ from "
                        f"the sampler's (another grammar library version than the run's?)")
                rows += [(b, int(s + i)) for i in np.flatnonzero(turn_loss)]
                packed.append(masks[turn_loss])
        if not rows:
            return None
        return GrammarMasks(torch.tensor(rows, dtype=torch.long), torch.from_numpy(np.concatenate(packed)),
                            self.vocab_size)


__all__ = ["BatchGrammarMasks", "GrammarMasks"]
