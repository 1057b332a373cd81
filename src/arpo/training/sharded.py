"""What a training step does differently on W ranks (torchrun, docs/scaling.md), kept out of the step.

The trainer (training/trainer.py) talks to a comm, `Trainer.comm`: `LocalComm` (one process) makes every call
the identity, so the single-process step reads top to bottom; `ShardedComm` does the collectives
that make a step on W ranks compute the one-process step:

* rank r rolls out its contiguous slice of the step's global prompt list (`shard`);
* rollout metrics and advantages see every rank's trajectories, in global order (`all_stats`, `gather`);
* mini-batches are the same global groups of trees: `kept` says how many trees there are and where
  this rank's start; each rank scales its loss by its share of the global mini-batch's loss
  denominator (`loss_share`) and the summed gradients are the one-process gradient;
* diagnostics and times are reduced over ranks (`diagnostics`, `slowest`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from arpo.algos.advantages import entropy_aware_advantage
from arpo.training import distributed

# loss aggregation -> its denominator over a batch (algos/losses.py): valid tokens, or valid sequences
LOSS_DENOMINATORS = {
    "token-mean": lambda mask: float(mask.sum()),
    "seq-mean-token-sum": lambda mask: float((mask.sum(-1) > 0).sum()),
    "seq-mean-token-mean": lambda mask: float((mask.sum(-1) > 0).sum()),
    "seq-mean-token-sum-norm": lambda mask: float((mask.sum(-1) > 0).sum()),
}
LOSS_LIKE_DIAGS = ("loss", "pg_loss", "kl", "entropy")  # aggregated like the loss; other diagnostics are token means


class LocalComm:
    """One process: the step's data is all here, every reduction is the identity."""

    rank, multi, is_main = 0, False, True
    gather: Callable[[Any], list] | None = None  # step_advantages needs no other ranks' rewards

    def shard(self, n: int) -> range:
        return range(n)

    def total(self, x):
        return x

    def all_stats(self, stats: list) -> list:
        return stats

    def per_rank(self, x) -> list:
        """A value of every rank (anything picklable: numbers, tuples, lists), in rank order."""
        return [x]

    def kept(self, n_trees: int) -> tuple[int, int]:
        """(trees in the step, index of this rank's first tree)."""
        counts = self.per_rank(n_trees)  # kept trees per rank, in global order
        return sum(counts), sum(counts[: self.rank])

    def entropy_aware(self, batch, old_ent, alpha: float) -> None:
        batch.advantages = entropy_aware_advantage(batch.advantages, old_ent, batch.mask, alpha)

    def loss_share(self, sub, preset):
        """(loss scale, aggregation normalizer override, what `diagnostics` needs)."""
        return 1.0, None, None

    def diagnostics(self, share, diag: dict | None) -> dict | None:
        return diag

    def slowest(self, times: dict) -> dict:
        return times

    def barrier(self) -> None:
        """Every rank got here (one process: nothing to wait for)."""


class ShardedComm(LocalComm):
    """One of W torchrun ranks (training/distributed.py holds the process group)."""

    multi = True

    def __init__(self):
        self.rank, self.is_main = distributed.rank(), distributed.is_main()
        self.gather = distributed.gather

    def shard(self, n: int) -> range:
        return distributed.shard(n)

    def total(self, x):
        return distributed.total(x)

    def all_stats(self, stats: list) -> list:
        return [s for part in distributed.gather(stats) for s in part]

    def per_rank(self, x) -> list:
        return distributed.gather(x)

    def barrier(self) -> None:
        distributed.barrier()

    def entropy_aware(self, batch, old_ent, alpha: float) -> None:
        if batch is None:  # no trees on this rank: it still joins the gather
            entropy_aware_advantage_global(None, None, None, alpha)
        else:
            batch.advantages = entropy_aware_advantage_global(batch.advantages, old_ent, batch.mask, alpha)

    def loss_share(self, sub, preset):
        den = LOSS_DENOMINATORS[preset.loss_agg](sub.mask) if sub else 0.0
        shares = distributed.gather((den, float(sub.mask.sum()) if sub else 0.0, sub.width if sub else 0))
        scale = den / max(sum(x[0] for x in shares), 1.0)
        norm = (preset.agg_normalizer if preset.agg_normalizer is not None
                else float(max(x[2] for x in shares)))  # the global padded width
        return scale, norm, shares

    def diagnostics(self, share, diag: dict | None) -> dict | None:
        return global_diagnostics([(x[0], x[1], d) for x, d in zip(share, distributed.gather(diag), strict=True)])

    def slowest(self, times: dict) -> dict:
        return dict(zip(times, distributed.all_reduce(list(times.values()), op="max"), strict=True))


def step_comm(multi: bool) -> LocalComm:
    return ShardedComm() if multi else LocalComm()


def global_diagnostics(parts: list[tuple[float, float, dict | None]]) -> dict:
    """Diagnostics of a global mini-batch from every rank's (loss denominator, valid tokens,
    diagnostics): loss-like values weighted by denominator shares, token means by token shares."""
    den = sum(p[0] for p in parts) or 1.0
    tok = sum(p[1] for p in parts) or 1.0
    keys = list(dict.fromkeys(k for _, _, d in parts if d for k in d))
    return {k: sum((n / den if k in LOSS_LIKE_DIAGS else t / tok) * d[k] for n, t, d in parts if d and k in d)
            for k in keys}


def entropy_aware_advantage_global(adv, ent, mask, alpha: float, eps: float = 1e-6):
    """algos.advantages.entropy_aware_advantage (AEPO) with the entropy mean and std taken over the
    valid tokens of every rank's trees (gathered in global order: the same numbers, in the same
    order, as one process sees). adv None: this rank has no trees (it joins the gather)."""
    if adv is None or ent is None or mask is None:
        distributed.gather(torch.zeros(0))
        return adv
    h = ent.detach().float()
    mine = h[mask.bool()]
    vals = torch.cat([v.cpu() for v in distributed.gather(mine.cpu())])
    if vals.numel() < 2:
        return adv
    z = torch.where(mask.bool(), (h - vals.mean().to(h.device)) / (vals.std().to(h.device) + eps), torch.zeros_like(h))
    return adv * (1 + alpha * z).to(adv.dtype)
