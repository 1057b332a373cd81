"""Named algorithm presets: ARPO and the baselines of spec §4 as one-line switches.

A preset is a frozen dataclass of plain hyper-parameters, the names of the functions to use
(looked up in advantages.ADVANTAGE_ESTIMATORS, losses.POLICY_LOSSES / AGGREGATIONS /
KL_ESTIMATORS) and flags for rollout-side features. Every field is documented once, on
`AlgoPreset`. Change a field with `dataclasses.replace(get_preset("arpo"), clip_high=0.28)`.

A preset holds only what an algorithm decides: how advantages are computed and attributed, the
policy loss, and which rollout-side features it switches on (branching, DAPO's dynamic sampling,
AEPO's dynamic budget and branch penalty). The optimizer (`optim.*`) and the rollout budget and
branching rule (`rollout.*`: M, N, β, τ, k, Z) are the run's, the same for every preset, so that
comparisons are like for like, as in the paper; each preset's comment says what it changes and
where that comes from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypedDict

from arpo.algos.advantages import ADVANTAGE_ESTIMATORS, ATTRIBUTIONS, get_estimator
from arpo.algos.losses import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from arpo.errors import ArpoError


@dataclass(frozen=True)
class AlgoPreset:
    """Hyper-parameters of one RL algorithm. Defaults are ARPO's reference settings (spec §4, §2)."""

    name: str = "arpo"
    source: str = ""  # where these settings come from

    # advantages (spec §3)
    advantage_estimator: str = "grpo"  # key of ADVANTAGE_ESTIMATORS, or module.path:function
    attribution: str = "soft"  # "soft" (own Â on every token) or "hard" (mean over sharers)
    entropy_aware_advantage: bool = False  # AEPO: Â·(1 + α·z(H)) (spec §7)
    entropy_aware_alpha: float = 0.2  # α of the entropy-aware advantage

    # policy loss (spec §4)
    loss_type: str = "ppo_clip"  # key of POLICY_LOSSES; "entropy_balanced" is AEPO's clipping
    loss_agg: str = "token-mean"  # key of AGGREGATIONS
    agg_normalizer: float | None = None  # constant for seq-mean-token-sum-norm (None: padded T)
    clip_low: float = 0.2  # ε_low
    clip_high: float = 0.2  # ε_high (DAPO clip-higher when > ε_low)
    dual_clip: float | None = 3.0  # c for negative advantages; None disables
    kl_coef: float = 0.0  # β_KL; 0 means no reference model is kept
    kl_type: str = "low_var_kl"  # key of KL_ESTIMATORS
    entropy_coef: float = 0.0  # entropy bonus coefficient

    ppo_epochs: int = 1  # passes over each rollout batch

    # rollout-side features (spec §2; M, N, β, τ, k and Z are rollout.* settings)
    branching: bool = True  # entropy-based adaptive branching at tool steps; False: N = M global samples
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, sample more prompts
    dynamic_sampling_max_rounds: int = 10  # DAPO: cap on generation rounds per step (verl max_num_gen_batches)
    dynamic_budget: bool = False  # AEPO: N from a probe of H_root vs H_tool (spec §7)
    consecutive_branch_penalty: float = 0.0  # AEPO: score α + β·ΔH ·= max(0, 1 − penalty·l), l rounds; 0: off
    node_expansion: bool = False  # Tree-GRPO: the rollout expands random tool steps (rollout.mode tree_grpo)

    def __post_init__(self) -> None:
        if ":" in self.advantage_estimator:  # a plug-in: it must import
            try:
                get_estimator(self.advantage_estimator)
            except ArpoError as e:
                raise ArpoError(f"preset {self.name!r}: advantage_estimator: {e}") from e
        for field, table in (
            ("advantage_estimator", {**ADVANTAGE_ESTIMATORS, self.advantage_estimator: None}
             if ":" in self.advantage_estimator else ADVANTAGE_ESTIMATORS),
            ("attribution", ATTRIBUTIONS),
            ("loss_type", POLICY_LOSSES),
            ("loss_agg", AGGREGATIONS),
            ("kl_type", KL_ESTIMATORS),
        ):
            if getattr(self, field) not in table:
                raise ArpoError(f"preset {self.name!r}: {field}={getattr(self, field)!r}; valid: {sorted(table)}")
        if self.clip_low <= 0 or self.clip_high <= 0:
            raise ArpoError(f"preset {self.name!r}: clip_low and clip_high must be > 0")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ArpoError(f"preset {self.name!r}: dual_clip must be > 1 or null, got {self.dual_clip}")
        for key in ("kl_coef", "entropy_coef", "entropy_aware_alpha"):
            if getattr(self, key) < 0:
                raise ArpoError(f"preset {self.name!r}: {key} must be >= 0, got {getattr(self, key)}")
        if self.dynamic_sampling_max_rounds < 1:
            raise ArpoError(f"preset {self.name!r}: dynamic_sampling_max_rounds must be >= 1, "
                            f"got {self.dynamic_sampling_max_rounds}")
        if self.ppo_epochs < 1:
            raise ArpoError(f"preset {self.name!r}: ppo_epochs must be >= 1, got {self.ppo_epochs}")
        if self.loss_type == "gspo" and self.loss_agg != "seq-mean-token-mean":
            # GSPO's ratio is a per-sequence geometric mean: summing it over tokens (or averaging over the
            # batch's tokens) weights a sequence by its length, which is what GSPO's ratio exists to avoid
            raise ArpoError(f"preset {self.name!r}: loss_type=gspo needs loss_agg=seq-mean-token-mean "
                            f"(its sequence-level ratio with {self.loss_agg!r} weights sequences by length)")

    @property
    def entropy_balanced_clipping(self) -> bool:
        """AEPO's stop-gradient clipping is selected through loss_type."""
        return self.loss_type == "entropy_balanced"


_ARPO = AlgoPreset(
    name="arpo",
    source="ARPO (arXiv 2507.19849) and its released training scripts, spec §2 and §4",
)

class _NoBranching(TypedDict):
    branching: bool


_NO_BRANCHING = _NoBranching(branching=False)  # every trajectory a global sample: N = M

PRESETS: dict[str, AlgoPreset] = {
    "arpo": _ARPO,
    # The paper's GRPO baseline: ARPO with every trajectory a global sample (spec §4).
    "grpo": dataclasses.replace(
        _ARPO, name="grpo", source="spec §4: ARPO with every trajectory a global sample (N = M)", **_NO_BRANCHING
    ),
    # DAPO (arXiv 2503.14476): clip-higher 0.2/0.28, token-level loss, dynamic sampling (groups with
    # equal rewards are dropped and fresh prompts rolled out until prompts_per_step groups are kept, at
    # most dynamic_sampling_max_rounds rounds per step: training/trainer.py sample_groups), no KL, no dual clip. Its
    # overlong reward shaping is a reward-side feature and not part of this preset.
    "dapo": dataclasses.replace(
        _ARPO, name="dapo", source="DAPO, arXiv 2503.14476",
        clip_high=0.28, dual_clip=None, loss_agg="token-mean", kl_coef=0.0, dynamic_sampling=True, **_NO_BRANCHING,
    ),  # fmt: skip
    # REINFORCE++ (arXiv 2501.03262): global batch mean/std advantages with the PPO clip. Its KL
    # penalty folded into the reward is not reproduced; ARPO's comparison runs use KL coef 0.
    "reinforce_pp": dataclasses.replace(
        _ARPO, name="reinforce_pp", source="REINFORCE++, arXiv 2501.03262", advantage_estimator="reinforce_pp",
        **_NO_BRANCHING,
    ),  # fmt: skip
    # Dr.GRPO (arXiv 2503.20783): no std division, no 1/|o_i| length normalization; the constant
    # is the max generation length (spec §6: 4096 response tokens for reasoning runs).
    "dr_grpo": dataclasses.replace(
        _ARPO, name="dr_grpo", source="Dr.GRPO, arXiv 2503.20783", advantage_estimator="dr_grpo",
        loss_agg="seq-mean-token-sum-norm", agg_normalizer=4096, **_NO_BRANCHING,
    ),  # fmt: skip
    # GSPO (arXiv 2507.18071): sequence-level ratio, clip range 3e-4 / 4e-4, sequence-mean loss.
    "gspo": dataclasses.replace(
        _ARPO, name="gspo", source="GSPO, arXiv 2507.18071", loss_type="gspo", loss_agg="seq-mean-token-mean",
        clip_low=3e-4, clip_high=4e-4, dual_clip=None, **_NO_BRANCHING,
    ),  # fmt: skip
    # AEPO (arXiv 2510.14545, spec §7): ARPO plus dynamic global/branch budget, the consecutive-branch
    # penalty 0.05, entropy-balanced clipping and the entropy-aware advantage (α = 0.2).
    "aepo": dataclasses.replace(
        _ARPO, name="aepo", source="AEPO, arXiv 2510.14545, spec §7",
        dynamic_budget=True, consecutive_branch_penalty=0.05, loss_type="entropy_balanced",
        entropy_aware_advantage=True, entropy_aware_alpha=0.2,
    ),  # fmt: skip
    # Tree-GRPO (arXiv 2509.21240): N chains, then random non-leaf tool steps expanded until M trajectories
    # (rollout.mode tree_grpo, rollout/arpo.py), and its intra-tree plus inter-tree group advantage. The loss
    # is ARPO's (the paper trains with GRPO's clipped objective).
    "tree_grpo": dataclasses.replace(
        _ARPO, name="tree_grpo", source="Tree-GRPO, arXiv 2509.21240", advantage_estimator="tree_grpo",
        node_expansion=True,
    ),  # fmt: skip
}


def get_preset(name: str) -> AlgoPreset:
    """The preset called `name` (frozen; derive variants with dataclasses.replace)."""
    if name not in PRESETS:
        raise ArpoError(f"unknown algorithm preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]
