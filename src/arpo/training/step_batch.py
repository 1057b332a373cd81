"""From a step's scored rollout trees to what the loss reads (spec §3, §4): trajectory advantages
(group- or batch-normalized), per-token advantages (soft or hard attribution over shared prefixes),
the tree-packed TreeBatch, the behaviour policy's log-probs, the loss function and the mini-batch
order. Pure functions of their inputs; the trainer (training/trainer.py) calls them in order."""

from __future__ import annotations

import torch

from arpo.algos.advantages import compute_advantages, hard_attribution, hard_attribution_weights, soft_attribution
from arpo.algos.losses import masked_mean, policy_loss, truncated_is_weight
from arpo.errors import ArpoError
from arpo.training.batch import TreeBatch, rollout_logprobs


def step_advantages(trees, preset, gather=None, rank: int = 0) -> list[torch.Tensor]:
    """Trajectory advantages of a step, one (M_t,) tensor per tree (spec §3). The estimator sees the
    whole step at once, one group per tree: group estimators (GRPO, Dr.GRPO) normalize within each
    tree, batch estimators (REINFORCE++) over every trajectory of the step. `gather`
    (training.distributed.gather) adds the other ranks' trees in global order, so a step on W ranks
    normalizes over the same batch as one process; `rank`: this process's place in that order."""
    mine = [[t.reward for t in tr.trajectories] for tr in trees]
    roots = [tree_roots(tr) for tr in trees]  # the global sample each trajectory grew from
    parts = gather(mine) if gather is not None else [mine]  # every rank joins, with or without trees
    root_parts = gather(roots) if gather is not None else [roots]
    flat = [(g, r) for g, r in enumerate(tree for part in parts for tree in part) for r in r]
    if not flat:
        return []
    width = 1 + max(len(x) for part in parts for x in part)  # (tree g, root k) -> one id per tree of a prompt
    root_ids = [g * width + int(k) for g, ks in enumerate(x for part in root_parts for x in part) for k in ks]
    adv = compute_advantages(preset.advantage_estimator, torch.tensor([r for _, r in flat], dtype=torch.float64),
                             [g for g, _ in flat], root_ids)
    first = sum(len(tree) for part in parts[:rank] for tree in part)  # this rank's trajectories start here
    out, at = [], first
    for rewards in mine:
        out.append(adv[at : at + len(rewards)])
        at += len(rewards)
    return out


def tree_roots(tree) -> list[int]:
    """For each trajectory of a rollout tree, the index of the global sample it descends from."""
    parents = [t.parent_id for t in tree.trajectories]

    def root(i: int) -> int:
        while parents[i] is not None:
            i = parents[i]
        return i

    return [root(i) for i in range(len(parents))]


def token_advantages(tree, adv: torch.Tensor, attribution: str) -> list[torch.Tensor]:
    """Per-token advantages of each trajectory of one tree from its trajectory advantages (spec §3)."""
    lengths = [len(t.traj.response_ids) for t in tree.trajectories]
    if attribution == "hard":
        return hard_attribution(adv, tree.parents, tree.branch_at, lengths)
    return soft_attribution(adv, lengths)


def build_batch(trees, preset, advantages: list[torch.Tensor] | None = None):
    """The step's TreeBatch with per-token advantages; `advantages`: step_advantages(trees, ...)
    (computed here, for one process, when not given). Hard attribution also weights the loss mask:
    1/d on a token shared by d trajectories (algos.advantages.hard_attribution_weights); a trajectory's
    loss_weight (0: the overlong filter dropped it) scales its row."""
    layouts = [tr.to_training() for tr in trees]
    batch = TreeBatch.from_trees([t for t, _ in layouts], [m for _, m in layouts])
    adv = torch.zeros(batch.mask.shape)
    advantages = step_advantages(trees, preset) if advantages is None else advantages
    for ti, (tr, a_traj) in enumerate(zip(trees, advantages, strict=True)):
        for i, a in enumerate(token_advantages(tr, a_traj, preset.attribution)):
            adv[batch.rows[(ti, i)], : len(a)] = a
    batch.advantages = adv
    for ti, tr in enumerate(trees):  # a trajectory the overlong filter dropped trains no token (loss_weight 0)
        for i, t in enumerate(tr.trajectories):
            if t.loss_weight != 1.0:
                batch.mask[batch.rows[(ti, i)]] *= t.loss_weight
    if preset.attribution == "hard":  # each shared token counted once: its d copies weigh 1/d each
        for ti, tr in enumerate(trees):
            lengths = [len(t.traj.response_ids) for t in tr.trajectories]
            for i, w in enumerate(hard_attribution_weights(tr.parents, tr.branch_at, lengths)):
                batch.mask[batch.rows[(ti, i)], : len(w)] *= w
    return batch


def use_rollout_logprobs(cfg, model) -> bool:
    """Whether old_logp comes from the engine's records (see TrainConfig.old_logprobs). Never one step
    off-policy: π_old is then the current weights (recomputed), the records are π_behav (the version
    that generated the tree, training/pipeline.py)."""
    if cfg.rollout.max_off_policy_steps > 0:
        return False
    if cfg.old_logprobs != "auto":
        return cfg.old_logprobs == "rollout"
    exact = cfg.agent.top_p >= 1.0 and cfg.agent.top_k == 0 and cfg.agent.temperature > 0
    return cfg.engine == "hf" and exact and next(model.parameters()).dtype == torch.float32


def old_logprobs_from_rollout(trees, batch):
    """batch.old_logp and the old entropies from the trajectories' engine records."""
    vals = {(ti, i): (t.traj.logprobs, t.traj.entropies) for ti, tr in enumerate(trees)
            for i, t in enumerate(tr.trajectories)}
    return rollout_logprobs(batch, vals)


def weight_lagged_tokens(batch, behav_logp: torch.Tensor | None, rollout) -> dict:
    """One step off-policy (rollout.max_off_policy_steps > 0, training/pipeline.py): scale each token's
    advantage by the truncated importance weight w = min(π_old/π_behav, C), C = rollout.off_policy_is_cap
    (algos/losses.truncated_is_weight; batch.old_logp is π_old, `behav_logp` the engine's records).
    Returns is_weight_mean and is_weight_capped_frac; synchronous runs: nothing changes, {}."""
    if not rollout.max_off_policy_steps:
        return {}
    cap = rollout.off_policy_is_cap
    if behav_logp is None or batch.old_logp is None:
        raise ArpoError("rollout.max_off_policy_steps: the engine recorded no log-probs, so the truncated "
                        "importance weight min(π_old/π_behav, C) cannot be computed: set it to 0")
    bad = mask_nonfinite(batch, behav_logp)
    w = truncated_is_weight(batch.old_logp, behav_logp, batch.mask, cap)
    batch.advantages = batch.advantages * w
    valid = (batch.mask > 0).float()
    return {"is_weight_mean": float(masked_mean(w, valid)),
            "is_weight_capped_frac": float(masked_mean((w >= cap).float(), valid)), "behaviour_nonfinite_tokens": bad}


def mask_nonfinite(batch, logp: torch.Tensor) -> int:
    """Response tokens whose recorded log-prob (the engine's π_behaviour) is NaN or infinite leave the loss:
    their mask becomes 0 and the value 0, so no NaN reaches a weight, a ratio or a gradient. Returns how many
    (the step's metric behaviour_nonfinite_tokens)."""
    bad = (batch.mask > 0) & ~torch.isfinite(logp)
    n = int(bad.sum())
    if n:
        batch.mask = batch.mask.masked_fill(bad, 0)
        logp.masked_fill_(bad, 0.0)
    return n


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
