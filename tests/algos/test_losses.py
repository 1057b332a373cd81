"""Hand-computed checks of the policy losses (spec §4) and AEPO's entropy-balanced clipping (§7)."""

import math

import pytest
import torch

from arpo.algos.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregate,
    clipped_surrogate,
    entropy_balanced_loss,
    entropy_bonus,
    gspo_loss,
    gspo_sequence_ratio,
    gspo_token_ratio,
    kl_divergence,
    policy_loss,
    ppo_clip_loss,
)


def close(a, b, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32), torch.tensor(b, dtype=torch.float32),
                               atol=tol, rtol=0)


# Seven probe tokens with ε_low = ε_high = 0.2, dual clip c = 3, plus one padding token.
#   ρ     Â    case                          per-token loss
#   1.1   +1   inside the clip range         −1.1
#   1.5   +1   above 1+ε, Â>0: clipped high  −1.2
#   0.5   −1   below 1−ε, Â<0: clipped low   +0.8
#   4.0   −1   ρ > c, Â<0: dual clip         min(max(4, 1.2), 3) = 3
#   0.5   +1   below 1−ε, Â>0: not clipped   −0.5   (min picks ρÂ)
#   2.0   −1   above 1+ε, Â<0, ρ < c         +2.0   (max picks ρ|Â|)
#   1.5    0   zero advantage                0
#   10    +5   padding (mask 0)              would be −6.0 if counted
RATIOS = [1.1, 1.5, 0.5, 4.0, 0.5, 2.0, 1.5, 10.0]
ADVS = [1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 0.0, 5.0]
EXPECTED_TOKEN_LOSS = [-1.1, -1.2, 0.8, 3.0, -0.5, 2.0, 0.0]


def probe():
    logp = torch.log(torch.tensor([RATIOS])).requires_grad_(True)  # (1, 8), old_logp = 0 so ρ = exp(logp)
    old = torch.zeros(1, 8)
    adv = torch.tensor([ADVS])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])
    return logp, old, adv, mask


def test_clipped_surrogate_per_token_values_and_regions():
    logp, old, adv, mask = probe()
    pg, regions = clipped_surrogate(torch.exp(logp), adv, 0.2, 0.2, 3.0)
    close(pg[0, :7].detach(), EXPECTED_TOKEN_LOSS)
    assert regions["clipped_high"][0].tolist() == [False, True, False, False, False, False, False, True]
    assert regions["clipped_low"][0].tolist() == [False, False, True, False, False, False, False, False]
    assert regions["dual_clipped"][0].tolist() == [False, False, False, True, False, False, False, False]
    # without dual clip token 3 costs ρ|Â| = 4
    pg_nodual, _ = clipped_surrogate(torch.exp(logp), adv, 0.2, 0.2, None)
    assert math.isclose(float(pg_nodual[0, 3].detach()), 4.0, rel_tol=1e-6)
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_surrogate(torch.exp(logp), adv, 0.2, 0.2, 1.0)


def test_ppo_clip_loss_value_diagnostics_and_gradient():
    logp, old, adv, mask = probe()
    loss, diag = ppo_clip_loss(logp, old, adv, mask)
    # token-mean: (−1.1 − 1.2 + 0.8 + 3 − 0.5 + 2 + 0) / 7 = 3.0 / 7 = 0.428571
    assert math.isclose(loss.item(), 3.0 / 7, rel_tol=1e-5)
    assert math.isclose(float(diag["clip_frac"]), 2 / 7, rel_tol=1e-6)
    assert math.isclose(float(diag["clip_frac_high"]), 1 / 7, rel_tol=1e-6)
    assert math.isclose(float(diag["clip_frac_low"]), 1 / 7, rel_tol=1e-6)
    assert math.isclose(float(diag["dual_clip_frac"]), 1 / 7, rel_tol=1e-6)
    # (1.1 + 1.5 + 0.5 + 4 + 0.5 + 2 + 1.5) / 7 = 11.1 / 7
    assert math.isclose(float(diag["ratio_mean"]), 11.1 / 7, rel_tol=1e-5)
    # approx KL = mean(ρ − 1 − log ρ)
    k3 = sum(r - 1 - math.log(r) for r in RATIOS[:7]) / 7
    assert math.isclose(float(diag["approx_kl"]), k3, rel_tol=1e-5)
    loss.backward()
    # d/dlogp of −Âρ is −Âρ on unclipped tokens, /7 from the mean; clipped, dual-clipped and padding: 0
    close(logp.grad[0], [-1.1 / 7, 0, 0, 0, -0.5 / 7, 2.0 / 7, 0, 0])


def test_clip_higher_moves_the_upper_bound_only():
    logp, old, adv, mask = probe()
    pg, regions = clipped_surrogate(torch.exp(logp.detach()), adv, 0.2, 0.28, 3.0)
    # token 1 (ρ 1.5) is clipped at 1.28 now; token 2 (ρ 0.5, Â<0) still at 0.8
    assert math.isclose(float(pg[0, 1]), -1.28, rel_tol=1e-6)
    assert math.isclose(float(pg[0, 2]), 0.8, rel_tol=1e-6)
    # ρ = 1.25 with Â > 0 is inside [0.8, 1.28] but outside [0.8, 1.2]
    r = torch.tensor([[1.25]])
    a = torch.tensor([[1.0]])
    assert math.isclose(float(clipped_surrogate(r, a, 0.2, 0.28)[0]), -1.25, rel_tol=1e-6)
    assert math.isclose(float(clipped_surrogate(r, a, 0.2, 0.2)[0]), -1.2, rel_tol=1e-6)


# ---- aggregations on a ragged mask -------------------------------------------------------------

LOSS_MAT = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 6.0, 100.0, 100.0], [7.0, 7.0, 7.0, 7.0]])
RAGGED = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])  # row 2 is all padding


@pytest.mark.parametrize(
    "agg, normalizer, expected",
    [
        ("token-mean", None, 16 / 5),  # (1+2+3+4+6) / 5 valid tokens
        ("seq-mean-token-sum", None, 8.0),  # (6 + 10) / 2 valid sequences
        ("seq-mean-token-mean", None, 3.5),  # (6/3 + 10/2) / 2 = (2 + 5) / 2
        ("seq-mean-token-sum-norm", 10, 0.8),  # (6/10 + 10/10) / 2
        ("seq-mean-token-sum-norm", None, 2.0),  # normalizer T = 4: (1.5 + 2.5) / 2
    ],
)
def test_aggregations(agg, normalizer, expected):
    assert set(AGGREGATIONS) == {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    assert math.isclose(float(aggregate(LOSS_MAT, RAGGED, agg, normalizer)), expected, rel_tol=1e-6)


def test_aggregation_of_empty_mask_is_zero_and_unknown_name_fails():
    assert float(aggregate(LOSS_MAT, torch.zeros_like(RAGGED), "token-mean")) == 0.0
    assert float(aggregate(LOSS_MAT, torch.zeros_like(RAGGED), "seq-mean-token-mean")) == 0.0
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(LOSS_MAT, RAGGED, "sum")


# ---- KL and entropy ----------------------------------------------------------------------------


def test_kl_estimators_values():
    logp = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    # log π − log π_ref = ln 2 = 0.693147; r = π_ref/π = 0.5
    k = {name: float(f(logp, ref)) for name, f in KL_ESTIMATORS.items()}
    assert math.isclose(k["k1"], math.log(2), rel_tol=1e-6)
    assert math.isclose(k["k2"], 0.5 * math.log(2) ** 2, rel_tol=1e-6)  # 0.240227
    assert math.isclose(k["k3"], 0.5 - 1 + math.log(2), rel_tol=1e-5)  # 0.193147
    assert math.isclose(k["low_var_kl"], k["k3"], rel_tol=1e-6)  # inside the clamp
    # far-off token: log r = 15 -> k3 = e^15 − 16 ≈ 3.27e6; low_var_kl clamps it to 10
    far_logp, far_ref = torch.tensor([[-15.0]]), torch.tensor([[0.0]])
    assert float(KL_ESTIMATORS["k3"](far_logp, far_ref)) > 1e6
    assert float(KL_ESTIMATORS["low_var_kl"](far_logp, far_ref)) == 10.0


def test_kl_term_and_entropy_bonus():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.9]]))
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.1]]))
    mask = torch.tensor([[1, 1, 0]])
    # k1 per token [ln 2, 0, masked] -> token-mean ln2/2
    assert math.isclose(float(kl_divergence(logp, ref, mask, "k1")), math.log(2) / 2, rel_tol=1e-5)
    adv = torch.zeros(1, 3)  # no policy term: the loss is the KL term alone
    total, _ = policy_loss(logp, logp, adv, mask, kl_coef=0.1, kl_type="k1", ref_logp=ref)
    assert math.isclose(float(total), 0.1 * math.log(2) / 2, rel_tol=1e-5)
    assert float(policy_loss(logp, logp, adv, mask)[0]) == 0.0  # kl_coef 0: no reference model needed
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, logp, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="k3"):
        kl_divergence(logp, ref, mask, "k4")
    ent = torch.tensor([[1.0, 3.0, 50.0]])
    assert math.isclose(float(entropy_bonus(ent, mask, 0.01)), -0.02, rel_tol=1e-6)  # −0.01 · (1+3)/2


# ---- GSPO --------------------------------------------------------------------------------------


def test_gspo_sequence_ratio_and_loss():
    # row 0 log-ratios [0.1, 0.3, (0.5 masked)] -> mean 0.2, s = e^0.2 = 1.221403
    # row 1 log-ratios [-0.1, -0.3, (masked)] -> mean -0.2, s = e^-0.2 = 0.818731
    logp = torch.tensor([[0.1, 0.3, 0.5], [-0.1, -0.3, 9.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    close(gspo_sequence_ratio(logp, old, mask).detach(), [1.221403, 0.818731])
    tok = gspo_token_ratio(logp, old, mask)
    close(tok.detach(), [[1.221403] * 3, [0.818731] * 3])  # every position carries s_i
    adv = torch.ones(2, 3)
    loss, diag = gspo_loss(logp, old, adv, mask)  # clip 3e-4 / 4e-4, seq-mean-token-mean
    # row 0: s > 1.0004 with Â > 0 -> clipped, −1.0004; row 1: s < 1, unclipped, −0.818731
    assert math.isclose(loss.item(), (-1.0004 - 0.818731) / 2, rel_tol=1e-5)
    assert math.isclose(float(diag["clip_frac"]), 0.5, rel_tol=1e-6)  # 2 of 4 valid tokens
    loss.backward()
    # row 1 token grad: −Â·s / (2 tokens) / (2 seqs) = −0.818731/4; same as ∂(−s_1/2)/∂logp_t = −s_1/(2·2)
    close(logp.grad, [[0.0, 0.0, 0.0], [-0.818731 / 4, -0.818731 / 4, 0.0]])


# ---- AEPO entropy-balanced clipping --------------------------------------------------------------


def test_entropy_balanced_values_match_ppo_and_gradient_kept_only_on_upper_clip():
    logp, old, adv, mask = probe()
    loss, diag = entropy_balanced_loss(logp, old, adv, mask)
    assert math.isclose(loss.item(), 3.0 / 7, rel_tol=1e-5)  # same values as ppo_clip
    loss.backward()
    # token 1 (clipped high): −(1+ε)·Â/7 = −1.2/7 instead of 0; clipped low, dual, padding stay 0
    close(logp.grad[0], [-1.1 / 7, -1.2 / 7, 0, 0, -0.5 / 7, 2.0 / 7, 0, 0])


def test_entropy_balanced_gradient_is_rescaled_score_function():
    # a tiny softmax policy: ∇_W loss must equal −(1+ε)·Â·∇_W log π(o) for an upper-clipped token
    torch.manual_seed(0)
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(2, 3)
    tokens = torch.tensor([1, 4])
    logp = torch.log_softmax(x @ w.T, -1).gather(-1, tokens[:, None]).T  # (1, 2)
    old = logp.detach() - torch.log(torch.tensor([[1.5, 1.1]]))  # ρ = [1.5 (clipped), 1.1 (inside)]
    adv = torch.tensor([[2.0, 0.0]])  # only token 0 contributes
    mask = torch.ones(1, 2)
    eps_high = 0.2
    (grad_logp,) = torch.autograd.grad(logp[0, 0], w, retain_graph=True)
    loss, _ = entropy_balanced_loss(logp, old, adv, mask, clip_high=eps_high, agg="seq-mean-token-sum")
    (grad,) = torch.autograd.grad(loss, w, retain_graph=True)
    torch.testing.assert_close(grad, -(1 + eps_high) * 2.0 * grad_logp)
    assert math.isclose(loss.item(), -(1 + eps_high) * 2.0, rel_tol=1e-5)
    # the plain clipped surrogate gives this token no gradient at all
    loss_ppo, _ = ppo_clip_loss(logp, old, adv, mask, clip_high=eps_high, agg="seq-mean-token-sum")
    (grad_ppo,) = torch.autograd.grad(loss_ppo, w)
    assert float(grad_ppo.abs().max()) == 0.0
    assert float(grad_logp.abs().max()) > 0.0


# ---- the composed loss -------------------------------------------------------------------------


def test_policy_loss_composes_terms():
    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    old = logp.clone()  # ρ = 1
    ref = torch.log(torch.tensor([[0.25, 0.25]]))
    adv = torch.ones(1, 2)
    mask = torch.ones(1, 2)
    ent = torch.tensor([[1.0, 3.0]])
    total, diag = policy_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.1, entropy=ent, entropy_coef=0.01)
    # pg = −1; low_var_kl = 0.5 − 1 + ln 2 = 0.193147 (× 0.1); entropy bonus −0.01 · 2
    expected = -1 + 0.1 * (0.5 - 1 + math.log(2)) - 0.02
    assert math.isclose(total.item(), expected, rel_tol=1e-5)
    assert math.isclose(float(diag["pg_loss"]), -1.0, rel_tol=1e-6)
    assert math.isclose(float(diag["kl"]), 0.193147, rel_tol=1e-4)
    assert math.isclose(float(diag["entropy"]), 2.0, rel_tol=1e-6)
    assert {"clip_frac", "clip_frac_low", "dual_clip_frac", "approx_kl", "ratio_mean"} <= set(diag)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, old, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(logp, old, adv, mask, entropy_coef=0.1)
    with pytest.raises(ValueError, match="ppo_clip"):
        policy_loss(logp, old, adv, mask, loss_type="trpo")


def test_policy_loss_dispatches_by_name():
    assert set(POLICY_LOSSES) == {"ppo_clip", "gspo", "entropy_balanced"}
    logp = torch.tensor([[0.1, 0.3, 0.5], [-0.1, -0.3, 9.0]])
    old, adv = torch.zeros(2, 3), torch.ones(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    via_name, _ = policy_loss(
        logp, old, adv, mask, loss_type="gspo", agg="seq-mean-token-mean", clip_low=3e-4, clip_high=4e-4, dual_clip=None
    )
    direct, _ = gspo_loss(logp, old, adv, mask)
    assert math.isclose(via_name.item(), direct.item(), rel_tol=1e-6)
    ppo, _ = policy_loss(logp, old, adv, mask)
    assert not math.isclose(ppo.item(), direct.item(), rel_tol=1e-3)  # token ratios differ from s_i


# ---- masks with tool-result gaps, GSPO with per-token advantages, extreme ratios (issue 15 A.5) ----
def test_loss_and_aggregations_with_a_tool_result_gap_in_the_middle():
    """A trajectory: 2 generated tokens, 3 tool-result tokens (mask 0), 2 generated, then padding.
    Every aggregation counts only the 4 generated tokens; the gap gets no gradient."""
    ratios = torch.tensor([[1.1, 0.9, 50.0, 0.01, 7.0, 1.0, 1.05, 3.0]])
    logp = torch.log(ratios).requires_grad_(True)
    old = torch.zeros(1, 8)
    adv = torch.tensor([[1.0, 1.0, 9.0, 9.0, 9.0, -1.0, -1.0, 9.0]])
    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0]])
    # per-token (clip 0.2, dual 3): −1.1, −0.9, (gap), +1.0, +1.05  -> sum 0.05 over 4 tokens
    expected = {"token-mean": 0.05 / 4, "seq-mean-token-sum": 0.05, "seq-mean-token-mean": 0.05 / 4,
                "seq-mean-token-sum-norm": 0.05 / 10}
    for agg, want in expected.items():
        loss, diag = ppo_clip_loss(logp, old, adv, mask, agg=agg, agg_normalizer=10.0 if "norm" in agg else None)
        assert loss.item() == pytest.approx(want, abs=1e-5), agg
        assert float(diag["clip_frac"]) == 0.0  # the huge ratios sit in the gap: not counted
        logp.grad = None
        loss.backward()
        assert torch.equal(logp.grad[0, 2:5], torch.zeros(3)) and logp.grad[0, 7] == 0
        assert (logp.grad[0, [0, 1, 5, 6]] != 0).all()


def test_gspo_with_per_token_advantages_is_the_gspo_token_objective():
    """Hard attribution / AEPO give per-token advantages: GSPO then uses GSPO-token (arXiv
    2507.18071 §4.3): the whole sequence's ratio s_i is clipped, each token weighted by its own Â_t.
    Constant per-sequence advantages give exactly the sequence-level GSPO."""
    logp = torch.tensor([[-0.1, -0.2, 0.0, -0.3]], requires_grad=True)
    old = torch.zeros(1, 4)
    mask = torch.tensor([[1, 1, 0, 1]])  # a tool result in the middle
    s = math.exp((-0.1 - 0.2 - 0.3) / 3)  # 0.818731, unclipped for Â > 0 (s < 1 + ε_high)
    adv = torch.tensor([[1.0, 2.0, 7.0, 3.0]])
    loss, _ = gspo_loss(logp, old, adv, mask)
    assert loss.item() == pytest.approx(-s * (1 + 2 + 3) / 3, rel=1e-5)
    loss.backward()
    # d/dlogp_t of −(1/3)·Σ_u Â_u·s_i (token form: ∇ = s_i·∇log π_t for each token's own term)
    close(logp.grad, [[-s * 1 / 3, -s * 2 / 3, 0.0, -s * 3 / 3]])
    const, _ = gspo_loss(logp.detach(), old, torch.full((1, 4), 2.0), mask)
    assert const.item() == pytest.approx(-2 * s, rel=1e-5)  # = sequence GSPO with Â = 2


def test_gspo_with_a_token_sum_aggregation_is_rejected():
    import dataclasses

    from arpo.algos.presets import get_preset
    from arpo.errors import ArpoError

    for agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        with pytest.raises(ArpoError, match="loss_type=gspo needs loss_agg=seq-mean-token-mean"):
            dataclasses.replace(get_preset("gspo"), loss_agg=agg)


def test_extreme_log_ratios_are_clamped_and_finite():
    from arpo.algos.losses import LOG_RATIO_LIMIT, token_ratio

    logp = torch.tensor([[200.0, -200.0, 0.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    assert token_ratio(logp, old).tolist()[0][:2] == pytest.approx([math.exp(LOG_RATIO_LIMIT),
                                                                    math.exp(-LOG_RATIO_LIMIT)])
    for loss_fn in (ppo_clip_loss, gspo_loss, entropy_balanced_loss):
        loss, diag = loss_fn(logp, old, torch.tensor([[1.0, -1.0, 1.0]]), torch.ones(1, 3))
        logp.grad = None
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all(), loss_fn.__name__
        assert all(torch.isfinite(v).all() for v in diag.values())
    kl = kl_divergence(logp, torch.zeros(1, 3), torch.ones(1, 3), "low_var_kl")
    assert torch.isfinite(kl) and kl.item() <= 10.0  # low_var_kl clamps each token to [-10, 10]


def test_dr_grpo_kl_and_entropy_terms_use_the_constant_not_the_padded_width():
    """Dr.GRPO with a KL term: one sequence of 3 tokens, log π_θ − log π_ref = ln 2 on each (k1 = ln 2),
    ratio 1, Â = 1, constant 4096. Policy term −3/4096, KL term 0.1·3·ln 2/4096, entropy bonus
    −0.01·3·0.5/4096 — the same whether the batch is padded to 10, 20 or 100 columns."""
    want = (-3 + 0.1 * 3 * math.log(2) - 0.01 * 3 * 0.5) / 4096
    for width in (10, 20, 100):
        mask = torch.zeros(1, width)
        mask[0, :3] = 1
        logp = torch.zeros(1, width)
        ref = torch.full((1, width), -math.log(2))
        loss, diag = policy_loss(logp, logp, torch.ones(1, width), mask, agg="seq-mean-token-sum-norm",
                                 agg_normalizer=4096, ref_logp=ref, kl_coef=0.1, kl_type="k1",
                                 entropy=torch.full((1, width), 0.5), entropy_coef=0.01)
        assert float(loss) == pytest.approx(want, rel=1e-5), width
        assert float(diag["kl"]) == pytest.approx(3 * math.log(2) / 4096, rel=1e-5)
