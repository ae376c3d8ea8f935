"""Tests of trajlake/train/math.py: hand-computed tensors written here, brute-force loops and property tests.

Expected values are worked out by hand in the comments (or by an independent loop in the test), never by the
function under test. Pitfall numbers refer to /work/shared/notes/trainer-anchors.md.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trajlake.train import math as M

F64 = torch.float64
PROPERTY = settings(max_examples=40, deadline=None)


def t64(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def close(a: torch.Tensor | float, b: object, tol: float = 1e-9) -> None:
    a_t = torch.as_tensor(a, dtype=F64)
    b_t = torch.as_tensor(b, dtype=F64)
    assert a_t.shape == b_t.shape, (a_t.shape, b_t.shape)
    assert torch.allclose(a_t, b_t, atol=tol, rtol=tol), (a_t, b_t)


# ---------------------------------------------------------------------------------------------- masked_mean


def test_masked_mean_modes_hand_computed() -> None:
    v = t64([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    m = t64([[1, 1, 0], [0, 0, 0], [0, 0, 1]])
    close(M.masked_mean(v, m), (1 + 2 + 9) / 3)  # token-mean: 12 / 3 tokens
    close(M.masked_mean(v, m, "seq-mean-token-mean"), (1.5 + 9) / 2)  # the empty row 1 is left out
    close(M.masked_mean(v, m, "seq-mean-token-sum"), (3 + 9) / 2)
    close(M.masked_mean(v, m, denominator=6.0), 12 / 6)  # global token count
    close(M.masked_mean(v, m, "seq-mean-token-sum", denominator=4.0), 12 / 4)  # global sequence count
    close(M.masked_mean(v, m.bool()), 4.0)  # a bool mask works the same


def test_masked_mean_empty_mask_is_zero_with_grad() -> None:
    v = t64([[1.0, 2.0], [3.0, 4.0]]).requires_grad_()
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        out = M.masked_mean(v, torch.zeros(2, 2), mode)
        assert float(out.detach()) == 0.0 and out.grad_fn is not None
        (g,) = torch.autograd.grad(out, v)
        assert torch.equal(g, torch.zeros_like(v))


def test_masked_mean_rejects_bad_input() -> None:
    v, m = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="same shape"):
        M.masked_mean(v, torch.ones(2, 2))
    with pytest.raises(ValueError, match="denominator"):
        M.masked_mean(v, m, denominator=0.0)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        M.masked_mean(v, m, "mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        M.masked_mean(torch.ones(3), torch.ones(3), "seq-mean-token-mean")


def test_masked_mean_ignores_nan_and_inf_at_masked_positions() -> None:
    v = t64([[1.0, float("nan")], [float("inf"), 3.0]]).requires_grad_()
    m = t64([[1, 0], [0, 1]])
    out = M.masked_mean(v, m)
    close(out, 2.0)
    (g,) = torch.autograd.grad(out, v)
    close(g, [[0.5, 0.0], [0.0, 0.5]])


# ---------------------------------------------------------------------------------------------- log-probs


def test_token_logprobs_hand_computed() -> None:
    # logits at position 0 predict token 1: softmax([0, ln 3]) = [1/4, 3/4]; at position 1 predict token 2:
    # softmax([0, 0]) = [1/2, 1/2]; the last position's logits predict nothing in the sequence.
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0], [5.0, -5.0]]])
    ids = torch.tensor([[0, 1, 0]])
    close(M.token_logprobs(logits, ids), [[0.0, math.log(0.75), math.log(0.5)]], 1e-6)
    # temperature 2 halves the logits: p(1) = sqrt(3) / (1 + sqrt(3))
    close(M.token_logprobs(logits, ids, temperature=2.0),
          [[0.0, math.log(math.sqrt(3) / (1 + math.sqrt(3))), math.log(0.5)]], 1e-6)
    # temperature 0 (greedy sampling) leaves the logits as they are, as hf.process_logits does
    close(M.token_logprobs(logits, ids, temperature=0.0), [[0.0, math.log(0.75), math.log(0.5)]], 1e-6)


class _CausalToy(torch.nn.Module):
    """A causal 'LM': the logits at t are the cumulative sum of the embeddings of tokens 0..t."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(vocab, vocab, generator=gen))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.emb[ids].cumsum(dim=1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_alignment_against_brute_force_prefix_loop(temperature: float) -> None:
    # pitfall 11: logprob[t] must score token t given tokens < t. The brute force feeds each prefix alone.
    vocab, ids = 11, torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(1))
    model = _CausalToy(vocab)
    lp = M.token_logprobs(model(ids), ids, temperature)
    for b in range(ids.shape[0]):
        assert float(lp[b, 0].detach()) == 0.0
        for t in range(1, ids.shape[1]):
            last = model(ids[b:b + 1, :t])[0, -1].detach() / temperature
            expected = torch.log_softmax(last, dim=-1)[ids[b, t]]
            assert abs(float(lp[b, t].detach()) - float(expected)) < 1e-5, (b, t)


def test_token_logprobs_match_the_samplers_process_logits() -> None:
    hf = pytest.importorskip("trajlake.policies.hf")
    gen = torch.Generator().manual_seed(2)
    logits, ids = torch.randn(2, 6, 13, generator=gen), torch.randint(0, 13, (2, 6), generator=gen)
    lp = M.token_logprobs(logits, ids, temperature=0.8)
    ref = hf.process_logits(logits[:, :-1], 0.8, 1.0).gather(-1, ids[:, 1:, None]).squeeze(-1)
    close(lp[:, 1:], ref, 1e-6)


def test_token_logprobs_rejects_misaligned_shapes() -> None:
    with pytest.raises(ValueError, match="input_ids"):
        M.token_logprobs(torch.zeros(1, 4, 3), torch.zeros(1, 5, dtype=torch.long))


def test_entropy_hand_computed() -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0], [1.0, 2.0]]])
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    close(M.entropy_from_logits(logits), [[0.0, h, math.log(2.0)]], 1e-6)
    # a high temperature flattens towards uniform: entropy of softmax([0, ln3 / 1000]) is close to ln 2
    assert abs(float(M.entropy_from_logits(logits, temperature=1000.0)[0, 1]) - math.log(2.0)) < 1e-6


def test_entropy_under_a_mask_is_the_unmasked_value_where_the_mask_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    # hand-computed as in test_entropy_hand_computed; the mask keeps position 2 (the logits at 1 predict it)
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0], [1.0, 2.0]]])
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    close(M.entropy_from_logits(logits, mask=torch.tensor([[0, 1, 0]])), [[0.0, h, 0.0]], 1e-6)
    close(M.entropy_from_logits(logits, mask=torch.tensor([[1, 0, 1]])), [[0.0, 0.0, math.log(2.0)]], 1e-6)
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 9, 23, generator=gen) * 3
    mask = (torch.rand(3, 9, generator=gen) < 0.4).long()
    full = M.entropy_from_logits(logits, 0.7)
    masked = M.entropy_from_logits(logits, 0.7, mask)
    keep = mask.bool()
    keep[:, 0] = False  # nothing predicts position 0
    assert torch.equal(masked[keep], full[keep]) and not masked[~keep].any()
    # chunked over positions: the same values, whatever the chunk
    monkeypatch.setattr(M, "ENTROPY_CHUNK_ROWS", 4)
    assert torch.equal(M.entropy_from_logits(logits, 0.7), full)
    assert torch.equal(M.entropy_from_logits(logits, 0.7, mask), masked)
    with pytest.raises(ValueError, match=r"mask \(3, 8\) must be \[B, T\] = \(3, 9\)"):
        M.entropy_from_logits(logits, 0.7, mask[:, 1:])


def test_temperature_one_is_bit_identical_to_dividing_by_one() -> None:
    # issue 28: at temperature 1.0 the logits are no longer copied by x / 1.0; division by 1 is exact in IEEE
    # arithmetic, so the log-probs, entropies and gradients must be bit for bit those of the explicit division
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(2, 7, 19, generator=gen) * 4).requires_grad_()
    ids = torch.randint(0, 19, (2, 7), generator=gen)
    lp = M.token_logprobs(logits, ids, 1.0)
    (g,) = torch.autograd.grad(lp.sum(), [logits])
    x = logits[:, :-1].float() / 1.0
    ref = x.gather(-1, ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(x, dim=-1)
    ref = torch.cat([ref.new_zeros(2, 1), ref], dim=1)
    (g_ref,) = torch.autograd.grad(ref.sum(), [logits])
    assert torch.equal(lp, ref) and torch.equal(g, g_ref)
    logp = torch.log_softmax(x, dim=-1)
    h_ref = torch.cat([logp.new_zeros(2, 1), -(logp.exp() * logp).sum(-1)], dim=1)
    assert torch.equal(M.entropy_from_logits(logits, 1.0), h_ref)


# ---------------------------------------------------------------------------------------------- policy losses


def test_reinforce_loss_hand_computed_and_advantages_are_constants() -> None:
    logp = t64([[-1.0, -2.0, -3.0]]).requires_grad_()
    adv = t64([2.0]).requires_grad_()
    mask = t64([[0, 1, 1]])
    loss = M.reinforce_loss(logp, adv, mask)
    close(loss, -(2 * -2.0 + 2 * -3.0) / 2)  # = 5
    g_logp, g_adv = torch.autograd.grad(loss, [logp, adv], allow_unused=True)
    close(g_logp, [[0.0, -1.0, -1.0]])  # -A / N on policy tokens
    assert g_adv is None or torch.equal(g_adv, torch.zeros_like(g_adv))
    # per-token advantages [B, T]
    close(M.reinforce_loss(logp, t64([[9.0, 1.0, -1.0]]), mask), -(1 * -2.0 + -1 * -3.0) / 2)
    with pytest.raises(ValueError, match="advantages"):
        M.reinforce_loss(logp, t64([1.0, 2.0]), mask)


def test_sft_loss_hand_computed() -> None:
    logp = t64([[-1.0, -2.0], [-3.0, -4.0]])
    mask = t64([[1, 0], [1, 1]])
    close(M.sft_loss(logp, mask), (1 + 3 + 4) / 3)
    close(M.sft_loss(logp, mask, "seq-mean-token-mean"), (1 + 3.5) / 2)


# ---------------------------------------------------------------------------------------------- RLOO / GRPO


def test_rloo_hand_computed_and_size_one_group() -> None:
    adv = M.rloo_advantages(t64([1.0, 0.0, 0.0, 5.0]), ["a", "a", "a", "b"])
    # a: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5 (twice); b has no other member: 0
    close(adv, [1.0, -0.5, -0.5, 0.0])
    assert M.rloo_advantages(t64([3.0]), [("task", 7, "v1")]).tolist() == [0.0]


def test_grpo_hand_computed() -> None:
    r = t64([1.0, 0.0, 0.0, 2.0, 2.0, 7.0])
    g = ["a", "a", "a", "b", "b", "c"]
    # a: mean 1/3, unbiased var ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3; b all equal -> 0; c size 1 -> 0
    sd = math.sqrt(1 / 3)
    close(M.grpo_advantages(r, g, eps=0.0), [(2 / 3) / sd, (-1 / 3) / sd, (-1 / 3) / sd, 0, 0, 0])
    close(M.grpo_advantages(r, g, eps=0.5), [(2 / 3) / (sd + 0.5), (-1 / 3) / (sd + 0.5), (-1 / 3) / (sd + 0.5),
                                             0, 0, 0])
    close(M.grpo_advantages(r, g, scale="none"), [2 / 3, -1 / 3, -1 / 3, 0, 0, 0])  # Dr. GRPO


def test_grpo_all_equal_groups_are_exactly_zero() -> None:
    # 0.1 is not exact in binary: (3 * 0.1) / 3 != 0.1, a residue that 1 / eps would amplify to ~1e-11
    r = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7], dtype=torch.float32)
    for scale in ("group", "none"):
        adv = M.grpo_advantages(r, [0, 0, 0, 1, 1], scale=scale)
        assert adv.dtype == torch.float32 and adv.tolist() == [0.0] * 5
    assert M.rloo_advantages(r, [0, 0, 0, 1, 1]).abs().max() < 1e-6


def test_frac_zero_std_groups() -> None:
    r = t64([1.0, 0.0, 2.0, 2.0, 3.0])
    assert M.frac_zero_std_groups(r, ["a", "a", "b", "b", "c"]) == pytest.approx(2 / 3)  # b equal, c size 1
    assert M.frac_zero_std_groups(t64([]), []) == 0.0


def test_group_advantages_reject_bad_input() -> None:
    with pytest.raises(ValueError, match=r"rewards\[1\] is nan"):
        M.rloo_advantages(t64([1.0, float("nan")]), [0, 0])
    with pytest.raises(ValueError, match="one per reward"):
        M.grpo_advantages(t64([1.0, 2.0]), [0])
    with pytest.raises(ValueError, match="scale"):
        M.grpo_advantages(t64([1.0, 2.0]), [0, 0], scale="batch")  # type: ignore[arg-type]


groups_strategy = st.lists(st.tuples(st.integers(0, 4), st.floats(-10, 10, allow_nan=False)), min_size=1,
                           max_size=25)


@PROPERTY
@given(groups_strategy)
def test_rloo_equals_the_explicit_leave_one_out_loop(items: list[tuple[int, float]]) -> None:
    gids, rewards = [g for g, _ in items], [r for _, r in items]
    expected = []
    for i, (g, r) in enumerate(items):
        others = [rj for j, (gj, rj) in enumerate(items) if gj == g and j != i]
        expected.append(r - sum(others) / len(others) if others else 0.0)
    close(M.rloo_advantages(t64(rewards), gids), expected, 1e-9)


@PROPERTY
@given(groups_strategy, st.sampled_from(["group", "none"]))
def test_grpo_is_zero_mean_per_group(items: list[tuple[int, float]], scale: str) -> None:
    gids, rewards = [g for g, _ in items], [r for _, r in items]
    adv = M.grpo_advantages(t64(rewards), gids, scale=scale)  # type: ignore[arg-type]
    by_group: dict[int, list[float]] = defaultdict(list)
    for g, a in zip(gids, adv.tolist(), strict=True):
        by_group[g].append(a)
    for g, values in by_group.items():
        assert abs(sum(values) / len(values)) < 1e-7, (g, values)
        if len(values) == 1:
            assert values == [0.0]


# ---------------------------------------------------------------------------------------------- returns, shaping


def test_decomposed_return_hand_computed() -> None:
    # base = 1 - 0.1 * 2 - 0.5 * 1 = 0.3; discounted process suffix (gamma 0.5) of [0.5, 0, 1]: [0.75, 0.5, 1]
    out = M.decomposed_return(1.0, 2.0, 1.0, [0.5, 0.0, 1.0], gamma=0.5, lambda_c=0.1, lambda_s=0.5)
    assert out.dtype == torch.float32
    close(out, [1.05, 0.8, 1.3], 1e-6)
    close(M.decomposed_return(1.0, 0.0, 0.0, torch.zeros(2), 0.9, 0.1, 0.5), [1.0, 1.0], 1e-7)
    assert M.decomposed_return(1.0, 0.0, 0.0, [], 0.9, 0.1, 0.5).shape == (0,)


def test_shaped_rewards_hand_computed() -> None:
    r, phi, gamma = t64([1.0, 0.0, 2.0]), t64([1.0, 2.0, 3.0, 4.0]), 0.5
    # terminated: Phi(s_3) taken as 0 -> [1 + 1 - 1, 0 + 1.5 - 2, 2 + 0 - 3]
    close(M.shaped_rewards(r, phi, gamma, terminated=True), [1.0, -0.5, -1.0])
    # truncated: Phi(s_3) = 4 kept -> last is 2 + 2 - 3
    close(M.shaped_rewards(r, phi, gamma, terminated=False), [1.0, -0.5, 1.0])
    with pytest.raises(ValueError, match=r"\[T\+1\]"):
        M.shaped_rewards(r, phi[:3], gamma, terminated=True)


def _discounted(xs: list[float], gamma: float) -> float:
    return sum(gamma ** t * x for t, x in enumerate(xs))


floats_list = st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=12)


@PROPERTY
@given(floats_list, st.data(), st.floats(0.0, 1.0))
def test_shaping_identities(rewards: list[float], data: st.DataObject, gamma: float) -> None:
    phi = data.draw(st.lists(st.floats(-5, 5, allow_nan=False), min_size=len(rewards) + 1,
                             max_size=len(rewards) + 1))
    base = _discounted(rewards, gamma)
    term = M.shaped_rewards(t64(rewards), t64(phi), gamma, terminated=True).tolist()
    trunc = M.shaped_rewards(t64(rewards), t64(phi), gamma, terminated=False).tolist()
    assert _discounted(term, gamma) == pytest.approx(base - phi[0], abs=1e-9)
    assert _discounted(trunc, gamma) == pytest.approx(base + gamma ** len(rewards) * phi[-1] - phi[0], abs=1e-9)


# ---------------------------------------------------------------------------------------------- GAE


def test_gae_hand_computed_terminated_vs_truncated() -> None:
    r, v, gamma, lam = t64([0.0, 1.0]), t64([0.5, 0.2]), 0.9, 0.8
    # terminated: delta_1 = 1 - 0.2 = 0.8; delta_0 = 0.9 * 0.2 - 0.5 = -0.32; A_0 = -0.32 + 0.72 * 0.8 = 0.256
    adv, ret = M.gae(r, v, gamma, lam, terminated=True, bootstrap_value=1.5)  # bootstrap ignored: terminated
    close(adv, [0.256, 0.8])
    close(ret, [0.756, 1.0])
    # truncated, V(h_T) = 1.5: delta_1 = 1 + 1.35 - 0.2 = 2.15; A_0 = -0.32 + 0.72 * 2.15 = 1.228
    adv_t, ret_t = M.gae(r, v, gamma, lam, terminated=False, bootstrap_value=1.5)
    close(adv_t, [1.228, 2.15])
    close(ret_t, [1.728, 2.35])
    # the difference is exactly the bootstrap term (gamma lam)^(T-1-t) gamma V(h_T)
    close(adv_t - adv, [0.72 * 1.35, 1.35])


@PROPERTY
@given(floats_list, st.data(), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(-5, 5))
def test_gae_properties(rewards: list[float], data: st.DataObject, gamma: float, lam: float, boot: float) -> None:
    n = len(rewards)
    values = data.draw(st.lists(st.floats(-5, 5, allow_nan=False), min_size=n, max_size=n))
    r, v = t64(rewards), t64(values)
    adv_term, ret_term = M.gae(r, v, gamma, lam, terminated=True)
    adv_trunc, _ = M.gae(r, v, gamma, lam, terminated=False, bootstrap_value=boot)
    close(ret_term, adv_term + v)
    # terminated vs truncated differ by the bootstrap term only
    close(adv_trunc - adv_term, [(gamma * lam) ** (n - 1 - t) * gamma * boot for t in range(n)], 1e-8)
    # lam = 1: advantage = discounted return (plus the bootstrap when truncated) minus the value
    adv1, _ = M.gae(r, v, gamma, 1.0, terminated=False, bootstrap_value=boot)
    expected = [_discounted(rewards[t:], gamma) + gamma ** (n - t) * boot - values[t] for t in range(n)]
    close(adv1, expected, 1e-8)
    # lam = 0: advantage = the one-step TD error
    adv0, _ = M.gae(r, v, gamma, 0.0, terminated=True)
    nxt = [*values[1:], 0.0]
    close(adv0, [rewards[t] + gamma * nxt[t] - values[t] for t in range(n)], 1e-9)


def test_gae_detaches_and_keeps_dtype() -> None:
    v = torch.tensor([0.5, 0.2], requires_grad=True)
    adv, ret = M.gae(torch.tensor([0.0, 1.0]), v, 0.9, 0.8, terminated=True)
    assert adv.dtype == torch.float32 and not adv.requires_grad and not ret.requires_grad


# ---------------------------------------------------------------------------------------------- turns -> tokens


def test_turns_to_tokens_hand_computed() -> None:
    turn_values = t64([[10.0, 20.0], [30.0, 40.0]])
    token_turn = torch.tensor([[-1, 0, 0, -1, 1], [0, 0, 1, 1, -1]])
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 1, 1, 1, 0]])  # [1, 0] is a policy-turn token left out of the loss
    close(M.turns_to_tokens(turn_values, token_turn, mask), [[0, 10, 10, 0, 20], [0, 30, 40, 40, 0]])


def test_turns_to_tokens_names_misaligned_tokens() -> None:
    with pytest.raises(ValueError, match="sequence 0, token 2"):
        M.turns_to_tokens(t64([[1.0]]), torch.tensor([[0, 0, -1]]), torch.tensor([[1, 1, 1]]))
    with pytest.raises(ValueError, match="sequence 1, token 0"):
        M.turns_to_tokens(t64([[1.0], [2.0]]), torch.tensor([[0], [1]]), torch.tensor([[1], [1]]))
    out = M.turns_to_tokens(torch.zeros(1, 0), torch.tensor([[-1, -1]]), torch.tensor([[0, 0]]))
    close(out, [[0.0, 0.0]])


# ---------------------------------------------------------------------------------------------- ratios


def test_sequence_log_ratio_and_truncated_weights_hand_computed() -> None:
    new = t64([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    old = t64([[-1.5, -2.0, -2.0], [-1.0, -1.0 - math.log(3.0), -1.0]])
    mask = t64([[0, 1, 1], [1, 1, 0]])
    lr = M.sequence_log_ratio(new, old, mask)
    close(lr, [-1.0, math.log(3.0)])  # row 0: 0 + (-1); position 0 (mask 0) is not an action
    close(M.truncated_importance_weights(lr, 2.0), [math.exp(-1.0), 2.0])
    w = M.truncated_importance_weights(t64([0.0, 100.0, -100.0]).requires_grad_(), 5.0)
    assert not w.requires_grad
    close(w, [1.0, 5.0, math.exp(-20.0)])
    with pytest.raises(ValueError, match="max_weight"):
        M.truncated_importance_weights(lr, 0.0)


def test_sequence_ratio_on_5000_token_traces_stays_in_log_space() -> None:
    # pitfall 3: identical log-probs give ratio 1; a 0.1 shift per token over 5000 tokens is exp(500), which
    # overflows float32, but the log-ratio stays finite and the weight is clamped, not inf or nan.
    gen = torch.Generator().manual_seed(3)
    logp = -torch.rand(2, 5000, generator=gen) * 5
    mask = torch.ones(2, 5000)
    same = M.sequence_log_ratio(logp, logp.clone(), mask)
    assert same.tolist() == [0.0, 0.0]
    assert M.truncated_importance_weights(same, 2.0).tolist() == [1.0, 1.0]
    shifted = M.sequence_log_ratio(logp + 0.1, logp, mask)
    assert torch.isfinite(shifted).all() and abs(float(shifted[0]) - 500.0) < 0.5
    assert not torch.isfinite(torch.exp(shifted)).all()  # the naive product would overflow
    assert M.truncated_importance_weights(shifted, 3.0).tolist() == [3.0, 3.0]
    diag = M.ratio_diagnostics(torch.cat([shifted, -shifted]), torch.full((4,), 5000.0), max_weight=3.0)
    assert all(math.isfinite(x) for x in diag.values()), diag


def test_ratio_diagnostics_hand_computed() -> None:
    ln2 = math.log(2.0)
    d = M.ratio_diagnostics(t64([0.0, ln2]), t64([1.0, 3.0]), max_weight=1.5)
    mu = ln2 / 4  # per-token mean: sum of log-ratios / sum of lengths
    expected = {
        "ratio_mean": 1.5, "ratio_max": 2.0, "log_ratio_mean": ln2 / 2, "log_ratio_var": (ln2 / 2) ** 2,
        # ((0 - mu)^2 + (ln2 - 3 mu)^2) / 4 with ln2 - 3 mu = mu
        "log_ratio_var_slope": 2 * mu ** 2 / 4,
        "ess": 2.5 ** 2 / (1 + 1.5 ** 2), "ess_frac": 2.5 ** 2 / (1 + 1.5 ** 2) / 2,
        "frac_truncated": 0.5, "mean_length": 2.0,
    }
    assert d.keys() == expected.keys()
    for k, v in expected.items():
        assert d[k] == pytest.approx(v, abs=1e-12), k
    assert M.ratio_diagnostics(t64([0.0, ln2]), t64([1.0, 3.0]))["ess"] == pytest.approx(9 / 5)  # untruncated


def test_ratio_diagnostics_single_and_empty_batch_are_finite() -> None:
    d = M.ratio_diagnostics(t64([0.7]), t64([12.0]), max_weight=2.0)
    assert all(math.isfinite(x) for x in d.values())
    assert d["log_ratio_var"] == 0.0 and d["log_ratio_var_slope"] == pytest.approx(0.0) and d["ess"] == 1.0
    assert set(M.ratio_diagnostics(t64([]), t64([])).values()) == {0.0}


def test_ratio_diagnostics_slope_recovers_the_per_token_variance() -> None:
    # independent token log-ratios with variance s: Var(log rho | L) = s L, so the slope estimates s
    gen = torch.Generator().manual_seed(4)
    s = 0.04
    lengths = torch.randint(10, 200, (3000,), generator=gen)
    lr = torch.stack([(torch.randn(int(n), generator=gen, dtype=F64) * math.sqrt(s) - 0.01).sum()
                      for n in lengths])
    assert M.ratio_diagnostics(lr, lengths)["log_ratio_var_slope"] == pytest.approx(s, rel=0.08)


# ---------------------------------------------------------------------------------------------- PPO


def _ppo_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # ratios at positions 1..4: 1.5, 0.5, 1.1, 0.5; advantages 1, 1, -1, -1; position 0 is an observation
    old = t64([[-0.3, -1.0, -1.0, -1.0, -1.0]])
    new = old + t64([[9.0, math.log(1.5), math.log(0.5), math.log(1.1), math.log(0.5)]])
    adv = t64([[5.0, 1.0, 1.0, -1.0, -1.0]])
    mask = t64([[0, 1, 1, 1, 1]])
    return new.requires_grad_(), old, adv, mask


def test_ppo_token_level_hand_computed() -> None:
    new, old, adv, mask = _ppo_case()
    loss, stats = M.ppo_clip_loss(new, old, adv, mask)
    # objectives: min(1.5, 1.2) = 1.2 (high clip); min(0.5, 0.8) = 0.5; min(-1.1, -1.1) = -1.1;
    # min(-0.5, -0.8) = -0.8 (low clip); loss = -(1.2 + 0.5 - 1.1 - 0.8) / 4 = 0.05
    close(loss, 0.05)
    (g,) = torch.autograd.grad(loss, new)
    # d(-r A / 4)/dlog r = -r A / 4 where unclipped, 0 where the clip is active or the token is not an action
    close(g, [[0.0, 0.0, -0.5 / 4, 1.1 / 4, 0.0]])
    assert stats["clip_frac"] == 0.5 and stats["clip_frac_low"] == 0.25 and stats["clip_frac_high"] == 0.25
    k3 = [(r - 1) - math.log(r) for r in (1.5, 0.5, 1.1, 0.5)]
    assert stats["approx_kl"] == pytest.approx(sum(k3) / 4)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.5) / 4)
    # r > 1 + clip with A < 0 and r < 1 - clip with A > 0 are not clipped: min(-1.5, -1.2) = -1.5, min(0.5, 0.8)
    two_old = t64([[0.0, 0.0]])
    loss2, stats2 = M.ppo_clip_loss(two_old + t64([[math.log(1.5), math.log(0.5)]]), two_old, t64([[-1.0, 1.0]]),
                                    t64([[1, 1]]))
    close(loss2, -(-1.5 + 0.5) / 2)
    assert stats2["clip_frac"] == 0.0
    # asymmetric clip (DAPO clip-higher): 1.5 is now inside 1 + 0.6, objective 1.5 instead of 1.2
    close(M.ppo_clip_loss(new, old, adv, mask, clip_high=0.6)[0], -(1.5 + 0.5 - 1.1 - 0.8) / 4)


def test_ppo_is_weights_multiply_the_objective() -> None:
    new, old, adv, mask = _ppo_case()
    close(M.ppo_clip_loss(new, old, adv, mask, is_weights=t64([2.0]))[0], 0.1)
    w = t64([[7.0, 1.0, 2.0, 1.0, 0.0]])
    close(M.ppo_clip_loss(new, old, adv, mask, is_weights=w)[0], -(1.2 + 2 * 0.5 - 1.1) / 4)


def test_ppo_sequence_level_hand_computed() -> None:
    # seq 0: token ratios 2 and 0.5 -> geometric mean 1; seq 1: three tokens of ratio 1.5 -> 1.5, clipped to 1.2
    old = t64([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    new = (old + t64([[3.0, math.log(2.0), math.log(0.5)], [math.log(1.5)] * 3])).requires_grad_()
    mask = t64([[0, 1, 1], [1, 1, 1]])
    loss, stats = M.ppo_clip_loss(new, old, t64([1.0, 1.0]), mask, level="sequence")
    close(loss, -(1 + 1 + 3 * 1.2) / 5)
    (g,) = torch.autograd.grad(loss, new)
    close(g, [[0.0, -1 / 5, -1 / 5], [0.0, 0.0, 0.0]])  # s_i A / N per token of an unclipped sequence
    assert stats["clip_frac"] == pytest.approx(3 / 5) and stats["ratio_mean"] == pytest.approx((2 + 4.5) / 5)


@PROPERTY
@given(st.integers(0, 10_000), st.sampled_from(["token-mean", "seq-mean-token-mean"]))
def test_ppo_sequence_level_gradient_equals_gspo(seed: int, mode: str) -> None:
    # GSPO: J = agg over sequences of min(s_i A_i, clip(s_i) A_i), s_i = exp(mean of token log-ratios) with
    # its gradient; in token-mean each sequence weighs |o_i| / N. Written here independently of the module.
    gen = torch.Generator().manual_seed(seed)
    b, t = 3, 6
    old = -torch.rand(b, t, generator=gen, dtype=F64) * 3
    new = (old + torch.randn(b, t, generator=gen, dtype=F64) * 0.3).requires_grad_()
    mask = (torch.rand(b, t, generator=gen) < 0.7).to(F64)
    mask[:, 0] = 1.0
    adv = torch.randn(b, generator=gen, dtype=F64)
    loss, _ = M.ppo_clip_loss(new, old, adv, mask, level="sequence", mode=mode)  # type: ignore[arg-type]
    n_tok = mask.sum(1)
    s = torch.exp(((new - old) * mask).sum(1) / n_tok)
    per_seq = torch.minimum(s * adv, s.clamp(0.8, 1.2) * adv)
    ref = -(per_seq * n_tok).sum() / n_tok.sum() if mode == "token-mean" else -per_seq.mean()
    close(loss, ref, 1e-9)
    g, g_ref = torch.autograd.grad(loss, new)[0], torch.autograd.grad(ref, new)[0]
    close(g, g_ref, 1e-9)


def test_ppo_ratio_is_clamped_in_log_space() -> None:
    # a float32 log-ratio of 100 would be exp(100) = inf; with A < 0 min(r A, clip A) = r A would be -inf
    old = torch.zeros(1, 2)
    new = torch.tensor([[100.0, 0.0]], requires_grad=True)
    loss, stats = M.ppo_clip_loss(new, old, torch.tensor([-1.0]), torch.ones(1, 2))
    assert float(loss.detach()) == pytest.approx((math.exp(20.0) + 1.0) / 2, rel=1e-6)
    assert all(math.isfinite(v) for v in stats.values())
    assert torch.isfinite(torch.autograd.grad(loss, new)[0]).all()


def test_ppo_rejects_unknown_level() -> None:
    new, old, adv, mask = _ppo_case()
    with pytest.raises(ValueError, match="level"):
        M.ppo_clip_loss(new, old, adv, mask, level="turn")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- KL, value loss


def test_kl_to_behavior_hand_computed() -> None:
    old = t64([[-1.0, -1.0, -1.0]])
    new = (old + t64([[4.0, math.log(2.0), math.log(0.5)]])).requires_grad_()
    mask = t64([[0, 1, 1]])
    close(M.kl_to_behavior(new, old, mask, "k1"), (-math.log(2.0) + math.log(2.0)) / 2)  # = 0
    # k3 = (r - 1) - log r: (1 - ln 2) + (-0.5 + ln 2) = 0.5, mean 0.25
    k3 = M.kl_to_behavior(new, old, mask, "k3")
    close(k3, 0.25)
    (g,) = torch.autograd.grad(k3, new)
    close(g, [[0.0, (2.0 - 1) / 2, (0.5 - 1) / 2]])  # d/dlog r of (r - 1 - log r) = r - 1, over 2 tokens
    with pytest.raises(ValueError, match="KL estimator"):
        M.kl_to_behavior(new, old, mask, "k2")  # type: ignore[arg-type]


def test_value_loss_hand_computed() -> None:
    values = t64([[1.0, 2.0, 3.0]]).requires_grad_()
    returns, mask = t64([[0.0, 2.0, 5.0]]), t64([[1, 1, 0]])
    close(M.value_loss(values, returns, mask), 0.5 * (1.0 + 0.0) / 2)
    # clipped: V_old = 1.6 -> V_clip = 1.6 - 0.5 = 1.1, (1.1 - 0)^2 = 1.21 > 1, so the clipped term wins
    old = t64([[1.6, 2.0, 0.0]])
    loss = M.value_loss(values, returns, mask, clip=0.5, old_values=old)
    close(loss, 0.5 * (1.21 + 0.0) / 2)
    (g,) = torch.autograd.grad(loss, values)
    close(g, [[0.0, 0.0, 0.0]])  # the winning clipped term is flat in V at position 0; position 1 has error 0
    with pytest.raises(ValueError, match="old_values"):
        M.value_loss(values, returns, mask, clip=0.5)


# ---------------------------------------------------------------------------------------------- pitfall 1


def _all_losses(logp: torch.Tensor, old: torch.Tensor, values: torch.Tensor, adv: torch.Tensor,
                mask: torch.Tensor) -> list[torch.Tensor]:
    out = []
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        out += [M.reinforce_loss(logp, adv, mask, mode), M.sft_loss(logp, mask, mode),
                M.ppo_clip_loss(logp, old, adv, mask, mode=mode)[0],
                M.ppo_clip_loss(logp, old, adv, mask, mode=mode, level="sequence")[0]]
    out += [M.kl_to_behavior(logp, old, mask, "k1"), M.kl_to_behavior(logp, old, mask, "k3"),
            M.value_loss(values, old, mask), M.value_loss(values, old, mask, clip=0.2, old_values=old * 0.9)]
    return out


@PROPERTY
@given(st.integers(0, 10_000), st.integers(1, 6), st.sampled_from([0.0, 1e6, float("nan"), float("-inf")]))
def test_losses_ignore_masked_positions_and_longer_tool_outputs(seed: int, extra: int, junk: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    b, t = 3, 8
    mask = (torch.rand(b, t, generator=gen) < 0.6).to(F64)
    mask[:, 1] = 1.0
    logp = -torch.rand(b, t, generator=gen, dtype=F64) * 3
    old = logp + torch.randn(b, t, generator=gen, dtype=F64) * 0.2
    values = torch.randn(b, t, generator=gen, dtype=F64)
    adv_seq = torch.randn(b, generator=gen, dtype=F64)
    adv_tok = torch.randn(b, t, generator=gen, dtype=F64)

    def run(lp: torch.Tensor, o: torch.Tensor, v: torch.Tensor, m: torch.Tensor,
            a_tok: torch.Tensor) -> list[tuple[float, torch.Tensor]]:
        lp, v = lp.clone().requires_grad_(), v.clone().requires_grad_()
        res = []
        for loss in _all_losses(lp, o, v, adv_seq, m) + _all_losses(lp, o, v, a_tok, m):
            g = torch.autograd.grad(loss, [lp, v], allow_unused=True)
            grads = torch.cat([(x if x is not None else torch.zeros_like(lp)) for x in g], dim=1)
            res.append((float(loss.detach()), grads))
        return res

    base = run(logp, old, values, mask, adv_tok)
    # (a) junk where mask == 0 (padding, observations): identical loss and gradient, gradient 0 there
    off = mask == 0
    fill = torch.full_like(logp, junk)
    junked = run(torch.where(off, fill, logp), torch.where(off, fill, old), torch.where(off, fill, values), mask,
                 torch.where(off, fill, adv_tok))
    for (l0, g0), (l1, g1) in zip(base, junked, strict=True):
        assert l0 == pytest.approx(l1, abs=1e-12)
        close(torch.where(off.repeat(1, 2), torch.zeros_like(g1), g1), g0, 1e-12)
        assert torch.equal(g1[off.repeat(1, 2)], torch.zeros(int(off.sum()) * 2, dtype=F64))
    # (b) a longer tool output: `extra` mask-0 tokens inserted after position 2 of every sequence
    def widen(x: torch.Tensor, value: float) -> torch.Tensor:
        return torch.cat([x[:, :3], torch.full((b, extra), value, dtype=x.dtype), x[:, 3:]], dim=1)

    longer = run(widen(logp, -7.0), widen(old, -2.0), widen(values, 3.0), widen(mask, 0.0), widen(adv_tok, 5.0))
    for (l0, g0), (l1, g1) in zip(base, longer, strict=True):
        assert l0 == pytest.approx(l1, abs=1e-12)
        keep = [i for i in range(t + extra) if not 3 <= i < 3 + extra]
        keep2 = keep + [t + extra + i for i in keep]
        close(g1[:, keep2], g0, 1e-12)


# ---------------------------------------------------------------------------------------------- pitfall 2


@PROPERTY
@given(st.integers(0, 10_000), st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]))
def test_micro_batch_accumulation_with_global_denominator_equals_full_batch(seed: int, mode: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    b, t = 6, 7
    mask = (torch.rand(b, t, generator=gen) < 0.5).to(F64)
    mask[4] = 0.0  # an empty sequence in the batch
    logp = (-torch.rand(b, t, generator=gen, dtype=F64) * 3).requires_grad_()
    old = logp.detach() + torch.randn(b, t, generator=gen, dtype=F64) * 0.3
    adv = torch.randn(b, t, generator=gen, dtype=F64)
    global_count = float(mask.sum()) if mode == "token-mean" else float((mask.sum(1) > 0).sum())

    def losses(lp: torch.Tensor, o: torch.Tensor, a: torch.Tensor, m: torch.Tensor,
               den: float | None) -> list[torch.Tensor]:
        return [M.reinforce_loss(lp, a, m, mode, den), M.sft_loss(lp, m, mode, den),  # type: ignore[arg-type]
                M.ppo_clip_loss(lp, o, a, m, mode=mode, denominator=den)[0]]  # type: ignore[arg-type]

    full = losses(logp, old, adv, mask, None)
    for k, full_loss in enumerate(full):
        (g_full,) = torch.autograd.grad(full_loss, logp)
        acc = torch.zeros((), dtype=F64)
        for lo in range(0, b, 2):  # three micro-batches of two sequences
            sl = slice(lo, lo + 2)
            acc = acc + losses(logp[sl], old[sl], adv[sl], mask[sl], global_count)[k]
        (g_acc,) = torch.autograd.grad(acc, logp)
        close(acc, full_loss, 1e-12)
        close(g_acc, g_full, 1e-12)


# ------------------------------------------------------------------- decoupled PPO: the correction counted once


def test_the_rl_objective_counts_the_off_policy_correction_once() -> None:
    """A hand-made two-episode batch: episode 0 was sampled by the learner at the iteration's start (staleness 0:
    pi_prox = mu), episode 1 by an older version (staleness 1). Decoupled PPO: token ratios r = pi / pi_prox,
    clipped to [0.8, 1.2]; mu only in episode 1's truncated weight w_1 = min(prod pi_prox / mu, 2). The gradient
    of the token-mean loss with respect to log pi at each policy token is -w_i * r_t * A_i / 4 where the clip
    leaves it, 0 where it removes it. (Today's loop took r = pi / mu and multiplied by min(prod pi / mu, 2) as
    well: pi / mu counted twice.)"""
    from trajlake.train.config import TrainConfig
    from trajlake.train.loop import policy_objective

    mask = t64([[0, 1, 1], [0, 1, 1]])
    mu = t64([[0.0, -1.0, -0.5], [0.0, -0.8, -1.2]])
    prox = t64([[0.0, -1.0, -0.5], [0.0, -0.6, -1.0]])
    new = t64([[0.0, -0.9, -0.5], [0.0, -0.5, -1.3]]).requires_grad_(True)
    adv = t64([1.0, -0.5])
    cfg = TrainConfig(name="x", clip_low=0.2, clip_high=0.2, is_max_weight=2.0)
    loss, stats = policy_objective(cfg, new, prox, mu, adv, mask, denominator=4.0)
    loss.backward()
    w1 = math.exp((-0.6 + 0.8) + (-1.0 + 1.2))  # 1.49 < 2: not truncated
    # episode 0: r = e^0.1, e^0; episode 1: r = e^0.1 (kept), e^-0.3 = 0.74 < 0.8 with A < 0 (clipped: no grad)
    expected = [[0.0, -math.exp(0.1) * 1.0 / 4, -1.0 * 1.0 / 4],
                [0.0, -w1 * math.exp(0.1) * -0.5 / 4, 0.0]]
    close(new.grad, expected, 1e-12)
    # the loss itself: -(sum of w * min(r A, clip(r) A)) / 4
    close(loss, -(math.exp(0.1) + 1.0 + w1 * math.exp(0.1) * -0.5 + w1 * 0.8 * -0.5) / 4, 1e-12)
    close(stats["is_weight_max"], w1, 1e-12)
    # an episode the learner sampled at the iteration's start gets weight 1 and a plain PPO ratio against mu
    only0, _ = policy_objective(cfg, new[:1], prox[:1], mu[:1], adv[:1], mask[:1], denominator=2.0)
    close(only0, -(math.exp(0.1) + 1.0) / 2, 1e-12)


def test_reinforce_weights_by_the_truncated_trajectory_ratio_alone() -> None:
    from trajlake.train.config import TrainConfig
    from trajlake.train.loop import policy_objective

    mask = t64([[1, 1]])
    mu, new = t64([[-1.0, -1.0]]), t64([[-0.5, -0.5]]).requires_grad_(True)
    cfg = TrainConfig(name="x", policy_loss="reinforce", is_max_weight=2.0)
    loss, _ = policy_objective(cfg, new, mu, mu, t64([1.0]), mask, denominator=2.0)
    loss.backward()
    close(new.grad, [[-2.0 / 2, -2.0 / 2]], 1e-12)  # min(e^1, 2) = 2, detached; d(-A log pi)/d log pi = -A


# ------------------------------------------------------------------------------------- learning-rate schedule


def test_learning_rate_warm_up_and_decay_hand_computed() -> None:
    lr = M.learning_rate
    assert [lr(s, 10, 1.0, warmup_steps=3) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert lr(3, 10, 1.0, warmup_steps=3, schedule="linear", min_lr_ratio=0.1) == 1.0
    assert lr(6, 10, 1.0, warmup_steps=3, schedule="linear", min_lr_ratio=0.1) == pytest.approx(0.55)
    assert lr(9, 10, 1.0, warmup_steps=3, schedule="linear", min_lr_ratio=0.1) == pytest.approx(0.1)
    assert lr(6, 10, 1.0, warmup_steps=3, schedule="cosine", min_lr_ratio=0.1) == pytest.approx(0.55)
    assert lr(9, 10, 1.0, warmup_steps=3, schedule="cosine", min_lr_ratio=0.1) == pytest.approx(0.1)
    assert lr(0, 1, 0.5, schedule="cosine") == 0.5  # one step: no room to decay
    assert [lr(s, 4, 2.0) for s in range(4)] == [2.0] * 4  # the default: constant, as before


def test_the_placebo_shuffles_rewards_within_groups_only() -> None:
    rewards = t64([1.0, 0.0, 0.0, 5.0, 6.0, 7.0, 9.0])
    groups = ["a", "a", "a", "b", "b", "b", "c"]
    seen = set()
    for seed in range(20):
        out = M.shuffle_within_groups(rewards, groups, torch.Generator().manual_seed(seed))
        assert sorted(out[:3].tolist()) == [0.0, 0.0, 1.0] and sorted(out[3:6].tolist()) == [5.0, 6.0, 7.0]
        assert out[6] == 9.0  # a group of one keeps its reward
        seen.add(tuple(out.tolist()))
    assert len(seen) > 5  # the attempts' rewards really move
    again = M.shuffle_within_groups(rewards, groups, torch.Generator().manual_seed(3))
    assert torch.equal(again, M.shuffle_within_groups(rewards, groups, torch.Generator().manual_seed(3)))


# ---------------------------------------------------------------------------------------------- R2: per-turn credit


def test_policy_turn_rewards_go_to_the_last_policy_turn_at_or_before_them() -> None:
    actors = ["system", "user", "policy", "env", "policy", "env", "env"]
    rewards = [0.1, 0.2, -0.01, 0.5, -0.01, 0.25, 0.125]
    # turn 0: the two leading turns (before any policy turn) + its call + its observation = 0.1 + 0.2 - 0.01 + 0.5
    # turn 1: its call + both observations after it = -0.01 + 0.25 + 0.125
    close(M.policy_turn_rewards(rewards, actors), [0.79, 0.365], 1e-12)
    assert M.policy_turn_rewards([1.0, 2.0], ["user", "env"]).shape == (0,)  # no policy turn: nothing to credit
    with pytest.raises(ValueError, match="one per turn"):
        M.policy_turn_rewards([1.0], ["user", "policy"])
    with pytest.raises(ValueError, match="turn 1"):
        M.policy_turn_rewards([0.0, math.nan], ["policy", "env"])


def test_episode_turn_rewards_per_turn_and_potential_hand_computed() -> None:
    p = t64([0.5, 0.0, 0.25])
    # per_turn: the process reward where earned, the terminal part (1) on the last turn
    close(M.episode_turn_rewards(1.0, p, 1.0, "per_turn"), [0.5, 0.0, 1.25])
    # potential, Phi(h_0..h_3) = [0, 0.5, 0.5, 0.75]; corrected: Phi(h_3) -> 0
    # r_0 = 0.5 - 0 = 0.5, r_1 = 0.5 - 0.5 = 0, r_2 = 1 + 0 - 0.5 = 0.5: sums to the terminal part, 1
    close(M.episode_turn_rewards(1.0, p, 1.0, "potential"), [0.5, 0.0, 0.5])
    # uncorrected (a truncated episode whose value is bootstrapped): r_2 = 1 + 0.75 - 0.5
    close(M.episode_turn_rewards(1.0, p, 1.0, "potential", end_correction=False), [0.5, 0.0, 1.25])
    # gamma 0.5, corrected: r_0 = 0.5 * 0.5 - 0 = 0.25, r_1 = 0.5 * 0.5 - 0.5 = -0.25, r_2 = 1 + 0 - 0.5 = 0.5;
    # discounted: 0.25 - 0.125 + 0.125 = 0.25 = gamma^2 * 1
    close(M.episode_turn_rewards(1.0, p, 0.5, "potential"), [0.25, -0.25, 0.5])
    assert M.episode_turn_rewards(1.0, t64([]), 1.0, "potential").shape == (0,)
    with pytest.raises(ValueError, match="unknown process shaping"):
        M.episode_turn_rewards(1.0, p, 1.0, "dense")  # type: ignore[arg-type]


@PROPERTY
@given(floats_list, st.floats(-2, 2, allow_nan=False), st.floats(0.0, 1.0))
def test_potential_shaping_keeps_the_return_and_per_turn_adds_the_process_reward(
        process: list[float], terminal: float, gamma: float) -> None:
    k = len(process)
    shaped = M.episode_turn_rewards(terminal, t64(process), gamma, "potential").tolist()
    assert _discounted(shaped, gamma) == pytest.approx(gamma ** (k - 1) * terminal, abs=1e-9)  # - Phi(h_0) = 0
    per_turn = M.episode_turn_rewards(terminal, t64(process), gamma, "per_turn").tolist()
    assert _discounted(per_turn, gamma) == pytest.approx(gamma ** (k - 1) * terminal + _discounted(process, gamma),
                                                         abs=1e-9)
    g = M.returns_to_go([t64(shaped)], gamma)[0].tolist()
    # the shaped return-to-go at turn j is the terminal part's minus the process reward already earned (gamma 1)
    if gamma == 1.0:
        assert g == pytest.approx([terminal - sum(process[:j]) for j in range(k)], abs=1e-9)


def test_returns_to_go_hand_computed_and_zero_padded() -> None:
    # gamma 0.5: [1, 0, 2] -> G_2 = 2, G_1 = 0 + 0.5 * 2 = 1, G_0 = 1 + 0.5 * 1 = 1.5; [3] -> [3, 0, 0]
    close(M.returns_to_go([t64([1.0, 0.0, 2.0]), t64([3.0])], 0.5), [[1.5, 1.0, 2.0], [3.0, 0.0, 0.0]])
    assert M.returns_to_go([t64([])], 1.0).tolist() == [[0.0]]


def test_turn_group_advantages_hand_computed_three_episode_group() -> None:
    """Three episodes of one group with 3, 1 and 2 turns (G_k = 0 past an episode's end) and one alone."""
    g = t64([[1.5, 1.0, 2.0], [3.0, 0.0, 0.0], [0.5, 0.5, 0.0], [4.0, 4.0, 0.0]])
    lengths, groups = [3, 1, 2, 2], ["a", "a", "a", "b"]
    # RLOO, turn 0: 1.5 - (3 + 0.5) / 2 = -0.25; 3 - (1.5 + 0.5) / 2 = 2; 0.5 - (1.5 + 3) / 2 = -1.75
    # turn 1: 1 - (0 + 0.5) / 2 = 0.75; (episode 1 has no turn 1); 0.5 - (1 + 0) / 2 = 0
    # turn 2: 2 - (0 + 0) / 2 = 2; the others have no turn 2. Group b has one member: 0 (no baseline).
    close(M.turn_group_advantages(g, lengths, groups, "rloo"),
          [[-0.25, 0.75, 2.0], [2.0, 0.0, 0.0], [-1.75, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # GRPO, turn 0: mean 5/3, deviations -1/6, 4/3, -7/6, unbiased std sqrt((1/36 + 16/9 + 49/36) / 2)
    sd0 = math.sqrt((1 / 36 + 16 / 9 + 49 / 36) / 2)
    # turn 1: [1, 0, 0.5], mean 0.5, deviations 0.5, -0.5, 0, std 0.5; turn 2: [2, 0, 0], mean 2/3, std sqrt(4/3)
    sd2 = math.sqrt(((4 / 3) ** 2 + 2 * (2 / 3) ** 2) / 2)
    eps = 1e-6
    close(M.turn_group_advantages(g, lengths, groups, "grpo"),
          [[(-1 / 6) / (sd0 + eps), 0.5 / (0.5 + eps), (4 / 3) / (sd2 + eps)],
           [(4 / 3) / (sd0 + eps), 0.0, 0.0], [(-7 / 6) / (sd0 + eps), 0.0, 0.0], [0.0, 0.0, 0.0]], 1e-9)
    with pytest.raises(ValueError, match="one length per row"):
        M.turn_group_advantages(g, [1, 2], groups, "rloo")


@PROPERTY
@given(st.lists(st.lists(st.floats(-3, 3, allow_nan=False), min_size=1, max_size=5), min_size=2, max_size=5),
       st.integers(0, 4), st.lists(st.floats(-3, 3, allow_nan=False), min_size=5, max_size=5))
def test_turn_rloo_baseline_does_not_depend_on_the_episodes_own_actions(
        rows: list[list[float]], who: int, other: list[float]) -> None:
    """Replacing episode i's rewards (another trajectory of its own) moves its advantage at turn k only by the
    change of its own G_k: the baseline at turn k comes from the other members alone."""
    i = who % len(rows)
    groups = ["g"] * len(rows)
    g1 = M.returns_to_go([t64(r) for r in rows], 1.0)
    changed = [*rows[:i], other[:len(rows[i])], *rows[i + 1:]]
    g2 = M.returns_to_go([t64(r) for r in changed], 1.0)
    lengths = [len(r) for r in rows]
    a1 = M.turn_group_advantages(g1, lengths, groups, "rloo")
    a2 = M.turn_group_advantages(g2, lengths, groups, "rloo")
    k = lengths[i]
    close(a2[i, :k] - a1[i, :k], g2[i, :k] - g1[i, :k], 1e-9)


def test_kl_to_reference_is_k2_with_the_score_function_gradient() -> None:
    """k2 by hand: the token mean over the mask of (log pi - log pi_ref)^2 / 2, its gradient (log pi - log pi_ref)
    / n on the policy tokens and 0 elsewhere (a NaN reference off the mask changes nothing); 0 where they agree."""
    import torch

    from trajlake.train.math import kl_to_reference

    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0, float("nan")], [-0.2, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    kl = kl_to_reference(logp, ref, mask)
    assert float(kl.detach()) == pytest.approx((0.5 * 0.5 ** 2 + 0.0 + 0.5 * 2.0 ** 2 + 0.0) / 4)
    kl.backward()
    assert logp.grad is not None
    assert logp.grad.flatten().tolist() == pytest.approx([0.5 / 4, 0.0, 0.0, 0.0, -2.0 / 4, 0.0])
    same = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    zero = kl_to_reference(same, same.detach().clone(), torch.ones(1, 2))
    zero.backward()
    assert float(zero.detach()) == 0.0 and same.grad is not None and same.grad.abs().sum() == 0.0
