"""Order-free randomness (issue 38): every seed and branch uniform of a rollout comes from a key, and
every tool call that runs is counted. Reproduced first: with a shared random.Random per prompt the
same seed gave different trees when tool results arrived in a different order."""

import random
import time

import pytest

from arpo.engine.hf import HFEngine
from arpo.engine.rng import _splitmix64, fold_key, key_seed, key_uniform
from arpo.rollout.arpo import DECISION, FORK, GLOBAL, ARPORollout, rollout_key
from arpo.settings import AgentConfig, RolloutConfig
from arpo.testing import hook_rollout, scripted_hook
from arpo.tools.base import ToolResult
from arpo.tools.registry import ToolRegistry

M64 = 2**64


def test_splitmix64_matches_the_published_test_vectors():
    # Vigna's splitmix64.c: the first outputs from state 0 and from state 1234567
    assert _splitmix64(0) == 0xE220A8397B1DCDAF
    assert _splitmix64(1234567) == 6457827717110365317
    assert _splitmix64((1234567 + 0x9E3779B97F4A7C15) % M64) == 3203168211198807973


def test_fold_key_hand_values():
    s = _splitmix64
    assert fold_key() == 0
    assert fold_key(0) == s(0 ^ s(0)) == s(0xE220A8397B1DCDAF)
    assert fold_key(3, 5) == s(s(s(3)) ^ s(5))
    assert fold_key(-1) == s(s(M64 - 1))  # negative parts are taken mod 2**64
    assert fold_key(1, 2) != fold_key(2, 1) and fold_key(1, 2) != fold_key(1, 2, 0)  # position matters


def test_key_uniform_and_seed_hand_values():
    assert key_uniform(0) == 0.5 * 2.0**-52  # never 0
    assert key_uniform(M64 - 1) == 1.0 - 2.0**-53  # never 1 (exact in a double)
    assert key_uniform(2**63) == 0.5 + 2.0**-53
    assert key_uniform(4096 * 3 + 4095) == 3.5 * 2.0**-52  # the low 12 bits do not count
    assert key_seed(M64 - 1) == 2**62 - 1 and key_seed(7) == 1
    us = [key_uniform(fold_key(9, i)) for i in range(20000)]
    assert abs(sum(us) / len(us) - 0.5) < 0.01 and 0 < min(us) and max(us) < 1


def test_rollout_key_is_fold_key_of_its_parts():
    assert rollout_key(7, 2, DECISION, 0, 1) == fold_key(7, 2, DECISION, 0, 1)
    assert rollout_key(7, 2, GLOBAL, 0) != rollout_key(7, 3, GLOBAL, 0) != rollout_key(8, 2, GLOBAL, 0)
    assert rollout_key(7, 2, FORK, 0, 1, 0) != rollout_key(7, 2, DECISION, 0, 1, 0)


class JitterEcho:
    """A real tool whose latency is random (OS entropy, not a seed): results arrive in a new order
    each run. Counts its calls."""

    name = "python"

    def __init__(self, max_s: float):
        self.max_s, self.calls = max_s, 0

    def __call__(self, x):
        self.calls += 1
        time.sleep(random.SystemRandom().uniform(0.0, self.max_s))
        return ToolResult(x[::-1])


SCRIPT = ["<python> a </python>", "<python> bb </python>", "<python> ccc </python>", "<answer> \\boxed{1} </answer>"]


def rollout(tiny_lm, tok, cfg, delivery, tool, free_tokens=0, n_prompts=4):
    ro = ARPORollout(HFEngine(tiny_lm, tok), ToolRegistry([tool]),
                     AgentConfig(max_response_tokens=200, tool_delivery=delivery), cfg)
    hook_rollout(ro, scripted_hook(tok, SCRIPT, free_tokens=free_tokens))
    return ro.run([tok(f"Question number {i}?")["input_ids"] for i in range(n_prompts)], seed=5)


def shape(tree):
    """A tree up to the order its trajectories were made in: each trajectory as the path of branch
    points from its global sample (the globals in their start order)."""
    ts = tree.trajectories

    def path(i):
        t = ts[i]
        return (i,) if t.parent_id is None else path(t.parent_id) + (t.branch_token_index,)

    return sorted(path(i) for i in range(len(ts)))


def test_branch_decisions_do_not_depend_on_the_order_results_arrive(tiny_lm, tiny_tok):
    """Fully scripted tokens (every ΔH = 0, P = 0.5) and room for every branch (M = 48): which
    trajectories branch where is then decided by the draws alone. Delivered as results arrive, with
    a jittered tool, the decisions are taken in a different order each run; keyed draws give the
    same trees anyway. FAILED before (one random.Random per prompt, drawn in decision order)."""
    cfg = RolloutConfig(group_size=32, initial_rollouts=3, fill_up=False, entropy_tokens=2)
    runs = [[shape(t) for t in rollout(tiny_lm, tiny_tok, cfg, "arrival", JitterEcho(0.01), n_prompts=2)]
            for _ in range(2)]
    assert all(len(s) > 3 for s in runs[0])  # the trees do branch
    assert runs[1] == runs[0]


@pytest.mark.parametrize("aepo", [False, True])
def test_every_tool_call_that_runs_is_counted(tiny_lm, tiny_tok, aepo):
    """tool_calls_issued == the calls the tool really ran, AEPO's probe pass included (its trajectory
    is discarded, its calls are not). FAILED before for AEPO: the probe's calls went uncounted."""
    from types import SimpleNamespace as NS

    from arpo.training.rollout_metrics import metrics_of, traj_stats

    tool = JitterEcho(0.0)
    cfg = RolloutConfig(group_size=4, initial_rollouts=2, dynamic_budget=aepo,
                        consecutive_branch_penalty=0.05 if aepo else 0.0)
    trees = rollout(tiny_lm, tiny_tok, cfg, "step", tool, free_tokens=3, n_prompts=2)
    for tree in trees:
        for t in tree.trajectories:
            t.reward, t.result = 0.0, NS(correct=False, format_ok=True)
    m = metrics_of(traj_stats(trees))
    assert sum(t.parent_id is not None for tree in trees for t in tree.trajectories) > 0  # inherited calls exist
    assert m["tool_calls_issued"] == tool.calls
    assert m["probe_tool_calls"] == (2 * len(SCRIPT[:-1]) if aepo else 0)  # each probe made the script's 3 calls
