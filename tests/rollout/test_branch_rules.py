"""Branch rules as plug-ins (rollout/branch_rules.py): hand-computed probabilities, `auto`, and a rule of
your own loaded as module:function into a real rollout."""

import pytest

from arpo.errors import ArpoError
from arpo.rollout.branch_rules import BranchContext, get_branch_rule
from arpo.settings import BRANCH_RULES, auto_rule_name

RULES = {name: get_branch_rule(name) for name in BRANCH_RULES}


def test_each_rule_against_hand_values():
    ctx = BranchContext(delta_entropy=1.0, beta=0.2, tau=0.3)
    assert RULES["arpo"](ctx) == pytest.approx(0.9)  # 1 − 0.3 + 0.2
    assert RULES["reference"](ctx) == pytest.approx(0.5)  # 0.3 + 0.2
    assert RULES["aepo"](ctx) == pytest.approx(0.9)  # no penalty: the arpo rule
    assert RULES["bernoulli"](ctx) == pytest.approx(0.7)  # 1 − 0.3, ΔH ignored
    assert RULES["bernoulli"](BranchContext(-5.0, 0.2, 0.3)) == pytest.approx(0.7)
    # AEPO: l = 4 rounds, c = 0.05: f = 0.8; P = 1 + 0.2 − 0.3/0.8 = 0.825
    pen = BranchContext(delta_entropy=1.0, beta=0.2, tau=0.3, consecutive=4, penalty=0.05)
    assert RULES["aepo"](pen) == pytest.approx(0.825)
    assert RULES["aepo"](BranchContext(1.0, 0.2, 0.3, consecutive=20, penalty=0.05)) == 0.0  # f = 0
    assert RULES["arpo"](BranchContext(10.0, 0.2, 0.5)) == 1.0  # clipped
    assert RULES["reference"](BranchContext(-10.0, 0.2, 0.5)) == 0.0


def test_auto_picks_by_mode_and_penalty_and_plugins_resolve():
    assert auto_rule_name("paper", 0.0) == "arpo" and auto_rule_name("reference", 0.0) == "reference"
    assert auto_rule_name("paper", 0.05) == "aepo" and auto_rule_name("reference", 0.05) == "aepo"
    assert get_branch_rule("auto", "reference") is RULES["reference"]
    assert get_branch_rule("arpo.rollout.branch_rules:bernoulli_rule") is RULES["bernoulli"]
    with pytest.raises(ArpoError, match="unknown branch rule 'coin'.*aepo, arpo, bernoulli, outcome_open, reference, "
                                        "top_entropy, zscore"):
        get_branch_rule("coin")
    with pytest.raises(ArpoError, match="has no attribute"):
        get_branch_rule("arpo.rollout.branch_rules:nope")
    from arpo.settings import RolloutConfig

    with pytest.raises(ArpoError, match="rollout.branch_rule"):
        RolloutConfig(branch_rule="no.such.module:rule").validate()


def test_a_rule_of_your_own_drives_a_rollout(tiny_lm, tiny_tok, tmp_path, monkeypatch):
    """`rollout.branch_rule: myrules:first_step_only` (a module in the working directory): branch with
    certainty after the first tool result, never later; the recorded probabilities are the rule's."""
    from test_arpo import make, prompts

    from arpo.settings import RolloutConfig

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
    from arpo.settings import RolloutConfig

    with pytest.raises(ArpoError, match="branch rule 'tree_grpo' was renamed bernoulli"):
        get_branch_rule("tree_grpo")
    with pytest.raises(ArpoError, match="rollout.branch_rule: branch rule 'tree_grpo' was renamed bernoulli"):
        RolloutConfig(branch_rule="tree_grpo").validate()


# ---- staged rules (issue 41): hand-computed values ------------------------------------------------
def _pts(dhs, keys=None, shares=None):
    from arpo.rollout.staged_rules import DecisionPoint

    keys = keys or list(range(len(dhs)))
    shares = shares or [0.0] * len(dhs)
    return [DecisionPoint(dh, 0, k, s) for dh, k, s in zip(dhs, keys, shares, strict=True)]


def test_zscore_rule_hand_values():
    from arpo.rollout.staged_rules import GroupContext, z_scores, zscore_rule

    # ΔH = 0.01, 0.03, 0.05: mean 0.03, population sd sqrt((0.0004 + 0 + 0.0004)/3) = 0.016330
    assert z_scores([0.01, 0.03, 0.05]) == pytest.approx([-1.224745, 0.0, 1.224745], abs=1e-6)
    assert z_scores([0.2, 0.2]) == [0.0, 0.0] and z_scores([]) == []
    ctx = GroupContext(beta=0.2, tau=0.5, forks=2)
    # P = clip(0.5 + 0.2·z): 0.5 − 0.244949, 0.5, 0.5 + 0.244949 — the scale of ΔH does not matter
    assert zscore_rule(_pts([0.01, 0.03, 0.05]), ctx) == pytest.approx([0.255051, 0.5, 0.744949], abs=1e-6)
    assert zscore_rule(_pts([1.0, 3.0, 5.0]), ctx) == pytest.approx([0.255051, 0.5, 0.744949], abs=1e-6)
    assert zscore_rule(_pts([0.0, 0.0, 0.0, 9.0]), GroupContext(1.0, 0.5, 1))[-1] == 1.0  # z = sqrt(3): clipped


def test_top_entropy_rule_spends_the_budget_on_the_largest_delta_h():
    from arpo.rollout.staged_rules import GroupContext, branch_order, top_entropy_rule

    pts = _pts([0.1, 0.4, -0.2, 0.4, 0.3], keys=[5, 9, 1, 2, 7])
    # ΔH order: 0.4 (key 2, index 3) before 0.4 (key 9, index 1), then 0.3 (index 4)
    assert top_entropy_rule(pts, GroupContext(0.2, 0.5, forks=2)) == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert top_entropy_rule(pts, GroupContext(0.2, 0.5, forks=3)) == [0.0, 1.0, 0.0, 1.0, 1.0]
    assert top_entropy_rule(pts, GroupContext(0.2, 0.5, forks=0)) == [0.0] * 5
    assert top_entropy_rule(pts, GroupContext(0.2, 0.5, forks=9)) == [1.0] * 5
    # the order branched points take the room in: P descending, then key
    assert branch_order(pts, [0.5, 1.0, 0.5, 1.0, 0.2]) == [3, 1, 2, 0, 4]


def test_outcome_open_rule_and_open_shares_hand_values():
    from arpo.rollout.staged_rules import GroupContext, final_answer, open_shares, outcome_open_rule

    # four initial samples: calls [x, y], [x, y], [x, z], [w]; answers 7, 8, 7, 7
    paths = [["x", "y"], ["x", "y"], ["x", "z"], ["w"]]
    shares = open_shares(paths, ["7", "8", "7", "7"])
    # after result 0: samples 0-2 made call x (answers 7, 8, 7): 1 − 2/3; sample 3 is alone: 0
    # after result 1: samples 0, 1 made x, y (7, 8): 1 − 1/2; sample 2 is alone: 0
    assert [x for row in shares for x in row] == pytest.approx([1 / 3, 0.5, 1 / 3, 0.5, 1 / 3, 0.0, 0.0])
    assert [len(row) for row in shares] == [2, 2, 2, 1]
    assert open_shares([["x"], ["x"]], [None, None]) == [[0.0], [0.0]]  # no answer twice: they agree
    assert open_shares([["x"], ["x"]], ["1", None]) == [[0.5], [0.5]]
    pts = _pts([0.1, 0.0, 0.3, 0.2], keys=[4, 3, 2, 1], shares=[1 / 3, 0.5, 1 / 3, 0.0])
    assert outcome_open_rule(pts, GroupContext(0.2, 0.5, forks=2)) == [0.0, 1.0, 1.0, 0.0]  # 0.5, then larger ΔH
    assert outcome_open_rule(pts, GroupContext(0.2, 0.5, forks=9)) == [1.0, 1.0, 1.0, 0.0]  # agreed: never
    assert final_answer("<think>..</think><answer> \\boxed{ 7 } </answer>", "answer") == "\\boxed{ 7 }"
    assert final_answer("<answer>1</answer> then <answer>2</answer>", "answer") == "2"
    assert final_answer("<answer>1", "length") is None


def test_staged_rules_are_registered_listed_and_refused_in_reference_mode():
    from arpo.settings import RolloutConfig, load_branch_rule, rule_lines, rule_summaries

    assert set(rule_summaries()) == {"auto"} | set(BRANCH_RULES)
    assert {n for n, r in BRANCH_RULES.items() if r.staged} == {"zscore", "top_entropy", "outcome_open"}
    assert all(load_branch_rule(n)[1] == r.staged for n, r in BRANCH_RULES.items())
    assert any(line.startswith("top_entropy: ") for line in rule_lines())
    with pytest.raises(ArpoError, match="rollout.branch_rule: zscore is a staged rule.*mode: paper"):
        RolloutConfig(branch_rule="zscore", mode="reference").validate()


def test_one_registry_names_each_rule_once_with_its_function():
    """Issue 64: the branch rules were four tables (rollout/branch_rules.py's BRANCH_RULES and
    RULE_SUMMARIES, rollout/staged_rules.py's STAGED_RULES, settings' BRANCH_RULE_NAMES) kept equal by a
    test; now one registry (settings BRANCH_RULES: name, function, staged, summary). A config is
    checked against it without importing the rollout; a built-in named by its module:function is the
    built-in (staged as registered); a plug-in is staged by its mark."""
    import subprocess
    import sys

    import arpo.rollout.branch_rules as per_decision
    import arpo.rollout.staged_rules as staged_mod
    from arpo.settings import branch_rule_is_staged, load_branch_rule

    assert not hasattr(per_decision, "RULE_SUMMARIES") and not hasattr(staged_mod, "STAGED_RULES")
    for name, rule in BRANCH_RULES.items():
        module, _, fn = rule.function.partition(":")
        assert rule.name == name and rule.summary
        assert getattr(staged_mod if rule.staged else per_decision, fn).__module__ == module
    assert branch_rule_is_staged("arpo.rollout.staged_rules:zscore_rule")
    assert load_branch_rule("arpo.rollout.staged_rules:zscore_rule") == (staged_mod.zscore_rule, True)
    assert not branch_rule_is_staged("arpo.rollout.branch_rules:bernoulli_rule")
    assert branch_rule_is_staged("auto", "reference", 0.0) is False
    with pytest.raises(ArpoError, match="unknown branch rule 'coin'.*aepo, arpo, bernoulli, outcome_open, reference, "
                                        "top_entropy, zscore"):
        branch_rule_is_staged("coin")
    code = ("import sys; from arpo.settings import RolloutConfig; RolloutConfig(branch_rule='top_entropy').validate(); "
            "print(sorted(m for m in sys.modules if m.startswith('arpo.rollout')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _two_answer_rollout(tiny_lm, tiny_tok, cfg, delivery="step", tool=None, n_prompts=2, seed=3):
    """Scripted calls, with the answer 1 or 2 by the parity of a sample's first (free) token: the initial
    samples of a prompt disagree, so the outcome-open rule has points to branch at."""
    from test_keyed_rollout import JitterEcho

    from arpo.engine.hf import HFEngine
    from arpo.rollout.arpo import ARPORollout
    from arpo.settings import AgentConfig
    from arpo.testing import hook_rollout, scripted_hook
    from arpo.tools.registry import ToolRegistry

    calls = ["<python> a </python>", "<python> bb </python>"]
    one = scripted_hook(tiny_tok, calls + ["<answer> \\boxed{1} </answer>"], free_tokens=2)
    two = scripted_hook(tiny_tok, calls + ["<answer> \\boxed{2} </answer>"], free_tokens=2)

    def hook(seq, logits):
        first = seq.tokens[seq.prompt_len] if len(seq.tokens) > seq.prompt_len else 0
        return (one if first % 2 == 0 else two)(seq, logits)

    ro = ARPORollout(HFEngine(tiny_lm, tiny_tok), ToolRegistry([tool or JitterEcho(0.0)]),
                     AgentConfig(max_response_tokens=200, tool_delivery=delivery), cfg)
    hook_rollout(ro, hook)
    return ro.run([tiny_tok(f"Question number {i}?")["input_ids"] for i in range(n_prompts)], seed=seed)


@pytest.mark.parametrize("rule", ["zscore", "top_entropy", "outcome_open"])
def test_staged_rules_keep_the_tree_invariants(tiny_lm, tiny_tok, rule):
    """M trajectories per prompt; forks only from initial samples, right after a tool result, never
    branching again; every initial sample's decision point recorded with the rule's probability; the
    budgeted rules spend their whole budget when there are enough points."""
    from arpo.settings import RolloutConfig

    cfg = RolloutConfig(group_size=7, initial_rollouts=3, branch_factor=2, entropy_tokens=2, branch_rule=rule)
    trees = _two_answer_rollout(tiny_lm, tiny_tok, cfg)
    for tree in trees:
        tree.validate()
        ts = tree.trajectories
        assert len(ts) == 7
        initial = [t for t in ts[:3]]
        assert all(t.parent_id is None for t in initial)
        forks = [t for t in ts if t.parent_id is not None]
        assert all(t.parent_id in (0, 1, 2) for t in forks)  # from initial samples only
        for t in forks:
            assert t.branch_token_index in [c.result_span[1] for c in ts[t.parent_id].traj.tool_calls]
            assert not t.branch_decisions
        ds = [d for t in initial for d in t.branch_decisions]
        assert len(ds) == 6  # 3 samples x 2 tool results
        assert sum(d["branched"] for d in ds) * 2 >= len(forks) >= 1 or rule == "zscore"
        if rule == "top_entropy":  # ⌈(7 − 3)/2⌉ = 2 points, the two largest ΔH
            assert sum(d["branched"] for d in ds) == 2 and len(forks) == 4
            top = sorted(ds, key=lambda d: -d["delta_entropy"])[:2]
            assert all(d["branched"] for d in top) or top[1]["delta_entropy"] == sorted(
                ds, key=lambda d: -d["delta_entropy"])[2]["delta_entropy"]
        if rule == "outcome_open":
            assert all(d["open_share"] > 0 or not d["branched"] for d in ds)
            assert any(d["open_share"] > 0 for d in ds)  # the two answers do occur


@pytest.mark.parametrize("rule", ["zscore", "top_entropy", "outcome_open"])
def test_staged_rules_do_not_depend_on_the_order_results_arrive(tiny_lm, tiny_tok, rule):
    """A tool with jittered latency (results finish in a new order each run), delivered at token-defined
    steps (`agent.tool_delivery: step`, the default): the same seed gives the same trees, decisions
    and tokens (the stage is the moment the last initial sample finishes: a property of its tokens,
    and the points' uniforms are keyed). With `arrival` delivery the sampled tokens themselves can
    differ (who shares a decode batch moves log-probs: issue 38), so no rule can promise it there."""
    from test_keyed_rollout import JitterEcho, shape

    from arpo.settings import RolloutConfig

    cfg = RolloutConfig(group_size=6, initial_rollouts=3, entropy_tokens=2, branch_rule=rule)
    runs = []
    for _ in range(2):
        trees = _two_answer_rollout(tiny_lm, tiny_tok, cfg, delivery="step", tool=JitterEcho(0.01))
        runs.append([(shape(t), [d for x in t.trajectories for d in x.branch_decisions],
                      [x.traj.response_ids for x in t.trajectories]) for t in trees])
    assert any(len(s[0]) > 3 and any(len(p) > 1 for p in s[0]) for s in runs[0])  # they branch
    assert runs[1] == runs[0]


def test_a_staged_rule_with_aepos_dynamic_budget_fills_the_group(tiny_lm, tiny_tok):
    """AEPO's probe picks N per prompt; the staged rule's points are those N samples', its budget
    ⌈(M − N)/Z⌉, and the group still ends with M trajectories."""
    import math

    from arpo.settings import RolloutConfig

    cfg = RolloutConfig(group_size=6, initial_rollouts=3, entropy_tokens=2, branch_rule="top_entropy",
                        dynamic_budget=True)
    for tree in _two_answer_rollout(tiny_lm, tiny_tok, cfg, n_prompts=1):
        n = tree.budget["initial_rollouts"]
        ts = tree.trajectories
        assert len(ts) == 6 and all(t.parent_id is None for t in ts[:n])
        ds = [d for t in ts[:n] for d in t.branch_decisions]
        assert len(ds) == 2 * n and sum(d["branched"] for d in ds) == min(len(ds), math.ceil((6 - n) / 1))
