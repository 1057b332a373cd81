"""From a step's scored rollout trees to what the loss reads (spec §3, §4): trajectory advantages
(group- or batch-normalized), per-token advantages (soft or hard attribution over shared prefixes),
the tree-packed TreeBatch, the behaviour policy's log-probs, the loss function and the mini-batch
order. Pure functions of their inputs; the trainer (training/trainer.py) calls them in order."""

from __future__ import annotations

import torch

from arpo.algos.advantages import compute_advantages, hard_attribution, soft_attribution
from arpo.algos.losses import policy_loss
from arpo.training.batch import TreeBatch, rollout_logprobs


def step_advantages(trees, preset, gather=None, rank: int = 0) -> list[torch.Tensor]:
    """Trajectory advantages of a step, one (M_t,) tensor per tree (spec §3). The estimator sees the
    whole step at once, one group per tree: group estimators (GRPO, Dr.GRPO) normalize within each
    tree, batch estimators (REINFORCE++) over every trajectory of the step. `gather`
    (training.distributed.gather) adds the other ranks' trees in global order, so a step on W ranks
    normalizes over the same batch as one process; `rank`: this process's place in that order."""
    mine = [[t.reward for t in tr.trajectories] for tr in trees]
    parts = gather(mine) if gather is not None else [mine]  # every rank joins, with or without trees
    flat = [(g, r) for g, r in enumerate(tree for part in parts for tree in part) for r in r]
    if not flat:
        return []
    adv = compute_advantages(preset.advantage_estimator, torch.tensor([r for _, r in flat], dtype=torch.float64),
                             [g for g, _ in flat])
    first = sum(len(tree) for part in parts[:rank] for tree in part)  # this rank's trajectories start here
    out, at = [], first
    for rewards in mine:
        out.append(adv[at : at + len(rewards)])
        at += len(rewards)
    return out


def token_advantages(tree, adv: torch.Tensor, attribution: str) -> list[torch.Tensor]:
    """Per-token advantages of each trajectory of one tree from its trajectory advantages (spec §3)."""
    lengths = [len(t.traj.response_ids) for t in tree.trajectories]
    if attribution == "hard":
        return hard_attribution(adv, tree.parents, tree.branch_at, lengths)
    return soft_attribution(adv, lengths)


def build_batch(trees, preset, advantages: list[torch.Tensor] | None = None):
    """The step's TreeBatch with per-token advantages; `advantages`: step_advantages(trees, ...)
    (computed here, for one process, when not given)."""
    layouts = [tr.to_training() for tr in trees]
    batch = TreeBatch.from_trees([t for t, _ in layouts], [m for _, m in layouts])
    adv = torch.zeros(batch.mask.shape)
    advantages = step_advantages(trees, preset) if advantages is None else advantages
    for ti, (tr, a_traj) in enumerate(zip(trees, advantages)):
        for i, a in enumerate(token_advantages(tr, a_traj, preset.attribution)):
            adv[batch.rows[(ti, i)], : len(a)] = a
    batch.advantages = adv
    return batch


def use_rollout_logprobs(cfg, model) -> bool:
    """Whether old_logp comes from the engine's records (see TrainConfig.old_logprobs)."""
    if cfg.old_logprobs != "auto":
        return cfg.old_logprobs == "rollout"
    exact = cfg.agent.top_p >= 1.0 and cfg.agent.top_k == 0 and cfg.agent.temperature > 0
    return cfg.engine == "hf" and exact and next(model.parameters()).dtype == torch.float32


def old_logprobs_from_rollout(trees, batch):
    """batch.old_logp and the old entropies from the trajectories' engine records."""
    vals = {(ti, i): (t.traj.logprobs, t.traj.entropies) for ti, tr in enumerate(trees)
            for i, t in enumerate(tr.trajectories)}
    return rollout_logprobs(batch, vals)


def make_loss_fn(batch, preset, agg_normalizer: float | None = None):
    """agg_normalizer: overrides preset.agg_normalizer (a distributed run passes the global width)."""
    norm = preset.agg_normalizer if agg_normalizer is None else agg_normalizer

    def fn(logp, ent):
        return policy_loss(
            logp, batch.old_logp, batch.advantages, batch.mask, loss_type=preset.loss_type, agg=preset.loss_agg,
            agg_normalizer=norm, clip_low=preset.clip_low, clip_high=preset.clip_high,
            dual_clip=preset.dual_clip, ref_logp=batch.ref_logp, kl_coef=preset.kl_coef, kl_type=preset.kl_type,
            entropy=ent, entropy_coef=preset.entropy_coef,
        )

    return fn


def minibatch_order(n_trees: int, minibatches: int, seed: int, step: int, epoch: int) -> list[list[int]]:
    """Mini-batches of (global) tree indices."""
    g = torch.Generator().manual_seed(seed * 7_000_003 + step * 131 + epoch)
    order = torch.randperm(n_trees, generator=g).tolist()
    return [order[k::minibatches] for k in range(minibatches) if order[k::minibatches]]
