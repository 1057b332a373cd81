"""A rubric: a weighted sum of reward functions (`reward.fn: weighted:rg=0.8,f1=0.2`).

    reward = Σ_i w_i · r_i          score = Σ_i w_i · s_i / Σ_i w_i          correct = score ≥ 1
    format_ok = every component's;  answer = the first component's

Components are any reward spec (a built-in, `module:function`, `judge:...`), resolved by the caller's
`resolve` (eval/judge_reward.reward_from_spec resolves all of them). A component that scores whole
groups at once (a group-relative judge: `score_trees`) keeps doing so inside the sum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arpo.errors import ArpoError
from arpo.rewards import score_trees
from arpo.rewards.result import RewardResult


def parse_weights(spec: str) -> list[tuple[str, float]]:
    """'weighted:rg=0.8,f1=0.2' -> [('rg', 0.8), ('f1', 0.2)] (a name may hold ':'; the weight follows its last '=')."""
    body = spec.removeprefix("weighted:")
    out = []
    for part in filter(None, (p.strip() for p in body.split(","))):
        name, eq, w = part.rpartition("=")
        try:
            weight = float(w)
        except ValueError:
            weight = float("nan")
        if not eq or not name or weight != weight:
            raise ArpoError(f"{spec}: {part!r} is not NAME=WEIGHT (e.g. weighted:rg=0.8,f1=0.2)")
        out.append((name, weight))
    if not out or sum(w for _, w in out) == 0:
        raise ArpoError(f"{spec}: name at least one reward with a non-zero weight (e.g. weighted:rg=0.8,f1=0.2)")
    return out


def combine(results: list[RewardResult], weights: list[float]) -> RewardResult:
    total = sum(weights)
    reward = sum(w * r.reward for w, r in zip(weights, results, strict=True))
    score = sum(w * r.score for w, r in zip(weights, results, strict=True)) / total
    errs = [r.format_error for r in results if r.format_error]
    return RewardResult(reward, score, all(r.format_ok for r in results), errs[0] if errs else None,
                        results[0].answer, score >= 1.0 - 1e-9)


class WeightedReward:
    def __init__(self, spec: str, resolve: Callable[[str], Any]):
        self.spec = spec
        self.parts = [(name, resolve(name), w) for name, w in parse_weights(spec)]

    def __call__(self, response: str, example: dict, **kw: Any) -> RewardResult:
        return combine([fn(response, example, **kw) for _, fn, _ in self.parts], [w for *_, w in self.parts])

    def score_trees(self, trees, math_scorer: str, tags) -> None:
        """Each component scores the trees (its own way: per trajectory, or a group at once), then the sum."""
        per: list[list[RewardResult]] = []
        for _, fn, _ in self.parts:
            score_trees(trees, fn, math_scorer, tags)
            per.append([t.result for tree in trees for t in tree.trajectories])
        ws = [w for *_, w in self.parts]
        for i, t in enumerate(t for tree in trees for t in tree.trajectories):
            t.result = combine([p[i] for p in per], ws)
            t.reward = float(t.result.reward)

    def pop_metrics(self) -> dict:
        out: dict = {}
        for _, fn, _ in self.parts:
            for k, v in getattr(fn, "pop_metrics", dict)().items():
                out[k] = out.get(k, 0) + v
        return out
