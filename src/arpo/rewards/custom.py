"""Your own reward function behind arpo's contract (`reward.fn=module:function`, `--reward module:function`).

The contract (README "Reward contract"): arpo calls `fn(response, example, **options)` once per
trajectory, with `response` the text the MODEL wrote — the tool results the environment appended
are removed (`own_text`: the rollout's `tool_spans` blanked, or without them everything from the
first `<result>` to the last `</result>`), so a reward that looks for the gold in `response` never credits an
answer a tool printed (issue 37) — and `example` the data row (`question`, `answers`, `task`, `id`,
and the row's other fields); options `tool_calls` ([{tool, ok}]), `tools` (the agent's tool names),
`math_scorer`, `tool_spans`, `finish_reason` (answer | eos | stop | length: the token budget |
tool_cap: the call cap; rollout/agent.py) and `raw_response` are passed only if the function accepts them (by
name or **kwargs). A reward that must read the tool results asks for them: a parameter named
`raw_response` receives the whole response, tool results included (with `tool_spans`, the spans of
the results in it). A function with a `completions` parameter is called the TRL way:
`fn(prompts=[question], completions=[the model's own text], **row fields)` and may return a list.

It may return
* a number r (TRL's convention): reward r; score = r clipped to [0, 1]; correct when r >= 1;
* a dict with `reward` (number) and optionally `score`, `correct`, `format_ok`, `format_error`, `answer`;
* an object with those attributes (arpo.rewards.RewardResult).
Anything else, a NaN or an infinity, or an exception is an ArpoError that names the function and the example; every
command calls the reward once (`check_reward`) before it loads a model, so a broken reward fails in a
second, not after the model has loaded.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

from arpo.errors import ArpoError
from arpo.rewards.format import model_text
from arpo.rewards.result import RewardResult, response_answer

OPTIONS = ("tool_calls", "tools", "math_scorer", "task", "tool_spans", "raw_response", "finish_reason")
FIELDS = ("score", "correct", "format_ok", "format_error", "answer")
CONTRACT = "return a number, a dict with a numeric 'reward', or an object with a .reward (README: Reward contract)"


class UserReward:
    """A user's reward function, called by the contract above; returns a RewardResult."""

    def __init__(self, fn, name: str):
        self.fn, self.name = fn, name
        params: Mapping[str, inspect.Parameter]
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # a builtin or C callable: pass everything
            params = {}
        self.any_kw = not params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        self.names = set(params)
        self.trl = "completions" in self.names

    def _options(self, kw: dict) -> dict:
        return {k: v for k, v in kw.items() if self.any_kw or k in self.names}

    def __call__(self, response: str, example: dict, **kw: Any):
        where = f"reward {self.name} on example {example.get('id', '?')}"
        raw, response = response, own_text(response, kw.get("tool_spans"))
        kw = {**kw, "raw_response": raw}  # only a function that names it (or takes **kwargs) gets it
        try:
            if self.trl:
                rows = {k: [v] for k, v in example.items() if k not in ("prompts", "completions")}
                out = self.fn(prompts=[example.get("question", "")], completions=[response],
                              **self._options({**rows, **kw}))
                if isinstance(out, (list, tuple)):
                    if len(out) != 1:
                        raise ArpoError(f"{where}: returned {len(out)} values for 1 completion")
                    out = out[0]
            else:
                out = self.fn(response, example, **self._options(kw))
        except ArpoError:
            raise
        except Exception as e:
            raise ArpoError(f"{where} raised {type(e).__name__}: {e}") from e
        return to_result(out, raw, where, kw.get("tool_spans"))


def own_text(response: str, tool_spans=None) -> str:
    """The model's own text of a response: the environment's blocks (`tool_spans`, the rollout's) each
    replaced by a newline. Without spans (a script scoring saved text) the blocks cannot be told from a
    tool's output that prints `</result> ... <result>` (issue 61: a non-greedy strip kept such a tool's
    `\\boxed{72}` as the model's), so everything from the first `<result>` to the last `</result>` goes
    (the model's text between its tool calls with it; its final answer, after the last result, stays),
    and a `<result>` never closed takes the rest of the response with it."""
    if tool_spans is not None:
        return model_text(response, tool_spans)
    first = response.find("<result>")
    if first == -1:
        return response
    last = response.rfind("</result>")
    if last < first:
        return response[:first] + "\n"
    return response[:first] + "\n" + response[last + len("</result>"):]


def to_result(out, response: str, where: str, tool_spans=None):
    """A RewardResult from what a reward function returned (see the module docstring)."""
    if isinstance(out, RewardResult):
        return out
    if isinstance(out, dict):
        if "reward" not in out:
            raise ArpoError(f"{where}: returned a dict without 'reward' (keys: {', '.join(map(str, out)) or 'none'}); "
                            + CONTRACT)
        vals = dict(out)
    elif isinstance(out, (int, float)) and not isinstance(out, complex):
        vals = {"reward": out}
    elif hasattr(out, "reward"):
        vals = {k: getattr(out, k) for k in ("reward", *FIELDS) if hasattr(out, k)}
    else:
        raise ArpoError(f"{where}: returned {type(out).__name__} {out!r:.80}; " + CONTRACT)
    try:
        reward = float(vals["reward"])
        score = float(vals["score"]) if vals.get("score") is not None else min(max(reward, 0.0), 1.0)
    except (TypeError, ValueError) as e:
        raise ArpoError(f"{where}: reward/score is not a number ({e}); " + CONTRACT) from e
    if not (math.isfinite(reward) and math.isfinite(score)):  # inf passed the start check, then killed the step
        raise ArpoError(f"{where}: returned {reward if not math.isfinite(reward) else score} (reward and score "
                        "must be finite numbers)")
    correct = bool(vals["correct"]) if vals.get("correct") is not None else score >= 1.0 - 1e-9
    return RewardResult(reward, score, bool(vals.get("format_ok", True)), vals.get("format_error"),
                        vals["answer"] if "answer" in vals else response_answer(response, tool_spans), correct)


def check_reward(fn, examples: list[dict], math_scorer: str = "math_equal", name: str = "") -> None:
    """Call the reward once, on a well-formed answer with the first example's gold, before any model
    loads: a reward that raises or returns something else fails here (an ArpoError naming it)."""
    if not examples:
        return
    ex = examples[0]
    golds = ex.get("answers") or [ex.get("answer", "")]
    gold = golds[0] if isinstance(golds, (list, tuple)) and golds else golds
    response = f"<think>checking the reward</think>\n<answer>\\boxed{{{gold}}}</answer>"
    try:
        res = fn(response, ex, tool_calls=[], tools=(), math_scorer=math_scorer)
    except ArpoError as e:
        raise ArpoError(f"the reward failed its check call (a well-formed answer with the gold): {e}") from e
    except Exception as e:
        raise ArpoError(f"reward {name or fn!r} raised {type(e).__name__}: {e} on its check call") from e
    if not hasattr(res, "reward"):
        raise ArpoError(f"reward {name or fn!r}: returned {type(res).__name__}; " + CONTRACT)
    for k in ("reward", "score"):
        v = getattr(res, k, 0.0)
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ArpoError(f"reward {name or fn!r}: its {k} is {v!r} on its check call (a well-formed answer with "
                            "the gold); reward and score must be finite numbers")
