"""Branch rules: the probability that the rollout forks at a tool step (spec §2, §7), as plug-ins.

A branch rule is a pure function `rule(ctx: BranchContext) -> float` in [0, 1]. The scheduler
(rollout/arpo.py) calls it once per branch decision, after tool result t, while the prompt's group
has room, and forks `branch_factor` new partial rollouts with that probability (one U(0,1) draw,
keyed by the seed, the prompt, the trajectory's lineage and t: rollout/arpo.py's rollout_key).
*When* it decides and which ΔH it passes are the scheduler's (`rollout.mode`: paper = the entropy
after result t; reference = after result t − 1, 0 at t = 0).

Choose one with `rollout.branch_rule`: a name of the registry (settings/rollout.py BRANCH_RULES:
name, function, staged, summary), `auto` (aepo when
`consecutive_branch_penalty > 0`, else reference in reference mode, else arpo) or your own
`module.path:function` taking a BranchContext. Each rule's docstring gives its math; the tests check
them against hand-computed values (tests/rollout/test_branch_rules.py).

Staged rules (rollout/staged_rules.py: zscore, top_entropy, outcome_open) decide for all of a
prompt's decision points at once, after its N initial samples have finished; they share the
registry and `rollout.branch_rule`. Its summaries are the lines `arpo train --print-config` lists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from arpo.settings import load_branch_rule


@dataclass(frozen=True)
class BranchContext:
    """What a rule may look at for one decision."""

    delta_entropy: float  # ΔH = H_t − H_initial (the mode's timing; the scale of rollout.entropy_* switches)
    beta: float  # rollout.entropy_weight
    tau: float  # rollout.branch_threshold
    depth: int = 0  # t: the decision follows the trajectory's (t+1)-th tool result (0-based index)
    consecutive: int = 0  # l: rounds (tool-call depths) right before t in which the prompt branched
    penalty: float = 0.0  # rollout.consecutive_branch_penalty (c)
    step_entropy: float | None = None  # H_t itself, when measured
    initial_entropy: float | None = None  # H_initial


def _clip(p: float) -> float:
    return min(1.0, max(0.0, p))


def arpo_rule(ctx: BranchContext) -> float:
    """ARPO paper: branch if α + β·ΔH > τ with α ~ U(0, 1), i.e. P = clip(1 − τ + β·ΔH, 0, 1)."""
    return _clip(1.0 - ctx.tau + ctx.beta * ctx.delta_entropy)


def reference_rule(ctx: BranchContext) -> float:
    """ARPO reference code: branch if U − β·ΔH ≤ τ with U ~ U(0, 1), i.e. P = clip(τ + β·ΔH, 0, 1).
    Equal to arpo_rule at τ = 0.5 only."""
    return _clip(ctx.tau + ctx.beta * ctx.delta_entropy)


def aepo_rule(ctx: BranchContext) -> float:
    """AEPO code's consecutive-branch penalty: the score α + β·ΔH (α ~ U(0, 1)) is scaled by
    f = max(0, 1 − c·l) and the rollout branches if f·(α + β·ΔH) ≥ τ, so
    P = clip(1 + β·ΔH − τ/f, 0, 1) for f > 0; for f = 0, P = 1 if τ ≤ 0 else 0. c = 0 is arpo_rule.
    With `rollout.mode: reference` (the ΔH timing AEPO's code inherited from ARPO's) this is the
    AEPO code's rule."""
    f = max(0.0, 1.0 - ctx.penalty * ctx.consecutive)
    if f == 0.0:
        return 1.0 if ctx.tau <= 0 else 0.0
    return _clip(1.0 + ctx.beta * ctx.delta_entropy - ctx.tau / f)


def bernoulli_rule(ctx: BranchContext) -> float:
    """Entropy-blind: a Bernoulli(P) at every tool step, P = clip(1 − τ, 0, 1) whatever ΔH — the
    control for ARPO's claim that entropy tells where to branch (same budget M, same τ; it is ARPO's
    rule at β = 0). Not Tree-GRPO (arXiv 2509.21240), which samples nodes of the finished trees to
    expand; this rule was called `tree_grpo` until that name was found to claim more than it does."""
    return _clip(1.0 - ctx.tau)


BranchRuleFn = Callable[[BranchContext], float]


def get_branch_rule(spec: str, mode: str = "paper", penalty: float = 0.0) -> Callable:
    """The function of the rule named `spec` (auto, a name of settings' BRANCH_RULES, or
    module.path:function; settings.load_branch_rule gives it with whether it is staged)."""
    return load_branch_rule(spec, mode, penalty)[0]
