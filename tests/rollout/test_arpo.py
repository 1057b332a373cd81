"""ARPO scheduler: tree invariants over many random trees, the branch rule's semantics and rate."""

import math
import random

import pytest

from arpo.engine.hf import HFEngine
from arpo.errors import ArpoError
from arpo.rollout.arpo import ARPORollout, dynamic_initial_rollouts, segment_entropy
from arpo.rollout.branch_rules import BranchContext, get_branch_rule
from arpo.settings import AgentConfig, RolloutConfig
from arpo.testing import hook_rollout, scripted_hook
from arpo.tools.base import ToolResult
from arpo.tools.registry import ToolRegistry


def branch_probability(delta_h: float, beta: float, tau: float, consecutive: int = 0, penalty: float = 0.0,
                       mode: str = "paper") -> float:
    """The probability of the rule `branch_rule: auto` picks for this mode and penalty."""
    ctx = BranchContext(delta_h, beta, tau, consecutive=consecutive, penalty=penalty)
    return get_branch_rule("auto", mode, penalty)(ctx)


class Echo:
    name = "python"

    def __call__(self, x):
        return ToolResult(x[::-1])


SCRIPT = ["<python> a </python>", "<python> bb </python>", "<python> ccc </python>", "<answer> \\boxed{1} </answer>"]


def make(tiny_lm, tok, cfg, agent=None, free_tokens=4, script=SCRIPT, engine=None):
    ro = ARPORollout(engine or HFEngine(tiny_lm, tok), ToolRegistry([Echo()]),
                     agent or AgentConfig(max_response_tokens=400), cfg)
    hook_rollout(ro, scripted_hook(tok, script, free_tokens=free_tokens))
    return ro


def prompts(tok, n):
    return [tok(f"Question number {i}?")["input_ids"] for i in range(n)]


def check_tree(tree, cfg, agent, prompt):
    tree.validate()
    trajs = tree.trajectories
    assert len(trajs) == cfg.group_size  # exactly M (fill-up on)
    assert sum(t.parent_id is None for t in trajs) >= cfg.initial_rollouts  # at least N global samples
    for t in trajs:
        tr = t.traj
        assert tr.prompt_ids == prompt
        assert len(tr.response_ids) <= agent.max_response_tokens
        assert len(tr.tool_calls) <= agent.max_tool_calls
        # loss mask is 0 exactly on tool-result tokens
        expected = [1] * len(tr.response_ids)
        for c in tr.tool_calls:
            a, b = c.result_span
            expected[a:b] = [0] * (b - a)
        assert tr.loss_mask == expected
        if t.parent_id is not None:
            parent = trajs[t.parent_id]
            b = t.branch_token_index
            # every branch point sits directly after one of the parent's tool results
            assert b in [c.result_span[1] for c in parent.traj.tool_calls]
            assert tr.response_ids[:b] == parent.traj.response_ids[:b]
            assert tr.loss_mask[:b] == parent.traj.loss_mask[:b]
            assert t.initial_entropy == parent.initial_entropy  # forks inherit H_initial
        # decisions use the entropy *after* the tool result (paper semantics)
        for d in t.branch_decisions:
            i = d["tool_call_index"]
            start = tr.tool_calls[i].result_span[1]
            seg = []
            # the window is the entropies' slice; the mask runs to the end of the response
            for e, m in zip(tr.entropies[start : start + cfg.entropy_tokens], tr.loss_mask[start:], strict=False):
                if not m:
                    break
                seg.append(e)
            assert t.step_entropies[i] == pytest.approx(sum(seg) / len(seg), abs=1e-9)
            assert d["delta_entropy"] == pytest.approx(t.step_entropies[i] - t.initial_entropy, abs=1e-5)
            assert d["probability"] == pytest.approx(
                branch_probability(d["delta_entropy"], cfg.entropy_weight, cfg.branch_threshold), abs=1e-5)


@pytest.mark.parametrize("seed", range(6))
def test_random_trees_satisfy_invariants(tiny_lm, tiny_tok, seed):
    r = random.Random(seed)
    m = r.choice([2, 4, 6, 8])
    cfg = RolloutConfig(group_size=m, initial_rollouts=r.randint(1, m), branch_factor=r.choice([1, 2]),
                        entropy_tokens=r.choice([1, 3, 4]), entropy_weight=r.choice([0.2, 0.5, 1.0]), seed=seed)
    agent = AgentConfig(max_response_tokens=r.choice([60, 400]), max_tool_calls=r.choice([1, 2, 5]))
    ro = make(tiny_lm, tiny_tok, cfg, agent)
    ps = prompts(tiny_tok, 2)
    trees = ro.run(ps)
    for tree, p in zip(trees, ps, strict=True):
        check_tree(tree, cfg, agent, p)
    assert not ro.engine.seqs  # everything released


def test_topk_estimator_on_an_engine_without_topk_entropies_is_an_error(tiny_lm, tiny_tok):
    """entropy_estimator: topk with the engine option topk_entropy: 0 (no top-k entropies recorded)
    measured every segment as empty: no entropy, no branch decision, a GRPO run in silence."""
    cfg = RolloutConfig(group_size=4, initial_rollouts=2, entropy_estimator="topk", entropy_tokens=2)
    with pytest.raises(ArpoError, match="topk_entropy: 0"):
        make(tiny_lm, tiny_tok, cfg, engine=HFEngine(tiny_lm, tiny_tok, topk_entropy=0))
    ro = make(tiny_lm, tiny_tok, cfg, engine=HFEngine(tiny_lm, tiny_tok, topk_entropy=10))
    (tree,) = ro.run(prompts(tiny_tok, 1))
    assert any(t.branch_decisions for t in tree.trajectories)  # with them, it decides


def test_grpo_is_no_branching(tiny_lm, tiny_tok):
    cfg = RolloutConfig(group_size=4, initial_rollouts=4, entropy_tokens=2)
    (tree,) = make(tiny_lm, tiny_tok, cfg).run(prompts(tiny_tok, 1))
    assert all(t.parent_id is None for t in tree.trajectories) and len(tree) == 4
    assert all(t.branch_decisions == [] for t in tree.trajectories)


def test_branching_happens_and_shares_prefix_computation(tiny_lm, tiny_tok):
    cfg = RolloutConfig(group_size=8, initial_rollouts=2, entropy_weight=0.0, branch_threshold=0.0, entropy_tokens=2)
    ro = make(tiny_lm, tiny_tok, cfg)
    (tree,) = ro.run(prompts(tiny_tok, 1))
    forks = [t for t in tree.trajectories if t.parent_id is not None]
    assert len(forks) == 6  # P = α + 0 > τ = 0 always: branch at every decision until M
    shared = sum(t.branch_token_index for t in forks)
    # a fork's prefill is one token, never its shared prefix
    assert ro.engine.stats["prefill_tokens"] < (sum(len(t.traj.response_ids) for t in tree.trajectories)
                                                - shared + 8 * 40)


def test_empirical_branch_rate_matches_formula(tiny_lm, tiny_tok):
    """With a seeded RNG, the branched fraction matches the mean of clip(1 − τ + β·ΔH) (binomial test)."""
    cfg = RolloutConfig(group_size=16, initial_rollouts=8, entropy_tokens=3, entropy_weight=0.4, seed=11)
    ro = make(tiny_lm, tiny_tok, cfg, AgentConfig(max_response_tokens=400))
    decisions = []
    for s in range(3):
        for tree in ro.run(prompts(tiny_tok, 4), seed=s):
            for t in tree.trajectories:
                decisions += t.branch_decisions
    assert len(decisions) > 60
    ps = [d["probability"] for d in decisions]
    assert min(ps) < 0.4 < 0.6 < max(ps)  # the entropy term really moves the probability
    k = sum(d["branched"] for d in decisions)
    mean, var = sum(ps), sum(p * (1 - p) for p in ps)
    assert abs(k - mean) < 3.5 * math.sqrt(var), (k, mean, var)


def test_reference_mode_uses_lagged_entropy(tiny_lm, tiny_tok):
    cfg = RolloutConfig(group_size=6, initial_rollouts=3, entropy_tokens=3, mode="reference", seed=2)
    (tree,) = make(tiny_lm, tiny_tok, cfg).run(prompts(tiny_tok, 1))
    seen = 0
    for t in tree.trajectories:
        for d in t.branch_decisions:
            i = d["tool_call_index"]
            want = 0.0 if i == 0 else t.step_entropies[i - 1] - t.initial_entropy
            assert d["delta_entropy"] == pytest.approx(want, abs=1e-5)
            seen += 1
    assert seen > 0


def test_dynamic_budget_starts_exactly_the_formulas_n(tiny_lm, tiny_tok):
    """AEPO: the probe runs in a pass of its own (then is discarded), so exactly
    N = clamp(int(M·σ(0.5·(H_root − H_tool))) + 1, 1, M) global samples start (formula 9); before,
    the probe was global no. 1 and its branches used up room, so fewer globals started."""
    for seed in range(3):
        cfg = RolloutConfig(group_size=6, initial_rollouts=3, entropy_tokens=3, dynamic_budget=True, fill_up=False,
                            entropy_weight=0.0, branch_threshold=0.0, seed=seed)  # every decision branches
        ro = make(tiny_lm, tiny_tok, cfg)
        trees = ro.run(prompts(tiny_tok, 2))
        for tree in trees:
            b = tree.budget
            n = dynamic_initial_rollouts(6, b["h_root"], b["h_tool"])
            assert b["initial_rollouts"] == n
            assert sum(t.parent_id is None for t in tree.trajectories) == n  # fill-up off: exactly N
            assert all(t.parent_id is None for t in tree.trajectories[:n])  # the N started first
            assert len(tree) == 6 or n == 6 or all(not t.branch_decisions for t in tree.trajectories)
        assert not ro.engine.seqs  # the probes are released too


def test_pure_functions_hand_values():
    # mean of [1, 2, 3] (k=3 of 4 tokens) = 2; sum = 6; normalized by ln(100)
    assert segment_entropy([1.0, 2.0, 3.0, 9.0], 3, "mean", False, 100) == pytest.approx(2.0)
    assert segment_entropy([1.0, 2.0, 3.0, 9.0], 3, "sum", True, 100) == pytest.approx(6.0 / math.log(100))
    # 1 − 0.5 + 0.2·1.0 = 0.7; clipped at 0 and 1
    assert branch_probability(1.0, 0.2, 0.5) == pytest.approx(0.7)
    assert branch_probability(-10.0, 0.2, 0.5) == 0.0 and branch_probability(10.0, 0.2, 0.5) == 1.0
    # AEPO penalty scales the score (the AEPO code): f = 1 − 0.05·2 = 0.9, branch if 0.9·(α + 0.2) > 0.5,
    # P = 1 + 0.2 − 0.5/0.9 = 0.644444 (scaling the probability instead gave 0.7·0.9 = 0.63)
    assert branch_probability(1.0, 0.2, 0.5, consecutive=2, penalty=0.05) == pytest.approx(1.2 - 0.5 / 0.9)
    assert branch_probability(1.0, 0.2, 0.5, consecutive=20, penalty=0.05) == 0.0  # f = 0
    # with a penalty, reference mode also uses the AEPO code's rule (the score U + β·ΔH against τ)
    assert branch_probability(1.0, 0.2, 0.3, 2, 0.05, mode="reference") == pytest.approx(1.2 - 0.3 / 0.9)
    # N = int(16·σ(0.5·(2−1))) + 1 = int(16·0.62246) + 1 = 9 + 1 = 10
    assert dynamic_initial_rollouts(16, 2.0, 1.0) == 10
    assert dynamic_initial_rollouts(16, -100.0, 100.0) == 1 and dynamic_initial_rollouts(16, 100.0, -100.0) == 16


def test_reference_rule_differs_from_the_paper_rule_away_from_tau_half():
    # the reference code branches when U − β·ΔH ≤ τ: P = clip(τ + β·ΔH); the paper: clip(1 − τ + β·ΔH)
    assert branch_probability(1.0, 0.2, 0.3, mode="reference") == pytest.approx(0.5)
    assert branch_probability(1.0, 0.2, 0.3) == pytest.approx(0.9)
    assert branch_probability(1.0, 0.2, 0.5, mode="reference") == pytest.approx(branch_probability(1.0, 0.2, 0.5))
    assert branch_probability(-5.0, 0.2, 0.3, mode="reference") == 0.0


def test_reference_mode_records_its_own_probability(tiny_lm, tiny_tok):
    cfg = RolloutConfig(group_size=6, initial_rollouts=2, entropy_tokens=3, mode="reference", branch_threshold=0.3,
                        seed=4)
    (tree,) = make(tiny_lm, tiny_tok, cfg).run(prompts(tiny_tok, 1))
    ds = [d for t in tree.trajectories for d in t.branch_decisions]
    assert ds and all(d["probability"] == pytest.approx(min(1, max(0, 0.3 + 0.2 * d["delta_entropy"])), abs=1e-5)
                      for d in ds)


def _fill_up_globals_with_children(lm, tok, mode, seeds):
    """Over several seeds: fill-up globals (globals after the first N) that have branches."""
    n = 0
    for seed in seeds:
        cfg = RolloutConfig(group_size=6, initial_rollouts=1, entropy_tokens=3, mode=mode, seed=seed)
        (tree,) = make(lm, tok, cfg, agent=AgentConfig(max_response_tokens=400, max_tool_calls=1)).run(prompts(tok, 1))
        globals_ = [i for i, t in enumerate(tree.trajectories) if t.parent_id is None]
        n += sum(1 for g in globals_[1:] if any(t.parent_id == g for t in tree.trajectories))
    return n


def test_reference_fill_up_adds_one_global_per_round_and_it_can_branch(tiny_lm, tiny_tok):
    # one tool call per path; N = 1 of M = 6: the first path and its branches end early, then fill-up
    assert _fill_up_globals_with_children(tiny_lm, tiny_tok, "reference", range(4)) > 0
    assert _fill_up_globals_with_children(tiny_lm, tiny_tok, "paper", range(4)) == 0  # all added at once: no room


@pytest.mark.parametrize("z", [2, 3])
def test_branch_counts_with_branch_factor(tiny_lm, tiny_tok, z):
    """A branch creates Z children at one point (fewer only when the budget M runs out), all at
    that branch point; the tree holds exactly M trajectories."""
    cfg = RolloutConfig(group_size=8, initial_rollouts=2, branch_factor=z, branch_threshold=0.0, entropy_weight=0.0,
                        entropy_tokens=2, seed=1)  # P = clip(1 − 0 + 0) = 1: branch at every chance
    for tree in make(tiny_lm, tiny_tok, cfg).run(prompts(tiny_tok, 2)):
        assert len(tree) == 8
        events: dict = {}
        for t in tree.trajectories:
            if t.parent_id is not None:
                events.setdefault((t.parent_id, t.branch_token_index), []).append(t.traj_id)
        sizes = [len(v) for _, v in sorted(events.items(), key=lambda kv: min(kv[1]))]
        assert sum(sizes) == 8 - sum(t.parent_id is None for t in tree.trajectories)
        assert all(n == z for n in sizes[:-1]) and 1 <= sizes[-1] <= z  # only the last event is cut by M
        fired = [d for t in tree.trajectories for d in t.branch_decisions if d["branched"]]
        assert len(fired) == len(events)


def test_issued_calls_equal_the_tool_runs(tiny_lm, tiny_tok):
    """train.issued_calls counts each tool run once: the calls of a tree's trajectories minus the prefix
    calls branches inherit equal the calls the tool really received."""
    from arpo.training.rollout_metrics import issued_calls

    runs = []

    class Counting(Echo):
        def __call__(self, x):
            runs.append(x)
            return super().__call__(x)

    cfg = RolloutConfig(group_size=8, initial_rollouts=2, entropy_weight=0.0, branch_threshold=0.0, entropy_tokens=2)
    ro = ARPORollout(HFEngine(tiny_lm, tiny_tok), ToolRegistry([Counting()]), AgentConfig(max_response_tokens=400), cfg)
    hook_rollout(ro, scripted_hook(tiny_tok, SCRIPT, free_tokens=4))
    (tree,) = ro.run(prompts(tiny_tok, 1))
    assert sum(t.parent_id is not None for t in tree.trajectories) == 6
    assert sum(issued_calls(t) for t in tree.trajectories) == len(runs)
    assert sum(len(t.traj.tool_calls) for t in tree.trajectories) > len(runs)  # inherited calls are not re-run


def test_reference_mode_fork_starts_with_zero_delta_entropy(tiny_lm, tiny_tok):
    """Reference code: a fork takes a new batch slot whose H_initial is the entropy of its first own
    segment, so the fork's first decision has ΔH = 0 and later ones are measured against that segment."""
    firsts, later = 0, 0
    for seed in range(3):
        cfg = RolloutConfig(group_size=8, initial_rollouts=2, entropy_tokens=3, mode="reference", seed=seed)
        (tree,) = make(tiny_lm, tiny_tok, cfg).run(prompts(tiny_tok, 1))
        for t in tree.trajectories:
            if t.parent_id is None or not t.branch_decisions:
                continue
            parent = tree.trajectories[t.parent_id]
            at = next(i for i, c in enumerate(parent.traj.tool_calls) if c.result_span[1] == t.branch_token_index)
            assert t.initial_entropy == t.step_entropies[at]  # its own first segment, not the parent's H_initial
            first, *rest = t.branch_decisions
            assert first["tool_call_index"] == at + 1 and first["delta_entropy"] == 0.0
            firsts += 1
            for d in rest:
                i = d["tool_call_index"]
                assert d["delta_entropy"] == pytest.approx(t.step_entropies[i - 1] - t.step_entropies[at], abs=1e-5)
                later += 1
    assert firsts > 0 and later > 0


def test_aepo_penalty_counts_rounds_and_scales_the_score(tiny_lm, tiny_tok):
    """β = 0, τ = 0.25, penalty 0.5: f = 1, 0.5, 0 for l = 0, 1, 2 consecutive branching rounds, so
    P = 1 − 0.25/f = 0.75, 0.5, 0 (hand values; scaling the probability would give 0.75, 0.375, 0).
    l counts rounds (tool-call depths), not decisions: every decision after the first tool result
    (round 0) has l = 0, however many of them branched."""
    want = {0: 0.75, 1: 0.5, 2: 0.0}
    seen = set()
    for seed in range(2):
        cfg = RolloutConfig(group_size=16, initial_rollouts=4, entropy_tokens=2, entropy_weight=0.0,
                            branch_threshold=0.25, consecutive_branch_penalty=0.5, seed=seed)
        (tree,) = make(tiny_lm, tiny_tok, cfg).run(prompts(tiny_tok, 1))
        ds = [d for t in tree.trajectories for d in t.branch_decisions]
        for d in ds:
            t, consec = d["tool_call_index"], d["consecutive"]
            assert consec <= t and (t > 0 or consec == 0)
            assert d["probability"] == pytest.approx(want[min(consec, 2)], abs=1e-6)
            seen.add(min(consec, 2))
        # several branches in round 0, and l stays 0 there
        assert sum(d["branched"] for d in ds if d["tool_call_index"] == 0) >= 2
    assert {0, 1} <= seen
