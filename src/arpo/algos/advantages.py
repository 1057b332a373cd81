"""Advantages: outcome-reward normalization, tree attribution, AEPO's entropy-aware rescaling.

Pure tensor functions (spec §3, §7). Shapes: M trajectories of one prompt, N trajectories of a
batch, (B, T) padded token tensors. Advantages are targets, not parameters: nothing here is meant
to carry gradient.

Rollout trees are taken in a generic form so this module does not depend on the tree class:
trajectory i has `lengths[i]` response tokens, was forked from `parent[i]` (-1 for a global
sample) and shares its first `branch_at[i]` response tokens with that parent, i.e. its tokens
[0, branch_at[i]) *are* the parent's tokens [0, branch_at[i]) (the same nodes of the tree).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from arpo.plugins import resolve

IntsLike = torch.Tensor | Sequence[int]


# --------------------------------------------------------------------------------------------
# Outcome-reward normalization (spec §3, first paragraph; baselines of §4)
# --------------------------------------------------------------------------------------------


def group_normalize(rewards: torch.Tensor, std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO group advantage `Â_i = (R_i − mean(R)) / (std(R) + eps)` over the last dim (spec §3).

    `std` is the *unbiased* standard deviation (torch's default, correction=1), as the reference.
    `std=False` is Dr.GRPO (arXiv 2503.20783): `Â_i = R_i − mean(R)`, no division.
    A group of one has no baseline to compare against: its advantage is 0 (the unbiased std of
    one sample is undefined, and `R − mean` is 0 anyway). Statistics are computed in float64 and a
    group whose rewards are all equal gets exactly 0 (in float32 the mean of 16 × 0.7 misses 0.7 by
    one rounding step, and dividing that by std + 1e-6 gave ±0.1).
    rewards (..., G) -> (..., G) float32
    """
    r = rewards.double()
    if r.shape[-1] < 2:
        return torch.zeros_like(rewards, dtype=torch.float32)
    centered = _zero_if_constant(r - r.mean(dim=-1, keepdim=True), r.amax(-1, keepdim=True) == r.amin(-1, keepdim=True))
    if std:
        centered = centered / (r.std(dim=-1, keepdim=True) + eps)
    return centered.float()


def _zero_if_constant(centered: torch.Tensor, constant: torch.Tensor) -> torch.Tensor:
    """Exactly 0 where the rewards being compared are all equal (no signal, whatever the rounding)."""
    return torch.where(constant, torch.zeros_like(centered), centered)


def _group_index(group_ids: IntsLike) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense group index per sample (N,) and group sizes (K,) from arbitrary group ids."""
    ids = torch.as_tensor(group_ids)
    _, index = torch.unique(ids, return_inverse=True)
    return index, torch.bincount(index)


def grouped_normalize(
    rewards: torch.Tensor, group_ids: IntsLike, std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """`group_normalize` applied within each group of a flat batch, vectorized.

    Same conventions: unbiased std, groups of one get 0, float64 statistics, a group of equal
    rewards gets exactly 0. rewards (N,), group_ids (N,) -> (N,) float32
    """
    r = rewards.double()
    index, sizes = _group_index(group_ids)  # (N,), (K,)
    k = sizes.numel()
    mean = torch.zeros(k, dtype=r.dtype).index_add_(0, index, r) / sizes  # (K,)
    hi = torch.full((k,), -torch.inf, dtype=r.dtype).scatter_reduce(0, index, r, "amax")
    lo = torch.full((k,), torch.inf, dtype=r.dtype).scatter_reduce(0, index, r, "amin")
    centered = _zero_if_constant(r - mean[index], (hi == lo)[index])  # (N,)
    out = centered
    if std:
        sq = torch.zeros(k, dtype=r.dtype).index_add_(0, index, (r - mean[index]) ** 2)  # (K,)
        group_std = (sq / (sizes - 1).clamp_min(1)).sqrt()  # (K,) unbiased
        out = centered / (group_std[index] + eps)
    return torch.where(sizes[index] > 1, out, torch.zeros_like(out)).float()


def batch_normalize(
    rewards: torch.Tensor,
    group_ids: IntsLike | None = None,
    subtract_group_mean: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """REINFORCE++ (arXiv 2501.03262) batch-level normalization.

    Default (`subtract_group_mean=False`), REINFORCE++ proper: the baseline and the scale are the
    *global* batch mean and unbiased std over all N samples, `Â = (R − mean_N) / (std_N + eps)`;
    `group_ids` is then unused. With `subtract_group_mean=True` (REINFORCE++-baseline, for several
    samples per prompt) each reward first loses its own group's mean, then the centered values are
    divided by their batch std: `Â = (R − mean_g) / (std_N(R − mean_g) + eps)` (the centered
    values already have batch mean 0). A batch of one, or of equal rewards, gets 0 (float64 statistics).
    The batch is the whole step's batch: the training recipe calls this once over every tree (and
    every rank) of a step, never per prompt. Statistics are per *trajectory* (one value each);
    verl whitens per *token* (each reward repeated over the response's tokens), which weighs long
    trajectories more: docs/algorithm.md, "Advantages".
    rewards (N,), group_ids (N,) -> (N,) float32
    """
    r = rewards.double()
    if r.numel() < 2:
        return torch.zeros_like(rewards, dtype=torch.float32)
    if subtract_group_mean:
        if group_ids is None:
            raise ValueError("batch_normalize(subtract_group_mean=True) needs group_ids")
        centered = grouped_normalize(r, group_ids, std=False).double()
        # grouped_normalize zeroes singleton groups; REINFORCE++-baseline does the same (R − R = 0).
    else:
        centered = _zero_if_constant(r - r.mean(), r.max() == r.min())
    return (centered / (centered.std() + eps)).float()


# Advantage estimators: f(rewards (N,), group_ids (N,), root_ids (N,) | None) -> advantages (N,), one
# value per trajectory of the step's whole batch. group_ids: the prompt (tree) of each trajectory;
# root_ids: the global sample each trajectory descends from (itself for a global sample; forks
# share their root's id) — None means every trajectory is its own root.


def grpo_advantage(rewards: torch.Tensor, group_ids: IntsLike, root_ids: IntsLike | None = None) -> torch.Tensor:
    """GRPO / ARPO: `Â_i = (R_i − mean_g R) / (std_g R + 1e-6)`, per prompt g, unbiased std (spec §3)."""
    return grouped_normalize(rewards, group_ids, std=True)


def dr_grpo_advantage(rewards: torch.Tensor, group_ids: IntsLike, root_ids: IntsLike | None = None) -> torch.Tensor:
    """Dr.GRPO: `Â_i = R_i − mean_g R`, per prompt g, no std division."""
    return grouped_normalize(rewards, group_ids, std=False)


def reinforce_pp_advantage(rewards: torch.Tensor, group_ids: IntsLike, root_ids: IntsLike | None = None
                           ) -> torch.Tensor:
    """REINFORCE++: `Â_i = (R_i − mean_N R) / (std_N R + 1e-6)` over the whole batch, prompts ignored
    (per trajectory; verl per token: docs/algorithm.md)."""
    return batch_normalize(rewards, group_ids, subtract_group_mean=False)


def reinforce_pp_baseline_advantage(rewards: torch.Tensor, group_ids: IntsLike, root_ids: IntsLike | None = None
                                    ) -> torch.Tensor:
    """REINFORCE++-baseline: `c_i = R_i − mean_g R`, then `Â_i = c_i / (std_N c + 1e-6)` over the batch."""
    return batch_normalize(rewards, group_ids, subtract_group_mean=True)


def tree_grpo_advantage(rewards: torch.Tensor, group_ids: IntsLike, root_ids: IntsLike | None = None
                        ) -> torch.Tensor:
    """Tree-GRPO-style (arXiv 2509.21240): intra-tree plus inter-tree group-relative advantage,
    `Â_i = GRPO_{root(i)}(R)_i + GRPO_{g(i)}(R)_i`: normalized among the trajectories grown from the
    same global sample (its forks and itself), plus normalized over the prompt's whole group. A tree
    of one trajectory contributes 0 to its intra-tree term (no sibling to compare with), so without
    branching this is GRPO."""
    inter = grouped_normalize(rewards, group_ids, std=True)
    if root_ids is None:
        return inter
    return inter + grouped_normalize(rewards, root_ids, std=True)


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {
    "grpo": grpo_advantage,
    "dr_grpo": dr_grpo_advantage,
    "reinforce_pp": reinforce_pp_advantage,
    "reinforce_pp_baseline": reinforce_pp_baseline_advantage,
    "tree_grpo": tree_grpo_advantage,
}


def get_estimator(spec: str) -> Callable[..., torch.Tensor]:
    """An estimator by name (ADVANTAGE_ESTIMATORS) or your own as `module.path:function`, called as
    f(rewards, group_ids, root_ids)."""
    return resolve(spec, ADVANTAGE_ESTIMATORS, "advantage estimator")


def compute_advantages(name: str, rewards: torch.Tensor, group_ids: IntsLike, root_ids: IntsLike | None = None
                       ) -> torch.Tensor:
    """Apply the estimator `name` (get_estimator). (N,), (N,), (N,) -> (N,)"""
    if name not in ADVANTAGE_ESTIMATORS and ":" not in name:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {sorted(ADVANTAGE_ESTIMATORS)} "
                         "or module.path:function")
    adv = get_estimator(name)(rewards, group_ids, root_ids)
    if not isinstance(adv, torch.Tensor) or adv.shape != rewards.shape:
        raise ValueError(f"advantage estimator {name!r} must return a tensor of shape {tuple(rewards.shape)}")
    return adv.float()


# --------------------------------------------------------------------------------------------
# Attribution of trajectory advantages to tokens (spec §3)
# --------------------------------------------------------------------------------------------


def soft_attribution(adv: torch.Tensor, lengths: IntsLike) -> list[torch.Tensor]:
    """Soft attribution (spec §3, the default): every token of trajectory i gets its own `Â_i`,
    shared prefix included. adv (M,), lengths (M,) -> M tensors of shape (L_i,)"""
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    if adv.shape != lengths.shape:
        raise ValueError(f"adv {tuple(adv.shape)} and lengths {tuple(lengths.shape)} must both be (M,)")
    return [adv[i].expand(int(n)).clone() for i, n in enumerate(lengths.tolist())]


def _check_tree(parent: list[int], branch_at: list[int], lengths: list[int]) -> None:
    m = len(lengths)
    if not (len(parent) == len(branch_at) == m):
        raise ValueError(f"parent, branch_at, lengths must all have M={m} entries")
    for i, (p, b, n) in enumerate(zip(parent, branch_at, lengths, strict=True)):
        if n < 0:
            raise ValueError(f"trajectory {i}: negative length {n}")
        if p == -1:
            if b != 0:
                raise ValueError(f"trajectory {i} is a root (parent -1) but branch_at={b}, expected 0")
            continue
        if not 0 <= p < m or p == i:
            raise ValueError(f"trajectory {i}: parent {p} is not another trajectory index or -1")
        if not 0 <= b <= min(n, lengths[p]):
            raise ValueError(
                f"trajectory {i}: branch_at={b} must be in [0, min(own length {n}, parent length {lengths[p]})]"
            )
    for i in range(m):  # a chain longer than m steps must revisit a trajectory
        cur, steps = i, 0
        while cur != -1:
            cur, steps = parent[cur], steps + 1
            if steps > m:
                raise ValueError(f"parent links form a cycle through trajectory {i}")


def _token_owners(parent: list[int], branch_at: list[int], lengths: list[int]) -> list[torch.Tensor]:
    """owner[i][t]: the trajectory whose *own* segment contains token t of trajectory i (the
    oldest ancestor it is inherited from). Resolved parent-first, so each entry is one lookup."""
    owners: list[torch.Tensor | None] = [None] * len(lengths)

    def resolve(i: int) -> torch.Tensor:
        own = owners[i]
        if own is None:
            own = torch.full((lengths[i],), i, dtype=torch.long)  # (L_i,)
            if parent[i] != -1:
                b = branch_at[i]
                own[:b] = resolve(parent[i])[:b]
            owners[i] = own
        return own

    return [resolve(i) for i in range(len(lengths))]


def _shared_sums(
    adv: torch.Tensor, parent: list[int], branch_at: list[int], lengths: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of `Â_j` and count d over the trajectories j that share token t of trajectory a,
    for every (a, t). Returns (M, Lmax) sums and counts; only entries at t >= branch_at[a]
    (a's own segment) are meaningful."""
    m, lmax = len(lengths), max(lengths, default=0)
    # (a, reach, j): trajectory j holds a's tokens [0, reach). Walk each j up its fork chain once.
    pairs = []
    for j in range(m):
        cur, reach = j, lengths[j]
        pairs.append((j, reach, j))
        while parent[cur] != -1:
            reach = min(reach, branch_at[cur])  # below every fork point on the way up
            cur = parent[cur]
            pairs.append((cur, reach, j))
    rows, stops, who = torch.tensor(pairs, dtype=torch.long).reshape(-1, 3).unbind(-1)  # (P,) each
    starts = rows * (lmax + 1)  # flat index of (a, 0) in the (M, Lmax+1) difference buffers
    vals = adv.detach().to(torch.float64)[who]  # (P,) float64 keeps the running sums exact
    ones = torch.ones_like(vals)
    diff_sum = torch.zeros(m * (lmax + 1), dtype=torch.float64)
    diff_cnt = torch.zeros(m * (lmax + 1), dtype=torch.float64)
    diff_sum.index_add_(0, starts, vals).index_add_(0, starts + stops, -vals)
    diff_cnt.index_add_(0, starts, ones).index_add_(0, starts + stops, -ones)
    sums = diff_sum.view(m, lmax + 1).cumsum(-1)[:, :lmax]  # (M, Lmax)
    counts = diff_cnt.view(m, lmax + 1).cumsum(-1)[:, :lmax].round()  # (M, Lmax)
    return sums, counts


def _tree_lists(parent: IntsLike, branch_at: IntsLike, lengths: IntsLike) -> tuple[list[int], list[int], list[int]]:
    p, b, n = (torch.as_tensor(x, dtype=torch.long).tolist() for x in (parent, branch_at, lengths))
    _check_tree(p, b, n)
    return p, b, n


def token_share_counts(parent: IntsLike, branch_at: IntsLike, lengths: IntsLike) -> list[torch.Tensor]:
    """d per token: how many trajectories contain that very token (the same tree node), itself
    included. 1 on unshared tokens. parent, branch_at, lengths (M,) -> M tensors (L_i,) long"""
    p, b, n = _tree_lists(parent, branch_at, lengths)
    _, counts = _shared_sums(torch.zeros(len(n)), p, b, n)
    owners = _token_owners(p, b, n)
    return [counts[own, torch.arange(len(own))].long() for own in owners]


def hard_attribution(
    adv: torch.Tensor, parent: IntsLike, branch_at: IntsLike, lengths: IntsLike
) -> list[torch.Tensor]:
    """Hard attribution (spec §3): a token shared by d trajectories S gets
    `Â_shared = (1/d) Σ_{j∈S} Â_j`; tokens after the last branch point keep their own `Â_i`.
    The loss counts each shared token once: see hard_attribution_weights (the training batch
    weights its d copies by 1/d).

    Sharing is transitive through fork chains: token t of trajectory i is its parent's token t
    when t < branch_at[i], hence also the grandparent's if t < branch_at[parent], and so on, and it
    is shared by every sibling/descendant that inherited it the same way.

    Algorithm, a reduction over each node's descendants in O(M·depth + Σ L_i):
      1. Each token lives in exactly one trajectory's own segment (its *owner*: positions
         [branch_at[a], L_a) of trajectory a). Owners are resolved parent-first.
      2. A descendant j of a holds a's token t iff t < reach(j, a), the minimum branch_at along
         the fork chain from j up to a (j itself has reach L_j). Walking every j up its chain once
         records these (a, reach, Â_j) pairs; each adds Â_j (and 1) to a's positions [0, reach)
         through a difference array, and one cumsum per row gives Σ Â_j and d for every position.
      3. Token t of trajectory i reads mean = sum / d at (owner[i][t], t).
    adv (M,), parent (M,), branch_at (M,), lengths (M,) -> M tensors of shape (L_i,), adv's dtype
    """
    p, b, n = _tree_lists(parent, branch_at, lengths)
    if adv.shape != (len(n),):
        raise ValueError(f"adv must be (M,)=({len(n)},), got {tuple(adv.shape)}")
    sums, counts = _shared_sums(adv, p, b, n)
    mean = sums / counts.clamp_min(1)  # (M, Lmax)
    owners = _token_owners(p, b, n)
    return [mean[own, torch.arange(len(own))].to(adv.dtype) for own in owners]


def hard_attribution_weights(parent: IntsLike, branch_at: IntsLike, lengths: IntsLike) -> list[torch.Tensor]:
    """Loss weight of each token under hard attribution: `w = 1/d` on a token shared by d
    trajectories, 1 on unshared ones. The flat training batch holds a shared token once per
    trajectory (d rows); weighting each copy by 1/d counts the tree token once in the loss, with its
    one advantage `Â_shared`: its gradient is `Â_shared·∇log π` (token-mean: over the number of
    distinct tree tokens Σ w), where soft attribution gives `Σ_j Â_j·∇log π = d·Â_shared·∇log π`
    over Σ_i L_i row tokens. Without these weights hard attribution would equal soft exactly at
    ratio 1 (one optimizer step per rollout batch): d copies of the mean sum to the sum.
    parent, branch_at, lengths (M,) -> M tensors (L_i,) float32"""
    return [1.0 / d.float() for d in token_share_counts(parent, branch_at, lengths)]


ATTRIBUTIONS = {"soft", "hard"}  # the two modes of spec §3; soft takes no tree arguments


# --------------------------------------------------------------------------------------------
# AEPO entropy-aware advantage (spec §7)
# --------------------------------------------------------------------------------------------


def entropy_aware_advantage(
    adv_tokens: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    alpha: float = 0.2,
    eps: float = 1e-6,
) -> torch.Tensor:
    """AEPO (arXiv 2510.14545, spec §7): `Â_t ← Â_t · (1 + α · z_t)`, where
    `z_t = (H_t − mean(H)) / (std(H) + eps)` is the token's policy entropy standardized over the
    batch's valid tokens (mask 1; unbiased std) and detached, so high-entropy tokens get larger
    updates. Masked-out tokens are returned unchanged (z = 0); with fewer than two valid tokens
    every z is 0.
    adv_tokens (B, T), entropy (B, T), mask (B, T) -> (B, T)
    """
    valid = mask.bool()
    h = entropy.detach().float()
    n = int(valid.sum())
    if n < 2:
        return adv_tokens.clone()
    vals = h[valid]  # (n,)
    z = torch.where(valid, (h - vals.mean()) / (vals.std() + eps), torch.zeros_like(h))  # (B, T)
    return adv_tokens * (1 + alpha * z).to(adv_tokens.dtype)
