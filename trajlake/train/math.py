"""The trainer's math: masked losses, advantages, GAE, shaping and importance ratios (issue 12, "The math").

Pure functions of tensors: torch only, no lake, no I/O, no global state. Equation numbers (19.2-19.7) are those
of the method's definitions (credit assignment, the masked loss, PPO/GRPO/RLOO); docs/training.md "The math"
states the conventions chosen here.

Conventions used by every function:

- Token tensors are batch-first ``[B, T]`` (B sequences, T token positions). ``mask`` has the same shape, is 0/1
  (bool or numeric) and is 1 on policy action tokens, 0 on tool observations, system and user text and padding
  (19.6). Values at mask-0 positions never reach a result or a gradient (they may be anything, even NaN or inf).
- ``logp`` at position t is the log-probability of token t given the tokens before it (``token_logprobs``);
  position 0 has no predictor and holds 0.0.
- Advantages, returns, importance weights and baselines are constants of the loss: they are detached.
- Turn-level quantities (rewards, values, GAE) live on environment turns ``[T_turns]`` or ``[B, K]`` and reach
  tokens through ``turns_to_tokens``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Literal

import torch
from torch import Tensor

LossAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]

#: log-ratios are clamped here before exp so a long off-policy trajectory cannot overflow (pitfall 3)
LOG_RATIO_CLAMP = 20.0


# ------------------------------------------------------------------------------------------ aggregation


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` where mask is 1, exactly 0.0 elsewhere; a select (not a product) so NaN/inf there vanish."""
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must have the same shape")
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: Tensor, mask: Tensor) -> Tensor:
    """The sum of ``values`` over the positions of ``mask`` (values elsewhere, NaN and inf included, left out)."""
    return _masked(values, mask).sum()


def masked_mean(values: Tensor, mask: Tensor, mode: LossAggregation = "token-mean",
                denominator: float | None = None) -> Tensor:
    """Aggregate per-token ``values`` over the policy tokens of ``mask`` (19.6).

    - ``token-mean``: sum(m*v) / sum(m) over the whole batch, every policy token weighs the same (19.6).
    - ``seq-mean-token-mean``: mean over sequences with at least one policy token of each sequence's masked
      mean (the original GRPO normalisation; it has a length bias).
    - ``seq-mean-token-sum``: mean over those sequences of each sequence's masked sum.

    ``denominator`` replaces the local count (policy tokens for ``token-mean``, non-empty sequences for the
    ``seq-mean-*`` modes) so that gradient accumulation over micro-batches equals one big batch: pass the
    global count and sum the micro-batch losses (pitfall 2). An empty mask gives 0, a zero tensor that still
    carries a grad_fn when ``values`` does. Shapes: ``[B, ...]``; the ``seq-mean-*`` modes treat dim 0 as the
    sequence.
    """
    v = _masked(values, mask)
    m = mask.to(v.dtype)
    if denominator is not None and not denominator > 0:
        raise ValueError(f"denominator must be > 0 (the global count), got {denominator}")
    if mode == "token-mean":
        total = v.sum()
        count = float(m.sum()) if denominator is None else denominator
        return total / count if count > 0 else total * 0.0
    if mode not in ("seq-mean-token-mean", "seq-mean-token-sum"):
        raise ValueError(f"unknown loss aggregation {mode!r}; expected one of token-mean, seq-mean-token-mean, "
                         f"seq-mean-token-sum")
    if v.dim() < 2:
        raise ValueError(f"{mode} needs [B, T] values, got shape {tuple(v.shape)}")
    seq_sum = v.flatten(1).sum(1)
    seq_count = m.flatten(1).sum(1)
    present = seq_count > 0
    per_seq = seq_sum / seq_count.clamp(min=1.0) if mode == "seq-mean-token-mean" else seq_sum
    n_seq = float(present.sum()) if denominator is None else denominator
    total = per_seq.sum()  # an empty sequence adds 0: its masked sum is 0
    return total / n_seq if n_seq > 0 else total * 0.0


# ------------------------------------------------------------------------------------------ log-probs


def _shifted_logits(logits: Tensor, input_ids: Tensor, temperature: float) -> Tensor:
    """Logits that predict tokens 1..T-1 (the logits at t-1 score token t), in float32, divided by T>0."""
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2]:
        raise ValueError(f"logits must be [B, T, V] and input_ids [B, T]; got {tuple(logits.shape)} and "
                         f"{tuple(input_ids.shape)}")
    return _at_temperature(logits[:, :-1].float(), temperature)


def _at_temperature(x: Tensor, temperature: float) -> Tensor:
    """``x / temperature`` when the temperature is > 0 (the sampler's convention), else ``x``."""
    # x / 1.0 == x exactly: skipping it saves a copy of the logits (and its backward) at the usual temperature
    return x / temperature if temperature > 0 and temperature != 1.0 else x


def token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``[B, T]`` log pi(token_t | tokens_<t) from a causal LM's ``[B, T, V]`` logits on ``input_ids``.

    The logits shift by one: ``logits[:, t-1]`` scores ``input_ids[:, t]`` (pitfall 11), and position 0 gets 0.0
    because nothing predicts it. Logits are divided by ``temperature`` when it is > 0, the sampler's convention
    (trajlake/policies/hf.py ``process_logits`` with top_p=1), so trainer and behaviour log-probs are comparable
    (pitfall 9). Computed in float32 as the gathered logit minus logsumexp (no full log-softmax tensor); the
    float32 copy of the logits is [B, T-1, V], so long sequences with a large vocabulary may need chunking.
    """
    x = _shifted_logits(logits, input_ids, temperature)
    chosen = x.gather(-1, input_ids[:, 1:].long().unsqueeze(-1)).squeeze(-1)
    lp = chosen - torch.logsumexp(x, dim=-1)
    return torch.cat([lp.new_zeros(lp.shape[0], 1), lp], dim=1)


def masked_token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float, positions: Tensor,
                          allowed: Tensor) -> Tensor:
    """``token_logprobs`` where some tokens were sampled under a grammar: at those tokens, the log-prob under
    the masked, renormalised distribution (logits outside the allowed set -> -inf, then temperature, then
    log-softmax), the distribution the behaviour policy recorded (trajlake/policies/hf.py ``process_logits``).

    ``positions``: ``[N, 2]`` (row, position t) of the masked tokens, t aligned like ``token_logprobs`` (the
    logits at t-1 score token t, so t >= 1); ``allowed``: ``[N, ceil(V / 8)]`` uint8, the allowed tokens as
    little-endian bits (``trajlake.train.data.masks``), or ``[N, V]`` bool. Other positions are as in
    ``token_logprobs``. A token outside its own allowed set is an error (its log-prob would be -inf). Gradients
    flow through both parts; the masked rows cost ``[N, V]`` beside the logits.
    """
    lp = token_logprobs(logits, input_ids, temperature)
    if positions.shape[0] == 0:
        return lp
    if positions.dim() != 2 or positions.shape[1] != 2 or allowed.shape[0] != positions.shape[0]:
        raise ValueError(f"positions must be [N, 2] and allowed [N, ...] with the same N; got "
                         f"{tuple(positions.shape)} and {tuple(allowed.shape)}")
    vocab = logits.shape[-1]
    rows, cols = positions[:, 0].long(), positions[:, 1].long()
    if bool((cols < 1).any()):
        raise ValueError("masked positions must be >= 1 (nothing predicts position 0)")
    if allowed.dtype == torch.bool:
        ok = allowed[:, :vocab]
    else:
        bits = torch.arange(8, device=allowed.device, dtype=torch.uint8)
        ok = ((allowed.to(torch.uint8).unsqueeze(-1) >> bits) & 1).flatten(1)[:, :vocab].bool()
    if ok.shape[1] < vocab:  # ids past the mask's width: never allowed
        ok = torch.cat([ok, ok.new_zeros(ok.shape[0], vocab - ok.shape[1])], dim=1)
    ok = ok.to(logits.device)
    x = logits[rows, cols - 1].float()
    if temperature > 0:
        x = x / temperature
    x = x.masked_fill(~ok, float("-inf"))
    tokens = input_ids[rows, cols].long()
    if not bool(ok.gather(-1, tokens.unsqueeze(-1)).all()):
        bad = int((~ok.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)).nonzero()[0])
        raise ValueError(f"token {int(tokens[bad])} at row {int(rows[bad])} position {int(cols[bad])} is outside "
                         f"its allowed set")
    masked = x.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)
    return lp.index_put((rows, cols), masked)


ENTROPY_CHUNK_ROWS = 2048
"""Positions whose entropy is computed at once: bounds the float32 ``[rows, V]`` temporaries (three of them, 400 MB
each at a 49,152-token vocabulary) whatever the batch's length."""


def entropy_from_logits(logits: Tensor, temperature: float = 1.0, mask: Tensor | None = None) -> Tensor:
    """``[B, T]`` entropy of the distribution that predicts token t, aligned like ``token_logprobs``.

    H_t = -sum_v p_v log p_v of softmax(logits[:, t-1] / temperature); position 0 gets 0.0. ``mask`` (``[B, T]``,
    aligned like the result): compute H only where it is non-zero and give 0.0 elsewhere. The trainer logs the
    entropy's mean over the policy tokens only, so the vocabulary-sized work at the other positions (observations,
    prompts: most of an agent's tokens) is skipped; each computed value is the unmasked one. Rows are processed
    :data:`ENTROPY_CHUNK_ROWS` at a time (the same values: each row is independent).
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, T, V], got {tuple(logits.shape)}")
    x = logits[:, :-1]
    b, t1, _ = x.shape
    if mask is None:
        where = torch.ones(b, t1, dtype=torch.bool, device=logits.device)
    else:
        if tuple(mask.shape) != (b, t1 + 1):
            raise ValueError(f"mask {tuple(mask.shape)} must be [B, T] = {(b, t1 + 1)}")
        where = mask[:, 1:].to(logits.device).bool()
    at = where.nonzero()  # [N, 2] (row, position); chunks of it index the logits without copying the rest
    out = torch.zeros(b, t1, dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        for start in range(0, at.shape[0], ENTROPY_CHUNK_ROWS):
            i, j = at[start:start + ENTROPY_CHUNK_ROWS].unbind(1)
            logp = torch.log_softmax(_at_temperature(x[i, j].float(), temperature), dim=-1)
            out[i, j] = -(logp.exp() * logp).sum(-1)
    return torch.cat([out.new_zeros(b, 1), out], dim=1)


# ------------------------------------------------------------------------------------------ policy losses


def _per_token(advantages: Tensor, like: Tensor) -> Tensor:
    """A per-sequence ``[B]`` quantity broadcast over ``[B, T]``, or a ``[B, T]`` one as is; detached."""
    a = advantages.detach().to(like.dtype)
    if a.shape == like.shape:
        return a
    if a.dim() == 1 and like.dim() >= 1 and a.shape[0] == like.shape[0]:
        return a.view(-1, *([1] * (like.dim() - 1))).expand_as(like)
    raise ValueError(f"advantages {tuple(a.shape)} must be [B] or match {tuple(like.shape)}")


def reinforce_loss(logp: Tensor, advantages: Tensor, mask: Tensor, mode: LossAggregation = "token-mean",
                   denominator: float | None = None) -> Tensor:
    """REINFORCE with a baseline (19.2): L = agg(-A * log pi(a_t | h_t)) over policy tokens.

    ``advantages`` already hold R - b(h) with a baseline that does not depend on the action (RLOO, GRPO, a
    critic): ``[B]`` per sequence (broadcast to its tokens) or ``[B, T]`` per token. They are detached.
    """
    # logp masked before the product: junk advantages at padding would give it a 0 * NaN gradient there
    lp = _masked(logp, mask)
    return masked_mean(-_per_token(advantages, lp) * lp, mask, mode, denominator)


def sft_loss(logp: Tensor, mask: Tensor, mode: LossAggregation = "token-mean",
             denominator: float | None = None) -> Tensor:
    """Masked negative log-likelihood of the policy tokens (19.6 with l_t = -log pi(a_t | h_t))."""
    return masked_mean(-logp, mask, mode, denominator)


# ------------------------------------------------------------------------------------------ group advantages


def _group_index(group_ids: Sequence[Hashable], n: int, device: torch.device) -> tuple[Tensor, int]:
    """Dense group index per item (order of first appearance) and the number of groups."""
    if len(group_ids) != n:
        raise ValueError(f"{len(group_ids)} group ids for {n} rewards; there must be one per reward")
    dense: dict[Hashable, int] = {}
    idx = [dense.setdefault(g, len(dense)) for g in group_ids]
    return torch.tensor(idx, dtype=torch.long, device=device), len(dense)


def _check_rewards(rewards: Tensor) -> Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be one value per episode [N], got shape {tuple(rewards.shape)}")
    bad = (~torch.isfinite(rewards)).nonzero()
    if len(bad):
        i = int(bad[0, 0])
        raise ValueError(f"rewards[{i}] is {float(rewards[i])}; group advantages need finite rewards")
    return rewards.detach().double()


def _group_stats(r: Tensor, gidx: Tensor, n_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per item: group size, group sum and group sum of squared deviations from the group mean (float64)."""
    size = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, gidx, torch.ones_like(r))
    total = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, gidx, r)
    dev = r - (total / size)[gidx]
    sq = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, gidx, dev * dev)
    return size[gidx], total[gidx], sq[gidx]


def _group_all_equal(r: Tensor, gidx: Tensor, n_groups: int) -> Tensor:
    """Per group: True when every reward of the group is the same value (exactly, not within eps)."""
    hi = torch.full((n_groups,), -math.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, gidx, r, "amax")
    lo = torch.full((n_groups,), math.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, gidx, r, "amin")
    return hi == lo


def rloo_advantages(rewards: Tensor, group_ids: Sequence[Hashable]) -> Tensor:
    """RLOO (19.7): A_i = R_i - (1 / (G - 1)) sum_{j != i} R_j, the mean of the others in i's group.

    Groups are episodes of the same task, seed and environment version (the caller builds ``group_ids``).
    A group of size 1 has no other member to form a baseline, so its advantage is 0 (it contributes no
    gradient; prime-rl's choice, pitfall 6). ``[N]`` in, ``[N]`` out in the rewards' dtype; detached.
    """
    r = _check_rewards(rewards)
    gidx, n_groups = _group_index(group_ids, len(r), r.device)
    size, total, _ = _group_stats(r, gidx, n_groups)
    others_mean = (total - r) / (size - 1).clamp(min=1.0)
    adv = torch.where(size > 1, r - others_mean, torch.zeros_like(r))
    return adv.to(rewards.dtype)


def grpo_advantages(rewards: Tensor, group_ids: Sequence[Hashable], scale: Literal["group", "none"] = "group",
                    eps: float = 1e-6) -> Tensor:
    """GRPO group-normalised advantages: (R_i - mean_g) / (std_g + eps), or R_i - mean_g with ``scale="none"``.

    ``std_g`` is the **unbiased** (Bessel, G-1) standard deviation of the group, the same as verl and TRL, so
    numbers compare with theirs. ``scale="none"`` is Dr. GRPO (no std division). A group of size 1 gets 0 (no
    group baseline exists), and a group whose rewards are all equal gets exactly 0 (not a rounding residue
    amplified by 1/eps; pitfall 7). ``[N]`` in, ``[N]`` out in the rewards' dtype; detached.
    """
    if scale not in ("group", "none"):
        raise ValueError(f"unknown GRPO scale {scale!r}; expected 'group' or 'none'")
    r = _check_rewards(rewards)
    gidx, n_groups = _group_index(group_ids, len(r), r.device)
    size, total, sq = _group_stats(r, gidx, n_groups)
    adv = r - total / size
    if scale == "group":
        adv = adv / (torch.sqrt(sq / (size - 1).clamp(min=1.0)) + eps)
    adv = torch.where((size > 1) & ~_group_all_equal(r, gidx, n_groups)[gidx], adv, torch.zeros_like(r))
    return adv.to(rewards.dtype)


def shuffle_within_groups(rewards: Tensor, group_ids: Sequence[Hashable], generator: torch.Generator) -> Tensor:
    """A placebo's rewards: each group's rewards permuted among its members (a random permutation per group
    from ``generator``). Every group keeps its multiset of rewards (so its mean and spread), and the link between
    an attempt and its reward is gone."""
    out = rewards.clone()
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        members[g].append(i)
    for idx in members.values():
        perm = torch.randperm(len(idx), generator=generator)
        out[idx] = rewards[[idx[int(j)] for j in perm]]
    return out


def frac_zero_std_groups(rewards: Tensor, group_ids: Sequence[Hashable]) -> float:
    """Fraction of groups whose rewards are all equal, so they carry no learning signal (pitfall 7).

    Size-1 groups count as zero-std (their advantage is 0 under both estimators). 0.0 when there are no groups.
    """
    r = _check_rewards(rewards)
    if len(r) == 0:
        return 0.0
    gidx, n_groups = _group_index(group_ids, len(r), r.device)
    return float(_group_all_equal(r, gidx, n_groups).double().mean())


# ------------------------------------------------------------------------------------------ returns and GAE


def decomposed_return(r_task: float, cost: float, violations: float, process_rewards: Sequence[float] | Tensor,
                      gamma: float, lambda_c: float, lambda_s: float) -> Tensor:
    """Return decomposition (19.3) per environment turn t = 0..K-1 (K = number of process rewards):

        G_t = R_task - lambda_c * C - lambda_s * V + sum_{u >= t} gamma^(u-t) r^process_u

    R_task, the cost C and the safety violations V are episode totals and enter every turn undiscounted; the
    process rewards are discounted from turn t on. Pass one process reward per turn (zeros where there is
    none); K = 0 gives an empty tensor. float32 ``[K]``.
    """
    proc = torch.as_tensor(process_rewards, dtype=torch.float64).reshape(-1)
    suffix = torch.zeros_like(proc)
    acc = 0.0
    for t in range(len(proc) - 1, -1, -1):
        acc = float(proc[t]) + gamma * acc
        suffix[t] = acc
    return (r_task - lambda_c * cost - lambda_s * violations + suffix).to(torch.float32)


def shaped_rewards(rewards: Tensor, potentials: Tensor, gamma: float, terminated: bool) -> Tensor:
    """Potential-based shaping: r'_t = r_t + gamma * Phi(s_{t+1}) - Phi(s_t), t = 0..T-1 (section 3).

    ``potentials`` holds Phi(s_0)..Phi(s_T) (``[T+1]``). When the episode **terminated**, Phi(s_T) is replaced
    by 0 (the terminal correction: no future after a true end), so sum_t gamma^t r'_t = sum_t gamma^t r_t -
    Phi(s_0) and the optimal policy is unchanged. When **truncated**, Phi(s_T) is kept (the episode continues in
    value), so the shaped return differs by gamma^T Phi(s_T) - Phi(s_0).
    """
    if rewards.dim() != 1 or potentials.shape != (rewards.shape[0] + 1,):
        raise ValueError(f"rewards must be [T] and potentials [T+1]; got {tuple(rewards.shape)} and "
                         f"{tuple(potentials.shape)}")
    phi = potentials.detach().to(rewards.dtype).clone()
    if terminated:
        phi[-1] = 0.0
    return rewards.detach() + gamma * phi[1:] - phi[:-1]


# ------------------------------------------------------------------------------------------ per-turn credit (R2)


def policy_turn_rewards(turn_rewards: Sequence[float], actors: Sequence[str], policy_actor: str = "policy"
                        ) -> Tensor:
    """Per-policy-turn rewards ``[K]`` from one reward per lake turn: a lake turn's reward belongs to the policy
    turn whose action earned it, the last policy turn (``actor == policy_actor``, in turn order) at or before it;
    rewards before the first policy turn go to turn 0. Policy turns are numbered k = 0..K-1 in turn order, as the
    trainer's samples number them (``token_turn``). An episode without a policy turn gives ``[0]`` values (nothing
    to credit). float64; the rewards of a turn are summed in turn order."""
    if len(turn_rewards) != len(actors):
        raise ValueError(f"{len(turn_rewards)} rewards for {len(actors)} turns; there must be one per turn")
    k_turns = sum(1 for a in actors if a == policy_actor)
    out = [0.0] * k_turns
    k = -1
    for i, (r, a) in enumerate(zip(turn_rewards, actors, strict=True)):
        if not math.isfinite(float(r)):
            raise ValueError(f"turn {i}: reward {r} is not finite")
        if a == policy_actor:
            k += 1
        if k_turns:
            out[max(k, 0)] += float(r)
    return torch.tensor(out, dtype=torch.float64)


def episode_turn_rewards(terminal: float, process: Tensor, gamma: float,
                         shaping: Literal["per_turn", "potential"] = "per_turn", *, end_correction: bool = True
                         ) -> Tensor:
    """The rewards r_k of one episode's policy turns k = 0..K-1 (19.3 per turn), ``[K]`` float64.

    The terminal part (R_task - lambda_c C - lambda_s V, ``terminal``) enters at the last policy turn; ``process``
    ``[K]`` holds the (weighted) process reward p_k each turn earned (``policy_turn_rewards``).

    - ``per_turn``: r_k = p_k + [k = K-1] * terminal.
    - ``potential``: potential-based shaping with Phi(h_k) = sum_{j<k} p_j (the process reward earned before
      turn k; Phi(h_0) = 0): r_k = [k = K-1] * terminal + gamma * Phi(h_{k+1}) - Phi(h_k), with the terminal
      correction Phi(h_K) = 0 when ``end_correction`` (``shaped_rewards`` with ``terminated``), so
      sum_k gamma^k r_k = gamma^(K-1) * terminal - Phi(h_0): the unshaped return. Without it (a truncated episode
      whose value is bootstrapped) Phi(h_K) is kept. K = 0 gives an empty tensor.
    """
    p = torch.as_tensor(process, dtype=torch.float64).reshape(-1)
    if len(p) == 0:
        return p
    base = torch.zeros_like(p)
    base[-1] = float(terminal)
    if shaping == "per_turn":
        return base + p
    if shaping != "potential":
        raise ValueError(f"unknown process shaping {shaping!r}; expected 'per_turn' or 'potential'")
    phi = torch.cat([p.new_zeros(1), torch.cumsum(p, 0)])
    return shaped_rewards(base, phi, gamma, terminated=end_correction)


def returns_to_go(rewards: Sequence[Tensor], gamma: float) -> Tensor:
    """G_k = sum_{j >= k} gamma^(j-k) r_j for each episode's per-turn rewards ``[K_i]``, as one ``[N, K_max]``
    float64 matrix padded with 0 (G_k = 0 for k beyond an episode's last turn). K_max is at least 1."""
    k_max = max([1, *(len(r) for r in rewards)])
    out = torch.zeros(len(rewards), k_max, dtype=torch.float64)
    for i, r in enumerate(rewards):
        acc = 0.0
        vals = torch.as_tensor(r, dtype=torch.float64).reshape(-1).tolist()
        for k in range(len(vals) - 1, -1, -1):
            acc = vals[k] + gamma * acc
            out[i, k] = acc
    return out


def turn_group_advantages(returns: Tensor, lengths: Sequence[int], group_ids: Sequence[Hashable],
                          estimator: Literal["rloo", "grpo"]) -> Tensor:
    """Per-turn group advantages ``[N, K]`` from the returns-to-go ``[N, K]`` (``returns_to_go``): turn k of episode
    i is compared with turn k of the other members of its group, so the baseline does not depend on episode i's
    actions.

    - ``rloo``: A_k^(i) = G_k^(i) - (1 / (G - 1)) sum_{j != i} G_k^(j), with G_k^(j) = 0 for k beyond episode j's
      last turn (19.7 per turn, ``rloo_advantages`` on column k).
    - ``grpo``: (G_k^(i) - mean_g G_k) / (std_g G_k + eps) over the members of the group (``grpo_advantages`` on
      column k, the same zero padding).

    Entries at k >= ``lengths[i]`` are 0 (no such turn). float64, detached.
    """
    if returns.dim() != 2 or len(lengths) != returns.shape[0]:
        raise ValueError(f"returns must be [N, K] with one length per row; got {tuple(returns.shape)} and "
                         f"{len(lengths)} lengths")
    if estimator not in ("rloo", "grpo"):
        raise ValueError(f"unknown estimator {estimator!r}; expected 'rloo' or 'grpo'")
    fn = rloo_advantages if estimator == "rloo" else grpo_advantages
    g = returns.detach().double()
    adv = torch.stack([fn(g[:, k], group_ids) for k in range(g.shape[1])], dim=1) if g.shape[1] else g.clone()
    present = torch.arange(g.shape[1])[None, :] < torch.as_tensor(list(lengths), dtype=torch.long)[:, None]
    return torch.where(present, adv, torch.zeros_like(adv))


def gae(rewards: Tensor, values: Tensor, gamma: float, lam: float, *, terminated: bool,
        bootstrap_value: float = 0.0) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (19.4) with time steps = environment turns.

        delta_t = r_t + gamma * V(h_{t+1}) - V(h_t);   A_t = sum_{l >= 0} (gamma * lam)^l delta_{t+l}

    After the last turn V(h_T) = 0 if the episode **terminated** and ``bootstrap_value`` (the critic's value of
    the last history) if it was **truncated** by a budget or the infrastructure (pitfall 4). Returns
    ``(advantages[T], returns[T])`` with returns = advantages + values, the critic's targets; both detached.
    The loss reaches action tokens through ``turns_to_tokens``.
    """
    if rewards.dim() != 1 or values.shape != rewards.shape:
        raise ValueError(f"rewards and values must both be [T]; got {tuple(rewards.shape)} and "
                         f"{tuple(values.shape)}")
    r, v = rewards.detach().double().cpu().tolist(), values.detach().double().cpu().tolist()
    adv = [0.0] * len(r)
    next_value = 0.0 if terminated else float(bootstrap_value)
    running = 0.0
    for t in range(len(r) - 1, -1, -1):  # a few turns per episode: a Python scan in float64 is exact enough
        delta = r[t] + gamma * next_value - v[t]
        running = delta + gamma * lam * running
        adv[t] = running
        next_value = v[t]
    advantages = torch.tensor(adv, dtype=rewards.dtype, device=rewards.device)
    return advantages, advantages + values.detach().to(rewards.dtype)


def turns_to_tokens(turn_values: Tensor, token_turn: Tensor, mask: Tensor) -> Tensor:
    """Broadcast a per-turn quantity ``[B, K]`` to the policy tokens of each turn, giving ``[B, T]``.

    ``token_turn[b, t]`` is the index k of the policy turn that token t belongs to, -1 for non-policy tokens.
    The result is 0 where mask is 0. A policy token (mask 1) without a turn, or a turn index >= K, is an
    alignment error and raises, naming the sequence and position.
    """
    if turn_values.dim() != 2 or token_turn.shape != mask.shape or token_turn.shape[0] != turn_values.shape[0]:
        raise ValueError(f"turn_values must be [B, K] and token_turn, mask [B, T]; got "
                         f"{tuple(turn_values.shape)}, {tuple(token_turn.shape)}, {tuple(mask.shape)}")
    on = mask.bool()
    k = turn_values.shape[1]
    bad = (on & ((token_turn < 0) | (token_turn >= k))).nonzero()
    if len(bad):
        b, t = (int(x) for x in bad[0])
        raise ValueError(f"sequence {b}, token {t}: policy token (mask 1) has turn index "
                         f"{int(token_turn[b, t])}, outside 0..{k - 1}")
    if k == 0:  # no policy turns, hence (checked above) no policy tokens
        return turn_values.new_zeros(mask.shape)
    picked = turn_values.gather(1, token_turn.long().clamp(0, k - 1))
    return torch.where(on, picked, torch.zeros((), dtype=picked.dtype, device=picked.device))


# ------------------------------------------------------------------------------------------ ratios


def sequence_log_ratio(logp_new: Tensor, logp_old: Tensor, mask: Tensor) -> Tensor:
    """Trajectory log-ratio (19.5): log rho(tau) = sum over policy tokens of (log pi_new - log mu), ``[B]``.

    Observations are not actions: only mask-1 tokens count. Kept in log space; exponentiate through
    ``truncated_importance_weights`` (clamped) to avoid overflow on long trajectories (pitfall 3).
    """
    return _masked(logp_new - logp_old.to(logp_new.dtype), mask).flatten(1).sum(1)


def truncated_importance_weights(log_ratio: Tensor, max_weight: float) -> Tensor:
    """Truncated importance weights min(exp(clamp(log_ratio, -20, 20)), c), detached (TIS).

    Works on the trajectory log-ratio ``[B]`` or per-token log-ratios ``[B, T]``. Truncation at c trades the
    ratio's heavy tail for a bias that grows with length (section 3).
    """
    if not max_weight > 0:
        raise ValueError(f"max_weight must be > 0, got {max_weight}")
    w = torch.exp(log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return w.clamp(max=max_weight)


def ratio_diagnostics(seq_log_ratio: Tensor, lengths: Tensor, max_weight: float | None = None) -> dict[str, float]:
    """Diagnostics of trajectory importance ratios rho_i = exp(log_ratio_i) against their lengths (section 3).

    Keys (all finite, also for B = 1):

    - ``ratio_mean``, ``ratio_max``: of rho (exp of the log-ratio clamped to [-20, 20]).
    - ``log_ratio_mean``, ``log_ratio_var``: mean and population variance of log rho over the batch.
    - ``log_ratio_var_slope``: per-token variance s of the log-ratio under Var(log rho | L) = s * L (independent
      token log-ratios): s = sum_i (log rho_i - mu * L_i)^2 / sum_i L_i with mu = sum_i log rho_i / sum_i L_i the
      per-token mean. How fast the log-variance grows with length, i.e. how fast weights become heavy-tailed.
    - ``ess``, ``ess_frac``: effective sample size (sum w)^2 / sum w^2 of the weights (truncated at
      ``max_weight`` when given) and ess / B.
    - ``frac_truncated``: fraction with rho > ``max_weight`` (0.0 without ``max_weight``).
    - ``mean_length``: mean of ``lengths`` (policy tokens per trajectory).

    An empty batch gives 0.0 for every key.
    """
    lr = seq_log_ratio.detach().double().reshape(-1)
    length = lengths.detach().double().reshape(-1)
    if lr.shape != length.shape:
        raise ValueError(f"seq_log_ratio {tuple(lr.shape)} and lengths {tuple(length.shape)} must match")
    keys = ("ratio_mean", "ratio_max", "log_ratio_mean", "log_ratio_var", "log_ratio_var_slope", "ess",
            "ess_frac", "frac_truncated", "mean_length")
    if len(lr) == 0:
        return dict.fromkeys(keys, 0.0)
    rho = torch.exp(lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    w = rho if max_weight is None else truncated_importance_weights(lr, max_weight)
    total_len = float(length.sum())
    per_token_mean = float(lr.sum()) / total_len if total_len > 0 else 0.0
    slope = float(((lr - per_token_mean * length) ** 2).sum()) / total_len if total_len > 0 else 0.0
    ess = float(w.sum() ** 2 / (w * w).sum())
    return {
        "ratio_mean": float(rho.mean()),
        "ratio_max": float(rho.max()),
        "log_ratio_mean": float(lr.mean()),
        "log_ratio_var": float(lr.var(unbiased=False)),
        "log_ratio_var_slope": slope,
        "ess": ess,
        "ess_frac": ess / len(lr),
        "frac_truncated": 0.0 if max_weight is None else float((rho > max_weight).double().mean()),
        "mean_length": float(length.mean()),
    }


def ppo_clip_loss(logp_new: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor, *,
                  clip_low: float = 0.2, clip_high: float = 0.2,
                  level: Literal["token", "sequence"] = "token", mode: LossAggregation = "token-mean",
                  denominator: float | None = None,
                  is_weights: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate on action tokens: per token -min(r*A, clip(r, 1-clip_low, 1+clip_high)*A).

    - ``level="token"``: r_t = pi_new(a_t) / pi_old(a_t) for each policy token.
    - ``level="sequence"`` (GSPO): one ratio per sequence, the geometric mean of its token ratios
      s_i = exp(mean over its policy tokens of (log pi_new - log pi_old)), so the clip range does not depend on
      length. It is applied to every policy token of the sequence in GSPO-token form, r_t = sg[s_i] *
      pi_new(a_t) / sg[pi_new(a_t)]: the value is s_i, and with per-sequence advantages the gradient equals
      GSPO's. The clip decision is per sequence. (GSPO's paper uses clip ranges around 3e-4/4e-4.)

    Log-ratios are clamped to [-20, 20] before exp. ``is_weights`` ([B] or [B, T], e.g. truncated trajectory
    weights) multiply the per-token objective; ``advantages`` ([B] or [B, T]) and ``is_weights`` are detached.
    Aggregated by ``masked_mean(mode, denominator)``. Stats over the policy tokens of this batch:
    ``clip_frac`` (tokens whose gradient the clip removed: r < 1-clip_low with A < 0 or r > 1+clip_high with
    A > 0), ``clip_frac_low``, ``clip_frac_high``, ``approx_kl`` (k3 estimate of KL(pi_old || pi_new), see
    ``kl_to_behavior``) and ``ratio_mean``.
    """
    if level not in ("token", "sequence"):
        raise ValueError(f"unknown PPO ratio level {level!r}; expected 'token' or 'sequence'")
    delta = _masked(logp_new - logp_old.to(logp_new.dtype), mask)
    if level == "token":
        log_r = delta
    else:
        count = mask.to(delta.dtype).flatten(1).sum(1).clamp(min=1.0)
        seq_mean = (delta.flatten(1).sum(1) / count).detach()
        lp_new = _masked(logp_new, mask)
        log_r = _per_token(seq_mean, delta) + lp_new - lp_new.detach()
    ratio = torch.exp(log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    adv = _per_token(advantages, ratio)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    objective = torch.minimum(ratio * adv, clipped * adv)
    if is_weights is not None:
        objective = objective * _per_token(is_weights, objective)
    loss = masked_mean(-objective, mask, mode, denominator)

    with torch.no_grad():
        on = mask.bool()
        n = max(int(on.sum()), 1)
        low = on & (ratio < 1.0 - clip_low) & (adv < 0)
        high = on & (ratio > 1.0 + clip_high) & (adv > 0)
        stats = {
            "clip_frac": float((low | high).sum()) / n,
            "clip_frac_low": float(low.sum()) / n,
            "clip_frac_high": float(high.sum()) / n,
            "approx_kl": float(kl_to_behavior(logp_new.detach(), logp_old, mask, "k3")),
            "ratio_mean": float(_masked(ratio, mask).sum()) / n,
        }
    return loss, stats


def decoupled_clip_loss(logp_new: Tensor, logp_prox: Tensor, logp_behavior: Tensor, advantages: Tensor,
                        mask: Tensor, *, max_weight: float, clip_low: float = 0.2, clip_high: float = 0.2,
                        level: Literal["token", "sequence"] = "token", mode: LossAggregation = "token-mean",
                        denominator: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """Decoupled PPO (Hilton et al., 2022): the off-policy correction counted once.

        L = -agg_t [ w_i * min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t) ]
        r_t = pi_new(a_t) / pi_prox(a_t),   w_i = min(prod_t pi_prox(a_t) / mu(a_t), c)

    ``logp_prox`` is the proximal policy pi_prox (the learner at the start of the iteration), ``logp_behavior``
    the behaviour policy mu that sampled the tokens. The clip keeps each update near pi_prox, which the learner
    controls; mu enters only the truncated trajectory weight w_i (19.5), detached. For an episode sampled by
    pi_prox itself (staleness 0) the weight is 1 and this is ``ppo_clip_loss`` against mu. Returns (loss, stats):
    ``ppo_clip_loss``'s stats plus ``is_weight_mean`` and ``is_weight_max``."""
    weights = truncated_importance_weights(sequence_log_ratio(logp_prox, logp_behavior, mask), max_weight)
    loss, stats = ppo_clip_loss(logp_new, logp_prox, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                                level=level, mode=mode, denominator=denominator, is_weights=weights)
    stats["is_weight_mean"] = float(weights.mean()) if weights.numel() else 0.0
    stats["is_weight_max"] = float(weights.max()) if weights.numel() else 0.0
    return loss, stats


def learning_rate(step: int, total_steps: int, lr: float, *, warmup_steps: int = 0,
                  schedule: Literal["constant", "linear", "cosine"] = "constant",
                  min_lr_ratio: float = 0.0) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``total_steps``: a linear warm-up from
    lr / (warmup_steps + 1) to lr over the first ``warmup_steps`` steps, then ``constant``, or ``linear`` /
    ``cosine`` decay from lr to lr * min_lr_ratio at the last step."""
    if step < warmup_steps:
        return lr * (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return lr
    span = total_steps - 1 - warmup_steps
    progress = 0.0 if span <= 0 else min(1.0, (step - warmup_steps) / span)  # one step: the peak
    floor = lr * min_lr_ratio
    if schedule == "linear":
        return lr - (lr - floor) * progress
    if schedule == "cosine":
        return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown learning-rate schedule {schedule!r}; expected constant, linear or cosine")


def kl_to_behavior(logp_new: Tensor, logp_old: Tensor, mask: Tensor, kind: Literal["k1", "k3"] = "k3") -> Tensor:
    """Masked token mean of a KL(mu || pi_new) estimator on tokens sampled from the behaviour policy mu.

    With log r = log pi_new - log mu: ``k1`` = -log r (unbiased, can be negative per token) and ``k3`` =
    (r - 1) - log r (unbiased, never negative, lower variance; as a loss its gradient is biased, pitfall 15).
    Keeps the gradient through ``logp_new`` so it can be a loss term (GRPO style) or a logged statistic.
    """
    log_r = _masked(logp_new - logp_old.to(logp_new.dtype), mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if kind == "k1":
        per_token = -log_r
    elif kind == "k3":
        per_token = torch.expm1(log_r) - log_r
    else:
        raise ValueError(f"unknown KL estimator {kind!r}; expected 'k1' or 'k3'")
    return masked_mean(per_token, mask, "token-mean")


def kl_to_reference(logp_new: Tensor, logp_ref: Tensor, mask: Tensor) -> Tensor:
    """Masked token mean of k2 = (log pi_new - log pi_ref)^2 / 2, the KL penalty to a reference policy.

    On tokens the policy itself sampled, its gradient (log pi_new - log pi_ref) * grad log pi_new is the
    per-token score-function gradient of KL(pi_new || pi_ref) (k3 as a loss has a biased gradient, pitfall 15);
    k2 is 0, with gradient 0, where the two policies agree. ``logp_ref`` carries no gradient."""
    delta = _masked(logp_new - logp_ref.detach().to(logp_new.dtype), mask)
    return masked_mean(0.5 * delta.square(), mask, "token-mean")


def value_loss(values: Tensor, returns: Tensor, mask_or_turn_mask: Tensor, clip: float | None = None,
               old_values: Tensor | None = None) -> Tensor:
    """Critic regression 0.5 * (V - G)^2, masked token (or turn) mean.

    ``mask_or_turn_mask`` selects the positions that carry a value target: policy tokens ``[B, T]`` or
    environment turns ``[B, K]``. With ``clip`` and ``old_values`` (PPO value clipping):
    0.5 * max((V - G)^2, (V_old + clamp(V - V_old, -clip, clip) - G)^2). ``returns`` are detached targets.
    """
    if values.shape != returns.shape:
        raise ValueError(f"values {tuple(values.shape)} and returns {tuple(returns.shape)} must match")
    # masked first: garbage at padding must not reach the squared error's gradient
    v = _masked(values, mask_or_turn_mask)
    target = _masked(returns.detach().to(values.dtype), mask_or_turn_mask)
    err = (v - target) ** 2
    if clip is not None:
        if old_values is None:
            raise ValueError("value clipping needs old_values (the critic's values at rollout time)")
        old = _masked(old_values.detach().to(values.dtype), mask_or_turn_mask)
        clipped = old + (v - old).clamp(-clip, clip)
        err = torch.maximum(err, (clipped - target) ** 2)
    return masked_mean(0.5 * err, mask_or_turn_mask, "token-mean")
