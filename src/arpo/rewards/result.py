"""What a reward function returns (rewards/__init__.py, rewards/custom.py)."""

from __future__ import annotations

from dataclasses import dataclass

from arpo.rewards.answer import extract_answer_block, extract_boxed


@dataclass
class RewardResult:
    reward: float
    score: float  # correctness in [0, 1]
    format_ok: bool
    format_error: str | None
    answer: str | None  # the extracted \boxed{} content
    correct: bool  # score == 1 (math equal / F1 == 1): used for accuracy and pass@k


def response_answer(response: str) -> str | None:
    """The last \\boxed{} of the answer block (of the whole response when there is none)."""
    block = extract_answer_block(response)
    return extract_boxed(block if block is not None else response)
