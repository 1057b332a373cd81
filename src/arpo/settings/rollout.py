"""The rollout's settings: the ARPO tree per prompt (spec §2; the scheduler: rollout/arpo.py), the
names `rollout.branch_rule` may give (the rules themselves: rollout/branch_rules.py and
rollout/staged_rules.py), and `arpo rollout`'s config (recipes/rollout.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from arpo.errors import ArpoError
from arpo.plugins import resolve
from arpo.settings.agent import AgentConfig, ToolsConfig
from arpo.settings.sections import DataConfig, ModelConfig, RewardConfig

# The built-in branch rules by name: True for a staged rule (it decides after the N initial samples
# finish). Their functions are rollout/branch_rules.py's BRANCH_RULES and rollout/staged_rules.py's
# STAGED_RULES (tests/rollout/test_branch_rules.py checks the names agree); the names live here so
# that a config is checked without importing the rollout.
BRANCH_RULE_NAMES: dict[str, bool] = {"arpo": False, "reference": False, "aepo": False, "bernoulli": False,
                                      "zscore": True, "top_entropy": True, "outcome_open": True}
# names that were built-in rules once: what to write instead (get_branch_rule refuses them with it)
RENAMED_BRANCH_RULES = {"tree_grpo": "bernoulli: it is a Bernoulli(1 − τ) at every tool step, not Tree-GRPO's "
                                     "node sampling"}


def auto_rule_name(mode: str, penalty: float) -> str:
    """What `branch_rule: auto` means: aepo with a consecutive-branch penalty, else the mode's own rule."""
    if penalty > 0:
        return "aepo"
    return "reference" if mode == "reference" else "arpo"


def branch_rule_is_staged(spec: str, mode: str = "paper", penalty: float = 0.0) -> bool:
    """Whether the rule `spec` names (auto, a built-in name or module.path:function) is staged; an
    error names what is wrong: a renamed rule (with its new name), an unknown name, a plug-in that does
    not import. A plug-in is staged when its function has `staged = True` (rollout/staged_rules.py)."""
    if spec in RENAMED_BRANCH_RULES:
        raise ArpoError(f"branch rule {spec!r} was renamed {RENAMED_BRANCH_RULES[spec]}")
    name = auto_rule_name(mode, penalty) if spec == "auto" else spec
    if name in BRANCH_RULE_NAMES:
        return BRANCH_RULE_NAMES[name]
    # the table only names the choices in resolve's error: a built-in name was answered above
    rule = resolve(name, cast(dict[str, Callable], dict.fromkeys(BRANCH_RULE_NAMES)), "branch rule")
    return bool(getattr(rule, "staged", False))


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
    dynamic_budget: bool = False  # AEPO: N from a probe rollout's entropies
    consecutive_branch_penalty: float = 0.0  # AEPO: 0.05
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
                                          and not self.consecutive_branch_penalty), "mode",
             "tree_grpo picks its nodes at random: leave branch_rule auto, dynamic_budget off and "
             "consecutive_branch_penalty 0")
        need(self.consecutive_branch_penalty >= 0, "consecutive_branch_penalty", "must be >= 0")
        need(isinstance(self.max_off_policy_steps, int) and self.max_off_policy_steps in (0, 1), "max_off_policy_steps",
             f"must be 0 (synchronous) or 1 (one step off-policy), got {self.max_off_policy_steps!r}")
        need(self.off_policy_is_cap >= 1, "off_policy_is_cap",
             f"must be >= 1 (C < 1 would down-weight on-policy tokens too), got {self.off_policy_is_cap}")
        if self.servers:
            from arpo.engine.vllm_server import check_server_urls  # noqa: PLC0415 - loads torch; kept out of this light module's import

            check_server_urls(self.servers, "rollout.servers")
        try:
            staged = branch_rule_is_staged(self.branch_rule, self.mode, self.consecutive_branch_penalty)
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
