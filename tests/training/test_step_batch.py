"""The training recipe's pieces of one step: advantages over the step's whole batch (issue 15 A.1)."""

from types import SimpleNamespace

import pytest
import torch

from arpo.algos.presets import get_preset
from arpo.training.step_batch import build_batch, step_advantages


def _fake_tree(rewards, length=3):
    trajs = [SimpleNamespace(reward=r, parent_id=None, traj=SimpleNamespace(response_ids=[0] * length))
             for r in rewards]
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
    from arpo.rollout.arpo import ARPORollout
    from arpo.settings import AgentConfig, RolloutConfig
    from arpo.tools import build_tools

    ro = ARPORollout(HFEngine(tiny_lm, tiny_tok), build_tools([]), AgentConfig(max_response_tokens=5),
                     RolloutConfig(group_size=4, initial_rollouts=4))
    trees = ro.run([tiny_tok.encode("question a"), tiny_tok.encode("question b")], seed=0)
    for tree, rewards in zip(trees, ([1, 0, 0, 0], [1, 1, 1, 0]), strict=True):
        for t, r in zip(tree.trajectories, rewards, strict=True):
            t.reward = float(r)
    batch = build_batch(trees, get_preset("reinforce_pp"))
    per_traj = [float(batch.advantages[batch.rows[(ti, i)], 0]) for ti in range(2) for i in range(4)]
    assert per_traj == pytest.approx([0.9354, -0.9354, -0.9354, -0.9354, 0.9354, 0.9354, 0.9354, -0.9354], abs=1e-4)


def _two_branch_tree():
    """Trajectory 0 = 4 generated tokens; trajectory 1 forks from it after token 2: tokens 0-1 shared."""
    from arpo.rollout.agent import Trajectory
    from arpo.rollout.tree import RolloutTree, TreeTrajectory

    def traj(resp):
        return Trajectory(sid=0, prompt_ids=[5, 6], response_ids=resp, loss_mask=[1] * len(resp),
                          logprobs=[0.0] * len(resp), entropies=[0.0] * len(resp), text="", tool_calls=[],
                          finish_reason="eos")

    return RolloutTree("p", [5, 6], [TreeTrajectory(traj([1, 2, 3, 4]), 0, None, None),
                                      TreeTrajectory(traj([1, 2, 7, 8]), 1, 0, 2)])


@pytest.mark.parametrize("attribution", ["soft", "hard"])
def test_hard_attribution_counts_a_shared_token_once_in_one_minibatch(attribution):
    """One optimizer step (ratio 1, token-mean), Â = (1, 0.5), tokens 0-1 shared. Gradient of the loss
    w.r.t. each *tree* token's log-prob (summed over the rows that hold it), by hand:
      soft: 8 row tokens; shared −(1 + 0.5)/8 = −0.1875; own −1/8, −0.5/8
      hard: 6 tree tokens, each once; shared −0.75/6 = −0.125 (mean Â); own −1/6, −0.5/6
    Hard without the 1/d weights gave exactly the soft numbers (2 copies · mean 0.75 = 1.5)."""
    import dataclasses

    from arpo.training.step_batch import make_loss_fn

    preset = dataclasses.replace(get_preset("arpo"), attribution=attribution)
    tree = _two_branch_tree()
    batch = build_batch([tree], preset, [torch.tensor([1.0, 0.5])])
    batch.old_logp = torch.zeros(batch.mask.shape)
    logp = batch.old_logp.clone().requires_grad_(True)
    loss, _ = make_loss_fn(batch, preset)(logp, None)
    (g,) = torch.autograd.grad(loss, logp)
    r0, r1 = batch.rows[(0, 0)], batch.rows[(0, 1)]
    shared = (g[r0, :2] + g[r1, :2]).tolist()
    own0, own1 = g[r0, 2:].tolist(), g[r1, 2:].tolist()
    n, s = (6, 0.75) if attribution == "hard" else (8, 1.5)
    assert shared == pytest.approx([-s / n] * 2, abs=1e-6)
    assert own0 == pytest.approx([-1 / n] * 2, abs=1e-6) and own1 == pytest.approx([-0.5 / n] * 2, abs=1e-6)


def test_round_indices_round_zero_is_the_step_batch_and_later_rounds_are_fresh():
    from arpo.data.order import batch_indices, round_indices

    assert round_indices(10, 3, 1, 4, 0, set()) == batch_indices(10, 3, 1, 4)
    used = set(round_indices(10, 3, 1, 4, 0, set()))
    r1 = round_indices(10, 3, 1, 4, 1, used)
    assert len(r1) == 3 and not used & set(r1) and r1 == round_indices(10, 3, 1, 4, 1, used)  # pure
    assert sorted(round_indices(4, 3, 1, 0, 1, {0, 1, 2})[:1]) == [3]  # the unused row first, then repeats


def _dapo_metrics(tmp_path, scripted_run, rounds):
    import json

    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps({"question": f"{kind} question {i}: what is {i} + {i}?", "answer": str(2 * i),
                                        "task": "math"}) + "\n"
                            for i, kind in enumerate(["Uniform", "Varied"] * 3)))
    run = scripted_run(tmp_path, steps=2, **{"data.path": data, "algo.preset": "dapo", "rollout.group_size": 3,
                                             "reward.fn": "arpo.testing:half_uniform_reward",
                                             "algo.dynamic_sampling_max_rounds": rounds})
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_dapo_dynamic_sampling_refills_the_batch_up_to_the_round_cap(tmp_path, scripted_run):
    """Half the questions give every response reward 0 (uniform groups, dropped). With up to 4 rounds
    each step trains exactly prompts_per_step = 2 groups (the data holds 3 varied questions); with a cap
    of 1 round the dropped groups are not replaced, which is what the preset did before."""
    full = _dapo_metrics(tmp_path / "a", scripted_run, 4)
    assert [m["groups_trained"] for m in full] == [2, 2] and all(m["groups_short"] == 0 for m in full)
    assert all(1 <= m["sampling_rounds"] <= 4 for m in full)
    assert sum(m["groups_dropped"] for m in full) >= 1  # some round did roll out a uniform group
    assert all(m["trajectories"] == 3 * 2 * m["sampling_rounds"] for m in full)  # metrics over every round
    capped = _dapo_metrics(tmp_path / "b", scripted_run, 1)
    assert all(m["sampling_rounds"] == 1 for m in capped)
    assert all(m["groups_trained"] == 2 - m["groups_dropped"] for m in capped)
