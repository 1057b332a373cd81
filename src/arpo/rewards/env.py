"""Rewards that an environment owns (docs/environments.md).

* `env`: the sum of the rewards an environment paid for the trajectory's actions (tools/plugins/env.py keeps
  each step's reward on its call record, `meta.env_reward`); a call whose environment broke the
  contract (`meta.env_error`: unreachable, malformed answer, no reward at the end, a branch that did
  not replay) raises it as a one-line ArpoError, so the step fails instead of training on it.
  score = the reward clipped to [0, 1]; correct when the episode ended with reward >= 1.
* `rg`: reasoning-gym's own score_answer of the model's answer (envs/reasoning_gym.py), partial credit.
"""

from __future__ import annotations

from typing import Any

from arpo.envs.reasoning_gym import score as rg_score
from arpo.errors import ArpoError
from arpo.rewards.answer import extract_answer_block, extract_boxed
from arpo.rewards.format import model_text
from arpo.rewards.result import RewardResult, response_answer


def _meta(call) -> dict:
    m = call.get("meta") if isinstance(call, dict) else getattr(call, "meta", None)
    return m if isinstance(m, dict) else {}


def env_reward(response: str, example: dict, *, tool_calls=None, tool_spans=None, **_: Any) -> RewardResult:
    """Σ_t r_t over the trajectory's environment steps (None counts 0)."""
    total, done, paid = 0.0, False, False
    for c in tool_calls or []:
        m = _meta(c)
        if m.get("env_error"):
            raise ArpoError(f"example {example.get('id', '?')}: {m['env_error']}")
        if m.get("env_reward") is not None:
            total += float(m["env_reward"])
            paid = True
        done = done or bool(m.get("env_done"))
    score = min(max(total, 0.0), 1.0)
    return RewardResult(total, score, True, None, response_answer(response, tool_spans),
                        paid and done and total >= 1.0 - 1e-9)


def model_answer(response: str, tool_spans=None) -> str | None:
    """The model's last \\boxed{} (answer block first), else its answer block's text."""
    own = model_text(response, tool_spans)
    block = extract_answer_block(own)
    boxed = extract_boxed(block if block is not None else own)
    if boxed is not None:
        return boxed
    return block.strip() if block is not None and block.strip() else None


def rg_reward(response: str, example: dict, *, tool_spans=None, **_: Any) -> RewardResult:
    """reasoning-gym's score_answer(answer, entry) of the row's generator."""
    rg = example.get("rg")
    if not isinstance(rg, dict):
        raise ArpoError(f"reward rg on example {example.get('id', '?')}: the example is not a reasoning-gym task "
                        "(train on an rg:NAME data spec)")
    ans = model_answer(response, tool_spans)
    s = rg_score(rg["dataset"], ans, rg["entry"])
    return RewardResult(s, s, ans is not None, None if ans is not None else "no answer", ans, s >= 1.0 - 1e-9)
