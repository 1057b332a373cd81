"""Policy-gradient losses: clipped surrogate and its variants, aggregations, KL, entropy (spec §4, §7).

Pure tensor functions over padded (B, T) tensors, B sequences of T response positions:
`logp` (current policy, carries gradient), `old_logp` (behaviour policy that sampled the tokens),
`advantages`, and `mask` (1 on tokens the model generated, 0 on tool results and padding; spec §1).

    ρ_t = π_θ(o_t | ·) / π_old(o_t | ·)
    L   = − agg_t [ min(ρ_t Â_t, clip(ρ_t, 1 − ε_low, 1 + ε_high) Â_t) ] + β_KL · KL(π_θ ‖ π_ref)

Every variant is a name in a table: POLICY_LOSSES ("ppo_clip", "gspo", "entropy_balanced"),
AGGREGATIONS (the four modes) and KL_ESTIMATORS (k1, k2, k3, low_var_kl). `policy_loss`
composes them from plain arguments.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Diagnostics = dict[str, torch.Tensor]

LOG_RATIO_LIMIT = 20.0  # exp(±20) keeps ρ finite for float32; real ratios are near 1


# --------------------------------------------------------------------------------------------
# Aggregations (spec §4: the four loss aggregations)
# --------------------------------------------------------------------------------------------


def _seq_valid(mask: torch.Tensor) -> torch.Tensor:
    return (mask.sum(-1) > 0).to(mask.dtype)  # (B,) sequences with at least one loss token


def _mean_over_seqs(per_seq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    valid = _seq_valid(mask)  # (B,)
    return (per_seq * valid).sum() / valid.sum().clamp_min(1)


def token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None) -> torch.Tensor:
    """Mean over every valid token of the batch (DAPO's token-level loss; ARPO's default).
    (B, T), (B, T) -> ()"""
    mask = mask.to(loss_mat.dtype)
    return (loss_mat * mask).sum() / mask.sum().clamp_min(1)


def seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None) -> torch.Tensor:
    """Sum over each sequence's valid tokens, then mean over sequences. (B, T), (B, T) -> ()"""
    mask = mask.to(loss_mat.dtype)
    return _mean_over_seqs((loss_mat * mask).sum(-1), mask)


def seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None) -> torch.Tensor:
    """Mean over each sequence's valid tokens, then mean over sequences (original GRPO's
    1/|o_i| weighting). (B, T), (B, T) -> ()"""
    mask = mask.to(loss_mat.dtype)
    per_seq = (loss_mat * mask).sum(-1) / mask.sum(-1).clamp_min(1)  # (B,)
    return _mean_over_seqs(per_seq, mask)


def seq_mean_token_sum_norm(
    loss_mat: torch.Tensor, mask: torch.Tensor, normalizer: float | None = None
) -> torch.Tensor:
    """Dr.GRPO (arXiv 2503.20783): sum over each sequence's valid tokens divided by a constant
    `normalizer`, then mean over sequences. The constant should be the same for every batch
    (Dr.GRPO uses the maximum generation length, i.e. `max_response_tokens`); None falls back to
    T = loss_mat.shape[-1], which is only constant when batches are padded to a fixed length.
    (B, T), (B, T) -> ()"""
    mask = mask.to(loss_mat.dtype)
    norm = float(loss_mat.shape[-1] if normalizer is None else normalizer)
    if norm <= 0:
        raise ValueError(f"seq-mean-token-sum-norm normalizer must be > 0, got {norm}")
    return _mean_over_seqs((loss_mat * mask).sum(-1) / norm, mask)


# Sequence means count only sequences with at least one valid token, so all-padding rows of a
# micro-batch do not dilute the loss. Every function: (loss_mat, mask, normalizer=None) -> ()
AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "token-mean": token_mean,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}


def aggregate(
    loss_mat: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean", normalizer: float | None = None
) -> torch.Tensor:
    """Reduce a per-token loss with the aggregation named `agg`. (B, T), (B, T) -> ()"""
    return _lookup(AGGREGATIONS, agg, "aggregation")(loss_mat, mask, normalizer)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over mask-1 entries; 0 when there are none. (B, T), (B, T) -> ()"""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp_min(1)


def _lookup(table: dict, name: str, what: str):
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; valid: {sorted(table)}")
    return table[name]


# --------------------------------------------------------------------------------------------
# Ratios
# --------------------------------------------------------------------------------------------


def token_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """ρ_t = exp(log π_θ − log π_old), log-ratio clamped to ±20 for finiteness. (B, T) -> (B, T)"""
    return torch.exp((logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def gspo_sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO (arXiv 2507.18071) sequence ratio: the geometric mean of the token ratios over valid
    tokens, `s_i = exp( (1/|o_i|) Σ_t mask·(log π_θ − log π_old) )`. Fully masked rows give 1.
    (B, T), (B, T), (B, T) -> (B,)"""
    mask = mask.to(logp.dtype)
    mean_log = ((logp - old_logp) * mask).sum(-1) / mask.sum(-1).clamp_min(1)  # (B,)
    return torch.exp(mean_log.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def gspo_token_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token form: `s_{i,t} = sg(s_i) · π_θ(o_t) / sg(π_θ(o_t))`. Its value is s_i at every
    position (so clipping acts on whole sequences) and its gradient is s_i·∇log π_θ(o_t), which
    with seq-mean-token-mean aggregation equals GSPO's sequence gradient and also accepts
    per-token advantages. (B, T) x3 -> (B, T)"""
    log_s = torch.log(gspo_sequence_ratio(logp, old_logp, mask)).detach()  # (B,)
    return torch.exp(log_s[:, None] + logp - logp.detach())


def truncated_is_weight(old_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor,
                        cap: float = 2.0) -> torch.Tensor:
    """Truncated importance weight of decoupled PPO (Hilton et al. 2021; AReaL, verl) for tokens that
    an older policy version sampled (one step off-policy, training/pipeline.py):

        w_t = min(π_old(o_t) / π_behav(o_t), C) = min(exp(log π_old − log π_behav), C)

    π_behav generated the token (its log-prob recorded by the engine), π_old is the current pre-update
    policy (the PPO ratio ρ_t = π_θ/π_old is taken against it). The loss term of token t is scaled by
    the constant w_t: −w_t·min(ρ_t Â_t, clip(ρ_t) Â_t) = −min(ρ_t (w_t Â_t), clip(ρ_t)(w_t Â_t)) since
    w_t > 0, so the trainer passes w_t·Â_t as the advantage. Tokens off the mask get 1. No gradient.
    (B, T) x3 -> (B, T)"""
    log_w = (old_logp - behav_logp).detach().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    w = torch.exp(log_w).clamp(max=cap)
    return torch.where(mask > 0, w, torch.ones_like(w))


# --------------------------------------------------------------------------------------------
# Clipped surrogate (spec §4) and AEPO's entropy-balanced clipping (spec §7)
# --------------------------------------------------------------------------------------------


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    keep_clipped_gradient: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped loss with DAPO clip-higher and dual clip. (B, T), (B, T) -> (B, T)

        pg_loss1 = −Â·ρ
        pg_loss2 = −Â·clip(ρ, 1 − ε_low, 1 + ε_high)
        pg_loss  = max(pg_loss1, pg_loss2)                       (= −min(ρÂ, clip(ρ)Â))
        Â < 0:   pg_loss = min(pg_loss, −c·Â)                    (dual clip, c > 1)

    `max(pg_loss1, pg_loss2)` picks pg_loss2 exactly on the *clipped* tokens: Â > 0 with
    ρ > 1 + ε_high (clipped high) and Â < 0 with ρ < 1 − ε_low (clipped low); there the loss is a
    constant and the gradient 0. The dual clip (arXiv 1912.09729, as in verl) bounds the loss of a
    negative-advantage token whose ratio exploded: for Â < 0 the clipped loss is |Â|·max(ρ, clip ρ),
    which exceeds c·|Â| iff ρ > c, so those tokens get the constant c·|Â| (gradient 0).
    The selection is written with `torch.where` on these regions so ties send the gradient to the
    unclipped branch rather than splitting it.

    keep_clipped_gradient: AEPO entropy-balanced clipping (spec §7). Clipped-high tokens use
    `ρ · sg((1 + ε_high)/ρ)` in place of the constant: same value 1 + ε_high, gradient
    (1 + ε_high)·∇log π, so the loss gradient is exactly −(1 + ε_high)·Â·∇log π instead of 0.
    Returns the per-token loss and boolean region masks (clipped_high, clipped_low, dual_clipped).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip}")
    pos, neg = advantages > 0, advantages < 0
    clipped_high = pos & (ratio > 1 + clip_high)  # (B, T)
    clipped_low = neg & (ratio < 1 - clip_low)  # (B, T)
    pg_loss1 = -advantages * ratio  # (B, T)
    clipped_ratio = ratio.clamp(1 - clip_low, 1 + clip_high)  # (B, T)
    if keep_clipped_gradient:
        # value (1 + ε_high), gradient (1 + ε_high)·∇log π: the stop-gradient rescaling trick
        rescaled = ratio * ((1 + clip_high) / ratio).detach()
        clipped_ratio = torch.where(clipped_high, rescaled, clipped_ratio)
    pg_loss2 = -advantages * clipped_ratio  # (B, T)
    pg_loss = torch.where(clipped_high | clipped_low, pg_loss2, pg_loss1)  # (B, T)
    dual_clipped = torch.zeros_like(pos)
    if dual_clip is not None:
        dual_clipped = neg & (ratio > dual_clip)
        pg_loss3 = -advantages * dual_clip  # constant: no gradient through ρ
        pg_loss = torch.where(dual_clipped, pg_loss3, pg_loss)
    regions = {"clipped_high": clipped_high, "clipped_low": clipped_low, "dual_clipped": dual_clipped}
    return pg_loss, regions


def _diagnostics(
    ratio: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, regions: dict
) -> Diagnostics:
    """Detached scalars: clip fractions over valid tokens, approx KL(π_old ‖ π_θ), ratio mean."""
    m = mask.float()
    log_r = (logp - old_logp).detach().float().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)

    def frac(region: torch.Tensor) -> torch.Tensor:
        return masked_mean(region.float(), m)

    return {
        "clip_frac": frac(regions["clipped_high"] | regions["clipped_low"]),
        "clip_frac_high": frac(regions["clipped_high"]),
        "clip_frac_low": frac(regions["clipped_low"]),
        "dual_clip_frac": frac(regions["dual_clipped"]),
        # k3 estimator of KL(π_old ‖ π_θ) from π_old's samples (CleanRL's approx_kl): ≥ 0, low variance
        "approx_kl": masked_mean(torch.expm1(log_r) - log_r, m),
        "ratio_mean": masked_mean(ratio.detach().float(), m),
    }


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
    agg_normalizer: float | None = None,
) -> tuple[torch.Tensor, Diagnostics]:
    """ARPO / GRPO / DAPO clipped surrogate with token ratios (spec §4). (B, T) x4 -> (), diagnostics"""
    ratio = token_ratio(logp, old_logp)
    pg_loss, regions = clipped_surrogate(ratio, advantages, clip_low, clip_high, dual_clip)
    return aggregate(pg_loss, mask, agg, agg_normalizer), _diagnostics(ratio, logp, old_logp, mask, regions)


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    dual_clip: float | None = None,
    agg: str = "seq-mean-token-mean",
    agg_normalizer: float | None = None,
) -> tuple[torch.Tensor, Diagnostics]:
    """GSPO (arXiv 2507.18071): the clipped surrogate on the sequence ratio (GSPO-token form), with
    GSPO's own, much tighter clip range (paper: 3e-4 / 4e-4) since s_i is a per-token geometric
    mean. Clip fractions therefore count tokens of clipped sequences. (B, T) x4 -> (), diagnostics"""
    ratio = gspo_token_ratio(logp, old_logp, mask)
    pg_loss, regions = clipped_surrogate(ratio, advantages, clip_low, clip_high, dual_clip)
    return aggregate(pg_loss, mask, agg, agg_normalizer), _diagnostics(ratio, logp, old_logp, mask, regions)


def entropy_balanced_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
    agg_normalizer: float | None = None,
) -> tuple[torch.Tensor, Diagnostics]:
    """AEPO entropy-balanced clipping (spec §7): as `ppo_clip_loss`, but upper-clipped tokens keep
    the gradient (1 + ε_high)·Â·∇log π (stop-gradient clip) instead of zero; loss values are
    unchanged. Lower-clipped and dual-clipped tokens still get zero gradient.
    (B, T) x4 -> (), diagnostics"""
    ratio = token_ratio(logp, old_logp)
    pg_loss, regions = clipped_surrogate(ratio, advantages, clip_low, clip_high, dual_clip, keep_clipped_gradient=True)
    return aggregate(pg_loss, mask, agg, agg_normalizer), _diagnostics(ratio, logp, old_logp, mask, regions)


# name -> f(logp, old_logp, advantages, mask, *, clip_low, clip_high, dual_clip, agg, agg_normalizer)
POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, Diagnostics]]] = {
    "ppo_clip": ppo_clip_loss,
    "gspo": gspo_loss,
    "entropy_balanced": entropy_balanced_loss,
}


# --------------------------------------------------------------------------------------------
# KL to the reference policy and entropy bonus
# --------------------------------------------------------------------------------------------
# Schulman's estimators of KL(π_θ ‖ π_ref) from tokens sampled by (approximately) π_θ,
# with log r = log π_ref − log π_θ. Each: (B, T), (B, T) -> (B, T).


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log π_θ − log π_ref = −log r: unbiased, high variance, can be negative."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log π_θ − log π_ref)²: biased, low variance, ≥ 0."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = r − 1 − log r, r = π_ref/π_θ: unbiased, low variance, ≥ 0."""
    log_r = ref_logp - logp
    return torch.expm1(log_r) - log_r


def kl_low_var(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """low_var_kl (spec §4, the reference's estimator): k3 with log r clamped to ±20 and the result
    clamped to [−10, 10] so one far-off token cannot dominate."""
    log_r = (ref_logp - logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return (torch.expm1(log_r) - log_r).clamp(-10.0, 10.0)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
    "low_var_kl": kl_low_var,
}


def kl_divergence(
    logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, kind: str = "low_var_kl", agg: str = "token-mean",
    normalizer: float | None = None,
) -> torch.Tensor:
    """KL(π_θ ‖ π_ref) estimated per token with `kind`, reduced with `agg` (and its `normalizer`, the
    constant of seq-mean-token-sum-norm). (B, T) x3 -> ()"""
    return aggregate(_lookup(KL_ESTIMATORS, kind, "KL estimator")(logp, ref_logp), mask, agg, normalizer)


def entropy_bonus(
    entropy: torch.Tensor, mask: torch.Tensor, coef: float = 0.0, agg: str = "token-mean",
    normalizer: float | None = None,
) -> torch.Tensor:
    """Entropy bonus as a loss term: `−coef · agg(H)`, so minimizing the loss raises entropy.
    ARPO uses coef 0 (spec §4). entropy (B, T), mask (B, T) -> ()"""
    if coef == 0.0:
        return entropy.new_zeros(())
    return -coef * aggregate(entropy, mask, agg, normalizer)


# --------------------------------------------------------------------------------------------
# The composed loss
# --------------------------------------------------------------------------------------------


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "ppo_clip",
    agg: str = "token-mean",
    agg_normalizer: float | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_type: str = "low_var_kl",
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> tuple[torch.Tensor, Diagnostics]:
    """Total loss = policy term (POLICY_LOSSES[loss_type]) + β_KL·KL + entropy bonus (spec §4).

    Defaults are ARPO's reference settings. KL and entropy terms use the same aggregation as the
    policy term, with the same `agg_normalizer` (with seq-mean-token-sum-norm and a constant, no term
    depends on the padded width). `entropy` (B, T) is needed only when entropy_coef != 0 (it is logged when given);
    `ref_logp` only when kl_coef != 0 (KL is logged whenever it is given).
    (B, T) x4 -> total loss (), diagnostics of detached scalars
    """
    pg, diag = _lookup(POLICY_LOSSES, loss_type, "policy loss")(
        logp, old_logp, advantages, mask,
        clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, agg=agg, agg_normalizer=agg_normalizer,
    )  # fmt: skip
    diag["pg_loss"] = pg.detach()
    total = pg
    if ref_logp is not None:
        kl = kl_divergence(logp, ref_logp, mask, kl_type, agg, agg_normalizer)
        diag["kl"] = kl.detach()
        total = total + kl_coef * kl
    elif kl_coef != 0.0:
        raise ValueError(f"policy_loss with kl_coef={kl_coef} needs ref_logp")
    if entropy is not None:
        diag["entropy"] = aggregate(entropy.detach(), mask, agg, agg_normalizer)
        total = total + entropy_bonus(entropy, mask, entropy_coef, agg, agg_normalizer)
    elif entropy_coef != 0.0:
        raise ValueError(f"policy_loss with entropy_coef={entropy_coef} needs entropy")
    diag["loss"] = total.detach()
    return total, diag
