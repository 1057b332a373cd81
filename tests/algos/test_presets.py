"""Every preset loads, is internally consistent, and drives the loss functions it names."""

import dataclasses

import pytest
import torch

from arpo.algos.advantages import ADVANTAGE_ESTIMATORS
from arpo.algos.losses import policy_loss
from arpo.algos.presets import PRESETS, AlgoPreset, get_preset
from arpo.errors import ArpoError

NAMES = ["arpo", "grpo", "dapo", "reinforce_pp", "dr_grpo", "gspo", "aepo", "tree_grpo"]


def test_all_presets_present_and_named_after_their_key():
    assert set(PRESETS) == set(NAMES)
    for name in NAMES:
        p = get_preset(name)
        assert isinstance(p, AlgoPreset) and p.name == name and p.source


def test_arpo_matches_spec_reference_settings():
    p = get_preset("arpo")
    # spec §4
    assert (p.clip_low, p.clip_high, p.dual_clip) == (0.2, 0.2, 3.0)
    assert (p.loss_type, p.loss_agg, p.kl_type, p.kl_coef, p.entropy_coef) == (
        "ppo_clip", "token-mean", "low_var_kl", 0.0, 0.0)
    assert p.ppo_epochs == 1
    # spec §2, §3
    assert p.branching and p.attribution == "soft" and p.advantage_estimator == "grpo"


def test_the_run_settings_live_in_one_place_each_not_in_the_preset():
    """Optimizer and rollout budget are the run's (optim.*, rollout.*), the same for every preset: the
    preset has no copy of them that nothing reads (issue 42). Their reference values, spec §2 and §4."""
    from arpo.settings import OptimConfig, RolloutConfig

    fields = {f.name for f in dataclasses.fields(AlgoPreset)}
    for gone in ["lr", "weight_decay", "grad_clip", "group_size", "initial_rollouts", "branch_factor",
                 "entropy_weight", "branch_threshold", "entropy_tokens"]:
        assert gone not in fields, gone
    o, r = OptimConfig(), RolloutConfig()
    assert (o.lr, o.weight_decay, o.grad_clip) == (1e-6, 0.01, 1.0)
    assert (r.group_size, r.initial_rollouts, r.branch_factor) == (16, 8, 1)
    assert (r.entropy_weight, r.branch_threshold, r.entropy_tokens) == (0.2, 0.5, 20)


def test_a_preset_without_branching_samples_every_trajectory_globally():
    from arpo.settings import RolloutConfig
    from arpo.training.trainer import rollout_config

    ro = RolloutConfig(group_size=8, initial_rollouts=4)
    assert rollout_config(ro, get_preset("arpo")).initial_rollouts == 4
    assert rollout_config(ro, get_preset("aepo")).initial_rollouts == 4
    for name in ["grpo", "dapo", "reinforce_pp", "dr_grpo", "gspo"]:
        assert rollout_config(ro, get_preset(name)).initial_rollouts == 8, name
    # Tree-GRPO: N chains, then node expansion; a preset without branching has no chain to expand
    tree = rollout_config(ro, get_preset("tree_grpo"))
    assert (tree.initial_rollouts, tree.mode) == (4, "tree_grpo")
    with pytest.raises(ArpoError, match="rollout.mode: tree_grpo"):
        rollout_config(dataclasses.replace(ro, mode="tree_grpo"), get_preset("grpo"))


def test_baselines_switch_what_their_papers_change():
    grpo = get_preset("grpo")
    assert not grpo.branching
    dapo = get_preset("dapo")
    assert (dapo.clip_low, dapo.clip_high, dapo.loss_agg, dapo.kl_coef) == (0.2, 0.28, "token-mean", 0.0)
    assert dapo.dynamic_sampling and not get_preset("arpo").dynamic_sampling
    assert get_preset("reinforce_pp").advantage_estimator == "reinforce_pp"
    dr = get_preset("dr_grpo")
    assert (dr.advantage_estimator, dr.loss_agg, dr.agg_normalizer) == ("dr_grpo", "seq-mean-token-sum-norm", 4096)
    gspo = get_preset("gspo")
    assert (gspo.loss_type, gspo.clip_low, gspo.clip_high) == ("gspo", 3e-4, 4e-4)
    aepo = get_preset("aepo")
    assert aepo.dynamic_budget and aepo.consecutive_branch_penalty == 0.05
    assert aepo.entropy_balanced_clipping and aepo.entropy_aware_advantage and aepo.entropy_aware_alpha == 0.2
    assert not get_preset("arpo").entropy_balanced_clipping
    tree = get_preset("tree_grpo")  # Tree-GRPO: node expansion and its intra- plus inter-tree advantage
    assert tree.branching and tree.node_expansion and tree.advantage_estimator == "tree_grpo"
    assert not any(get_preset(n).node_expansion for n in NAMES if n != "tree_grpo")
    for name in ["grpo", "dapo", "reinforce_pp", "dr_grpo", "gspo"]:  # trajectory-level baselines
        p = get_preset(name)
        assert not p.branching, name


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ArpoError) as err:
        get_preset("ppo")
    assert "ppo" in str(err.value) and all(n in str(err.value) for n in NAMES)


@pytest.mark.parametrize(
    "override, key",
    [
        ({"loss_agg": "sum"}, "loss_agg"),
        ({"loss_type": "trpo"}, "loss_type"),
        ({"advantage_estimator": "gae"}, "advantage_estimator"),
        ({"attribution": "medium"}, "attribution"),
        ({"kl_type": "k9"}, "kl_type"),
        ({"dual_clip": 0.5}, "dual_clip"),
    ],
)
def test_invalid_overrides_are_rejected_with_the_key(override, key):
    with pytest.raises(ArpoError, match=key):
        dataclasses.replace(get_preset("arpo"), **override)


@pytest.mark.parametrize("name", NAMES)
def test_each_preset_runs_its_advantage_and_loss(name):
    p = get_preset(name)
    adv = ADVANTAGE_ESTIMATORS[p.advantage_estimator](torch.tensor([1.0, 0.0, 0.0, 1.0]), [0, 0, 0, 0])
    logp = torch.full((4, 3), -1.0, requires_grad=True)
    old = torch.full((4, 3), -1.05)
    mask = torch.tensor([[1, 1, 0]] * 4)
    loss, diag = policy_loss(
        logp, old, adv[:, None].expand(4, 3), mask,
        loss_type=p.loss_type, agg=p.loss_agg, agg_normalizer=p.agg_normalizer,
        clip_low=p.clip_low, clip_high=p.clip_high, dual_clip=p.dual_clip,
        kl_coef=p.kl_coef, kl_type=p.kl_type, entropy_coef=p.entropy_coef,
    )  # fmt: skip
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert dataclasses.asdict(p)["name"] == name
