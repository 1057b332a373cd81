"""The order in which a run visits its data: a pure function of (seed, step), so resuming needs only
the step (sft and train draw their rows with it)."""

from __future__ import annotations

import torch


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).tolist()


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Rows of optimizer step `step` (a pure function: resuming needs only the step)."""
    per_epoch = max(1, (n + batch_size - 1) // batch_size)
    epoch, k = divmod(step, per_epoch)
    return epoch_order(n, seed, epoch)[k * batch_size : (k + 1) * batch_size]


def round_indices(n: int, k: int, seed: int, step: int, rnd: int, used: set[int]) -> list[int]:
    """Dataset rows of generation round `rnd` of step `step` (a pure function, so --resume repeats
    it). Round 0 is the step's own batch (batch_indices); DAPO's dynamic sampling adds rounds of
    k further rows, drawn from a permutation of its own and skipping rows this step already used
    (rows repeat only once all n are used)."""
    if rnd == 0:
        return batch_indices(n, k, seed, step)
    order = epoch_order(n, seed + 7_919 * rnd, step)
    fresh = [i for i in order if i not in used]
    return (fresh + [i for i in order if i in used])[:k]
