"""Branch rules as plug-ins (rollout/branch_rules.py): hand-computed probabilities, `auto`, and a rule of
your own loaded as module:function into a real rollout."""

import pytest

from arpo.errors import ArpoError
from arpo.rollout.branch_rules import BRANCH_RULES, BranchContext, auto_rule_name, get_branch_rule


def test_each_rule_against_hand_values():
    ctx = BranchContext(delta_entropy=1.0, beta=0.2, tau=0.3)
    assert BRANCH_RULES["arpo"](ctx) == pytest.approx(0.9)  # 1 − 0.3 + 0.2
    assert BRANCH_RULES["reference"](ctx) == pytest.approx(0.5)  # 0.3 + 0.2
    assert BRANCH_RULES["aepo"](ctx) == pytest.approx(0.9)  # no penalty: the arpo rule
    assert BRANCH_RULES["bernoulli"](ctx) == pytest.approx(0.7)  # 1 − 0.3, ΔH ignored
    assert BRANCH_RULES["bernoulli"](BranchContext(-5.0, 0.2, 0.3)) == pytest.approx(0.7)
    # AEPO: l = 4 rounds, c = 0.05: f = 0.8; P = 1 + 0.2 − 0.3/0.8 = 0.825
    pen = BranchContext(delta_entropy=1.0, beta=0.2, tau=0.3, consecutive=4, penalty=0.05)
    assert BRANCH_RULES["aepo"](pen) == pytest.approx(0.825)
    assert BRANCH_RULES["aepo"](BranchContext(1.0, 0.2, 0.3, consecutive=20, penalty=0.05)) == 0.0  # f = 0
    assert BRANCH_RULES["arpo"](BranchContext(10.0, 0.2, 0.5)) == 1.0  # clipped
    assert BRANCH_RULES["reference"](BranchContext(-10.0, 0.2, 0.5)) == 0.0


def test_auto_picks_by_mode_and_penalty_and_plugins_resolve():
    assert auto_rule_name("paper", 0.0) == "arpo" and auto_rule_name("reference", 0.0) == "reference"
    assert auto_rule_name("paper", 0.05) == "aepo" and auto_rule_name("reference", 0.05) == "aepo"
    assert get_branch_rule("auto", "reference") is BRANCH_RULES["reference"]
    assert get_branch_rule("arpo.rollout.branch_rules:bernoulli_rule") is BRANCH_RULES["bernoulli"]
    with pytest.raises(ArpoError, match="unknown branch rule 'coin'.*aepo, arpo, bernoulli, reference"):
        get_branch_rule("coin")
    with pytest.raises(ArpoError, match="has no attribute"):
        get_branch_rule("arpo.rollout.branch_rules:nope")
    from arpo.rollout.arpo import RolloutConfig

    with pytest.raises(ArpoError, match="rollout.branch_rule"):
        RolloutConfig(branch_rule="no.such.module:rule").validate()


def test_a_rule_of_your_own_drives_a_rollout(tiny_lm, tiny_tok, tmp_path, monkeypatch):
    """`rollout.branch_rule: myrules:first_step_only` (a module in the working directory): branch with
    certainty after the first tool result, never later; the recorded probabilities are the rule's."""
    from test_arpo import make, prompts

    from arpo.rollout.arpo import RolloutConfig

    (tmp_path / "myrules.py").write_text("def first_step_only(ctx):\n    return 1.0 if ctx.depth == 0 else 0.0\n"
                                         "def broken(ctx):\n    return 1.5\n")
    monkeypatch.chdir(tmp_path)
    cfg = RolloutConfig(group_size=6, initial_rollouts=2, entropy_tokens=2, branch_rule="myrules:first_step_only")
    (tree,) = make(tiny_lm, tiny_tok, cfg).run(prompts(tiny_tok, 1))
    ds = [d for t in tree.trajectories for d in t.branch_decisions]
    assert ds and all(d["branched"] == (d["tool_call_index"] == 0) for d in ds)
    assert all(d["probability"] == (1.0 if d["tool_call_index"] == 0 else 0.0) for d in ds)
    for t in tree.trajectories:  # every fork right after its parent's first tool result
        if t.parent_id is not None:
            assert t.branch_token_index == tree.trajectories[t.parent_id].traj.tool_calls[0].result_span[1]
    with pytest.raises(ArpoError, match="not a probability"):
        make(tiny_lm, tiny_tok, RolloutConfig(group_size=4, initial_rollouts=2, entropy_tokens=2,
                                              branch_rule="myrules:broken")).run(prompts(tiny_tok, 1))


def test_the_old_tree_grpo_name_is_refused_with_the_new_one():
    """`tree_grpo` was a Bernoulli per tool step, not Tree-GRPO's node sampling (issue 38): renamed
    `bernoulli`; the old name is an error naming it, in the config's words."""
    from arpo.rollout.arpo import RolloutConfig

    with pytest.raises(ArpoError, match="branch rule 'tree_grpo' was renamed bernoulli"):
        get_branch_rule("tree_grpo")
    with pytest.raises(ArpoError, match="rollout.branch_rule: branch rule 'tree_grpo' was renamed bernoulli"):
        RolloutConfig(branch_rule="tree_grpo").validate()
