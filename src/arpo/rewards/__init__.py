"""Rewards (spec §5): the hierarchical ARPO reward and pluggable alternatives.

    reward = −1                 if the format check fails            (format.py)
           = score + 0.1        if score > 0 and both search and python were called
           = score              if score > 0
           = 0                  otherwise
score = math equivalence (0/1) for math, max token F1 over gold answers for QA (answer.py).

A reward function is `fn(response, example, *, tool_calls=None, **options) -> RewardResult`;
`get_reward_fn("module.path:function")` loads your own.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from arpo.errors import ArpoError
from arpo.rewards.answer import exact_match, extract_answer_block, extract_boxed, f1_score, math_equal, max_over_golds
from arpo.rewards.format import check_format


@dataclass
class RewardResult:
    reward: float
    score: float  # correctness in [0, 1]
    format_ok: bool
    format_error: str | None
    answer: str | None  # the extracted \boxed{} content
    correct: bool  # score == 1 (math) / F1 == 1 or EM (QA): used for accuracy and pass@k


def _tools_used(response: str, tool_calls) -> set[str]:
    if tool_calls is not None:
        return {c["tool"] if isinstance(c, dict) else c.tool for c in tool_calls}
    return {t for t in ("search", "python") if f"<{t}>" in response}


def _answer(response: str) -> str | None:
    block = extract_answer_block(response)
    return extract_boxed(block if block is not None else response)


def score_answer(answer: str | None, example: dict, math_scorer: str = "math_equal") -> float:
    golds = [str(g) for g in example.get("answers", [])]
    if answer is None or not golds:
        return 0.0
    if example.get("task") == "math" and math_scorer == "math_equal":
        return float(any(math_equal(answer, g) for g in golds))
    return max_over_golds(f1_score, answer, golds)


def arpo_reward(response: str, example: dict, *, tool_calls=None, task: str | None = None,
                math_scorer: str = "math_equal", format_penalty: float = -1.0, multi_tool_bonus: float = 0.1,
                **_) -> RewardResult:
    """The hierarchical reward of spec §5."""
    ex = dict(example, task=task) if task else example
    err = check_format(response)
    ans = _answer(response)
    if err is not None:
        return RewardResult(format_penalty, 0.0, False, err, ans, False)
    score = score_answer(ans, ex, math_scorer)
    used = _tools_used(response, tool_calls)
    reward = score + multi_tool_bonus if score > 0 and {"search", "python"} <= used else score
    return RewardResult(reward, score, True, None, ans, score >= 1.0 - 1e-9)


def f1_reward(response: str, example: dict, **_) -> RewardResult:
    """Token F1 of the last \\boxed{} (or the whole answer block), no format gate."""
    ans = _answer(response)
    s = max_over_golds(f1_score, ans or "", [str(g) for g in example.get("answers", [])]) if ans else 0.0
    err = check_format(response)
    return RewardResult(s, s, err is None, err, ans, s >= 1.0 - 1e-9)


def em_reward(response: str, example: dict, **_) -> RewardResult:
    ans = _answer(response)
    s = max_over_golds(exact_match, ans or "", [str(g) for g in example.get("answers", [])]) if ans else 0.0
    err = check_format(response)
    return RewardResult(s, s, err is None, err, ans, s == 1.0)


REWARDS = {"arpo": arpo_reward, "f1": f1_reward, "em": em_reward}


def get_reward_fn(name: str):
    """A built-in reward (arpo, f1, em) or `module.path:function`."""
    if name in REWARDS:
        return REWARDS[name]
    if ":" not in name:
        raise ArpoError(f"unknown reward {name!r}; use one of {', '.join(REWARDS)} or module.path:function")
    mod, fn = name.split(":", 1)
    try:
        obj = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise ArpoError(f"reward {name!r} cannot be loaded: {e}") from e
    if not callable(obj):
        raise ArpoError(f"reward {name!r} is not callable")
    return obj
