"""The rollout's settings: the ARPO tree per prompt (spec §2; the scheduler: rollout/arpo.py), the
registry of the branch rules `rollout.branch_rule` may name (BRANCH_RULES; the rules themselves:
rollout/branch_rules.py and rollout/staged_rules.py), and `arpo rollout`'s config (recipes/rollout.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from arpo.errors import ArpoError
from arpo.plugins import resolve
from arpo.settings.agent import AgentConfig, ToolsConfig
from arpo.settings.sections import DataConfig, ModelConfig, RewardConfig


@dataclass(frozen=True)
class BranchRule:
    """One built-in branch rule: its name (`rollout.branch_rule`), its function as `module:function`
    (imported when a rollout asks for it, so a config is checked without importing the rollout),
    whether it is staged (it decides after the N initial samples finish: rollout/staged_rules.py, else
    once per decision: rollout/branch_rules.py) and the line `arpo train --print-config` shows."""

    name: str
    function: str
    staged: bool
    summary: str


# The one registry of the built-in branch rules.
BRANCH_RULES: dict[str, BranchRule] = {r.name: r for r in (
    BranchRule("arpo", "arpo.rollout.branch_rules:arpo_rule", False,
               "the paper's rule, per decision: P = clip(1 − τ + β·ΔH)"),
    BranchRule("reference", "arpo.rollout.branch_rules:reference_rule", False,
               "the reference code's rule, per decision: P = clip(τ + β·ΔH)"),
    BranchRule("aepo", "arpo.rollout.branch_rules:aepo_rule", False,
               "AEPO's code: the score α + β·ΔH scaled by max(0, 1 − c·l) for l consecutive branching rounds"),
    BranchRule("bernoulli", "arpo.rollout.branch_rules:bernoulli_rule", False,
               "entropy-blind control, per decision: P = clip(1 − τ) (not Tree-GRPO's node sampling)"),
    BranchRule("zscore", "arpo.rollout.staged_rules:zscore_rule", True,
               "staged: P = clip(1 − τ + β·z), z = ΔH standardized over the prompt's decision points"),
    BranchRule("top_entropy", "arpo.rollout.staged_rules:top_entropy_rule", True,
               "staged, budgeted: the ⌈(M − N)/Z⌉ decision points with the largest ΔH branch (EPTree)"),
    BranchRule("outcome_open", "arpo.rollout.staged_rules:outcome_open_rule", True,
               "staged: branch where the finished initial samples that made the same calls disagree"),
)}
AUTO_SUMMARY = "aepo with a consecutive-branch penalty, else reference in mode reference, else arpo"
# names that were built-in rules once: what to write instead (get_branch_rule refuses them with it)
RENAMED_BRANCH_RULES = {"tree_grpo": "bernoulli: it is a Bernoulli(1 − τ) at every tool step, not Tree-GRPO's "
                                     "node sampling"}


def auto_rule_name(mode: str, penalty: float) -> str:
    """What `branch_rule: auto` means: aepo with a consecutive-branch penalty, else the mode's own rule."""
    if penalty > 0:
        return "aepo"
    return "reference" if mode == "reference" else "arpo"


def rule_summaries() -> dict[str, str]:
    """{name: what it does} for auto and every built-in rule (`arpo train --print-config --json`)."""
    return {"auto": AUTO_SUMMARY, **{r.name: r.summary for r in BRANCH_RULES.values()}}


def rule_lines() -> list[str]:
    """`name: what it does`, one line per built-in rule (and auto), and how to plug in your own."""
    return [f"{name}: {line}" for name, line in rule_summaries().items()] + [
        "module.path:function: your own; a per-decision rule(ctx: BranchContext) -> P, or a staged "
        "rule(points, ctx) -> [P] marked staged = True (rollout/staged_rules.py)"]


def _builtin(spec: str, mode: str, penalty: float) -> BranchRule | None:
    """The registry's entry `spec` stands for (auto, a name, or a built-in's module:function), None for a
    plug-in; a renamed rule is an error that gives the new name (not a silent alias: results would
    carry the old label)."""
    if spec in RENAMED_BRANCH_RULES:
        raise ArpoError(f"branch rule {spec!r} was renamed {RENAMED_BRANCH_RULES[spec]}")
    name = auto_rule_name(mode, penalty) if spec == "auto" else spec
    return BRANCH_RULES.get(name) or next((r for r in BRANCH_RULES.values() if r.function == name), None)


def load_branch_rule(spec: str, mode: str = "paper", penalty: float = 0.0) -> tuple[Callable, bool]:
    """(function, staged) of the rule `spec` names: auto, a built-in name (BRANCH_RULES) or your own
    module.path:function, staged when it has `staged = True` (rollout/staged_rules.py's `staged`). An
    error names what is wrong: a renamed rule (with its new name), an unknown name, a plug-in that does
    not import."""
    rule = _builtin(spec, mode, penalty)
    if rule is not None:
        return resolve(rule.function, {}, "branch rule"), rule.staged
    # the registry only names the choices in resolve's error: a built-in name was answered above
    fn = resolve(spec, cast(dict[str, Callable], dict.fromkeys(BRANCH_RULES)), "branch rule")
    return fn, bool(getattr(fn, "staged", False))


def branch_rule_is_staged(spec: str, mode: str = "paper", penalty: float = 0.0) -> bool:
    """Whether the rule `spec` names is staged (load_branch_rule; a built-in is answered without importing it)."""
    rule = _builtin(spec, mode, penalty)
    return rule.staged if rule is not None else load_branch_rule(spec, mode, penalty)[1]


@dataclass
class RolloutConfig:
    group_size: int = 16  # M: trajectories per prompt (reference 16)
    initial_rollouts: int = 8  # N: global samples started per prompt (reference 8)
    branch_factor: int = 1  # Z: new partial rollouts per branch (reference 1, i.e. beam size 2)
    entropy_weight: float = 0.2  # β (reference 0.2; on the default full/mean scale, 0.34-0.37 ≈ it: docs/algorithm.md)
    branch_threshold: float = 0.5  # τ (reference 0.5)
    entropy_tokens: int = 20  # k: tokens whose entropy is measured (reference 20)
    entropy_estimator: str = "full"  # full (exact, from logits) | topk (reference: top-10 log-probs)
    entropy_reduction: str = "mean"  # mean (default: per-token nats, β on that scale) | sum (reference)
    entropy_normalize: bool = False  # divide by ln|V| (reference: true)
    # paper | reference (its code: lagged ΔH, P = clip(τ + β·ΔH), one fill-up global per round) | tree_grpo
    # (Tree-GRPO's node expansion: N chains, then rounds of random non-leaf tool steps expanded to M; rollout/arpo.py)
    mode: str = "paper"
    nodes_per_round: int = 1  # tree_grpo mode: nodes each chain's tree expands per round (Tree-GRPO's N)
    fill_up: bool = True  # add fresh global samples when all paths ended with < M trajectories
    # AEPO's two rollout options; null (the default): the algorithm preset's (aepo: true / 0.05, the others:
    # false / 0; `arpo rollout`: off); a set value, false and 0 included, wins over the preset
    dynamic_budget: bool | None = None  # AEPO: N from a probe rollout's entropies
    consecutive_branch_penalty: float | None = None  # AEPO: 0.05
    # the branch probability: auto (aepo with a penalty, else the mode's: arpo | reference) | arpo | reference |
    # aepo | bernoulli (entropy-blind) | staged, after the N initial samples finish: zscore | top_entropy |
    # outcome_open (rollout/staged_rules.py) | module.path:function (rollout/branch_rules.py; docs/branch_rules.md)
    branch_rule: str = "auto"
    seed: int = 0  # arpo rollout's sampling seed (arpo train derives its seeds from run.seed)
    # engine vllm_server: base URLs of the `vllm serve` endpoints that generate (docs/vllm_backend.md)
    servers: list[str] = field(default_factory=list)
    # arpo train: 0 = synchronous (a step's trees are generated, then trained on); 1 = one step off-policy:
    # the trees of step n+1 generate (weights of version n, every tree under one version) while step n
    # trains; a tree more than this many updates old is rejected (docs/scaling.md: "One step off-policy")
    max_off_policy_steps: int = 0
    # C of the truncated importance weight min(π_old/π_behaviour, C) on each token of a lagged tree
    # (decoupled PPO, algos/losses.truncated_is_weight); used only when max_off_policy_steps > 0
    off_policy_is_cap: float = 2.0

    def with_defaults(self, dynamic_budget: bool = False, consecutive_branch_penalty: float = 0.0) -> RolloutConfig:
        """These settings with each unset (None) AEPO option given the value passed (the preset's, or off):
        a value the config sets, false and 0 included, is kept."""
        return dataclasses.replace(
            self,
            dynamic_budget=dynamic_budget if self.dynamic_budget is None else self.dynamic_budget,
            consecutive_branch_penalty=(consecutive_branch_penalty if self.consecutive_branch_penalty is None
                                        else self.consecutive_branch_penalty))

    @property
    def penalty(self) -> float:
        """consecutive_branch_penalty, 0 when unset."""
        return self.consecutive_branch_penalty or 0.0

    def validate(self) -> None:
        def need(ok, key, msg):
            if not ok:
                raise ArpoError(f"rollout.{key}: {msg}")

        need(self.group_size >= 1, "group_size", "must be >= 1")
        need(1 <= self.initial_rollouts <= self.group_size, "initial_rollouts", "must be in [1, group_size]")
        need(self.branch_factor >= 1, "branch_factor", "must be >= 1")
        need(self.entropy_tokens >= 1, "entropy_tokens", "must be >= 1")
        need(self.entropy_estimator in ("full", "topk"), "entropy_estimator", "must be full or topk")
        need(self.entropy_reduction in ("mean", "sum"), "entropy_reduction", "must be mean or sum")
        need(self.mode in ("paper", "reference", "tree_grpo"), "mode", "must be paper, reference or tree_grpo")
        need(self.nodes_per_round >= 1, "nodes_per_round", f"must be >= 1, got {self.nodes_per_round}")
        need(self.mode != "tree_grpo" or (self.branch_rule == "auto" and not self.dynamic_budget
                                          and not self.penalty), "mode",
             "tree_grpo picks its nodes at random: leave branch_rule auto, dynamic_budget off and "
             "consecutive_branch_penalty 0")
        need(self.penalty >= 0, "consecutive_branch_penalty", "must be >= 0")
        need(isinstance(self.max_off_policy_steps, int) and self.max_off_policy_steps in (0, 1), "max_off_policy_steps",
             f"must be 0 (synchronous) or 1 (one step off-policy), got {self.max_off_policy_steps!r}")
        need(self.off_policy_is_cap >= 1, "off_policy_is_cap",
             f"must be >= 1 (C < 1 would down-weight on-policy tokens too), got {self.off_policy_is_cap}")
        if self.servers:
            from arpo.engine.vllm_server import check_server_urls  # noqa: PLC0415 - loads torch; kept out of this light module's import

            check_server_urls(self.servers, "rollout.servers")
        try:
            staged = branch_rule_is_staged(self.branch_rule, self.mode, self.penalty)
        except ArpoError as e:
            raise ArpoError(f"rollout.branch_rule: {e}") from e
        need(not (staged and self.mode == "reference"), "branch_rule",
             f"{self.branch_rule} is a staged rule (it decides after the initial samples finish, with the "
             "paper's ΔH); use it with mode: paper")



@dataclass
class RolloutJobConfig:
    model: ModelConfig = field(default_factory=ModelConfig)  # the policy that samples
    data: DataConfig = field(default_factory=DataConfig)  # the prompts (rows: README "Your own data")
    tools: ToolsConfig = field(default_factory=ToolsConfig)  # the tools the agent may call
    agent: AgentConfig = field(default_factory=AgentConfig)  # one trajectory: sampling and tool-call budget
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # the ARPO tree per prompt (spec §2)
    reward: RewardConfig = field(default_factory=RewardConfig)  # each dumped trajectory gets its reward
    prompts_per_batch: int = 4  # prompts whose trees are sampled together in one engine batch
