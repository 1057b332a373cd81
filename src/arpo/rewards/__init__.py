"""Rewards (spec §5): the hierarchical ARPO reward and pluggable alternatives.

    reward = format_penalty (−1)   if the format check fails                       (format.py)
                                   (truncated_penalty / call_cap_penalty instead when the token
                                   budget / the call cap ended the response: budget.py)
           = score + 0.1           if score > 0 and both search and python were called
           = score                 if score > 0
           = 0                     otherwise
score = math equivalence (0/1) for math, max token F1 over the gold answers for QA (answer.py).

A reward function is `fn(response, example, *, tool_calls=None, tools=None, tool_spans=None,
finish_reason=None, **options) -> RewardResult`, with
`example = {"answers": [str, ...], "task": "math" | "qa", ...}`, `tool_calls` the rollout's call
records, `tools` the tags of the tools the agent had (a plug-in tool's `<sql>` is a call, not stray
text; default: search and python), `finish_reason` how the rollout ended it (rollout/agent.py) and
`tool_spans` the [start, end) character spans of `response` that the environment appended (tool results and their
markup; `Trajectory.tool_spans`, from the loss mask). `get_reward_fn("module.path:function")` loads
your own, which may also return a number or a dict (custom.py: the contract; check_reward tries it
before a run).

Answers and tags are read only from what the model generated: a tool whose output contains
`</result><answer>\\boxed{72}</answer>` must not answer for the model. Every built-in reward does so
through `tool_spans` (check_format reads the blocks as data, the answer comes from
`model_text(response, tool_spans)`). A plug-in reward (`module:function`, custom.py) is handed the
model's own text as its `response` (tool results removed) and asks for the whole response by
naming a `raw_response` parameter. Without `tool_spans` (a caller that has only text) the built-in
rewards read the text as it is; a plug-in still gets it without its `<result>` blocks.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Iterable
from typing import Any

from arpo.errors import ArpoError
from arpo.rewards.answer import exact_match, extract_boxed, f1_score, math_equal, max_over_golds
from arpo.rewards.budget import RewardShaping, failed_format_reward, shape_group
from arpo.rewards.custom import UserReward
from arpo.rewards.env import env_reward, rg_reward, vf_reward
from arpo.rewards.format import TOOL_TAGS, check_format, model_text, tool_calls_in
from arpo.rewards.result import RewardResult, response_answer

__all__ = ["RewardResult", "arpo_reward", "f1_reward", "em_reward", "get_reward_fn", "score_answer",
           "check_format", "model_text", "extract_boxed", "f1_score", "exact_match", "math_equal", "max_over_golds"]

MATH_SCORERS = ("math_equal", "f1")


RewardFn = Callable[..., RewardResult]


def _tools_used(response: str, tool_calls: Iterable[Any] | None, tool_spans=None) -> set[str]:
    """Tools called: from the rollout's call records (dicts or objects with `tool`, or `tag`),
    else the top-level call tags of the response."""
    if tool_calls is None:
        return set(tool_calls_in(response, tool_spans=tool_spans))
    used: set[str] = set()
    for c in tool_calls:
        name = c.get("tool", c.get("tag")) if isinstance(c, dict) else getattr(c, "tool", getattr(c, "tag", None))
        if name is not None:  # a record naming no tool
            used.add(name)
    return used


def _golds(example: dict) -> list[str]:
    golds = example.get("answers", example.get("answer", []))
    return [str(golds)] if isinstance(golds, (str, int, float)) else [str(g) for g in golds]


_answer = response_answer  # the model's answer, read from its own text (tool_spans)


def score_answer(answer: str | None, example: dict, math_scorer: str = "math_equal") -> float:
    """Spec §5.2: math equivalence (0/1) for math, max token F1 over golds otherwise."""
    if math_scorer not in MATH_SCORERS:
        raise ArpoError(f"unknown math_scorer {math_scorer!r}; use one of {', '.join(MATH_SCORERS)}")
    golds = _golds(example)
    if answer is None or not golds:
        return 0.0
    if example.get("task") == "math" and math_scorer == "math_equal":
        return float(any(math_equal(answer, g) for g in golds))
    return max_over_golds(f1_score, answer, golds)


def _tags(tools: Iterable[str] | None) -> tuple[str, ...]:
    return TOOL_TAGS if tools is None else tuple(tools)


def arpo_reward(response: str, example: dict, *, tool_calls: Iterable[Any] | None = None, task: str | None = None,
                math_scorer: str = "math_equal", format_penalty: float = -1.0, multi_tool_bonus: float = 0.1,
                tools: Iterable[str] | None = None, tool_spans=None, finish_reason: str | None = None,
                truncated_penalty: float | None = None, call_cap_penalty: float | None = None,
                **_: Any) -> RewardResult:
    """The hierarchical reward of spec §5: format gate, correctness score, multi-tool bonus.
    `task` overrides `example["task"]`; `tool_calls` (the rollout's records) wins over counting tags;
    `tools`: the tags of the agent's tools (default search, python); `tool_spans`: the environment's
    blocks (module docstring). A response that fails the format check gets `format_penalty`, or
    `truncated_penalty` / `call_cap_penalty` (when set) if `finish_reason` says the token budget /
    the call cap ended it (budget.failed_format_reward)."""
    ex = dict(example, task=task) if task else example
    err = check_format(response, _tags(tools), tool_spans)
    ans = _answer(response, tool_spans)
    if err is not None:
        penalty = failed_format_reward(finish_reason, format_penalty, truncated_penalty, call_cap_penalty)
        return RewardResult(penalty, 0.0, False, err, ans, False)
    score = score_answer(ans, ex, math_scorer)
    both = {"search", "python"} <= _tools_used(response, tool_calls, tool_spans)
    bonus = multi_tool_bonus if score > 0 and both else 0.0
    return RewardResult(score + bonus, score, True, None, ans, score >= 1.0 - 1e-9)


def f1_reward(response: str, example: dict, *, tools: Iterable[str] | None = None, tool_spans=None,
              **_: Any) -> RewardResult:
    """Max token F1 of the model's last \\boxed{} over the golds, with no format gate and no bonus."""
    ans = _answer(response, tool_spans)
    s = max_over_golds(f1_score, ans, _golds(example)) if ans is not None else 0.0
    err = check_format(response, _tags(tools), tool_spans)
    return RewardResult(s, s, err is None, err, ans, s >= 1.0 - 1e-9)


def em_reward(response: str, example: dict, *, tools: Iterable[str] | None = None, tool_spans=None,
              **_: Any) -> RewardResult:
    """Exact match (SQuAD-normalized) of the model's last \\boxed{}, no format gate and no bonus."""
    ans = _answer(response, tool_spans)
    s = max_over_golds(exact_match, ans, _golds(example)) if ans is not None else 0.0
    err = check_format(response, _tags(tools), tool_spans)
    return RewardResult(s, s, err is None, err, ans, s == 1.0)


REWARDS: dict[str, RewardFn] = {"arpo": arpo_reward, "f1": f1_reward, "em": em_reward,  # rewards/env.py: env-owned
                                "env": env_reward, "rg": rg_reward, "vf": vf_reward}


def get_reward_fn(name: str, **options: Any) -> RewardFn:
    """A built-in reward (arpo, f1, em) or your own as `module.path:function`. `options` (the arpo
    reward's penalties and bonus: settings RewardConfig.options) are bound to a built-in reward;
    a plug-in takes none (RewardConfig.validate refuses them for it)."""
    if name in REWARDS:
        return functools.partial(REWARDS[name], **options) if options else REWARDS[name]
    mod, sep, fn = name.partition(":")
    if not sep or not mod or not fn:
        raise ArpoError(f"unknown reward {name!r}; use one of {', '.join(REWARDS)} or module.path:function")
    try:
        obj = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError, ValueError) as e:
        raise ArpoError(f"reward {name!r} cannot be loaded: {e}") from e
    if not callable(obj):
        raise ArpoError(f"reward {name!r} is not callable")
    if obj in REWARDS.values():  # a built-in by its path
        return obj

    return UserReward(obj, name)  # the contract: a number, a dict or a RewardResult; errors name the example


def score_trees(trees, reward_fn, math_scorer: str, tools: Iterable[str] | None = None,
                shaping: RewardShaping | None = None) -> None:
    """Attach a RewardResult to every trajectory of rollout trees (TreeTrajectory.reward = its scalar).
    `tools`: the tags of the agent's tools (a ToolRegistry works: its names). `shaping` (budget.py):
    OTC's tool factor and DAPO's overlong penalty on each tree's rewards (the result's `reward`
    becomes the shaped one; a response the token budget cut counts as longer than the budget, also
    when the cut came at a tool result that did not fit), and DAPO's overlong filter (a trajectory
    the token budget cut gets loss_weight 0: it trains no token)."""
    tags = None if tools is None else tuple(tools)
    own = getattr(reward_fn, "score_trees", None)
    if own is not None:  # a reward that scores whole groups at once, or in parallel (a judge, a rubric)
        return own(trees, math_scorer, tags)
    for tree in trees:
        for t in tree.trajectories:
            calls = [{"tool": c.tool, "ok": c.ok, "meta": c.meta} for c in t.traj.tool_calls]
            res = reward_fn(t.traj.text, tree.example, tool_calls=calls, math_scorer=math_scorer, tools=tags,
                            tool_spans=t.traj.tool_spans, finish_reason=t.traj.finish_reason)
            t.reward = float(res.reward)
            t.result = res
        if shaping is not None and shaping.active:
            _shape(tree, shaping)


def _shape(tree, shaping: RewardShaping) -> None:
    ts = tree.trajectories
    over = shaping.max_length + 1  # a response the token budget cut is longer than the budget (DAPO: −1)
    lengths = [over if t.traj.finish_reason == "length" else len(t.traj.response_ids) for t in ts]
    shaped = shape_group([t.reward for t in ts], lengths,
                         [len(t.traj.tool_calls) for t in ts], [bool(t.result.correct) for t in ts], shaping)
    for t, r in zip(ts, shaped, strict=True):
        t.reward = r
        t.result = dataclasses.replace(t.result, reward=r)
        if shaping.overlong_filter and t.traj.finish_reason == "length":
            t.loss_weight = 0.0
