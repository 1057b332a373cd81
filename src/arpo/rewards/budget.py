"""What the budgets cost (issue 59): a missing answer at the token or call cap scored apart from
malformed text, DAPO's overlong shaping, and OTC's tool-productivity factor. Pure functions of
numbers; `RewardShaping` carries the run's settings (settings `reward.*`, docs/rewards.md) to
rewards.score_trees, which applies them to every trajectory of a rollout tree.

A trajectory ends by its `finish_reason` (rollout/agent.py): `answer`, `eos`, `stop` (it stopped
by itself), `length` (the token budget `agent.max_response_tokens`, tool results included, was
used up) or `tool_cap` (a call beyond `agent.max_tool_calls`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

CUT_BY = {"length": "the token budget", "tool_cap": "the call cap"}  # finish reasons a budget imposed


def failed_format_reward(finish_reason: str | None, format_penalty: float, truncated_penalty: float | None = None,
                         call_cap_penalty: float | None = None) -> float:
    """The reward of a response that fails the format check (no valid answer):
        truncated_penalty   if the token budget cut it        (finish_reason `length`)
        call_cap_penalty    if it ended at the call cap       (finish_reason `tool_cap`)
        format_penalty      otherwise: malformed text the model ended itself
    A penalty left None is the format penalty (spec §5.1: −1 for all three)."""
    if finish_reason == "length" and truncated_penalty is not None:
        return float(truncated_penalty)
    if finish_reason == "tool_cap" and call_cap_penalty is not None:
        return float(call_cap_penalty)
    return float(format_penalty)


def overlong_penalty(length: int, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13), scaled by `factor` (verl's
    overlong_penalty_factor), added to the reward of a response of `length` tokens:
        0                                          if length ≤ L_max − L_cache
        factor · ((L_max − L_cache) − length) / L_cache   if L_max − L_cache < length ≤ L_max
        −factor                                    if length > L_max
    with L_max = `max_length`, L_cache = `buffer` (0: off, always 0).
    E.g. L_max 100, L_cache 20: length 80 → 0, 90 → −0.5, 100 → −1."""
    if buffer <= 0:
        return 0.0
    expected = max_length - buffer
    if length <= expected:
        return 0.0
    return -float(factor) * min(1.0, (length - expected) / buffer)


def otc_tool_factor(m: int, n: int, c: float = 1.0) -> float:
    """OTC's tool-use reward r_tool(m, n) (Wang et al. 2025, "Acting Less is Reasoning More!",
    arXiv 2504.14870, OTC-GRPO) for a response with m tool calls when n calls are optimal:
        1                              if m = n = 0
        cos(m·π / (2m + c))            if n = 0 < m
        sin(f(m, n)·π / (2n))          if n > 0,   f(m, n) = 2nm / (m + n)
    It is 1 at m = n and falls as m moves away from n either way (f = n only at m = n).
    E.g. n = 2: m = 2 → 1, m = 4 → sin(2/3·π) = 0.866, m = 1 → sin(π/3) = 0.866; n = 0, c = 1:
    m = 1 → cos(π/3) = 0.5."""
    if n == 0:
        return 1.0 if m == 0 else math.cos(m * math.pi / (2 * m + c))
    f = 2.0 * n * m / (m + n)
    return max(0.0, math.sin(f * math.pi / (2 * n)))


def optimal_calls(calls: Sequence[int], correct: Sequence[bool]) -> int | None:
    """OTC-GRPO's estimate of the optimal number of calls for a question: the fewest calls among
    the group's correct responses; None when none is correct (no estimate: rewards unchanged)."""
    ok = [m for m, c in zip(calls, correct, strict=True) if c]
    return min(ok) if ok else None


TOOL_EFFICIENCY = ("off", "otc")


@dataclass(frozen=True)
class RewardShaping:
    """The group- and length-level parts of the reward, applied by rewards.score_trees after the
    reward function (settings: `reward.*`, docs/rewards.md)."""

    max_length: int = 0  # L_max: agent.max_response_tokens
    overlong_buffer: int = 0  # L_cache of overlong_penalty (0: off)
    overlong_penalty_factor: float = 1.0
    overlong_filter: bool = False  # DAPO's overlong filtering: a trajectory the token budget cut trains no token
    tool_efficiency: str = "off"  # otc: a positive reward times otc_tool_factor(m, n*) (n*: optimal_calls)
    otc_c: float = 1.0  # c of otc_tool_factor

    @classmethod
    def of(cls, reward, max_response_tokens: int) -> RewardShaping:
        """The shaping of a run: its reward section (settings RewardConfig) and token budget."""
        return cls(max_length=max_response_tokens, overlong_buffer=reward.overlong_buffer,
                   overlong_penalty_factor=reward.overlong_penalty_factor, overlong_filter=reward.overlong_filter,
                   tool_efficiency=reward.tool_efficiency, otc_c=reward.otc_c)

    @property
    def active(self) -> bool:
        return self.overlong_buffer > 0 or self.overlong_filter or self.tool_efficiency != "off"


def shape_group(rewards: list[float], lengths: list[int], calls: list[int], correct: list[bool],
                shaping: RewardShaping) -> list[float]:
    """The rewards of one group after the shaping: OTC's factor on each positive reward (n* from the
    group's correct responses), then DAPO's overlong penalty added (lengths in response tokens)."""
    out = list(rewards)
    if shaping.tool_efficiency == "otc":
        n = optimal_calls(calls, correct)
        if n is not None:
            out = [r * otc_tool_factor(m, n, shaping.otc_c) if r > 0 else r for r, m in zip(out, calls, strict=True)]
    if shaping.overlong_buffer > 0:
        out = [r + overlong_penalty(n_tok, shaping.max_length, shaping.overlong_buffer,
                                    shaping.overlong_penalty_factor) for r, n_tok in zip(out, lengths, strict=True)]
    return out
