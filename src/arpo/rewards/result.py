"""What a reward function returns (rewards/__init__.py, rewards/custom.py)."""

from __future__ import annotations

from dataclasses import dataclass

from arpo.rewards.answer import extract_answer_block, extract_boxed
from arpo.rewards.format import model_text


@dataclass
class RewardResult:
    reward: float
    score: float  # correctness in [0, 1]
    format_ok: bool
    format_error: str | None
    answer: str | None  # the extracted \boxed{} content
    correct: bool  # score == 1 (math equal / F1 == 1): used for accuracy and pass@k


def response_answer(response: str, tool_spans=None) -> str | None:
    """The last \\boxed{} of the model's answer block (of all the model's text when there is none):
    read from what the model generated only, never from the spans the environment appended."""
    own = model_text(response, tool_spans)
    block = extract_answer_block(own)
    return extract_boxed(block if block is not None else own)
