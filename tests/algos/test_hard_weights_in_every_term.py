"""docs/algorithm.md: hard attribution's 1/d loss weights (the weighted mask) act on the KL and
entropy terms and on GSPO's sequence ratio too, not only on the policy term (hand values)."""

from __future__ import annotations

import math

import pytest
import torch

from arpo.algos.losses import gspo_sequence_ratio, policy_loss


def test_gspo_sequence_ratio_is_a_weighted_geometric_mean():
    # log-ratios 0.3 on a token shared by 2 trajectories (weight 1/2) and 0.9 on an own token (weight 1)
    logp, old = torch.tensor([[0.3, 0.9]]), torch.zeros(1, 2)
    s = gspo_sequence_ratio(logp, old, torch.tensor([[0.5, 1.0]]))
    assert s.item() == pytest.approx(math.exp((0.5 * 0.3 + 0.9) / 1.5))  # unweighted: exp(0.6)


def test_kl_and_entropy_terms_read_the_weighted_mask():
    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]])
    w = torch.tensor([[0.5, 1.0]])
    ent = torch.tensor([[2.0, 0.5]])
    zero = torch.zeros(1, 2)
    _, diag = policy_loss(logp, logp.detach(), zero, w, ref_logp=ref, kl_coef=0.1, kl_type="k1", entropy=ent,
                          entropy_coef=0.01)
    # token-mean over the weights: k1 = log π − log π_ref = (0.5, 0); entropy (2, 0.5)
    assert diag["kl"].item() == pytest.approx((0.5 * 0.5 + 1.0 * 0.0) / 1.5)
    assert diag["entropy"].item() == pytest.approx((0.5 * 2.0 + 1.0 * 0.5) / 1.5)
    assert diag["loss"].item() == pytest.approx(0.1 * 0.25 / 1.5 - 0.01 * 1.5 / 1.5)  # pg term 0 (advantage 0)
