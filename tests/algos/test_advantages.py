"""Hand-computed checks of spec §3 (normalization, soft/hard attribution) and §7 (entropy-aware)."""

import math

import pytest
import torch

from arpo.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    batch_normalize,
    compute_advantages,
    entropy_aware_advantage,
    group_normalize,
    grouped_normalize,
    hard_attribution,
    soft_attribution,
    token_share_counts,
)


def close(a, b, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32), torch.tensor(b, dtype=torch.float32),
                               atol=tol, rtol=0)


# ---- group normalization --------------------------------------------------------------------


def test_group_normalize_unbiased_std():
    # R = [1,0,0,1]: mean 0.5, deviations ±0.5, unbiased var = 4·0.25/3 = 1/3, std = 0.577350
    # Â = ±0.5 / 0.577350 = ±0.866025 (a biased std of 0.5 would give ±1.0)
    close(group_normalize(torch.tensor([1.0, 0, 0, 1])), [0.866025, -0.866025, -0.866025, 0.866025])
    # R = [1,0,0,0]: mean 0.25, dev [0.75, -0.25 x3], var = (0.5625 + 3·0.0625)/3 = 0.25, std 0.5
    close(group_normalize(torch.tensor([1.0, 0, 0, 0])), [1.5, -0.5, -0.5, -0.5])


def test_group_normalize_dr_grpo_and_degenerate_groups():
    close(group_normalize(torch.tensor([1.0, 0, 0, 0]), std=False), [0.75, -0.25, -0.25, -0.25])
    close(group_normalize(torch.tensor([5.0])), [0.0])  # a group of one has no baseline
    close(group_normalize(torch.tensor([1.0, 1.0, 1.0])), [0.0, 0.0, 0.0])  # 0 / (0 + eps)
    # batched over the last dim: each row is its own group
    out = group_normalize(torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 1]]))
    close(out[0], [1.5, -0.5, -0.5, -0.5])
    close(out[1], [0.866025, -0.866025, -0.866025, 0.866025])


def test_grouped_normalize_matches_per_group_and_zeroes_singletons():
    r = torch.tensor([1.0, 3.0, 0.0, 0.0, 1.0, 1.0, 9.0])
    gid = [7, 2, 7, 7, 7, 2, 4]
    # group 7 = [1,0,0,1] -> ±0.866025; group 2 = [3,1]: mean 2, dev ±1, unbiased std sqrt(2) -> ±0.707107
    # group 4 = [9] alone -> 0
    close(grouped_normalize(r, gid), [0.866025, 0.707107, -0.866025, -0.866025, 0.866025, -0.707107, 0.0])
    close(grouped_normalize(r, gid, std=False), [0.5, 1.0, -0.5, -0.5, 0.5, -1.0, 0.0])


def test_batch_normalize_reinforce_pp():
    r = torch.tensor([1.0, 0, 0, 1, 3, 1])
    gid = [0, 0, 0, 0, 1, 1]
    # global: mean 1, dev [0,-1,-1,0,2,0], unbiased var = 6/5 = 1.2, std 1.095445
    close(batch_normalize(r), [0.0, -0.912871, -0.912871, 0.0, 1.825742, 0.0])
    # baseline variant: group means 0.5 and 2 -> dev [.5,-.5,-.5,.5,1,-1], var = (4·.25 + 2·1)/5 = 0.6,
    # std 0.774597 -> [±0.645497, ±1.290994]
    close(
        batch_normalize(r, gid, subtract_group_mean=True),
        [0.645497, -0.645497, -0.645497, 0.645497, 1.290994, -1.290994],
    )
    with pytest.raises(ValueError):
        batch_normalize(r, None, subtract_group_mean=True)


def test_registry_names_and_dispatch():
    assert {"grpo", "dr_grpo", "reinforce_pp"} <= set(ADVANTAGE_ESTIMATORS)
    r, gid = torch.tensor([1.0, 0, 0, 0]), [0, 0, 0, 0]
    close(compute_advantages("grpo", r, gid), [1.5, -0.5, -0.5, -0.5])
    close(compute_advantages("dr_grpo", r, gid), [0.75, -0.25, -0.25, -0.25])
    # one group: global and group statistics coincide
    close(compute_advantages("reinforce_pp", r, gid), [1.5, -0.5, -0.5, -0.5])
    with pytest.raises(ValueError, match="grpo"):
        compute_advantages("ppo", r, gid)


# ---- attribution ----------------------------------------------------------------------------
# Hand-drawn tree (response tokens only):
#   traj 0 (global, 6 tokens): a0 a1 a2 | a3 a4 a5
#   traj 1 (global, 4 tokens): b0 b1 b2 b3
#   traj 2 forked from 0 at 3 (7 tokens): a0 a1 a2 | c3 c4 | c5 c6
#   traj 3 forked from 2 at 5 (8 tokens): a0 a1 a2 | c3 c4 | d5 d6 d7
# Â = [1, 2, 3, 4]
ADV = torch.tensor([1.0, 2.0, 3.0, 4.0])
PARENT, BRANCH_AT, LENGTHS = [-1, -1, 0, 2], [0, 0, 3, 5], [6, 4, 7, 8]


def test_hard_attribution_hand_drawn_tree():
    out = hard_attribution(ADV, PARENT, BRANCH_AT, LENGTHS)
    a = (1 + 3 + 4) / 3  # a0..a2 shared by {0, 2, 3} = 8/3
    c = (3 + 4) / 2  # c3, c4 shared by {2, 3} = 3.5
    close(out[0], [a, a, a, 1, 1, 1])
    close(out[1], [2, 2, 2, 2])
    close(out[2], [a, a, a, c, c, 3, 3])
    close(out[3], [a, a, a, c, c, 4, 4, 4])
    assert [len(x) for x in out] == LENGTHS


def test_share_counts_and_soft_attribution():
    counts = token_share_counts(PARENT, BRANCH_AT, LENGTHS)
    assert [c.tolist() for c in counts] == [
        [3, 3, 3, 1, 1, 1],
        [1, 1, 1, 1],
        [3, 3, 3, 2, 2, 1, 1],
        [3, 3, 3, 2, 2, 1, 1, 1],
    ]
    soft = soft_attribution(ADV, LENGTHS)
    assert [s.tolist() for s in soft] == [[1.0] * 6, [2.0] * 4, [3.0] * 7, [4.0] * 8]


def test_hard_attribution_weights_count_each_tree_token_once():
    from arpo.algos.advantages import hard_attribution_weights

    w = hard_attribution_weights(PARENT, BRANCH_AT, LENGTHS)
    t, h = 1 / 3, 1 / 2
    assert [x.tolist() for x in w] == [pytest.approx(v) for v in (
        [t, t, t, 1, 1, 1], [1, 1, 1, 1], [t, t, t, h, h, 1, 1], [t, t, t, h, h, 1, 1, 1])]
    # the weights of all rows sum to the number of distinct tree tokens: 6 + 4 + 4 (c3 c4 c5 c6) + 3 (d5..d7)
    assert float(sum(x.sum() for x in w)) == pytest.approx(17)


def test_hard_attribution_grandchild_forks_before_parents_fork():
    # traj 2 forked from 1 at 4; traj 3 forked from 2 at 2 (< 4): 3's tokens 0,1 are 1's tokens 0,1
    # (through 2), 3 never holds 2's own tokens (positions >= 4)
    # Â = [0, 1, 2, 6]: pos 0,1 of traj 1 shared by {1,2,3}: (1+2+6)/3 = 3; pos 2,3 by {1,2}: 1.5
    out = hard_attribution(torch.tensor([0.0, 1, 2, 6]), [-1, -1, 1, 2], [0, 0, 4, 2], [3, 5, 6, 4])
    close(out[0], [0, 0, 0])
    close(out[1], [3, 3, 1.5, 1.5, 1])
    close(out[2], [3, 3, 1.5, 1.5, 2, 2])
    close(out[3], [3, 3, 6, 6])
    assert token_share_counts([-1, -1, 1, 2], [0, 0, 4, 2], [3, 5, 6, 4])[1].tolist() == [3, 3, 2, 2, 1]


def _brute_force_hard(adv, parent, branch_at, lengths):
    """Reference: name each token by the (trajectory, position) it is inherited from, then average."""

    def node(i, t):
        while parent[i] != -1 and t < branch_at[i]:
            i = parent[i]
        return (i, t)

    groups = {}
    for i, n in enumerate(lengths):
        for t in range(n):
            groups.setdefault(node(i, t), []).append(float(adv[i]))
    return [[sum(groups[node(i, t)]) / len(groups[node(i, t)]) for t in range(n)] for i, n in enumerate(lengths)]


def test_hard_attribution_matches_brute_force_on_random_trees():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        m = int(torch.randint(1, 9, (1,), generator=g))
        parent, branch_at, lengths = [], [], []
        for i in range(m):
            n = int(torch.randint(0, 12, (1,), generator=g))
            p = int(torch.randint(-1, i, (1,), generator=g)) if i else -1
            b = int(torch.randint(0, min(n, lengths[p]) + 1, (1,), generator=g)) if p >= 0 else 0
            parent.append(p), branch_at.append(b), lengths.append(n)
        adv = torch.randn(m, generator=g)
        expected = _brute_force_hard(adv, parent, branch_at, lengths)
        for got, exp in zip(hard_attribution(adv, parent, branch_at, lengths), expected, strict=True):
            close(got, exp)


def test_hard_attribution_without_forks_equals_soft():
    adv = torch.tensor([0.5, -1.0, 2.0])
    for h, s in zip(hard_attribution(adv, [-1, -1, -1], [0, 0, 0], [2, 3, 1]), soft_attribution(adv, [2, 3, 1]),
                    strict=True):
        close(h, s.tolist())


@pytest.mark.parametrize(
    "parent, branch_at, lengths, msg",
    [
        ([-1, 0], [0, 5], [6, 4], "branch_at"),  # fork point past the child's own length
        ([-1, 0], [0, 3], [2, 4], "branch_at"),  # fork point past the parent's length
        ([-1, -1], [1, 0], [3, 3], "root"),
        ([1, 0], [1, 1], [3, 3], "cycle"),
        ([-1, 5], [0, 0], [3, 3], "parent"),
    ],
)
def test_tree_validation(parent, branch_at, lengths, msg):
    with pytest.raises(ValueError, match=msg):
        hard_attribution(torch.zeros(len(lengths)), parent, branch_at, lengths)


# ---- AEPO entropy-aware advantage -------------------------------------------------------------


def test_entropy_aware_advantage_values():
    adv = torch.full((2, 3), 2.0)
    entropy = torch.tensor([[1.0, 2.0, 100.0], [3.0, 50.0, 7.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # valid H = [1, 2, 3]: mean 2, unbiased std 1 -> z = [-1, 0, 1]
    # Â·(1 + 0.2 z) = 2·0.8, 2·1, 2·1.2; masked tokens keep Â = 2
    out = entropy_aware_advantage(adv, entropy, mask, alpha=0.2)
    close(out, [[1.6, 2.0, 2.0], [2.4, 2.0, 2.0]])
    assert not out.requires_grad  # z is detached
    close(entropy_aware_advantage(adv, entropy.detach(), mask, alpha=0.5), [[1.0, 2.0, 2.0], [3.0, 2.0, 2.0]])
    # one valid token: nothing to standardize against
    close(entropy_aware_advantage(adv, entropy.detach(), torch.tensor([[1, 0, 0], [0, 0, 0]])), adv.tolist())
    assert math.isclose(float(entropy_aware_advantage(adv, entropy.detach(), mask, alpha=0.0).sum()), 12.0)


@pytest.mark.parametrize("value", [0.7, 1.1, 0.1])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline"])
def test_equal_rewards_give_exactly_zero(name, value):
    """float32 statistics gave +0.1061 (0.7), -0.1061 (1.1), -0.0147 (0.1) for 16 equal rewards."""
    from arpo.algos.advantages import compute_advantages, group_normalize

    adv = compute_advantages(name, torch.full((16,), value), [0] * 16)
    assert adv.dtype == torch.float32 and torch.equal(adv, torch.zeros(16))
    assert torch.equal(group_normalize(torch.full((3, 16), value)), torch.zeros(3, 16))
    # a constant group beside a varying one: only the constant one is zeroed
    mixed = compute_advantages("grpo", torch.tensor([value] * 4 + [1.0, 0.0, 0.0, 0.0]), [0] * 4 + [1] * 4)
    assert torch.equal(mixed[:4], torch.zeros(4)) and mixed[4] == pytest.approx(1.5, abs=1e-5)


def test_tree_grpo_adds_intra_tree_to_inter_tree_hand_values():
    """One prompt, rewards (1, 0, 1, 1); trajectory 1 forks from 0 and 3 from 2 (roots 0, 0, 2, 2).
    Inter (all 4): mean 0.75, unbiased std 0.5: (0.5, −1.5, 0.5, 0.5). Intra: tree {0, 1} has (1, 0):
    ±1/√2; tree {2, 3} has equal rewards: 0. Sum: (1.2071, −2.2071, 0.5, 0.5)."""
    from arpo.algos.advantages import tree_grpo_advantage

    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    close(tree_grpo_advantage(r, [0, 0, 0, 0], [0, 0, 2, 2]), [0.5 + 0.70711, -1.5 - 0.70711, 0.5, 0.5], tol=1e-4)
    close(tree_grpo_advantage(r, [0, 0, 0, 0], [0, 1, 2, 3]), [0.5, -1.5, 0.5, 0.5], tol=1e-4)  # no forks: GRPO
    close(compute_advantages("tree_grpo", r, [0] * 4, [0, 0, 2, 2]), [1.20711, -2.20711, 0.5, 0.5], tol=1e-4)


def test_an_estimator_of_your_own_by_module_path(tmp_path, monkeypatch):
    """`algo.advantage_estimator: myadv:centered` — called with (rewards, group_ids, root_ids) over
    the step's batch; the recipe passes each trajectory's root (forks share their global sample's)."""
    import dataclasses
    from types import SimpleNamespace

    from arpo.algos.presets import get_preset
    from arpo.errors import ArpoError
    from arpo.training.step_batch import step_advantages

    (tmp_path / "myadv.py").write_text(
        "import torch\n"
        "def centered(rewards, group_ids, root_ids):\n"
        "    centered.roots = list(root_ids)\n"
        "    return rewards - rewards.mean()\n")
    monkeypatch.chdir(tmp_path)
    preset = dataclasses.replace(get_preset("arpo"), advantage_estimator="myadv:centered")
    tree = SimpleNamespace(trajectories=[SimpleNamespace(reward=r, parent_id=p)
                                         for r, p in [(1.0, None), (0.0, 0), (1.0, None), (0.0, 2)]])
    (adv,) = step_advantages([tree], preset)
    close(adv, [0.5, -0.5, 0.5, -0.5])
    import myadv

    assert myadv.centered.roots == [0, 0, 2, 2]
    with pytest.raises(ArpoError, match="advantage_estimator.*cannot import"):
        dataclasses.replace(get_preset("arpo"), advantage_estimator="nosuchmod:f")
    with pytest.raises(ArpoError, match="advantage_estimator"):
        dataclasses.replace(get_preset("arpo"), advantage_estimator="ppo")
