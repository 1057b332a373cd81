"""Staged branch rules (issue 41): rules that look at all of a prompt's decision points at once.

A per-decision rule (rollout/branch_rules.py: arpo, reference, aepo, bernoulli) is asked online,
once per decision, in the order trajectories reach their tool results. A rule that standardizes ΔH
over the decision points, spends a fixed budget on the best of them or asks whether finished
siblings disagree needs the whole set, and "the decisions seen so far" depends on the order they
arrive in. So a staged rule decides at a deterministic stage instead (rollout/arpo.py):

  1. the prompt's N initial samples run to their end without branching; every tool result t of
     every initial sample g is a decision point (g, t) with ΔH_{g,t} = H_{g,t} − H_{g,initial} (the
     paper's timing) and its rollout key (rollout_key(seed, prompt, DECISION, g, t));
  2. once all N have finished, the rule maps the list of points to probabilities P_i (a pure
     function of the set: the order the points are listed in does not matter); point i branches iff
     u_i < P_i, u_i = key_uniform(key_i), the same keyed uniform a per-decision rule uses;
  3. branched points fork Z (`branch_factor`) continuations each, right after their tool result, in
     the order of `branch_order` (highest P first, ties by key) while the group has room (M − N);
     forks run to their end and do not branch again (one expansion round, as EPTree with one
     iteration); fill-up globals then bring the group to M if it has fewer.

The stage is defined by tokens, not time: when the last initial sample finishes is a property of
the samples, so the same seed gives the same points, the same probabilities and the same forks
whatever order tool results arrived in. Standardization is per prompt (not per step): a step's
prompts are split over ranks, and a per-step statistic would depend on the number of ranks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DecisionPoint:
    """One decision point of a staged rule: after tool result `depth` (0-based) of an initial sample."""

    delta_entropy: float  # ΔH = H_t − H_initial of the initial sample
    depth: int  # t
    key: int  # its rollout key (rollout_key(..., DECISION, g, t)): its uniform, and the tie-break
    open_share: float = 0.0  # how much the finished siblings at this point disagree (open_shares)


@dataclass(frozen=True)
class GroupContext:
    """What a staged rule may know about the group besides its points."""

    beta: float  # rollout.entropy_weight
    tau: float  # rollout.branch_threshold
    forks: int  # how many points the budget can branch: ⌈(M − N) / Z⌉


GroupRule = Callable[[Sequence[DecisionPoint], GroupContext], list[float]]


def staged(fn: GroupRule) -> GroupRule:
    """Mark your own function as a staged rule (a plug-in `module:function` is one when it has
    `staged = True`; the built-in rules below are staged by their entry in settings' BRANCH_RULES)."""
    fn.staged = True  # type: ignore[attr-defined]
    return fn


def _clip(p: float) -> float:
    return min(1.0, max(0.0, p))


def z_scores(xs: Sequence[float]) -> list[float]:
    """z_i = (x_i − x̄) / s, s the population sd of xs; every z_i = 0 when s = 0 (one point, or all equal)."""
    if not xs:
        return []
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return [0.0 if sd == 0 else (x - mean) / sd for x in xs]


def zscore_rule(points: Sequence[DecisionPoint], ctx: GroupContext) -> list[float]:
    """ARPO's rule on standardized ΔH: P_i = clip(1 − τ + β·z_i, 0, 1), z_i = (ΔH_i − mean)/sd over the
    prompt's decision points (z_scores). β is then scale-free: β = 0.2 moves P by 0.2 per standard
    deviation of ΔH, whatever the entropy's unit, and the mean P is 1 − τ (before clipping)."""
    return [_clip(1.0 - ctx.tau + ctx.beta * z) for z in z_scores([p.delta_entropy for p in points])]


def _top(order: list[int], k: int, n: int) -> list[float]:
    """P = 1 for the first k indexes of `order`, 0 for the other of the n points."""
    chosen = set(order[: max(0, k)])
    return [1.0 if i in chosen else 0.0 for i in range(n)]


def top_entropy_rule(points: Sequence[DecisionPoint], ctx: GroupContext) -> list[float]:
    """Budgeted (TreeRL's EPTree forks at its top-entropy tokens): the ctx.forks points with the largest
    ΔH branch (P = 1), the others do not (P = 0); ties go to the smaller key. No coin flips: the
    whole budget M − N is spent, on the points where the entropy rose most."""
    order = sorted(range(len(points)), key=lambda i: (-points[i].delta_entropy, points[i].key))
    return _top(order, ctx.forks, len(points))


def outcome_open_rule(points: Sequence[DecisionPoint], ctx: GroupContext) -> list[float]:
    """Branch where the outcome is still open: among the points whose finished siblings disagree
    (open_share > 0, open_shares), the ctx.forks with the largest open_share branch (P = 1); ties go
    to the larger ΔH, then the smaller key. Points whose siblings agree never branch; room they
    leave goes to fill-up globals (fresh samples)."""
    open_ = [i for i, p in enumerate(points) if p.open_share > 0]
    order = sorted(open_, key=lambda i: (-points[i].open_share, -points[i].delta_entropy, points[i].key))
    return _top(order, ctx.forks, len(points))


def branch_order(points: Sequence[DecisionPoint], probs: Sequence[float]) -> list[int]:
    """The order in which branched points take the group's room: highest P first, ties by key."""
    return sorted(range(len(points)), key=lambda i: (-probs[i], points[i].key))


_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)


def final_answer(text: str, finish_reason: str) -> str | None:
    """The last `<answer>…</answer>` of a response, whitespace-collapsed; None when it did not end
    with an answer (another outcome: no answer)."""
    found = _ANSWER.findall(text) if finish_reason == "answer" else []
    return " ".join(found[-1].split()) if found else None


def open_shares(call_paths: Sequence[Sequence[str]], answers: Sequence[str | None]) -> list[list[float]]:
    """For initial sample g and its tool result t: its siblings S_{g,t} are the initial samples whose
    first t + 1 tool calls are g's (same call text: they stood where g stood after result t), and
    open_share_{g,t} = 1 − (count of the most common final answer in S_{g,t}) / |S_{g,t}| — 0 when
    they agree (or g is alone), up to 1 − 1/|S| when they all differ. No answer counts as an answer."""
    out = []
    for path in call_paths:
        row = []
        for t in range(len(path)):
            sibs = [h for h, other in enumerate(call_paths) if list(other[: t + 1]) == list(path[: t + 1])]
            counts: dict[str | None, int] = {}
            for h in sibs:
                counts[answers[h]] = counts.get(answers[h], 0) + 1
            row.append(1.0 - max(counts.values()) / len(sibs))
        out.append(row)
    return out

