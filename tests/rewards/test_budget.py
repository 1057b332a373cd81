"""Budgets and rewards as settings (issue 59 item 3), against hand-computed values: a missing answer at
the token cap or the call cap scored apart from malformed text, DAPO's overlong penalty and filter,
OTC's tool-productivity factor."""

import math

import pytest

from arpo.algos.presets import get_preset
from arpo.config import load_config
from arpo.errors import ArpoError
from arpo.rewards import arpo_reward, get_reward_fn, score_trees
from arpo.rewards.budget import (
    RewardShaping,
    failed_format_reward,
    optimal_calls,
    otc_tool_factor,
    overlong_penalty,
    shape_group,
)
from arpo.rollout.agent import ToolCallRecord, Trajectory
from arpo.rollout.tree import RolloutTree, TreeTrajectory
from arpo.settings import RewardConfig, TrainConfig
from arpo.training.step_batch import build_batch

EX = {"answers": ["391"], "task": "math"}
CUT = "<think> 17*23 is"  # what the token budget leaves of a response: no answer
CAPPED = "<think> x </think><python>1</python>"  # a call beyond the cap, never run
MALFORMED = "<think> x </think> \\boxed{391}"  # ended by itself, no <answer>
GOOD = "<think> x </think><answer> \\boxed{391} </answer>"


def test_failed_format_reward_by_how_it_ended():
    assert failed_format_reward("eos", -1.0, 0.0, -0.5) == -1.0
    assert failed_format_reward("answer", -1.0, 0.0, -0.5) == -1.0
    assert failed_format_reward("length", -1.0, 0.0, -0.5) == 0.0
    assert failed_format_reward("tool_cap", -1.0, 0.0, -0.5) == -0.5
    # unset: the format penalty (today's behaviour)
    assert failed_format_reward("length", -1.0) == failed_format_reward("tool_cap", -1.0) == -1.0


@pytest.mark.parametrize("text,reason,expected", [
    (MALFORMED, "eos", -0.7), (CUT, "length", 0.0), (CAPPED, "tool_cap", -0.2), (GOOD, "answer", 1.0),
    (GOOD, "length", 1.0),  # an answer that is there counts whatever ended the response
])
def test_arpo_reward_scores_each_ending_with_its_penalty(text, reason, expected):
    res = arpo_reward(text, EX, finish_reason=reason, format_penalty=-0.7, truncated_penalty=0.0,
                      call_cap_penalty=-0.2)
    assert res.reward == expected
    assert res.format_ok == (text == GOOD)


def test_defaults_keep_minus_one_for_all_three():
    for text, reason in ((MALFORMED, "eos"), (CUT, "length"), (CAPPED, "tool_cap")):
        assert arpo_reward(text, EX, finish_reason=reason).reward == -1.0
        assert get_reward_fn("arpo", **RewardConfig().options())(text, EX, finish_reason=reason).reward == -1.0


def test_overlong_penalty_hand_values():
    # L_max 100, L_cache 20: free up to 80, then linear down to −1 at 100
    assert [overlong_penalty(n, 100, 20) for n in (50, 80, 90, 95, 100)] == [0.0, 0.0, -0.5, -0.75, -1.0]
    assert overlong_penalty(85, 100, 20, factor=0.5) == -0.125
    assert overlong_penalty(101, 100, 20) == -1.0  # beyond L_max: −1 (DAPO)
    assert overlong_penalty(100, 100, 0) == 0.0  # L_cache 0: off


def test_otc_tool_factor_hand_values():
    assert otc_tool_factor(2, 2) == pytest.approx(1.0)
    assert otc_tool_factor(4, 2) == pytest.approx(math.sin(2 * math.pi / 3))  # f = 2·2·4/6 = 8/3; 8/3·π/4
    assert otc_tool_factor(1, 2) == pytest.approx(math.sin(math.pi / 3))  # f = 4/3; 4/3·π/4
    assert otc_tool_factor(4, 2) == pytest.approx(0.8660254)
    assert otc_tool_factor(0, 0) == 1.0
    assert otc_tool_factor(1, 0) == pytest.approx(0.5)  # cos(π/3), c = 1
    assert otc_tool_factor(2, 0, c=2.0) == pytest.approx(math.cos(2 * math.pi / 6))
    assert otc_tool_factor(6, 3) > otc_tool_factor(9, 3) > 0  # more calls beyond n*: less
    assert optimal_calls([3, 2, 1, 5], [True, True, False, True]) == 2
    assert optimal_calls([3, 2], [False, False]) is None


def test_shape_group_hand_values():
    shaping = RewardShaping(max_length=100, overlong_buffer=20, tool_efficiency="otc")
    out = shape_group([1.1, 1.0, 0.0, -1.0], [50, 95, 100, 100], [2, 4, 1, 6], [True, True, False, False], shaping)
    # n* = 2 (fewest calls of a correct one): 1.1·1 + 0; 1.0·0.866 − 0.75; 0 − 1; −1 − 1 (penalties not scaled)
    assert out == pytest.approx([1.1, 0.8660254 - 0.75, -1.0, -2.0])
    # no correct answer in the group: OTC has no n*, the rewards stay
    assert shape_group([0.5, 0.0], [10, 10], [1, 3], [False, False], RewardShaping(tool_efficiency="otc")) == [0.5, 0.0]


def _traj(n_tokens: int, reason: str, text: str, calls: int = 0) -> Trajectory:
    return Trajectory(sid=0, prompt_ids=[1, 2], response_ids=list(range(3, 3 + n_tokens)), loss_mask=[1] * n_tokens,
                      logprobs=[-1.0] * n_tokens, entropies=[0.5] * n_tokens, text=text,
                      tool_calls=[ToolCallRecord("python", "1", "1", True, 0.0) for _ in range(calls)],
                      finish_reason=reason)


def _tree():
    ts = [_traj(6, "answer", GOOD, calls=1), _traj(10, "length", CUT), _traj(8, "tool_cap", CAPPED, calls=2),
          _traj(9, "answer", GOOD, calls=2)]
    return RolloutTree("p", [1, 2], [TreeTrajectory(t, i, None, None) for i, t in enumerate(ts)], example=EX)


def test_score_trees_applies_the_penalties_the_shaping_and_the_overlong_filter():
    fn = get_reward_fn("arpo", **RewardConfig(truncated_penalty=0.0, call_cap_penalty=-0.5).options())
    tree = _tree()
    shaping = RewardShaping(max_length=10, overlong_buffer=4, overlong_filter=True, tool_efficiency="otc")
    score_trees([tree], fn, "math_equal", ("python",), shaping)
    # n* = 1; lengths 6, 10, 8, 9 against L_max 10, L_cache 4: penalties 0, −1, −0.5, −0.75
    expected = [1.0, 0.0 - 1.0, -0.5 - 0.5, otc_tool_factor(2, 1) - 0.75]
    assert [t.reward for t in tree.trajectories] == pytest.approx(expected)
    assert [t.result.reward for t in tree.trajectories] == pytest.approx(expected)
    assert [t.loss_weight for t in tree.trajectories] == [1.0, 0.0, 1.0, 1.0]  # the token budget cut #1
    batch = build_batch([tree], get_preset("grpo"))
    rows = [batch.rows[(0, i)] for i in range(4)]
    assert [float(batch.mask[r].sum()) for r in rows] == [6.0, 0.0, 8.0, 9.0]  # #1 trains no token
    assert float(batch.advantages[rows[1], 0]) != 0.0  # its reward still counts in the group's baseline


def test_without_shaping_score_trees_is_unchanged():
    tree = _tree()
    score_trees([tree], get_reward_fn("arpo"), "math_equal", ("python",))
    assert [t.reward for t in tree.trajectories] == [1.0, -1.0, -1.0, 1.0]
    assert all(t.loss_weight == 1.0 for t in tree.trajectories)
    batch = build_batch([tree], get_preset("grpo"))
    assert float(batch.mask.sum()) == 6 + 10 + 8 + 9


def test_reward_settings_load_and_are_checked():
    cfg = load_config(TrainConfig, None, ["reward.truncated_penalty=0", "reward.call_cap_penalty=-0.5",
                                          "reward.overlong_buffer=64", "reward.overlong_filter=true",
                                          "reward.tool_efficiency=otc"])
    cfg.reward.validate()
    assert cfg.reward.options() == {"format_penalty": -1.0, "truncated_penalty": 0.0, "call_cap_penalty": -0.5,
                                    "multi_tool_bonus": 0.1}
    s = RewardShaping.of(cfg.reward, cfg.agent.max_response_tokens)
    assert (s.max_length, s.overlong_buffer, s.overlong_filter, s.tool_efficiency) == (1024, 64, True, "otc")
    with pytest.raises(ArpoError, match="reward.format_penalty"):
        RewardConfig(fn="f1", format_penalty=-0.5).validate()
    with pytest.raises(ArpoError, match="reward.tool_efficiency"):
        RewardConfig(tool_efficiency="fewest").validate()
    with pytest.raises(ArpoError, match="reward.overlong_buffer"):
        RewardConfig(overlong_buffer=-1).validate()
