"""Rewards that an environment owns (docs/environments.md).

* `env`: the sum of the rewards an environment paid for the trajectory's actions (tools/plugins/env.py keeps
  each step's reward on its call record, `meta.env_reward`); a call whose environment broke the
  contract (`meta.env_error`: unreachable, malformed answer, no reward at the end, a branch that did
  not replay) raises it as a one-line ArpoError, so the step fails instead of training on it.
  score = the reward clipped to [0, 1]; correct when the episode ended with reward >= 1.
* `rg`: reasoning-gym's own score_answer of the model's answer (envs/reasoning_gym.py), partial credit.
* `vf`: a verifiers task's own rubric, run in verifiers' venv (envs/verifiers.py); the step's metrics
  get each reward function's and metric's mean (`vf/NAME`).
"""

from __future__ import annotations

import threading
from typing import Any

from arpo.envs import verifiers as vf_env
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


class VfReward:
    """reward.fn: vf — the verifiers task's own rubric (envs/verifiers.py)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[str, list[float]] = {}

    def __call__(self, response: str, example: dict, *, tool_calls=None, tool_spans=None, **_: Any) -> RewardResult:
        vf = example.get("vf")
        if not isinstance(vf, dict):
            raise ArpoError(f"reward vf on example {example.get('id', '?')}: the example is not a verifiers task "
                            "(train on a vf:TASKSET data spec)")
        msgs, state = vf_env.messages(response, vf, tool_calls, tool_spans)
        try:
            r = vf_env.score(vf, msgs, state)
        except ArpoError as e:
            raise ArpoError(f"example {example.get('id', '?')}: {e}") from e
        with self._lock:
            for k, (score, _w) in r["rewards"].items():
                self._sums.setdefault(f"vf/{k}", []).append(float(score))
            for k, v in r["metrics"].items():
                self._sums.setdefault(f"vf/{k}", []).append(float(v))
        total = float(r["reward"])
        score = min(max(total, 0.0), 1.0)
        ans = response_answer(response, tool_spans) or (model_text(response, tool_spans).strip()[-200:] or None)
        return RewardResult(total, score, True, None, ans, score >= 1.0 - 1e-9)

    def pop_metrics(self) -> dict:
        """The mean of each reward function and metric over the trajectories scored since the last call."""
        with self._lock:
            out = {k: sum(v) / len(v) for k, v in self._sums.items() if v}
            self._sums = {}
        return out


vf_reward = VfReward()
