"""The training recipe's pieces of one step: advantages over the step's whole batch (issue 15 A.1)."""

from types import SimpleNamespace

import pytest
import torch

from arpo.algos.presets import get_preset
from arpo.training.step_batch import build_batch, step_advantages


def _fake_tree(rewards, length=3):
    trajs = [SimpleNamespace(reward=r, traj=SimpleNamespace(response_ids=[0] * length)) for r in rewards]
    return SimpleNamespace(trajectories=trajs)


def test_reinforce_pp_normalizes_over_the_whole_step_not_per_tree():
    trees = [_fake_tree([1, 0, 0, 0]), _fake_tree([1, 1, 1, 0])]
    grpo = torch.cat(step_advantages(trees, get_preset("grpo")))
    assert grpo.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -1.5], abs=1e-5)
    rpp = torch.cat(step_advantages(trees, get_preset("reinforce_pp")))
    # batch mean 0.5, batch sample std 0.5345: ±0.9354, the same for both trees
    assert rpp.tolist() == pytest.approx([0.9354, -0.9354, -0.9354, -0.9354, 0.9354, 0.9354, 0.9354, -0.9354],
                                         abs=1e-4)


def test_step_advantages_with_ranks_equal_one_process():
    """Two 'ranks' holding one tree each see the batch statistics of both (gather in rank order)."""
    trees = [_fake_tree([1, 0, 0, 0]), _fake_tree([1, 1, 1, 0])]
    whole = torch.cat(step_advantages(trees, get_preset("reinforce_pp")))
    parts = [[[t.reward for t in trees[0].trajectories]], [[t.reward for t in trees[1].trajectories]]]
    for rank in (0, 1):
        (mine,) = step_advantages([trees[rank]], get_preset("reinforce_pp"), gather=lambda _: parts, rank=rank)
        assert mine.tolist() == pytest.approx(whole[4 * rank: 4 * rank + 4].tolist())


def test_build_batch_carries_the_step_level_advantages(tiny_lm, tiny_tok):
    """Through the training batch: real rollout trees, rewards set by hand."""
    from arpo.engine.hf import HFEngine
    from arpo.rollout.agent import AgentConfig
    from arpo.rollout.arpo import ARPORollout, RolloutConfig
    from arpo.tools import build_tools

    ro = ARPORollout(HFEngine(tiny_lm, tiny_tok), build_tools([]), AgentConfig(max_response_tokens=5),
                     RolloutConfig(group_size=4, initial_rollouts=4))
    trees = ro.run([tiny_tok.encode("question a"), tiny_tok.encode("question b")], seed=0)
    for tree, rewards in zip(trees, ([1, 0, 0, 0], [1, 1, 1, 0])):
        for t, r in zip(tree.trajectories, rewards):
            t.reward = float(r)
    batch = build_batch(trees, get_preset("reinforce_pp"))
    per_traj = [float(batch.advantages[batch.rows[(ti, i)], 0]) for ti in range(2) for i in range(4)]
    assert per_traj == pytest.approx([0.9354, -0.9354, -0.9354, -0.9354, 0.9354, 0.9354, 0.9354, -0.9354], abs=1e-4)
