"""rollout.mode: tree_grpo (issue 59 item 5): Tree-GRPO's node expansion (arXiv 2509.21240) — N chains,
then rounds of random non-leaf tool steps expanded until the group has exactly M trajectories."""

import random

import pytest

from arpo.engine.hf import HFEngine
from arpo.errors import ArpoError
from arpo.rollout.arpo import ARPORollout, pick_nodes
from arpo.settings import AgentConfig, RolloutConfig
from arpo.testing import hook_rollout, scripted_hook
from arpo.tools.base import ToolResult
from arpo.tools.registry import ToolRegistry


class Echo:
    name = "python"

    def __init__(self):
        self.runs = 0

    def __call__(self, x):
        self.runs += 1
        return ToolResult(x[::-1])


SCRIPT = ["<python> a </python>", "<python> bb </python>", "<python> ccc </python>", "<answer> \\boxed{1} </answer>"]


def make(lm, tok, cfg, agent=None, script=SCRIPT, free_tokens=4):
    tool = Echo()
    ro = ARPORollout(HFEngine(lm, tok), ToolRegistry([tool]), agent or AgentConfig(max_response_tokens=400), cfg)
    hook_rollout(ro, scripted_hook(tok, script, free_tokens=free_tokens))
    return ro, tool


def prompts(tok, n):
    return [tok(f"Question number {i}?")["input_ids"] for i in range(n)]


def own_result_ends(t) -> list[int]:
    own = t.branch_token_index or 0
    return [c.result_span[1] for c in t.traj.tool_calls if c.result_span[1] > own]


def check_shape(tree, cfg):
    tree.validate()
    ts = tree.trajectories
    assert len(ts) == cfg.group_size  # the budget, exactly
    assert sum(t.parent_id is None for t in ts) == cfg.initial_rollouts  # N chains, no fill-up needed
    for t in ts:
        assert t.branch_decisions == []  # no entropy decisions: nodes are drawn
        if t.parent_id is None:
            continue
        parent = ts[t.parent_id]
        # a node is the state right after one of the parent's *own* tool results (a non-leaf tool step)
        assert t.branch_token_index in own_result_ends(parent)
        assert t.traj.response_ids[: t.branch_token_index] == parent.traj.response_ids[: t.branch_token_index]
        assert t.traj.loss_mask[: t.branch_token_index] == parent.traj.loss_mask[: t.branch_token_index]


def test_pick_nodes_hand_values():
    assert pick_nodes([0.7, 0.2, 0.9, 0.4], 2) == [1, 3]
    assert pick_nodes([0.7, 0.2, 0.9, 0.4], 9) == [1, 3, 0, 2]
    assert pick_nodes([0.5, 0.5], 1) == [0]
    assert pick_nodes([], 3) == []


@pytest.mark.parametrize("seed", range(3))
def test_tree_shape_and_exact_budget(tiny_lm, tiny_tok, seed):
    r = random.Random(seed)
    m = r.choice([3, 5, 8])
    cfg = RolloutConfig(mode="tree_grpo", group_size=m, initial_rollouts=r.randint(1, min(3, m)),
                        branch_factor=r.choice([1, 2]), nodes_per_round=r.choice([1, 2]), seed=seed)
    ro, _ = make(tiny_lm, tiny_tok, cfg)
    trees = ro.run(prompts(tiny_tok, 2))
    for tree in trees:
        check_shape(tree, cfg)
    assert not ro.engine.seqs  # everything released


def test_expansions_come_in_rounds_and_reach_branches(tiny_lm, tiny_tok):
    """N = 1 chain of 3 tool results, M = 8, every node a round: round 0 forks from the chain's 3 nodes
    (4 trajectories); round 1 draws 4 of the tree's 6 nodes (the chain's 3, the branches' own 2 + 1 + 0),
    so at least one is a branch's: later rounds expand earlier branches (a fork of a fork), as
    Tree-GRPO's iterations do."""
    cfg = RolloutConfig(mode="tree_grpo", group_size=8, initial_rollouts=1, nodes_per_round=8, seed=3)
    ro, tool = make(tiny_lm, tiny_tok, cfg)
    (tree,) = ro.run(prompts(tiny_tok, 1))
    check_shape(tree, cfg)
    depth = [0] * len(tree)
    for i, t in enumerate(tree.trajectories):
        depth[i] = 0 if t.parent_id is None else depth[t.parent_id] + 1
    assert max(depth) >= 2
    # a fork runs only the calls after its node; the prefix's calls ran once
    issued = sum(len(t.traj.tool_calls) - sum(0 < c.result_span[1] <= (t.branch_token_index or 0)
                                               for c in t.traj.tool_calls) for t in tree.trajectories)
    assert tool.runs == issued < sum(len(t.traj.tool_calls) for t in tree.trajectories)


def test_a_seed_is_a_run(tiny_lm, tiny_tok):
    cfg = RolloutConfig(mode="tree_grpo", group_size=6, initial_rollouts=2, nodes_per_round=2, seed=7)

    def shape(seed):
        ro, _ = make(tiny_lm, tiny_tok, cfg)
        return [[(t.parent_id, t.branch_token_index, t.traj.response_ids) for t in tree.trajectories]
                for tree in ro.run(prompts(tiny_tok, 2), seed=seed)]

    first = shape(1)
    assert shape(1) == first
    assert shape(2) != first


def test_a_node_expanded_twice_gets_new_seeds(tiny_lm, tiny_tok):
    """One chain with one tool result, M = 4: every expansion is of the same node; each fork has a key of
    its own (FORK, lineage, t, j), so the three continuations are not copies of each other."""
    script = ["<python> a </python>", "<answer> \\boxed{1} </answer>"]
    cfg = RolloutConfig(mode="tree_grpo", group_size=4, initial_rollouts=1, seed=0)
    ro, _ = make(tiny_lm, tiny_tok, cfg, script=script, free_tokens=6)
    (tree,) = ro.run(prompts(tiny_tok, 1))
    check_shape(tree, cfg)
    forks = tree.trajectories[1:]
    assert {t.parent_id for t in forks} == {0}
    b = forks[0].branch_token_index
    assert len({tuple(t.traj.response_ids[b:]) for t in forks}) == 3


def test_no_tool_step_to_expand_fills_up_with_chains(tiny_lm, tiny_tok):
    cfg = RolloutConfig(mode="tree_grpo", group_size=5, initial_rollouts=2, seed=0)
    ro, _ = make(tiny_lm, tiny_tok, cfg, script=["<answer> \\boxed{1} </answer>"], free_tokens=0)
    (tree,) = ro.run(prompts(tiny_tok, 1))
    assert len(tree) == 5 and all(t.parent_id is None for t in tree.trajectories)


def test_mode_settings_are_checked():
    RolloutConfig(mode="tree_grpo").validate()
    with pytest.raises(ArpoError, match="rollout.mode"):
        RolloutConfig(mode="tree_grpo", branch_rule="zscore").validate()
    with pytest.raises(ArpoError, match="rollout.mode"):
        RolloutConfig(mode="tree_grpo", dynamic_budget=True).validate()
    with pytest.raises(ArpoError, match="rollout.nodes_per_round"):
        RolloutConfig(mode="tree_grpo", nodes_per_round=0).validate()
    with pytest.raises(ArpoError, match="rollout.mode"):
        RolloutConfig(mode="tree").validate()
