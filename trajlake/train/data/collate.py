"""Batches of the reader's samples: ``pad_collate`` (right-padded ``[B, Lmax]`` tensors) and ``pack`` (samples
packed in order into ``[1, max_tokens]`` rows with per-segment positions)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from trajlake.errors import TrajlakeError


def _scalars(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "advantage": torch.tensor([float(s["advantage"]) for s in samples], dtype=torch.float32),
        "reward": torch.tensor([float(s["reward"]) for s in samples], dtype=torch.float32),
        "terminated": torch.tensor([bool(s["terminated"]) for s in samples], dtype=torch.bool),
        "n_policy_turns": torch.tensor([int(s["n_policy_turns"]) for s in samples], dtype=torch.long),
        "has_behavior_logprobs": torch.tensor([_has_logprobs(s) for s in samples], dtype=torch.bool),
        "episode_id": [s["episode_id"] for s in samples],
        "group_id": [s["group_id"] for s in samples],
        "task_id": [s.get("task_id") for s in samples],
        "policy_version": [s["policy_version"] for s in samples],
        "policy_lag": [s.get("policy_lag") for s in samples],
        "retokenized": [bool(s.get("retokenized")) for s in samples],
        "grammar": [s.get("grammar") for s in samples],
    }


def _generated_turn(s: Mapping[str, Any], n: int) -> Any:
    """The sample's ``generated_turn`` (all -1 for a sample built without one)."""
    g = s.get("generated_turn")
    return np.full(n, -1, np.int64) if g is None else g


def _has_logprobs(s: Mapping[str, Any]) -> bool:
    """Every loss token has a recorded behaviour log-prob (and there is at least one loss token)."""
    m = np.asarray(s["loss_mask"]) == 1
    return bool(m.any() and np.isfinite(np.asarray(s["behavior_logprobs"])[m]).all())


def pad_collate(samples: Sequence[Mapping[str, Any]], pad_id: int = 0) -> dict[str, Any]:
    """Right-padded ``[B, Lmax]`` tensors: input_ids (long), attention_mask (long), loss_mask (float, 0 on padding),
    behavior_logprobs (float, NaN -> 0; ``has_behavior_logprobs`` [B] says whether every loss token of a sample
    had one, ``behavior_logprobs_mask`` [B, Lmax] which tokens did), token_turn and generated_turn (long, -1 on
    padding); [B]: advantage, reward, terminated, n_policy_turns; lists: episode_id, group_id, task_id,
    policy_version, policy_lag, retokenized, grammar (the sha256 of the run's grammar, None: unconstrained)."""
    if not samples:
        raise TrajlakeError("pad_collate: no samples")
    b = len(samples)
    lmax = max(1, max(int(np.asarray(s["input_ids"]).shape[0]) for s in samples))
    ids = np.full((b, lmax), pad_id, np.int64)
    att = np.zeros((b, lmax), np.int64)
    mask = np.zeros((b, lmax), np.float32)
    lp = np.zeros((b, lmax), np.float32)
    lp_ok = np.zeros((b, lmax), np.float32)
    tturn = np.full((b, lmax), -1, np.int64)
    gturn = np.full((b, lmax), -1, np.int64)
    for i, s in enumerate(samples):
        n = int(np.asarray(s["input_ids"]).shape[0])
        ids[i, :n] = s["input_ids"]
        att[i, :n] = 1
        mask[i, :n] = s["loss_mask"]
        row_lp = np.asarray(s["behavior_logprobs"], np.float32)
        finite = np.isfinite(row_lp)
        lp[i, :n] = np.where(finite, row_lp, 0.0)
        lp_ok[i, :n] = finite
        tturn[i, :n] = s["token_turn"]
        gturn[i, :n] = _generated_turn(s, n)
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(att),
            "loss_mask": torch.from_numpy(mask), "behavior_logprobs": torch.from_numpy(lp),
            "behavior_logprobs_mask": torch.from_numpy(lp_ok), "token_turn": torch.from_numpy(tturn),
            "generated_turn": torch.from_numpy(gturn), **_scalars(samples)}


def pack(samples: Iterable[Mapping[str, Any]], max_tokens: int, pad_id: int = 0) -> Iterator[dict[str, Any]]:
    """Pack samples, in order, into ``[1, max_tokens]`` rows: input_ids, attention_mask, position_ids (restarting
    at 0 for each sample), ``segment`` (the sample's index in the row, -1 on padding), loss_mask, behavior_logprobs
    (NaN -> 0), behavior_logprobs_mask, token_turn, generated_turn; per segment: ``cu_seqlens`` and the [S] values and lists of
    ``pad_collate``. Attention is NOT masked across segments by these tensors: only a model that honours
    position_ids-based packing (transformers' flash-attention varlen path) keeps samples apart; otherwise use
    ``pad_collate`` (the default). A sample longer than ``max_tokens`` is an error (never cut)."""
    row: list[Mapping[str, Any]] = []
    used = 0
    for s in samples:
        n = int(np.asarray(s["input_ids"]).shape[0])
        if n > max_tokens:
            raise TrajlakeError(f"pack: episode {s['episode_id']} has {n} tokens, over max_tokens {max_tokens} "
                                f"(filter with LakeTrajectories(max_length=...))")
        if row and used + n > max_tokens:
            yield _packed(row, max_tokens, pad_id)
            row, used = [], 0
        row.append(s)
        used += n
    if row:
        yield _packed(row, max_tokens, pad_id)


def _packed(row: Sequence[Mapping[str, Any]], max_tokens: int, pad_id: int) -> dict[str, Any]:
    ids = np.full(max_tokens, pad_id, np.int64)
    att = np.zeros(max_tokens, np.int64)
    pos = np.zeros(max_tokens, np.int64)
    seg = np.full(max_tokens, -1, np.int64)
    mask = np.zeros(max_tokens, np.float32)
    lp = np.zeros(max_tokens, np.float32)
    lp_ok = np.zeros(max_tokens, np.float32)
    tturn = np.full(max_tokens, -1, np.int64)
    gturn = np.full(max_tokens, -1, np.int64)
    cu = [0]
    at = 0
    for j, s in enumerate(row):
        n = int(np.asarray(s["input_ids"]).shape[0])
        sl = slice(at, at + n)
        ids[sl] = s["input_ids"]
        att[sl] = 1
        pos[sl] = np.arange(n)
        seg[sl] = j
        mask[sl] = s["loss_mask"]
        row_lp = np.asarray(s["behavior_logprobs"], np.float32)
        finite = np.isfinite(row_lp)
        lp[sl] = np.where(finite, row_lp, 0.0)
        lp_ok[sl] = finite
        tturn[sl] = s["token_turn"]
        gturn[sl] = _generated_turn(s, n)
        at += n
        cu.append(at)
    out = {"input_ids": ids, "attention_mask": att, "position_ids": pos, "segment": seg, "loss_mask": mask,
           "behavior_logprobs": lp, "behavior_logprobs_mask": lp_ok, "token_turn": tturn, "generated_turn": gturn}
    tensors: dict[str, Any] = {k: torch.from_numpy(v).unsqueeze(0) for k, v in out.items()}
    tensors["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
    return {**tensors, **_scalars(row)}



__all__ = ["pack", "pad_collate"]
