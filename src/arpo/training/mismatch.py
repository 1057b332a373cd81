"""Train–inference mismatch: how far the log-probs the rollout engine recorded while sampling are
from the training forward's log-probs of the same tokens under the same weights.

arpo owns both the sampler and the trainer, so on-policy the two should agree to float rounding
(fp32) and no importance correction is needed; a lagged tree (`rollout.max_off_policy_steps: 1`) gets
the truncated weight min(π_old/π_behaviour, C) (training/step_batch.py `weight_lagged_tokens`).
training/trainer.py's `policy_update` logs, every step, over the generated tokens of the mini-batch
trained before any update (all trees with `minibatches: 1`):

- `mismatch/kl`: mean of k3 = exp(d) − 1 − d, d = logp_train − logp_rollout, an unbiased, non-negative
  estimate of KL(rollout ‖ train) for tokens sampled from the rollout policy;
- `mismatch/max_abs`: max |d|;
- `mismatch/tokens`: how many tokens were compared.

(Rollouts whose logits a hook changes — scripted tests — record the hooked distribution, so their
mismatch is not the engine's.)
"""

from __future__ import annotations

import torch


def mismatch_sums(rollout_lp: torch.Tensor, train_lp: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """(sum of k3 terms, tokens, max |d|) over the tokens where mask > 0; all (B, T). float64, so
    k3 ≈ d²/2 does not cancel away for tiny d."""
    m = mask > 0
    d = (train_lp.detach().double() - rollout_lp.detach().to(train_lp.device).double())[m.to(train_lp.device)]
    if d.numel() == 0:
        return 0.0, 0.0, 0.0
    return float((torch.expm1(d) - d).sum()), float(d.numel()), float(d.abs().max())


def mismatch_metrics(parts: list[tuple[float, float, float]]) -> dict:
    """The logged metrics from per-rank (or per-mini-batch) sums."""
    n = sum(p[1] for p in parts)
    return {"mismatch/kl": sum(p[0] for p in parts) / max(n, 1.0), "mismatch/max_abs": max((p[2] for p in parts),
            default=0.0), "mismatch/tokens": n}
