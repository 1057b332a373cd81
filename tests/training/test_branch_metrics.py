"""Per-step branch rate and ΔH in the training metrics, and on the plots."""

import json

import pytest


def stat(decisions, branch=False):
    return {"reward": 1.0, "correct": 1.0, "format_error": 0.0, "calls": [("python", True, 0.01)], "post": [0.2],
            "init": 0.5, "branch": branch, "length": 30, "decisions": decisions}


def test_metrics_of_branch_rate_and_delta_entropy():
    from arpo.training.rollout_metrics import metrics_of

    m = metrics_of([stat([(-0.3, True), (-0.1, False)]), stat([(0.4, False)], branch=True), stat([])])
    assert m["branch_decisions"] == 3 and m["branches"] == 1
    assert m["branch_rate"] == pytest.approx(1 / 3) and m["delta_entropy"] == pytest.approx(0.0)
    none = metrics_of([stat([])])
    assert none["branch_rate"] == 0.0 and none["branch_decisions"] == 0


def test_plot_has_the_branch_rate_panel(tmp_path, capsys):
    from arpo.cli import main

    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "reward_mean": 0.1 * i, "branch_rate": 0.5 / i, "delta_entropy": -0.1 * i}) + "\n"
        for i in range(1, 4)))
    assert main(["plot", str(tmp_path)]) == 0
    assert (tmp_path / "plots" / "branch_rate.png").is_file()
    assert "br_rate" in capsys.readouterr().out


def test_issued_calls_count_a_branch_prefix_once():
    from types import SimpleNamespace as NS

    from arpo.training.rollout_metrics import issued_calls, metrics_of

    def call(end):
        return NS(result_span=(end - 5, end) if end else (0, 0))

    parent = NS(parent_id=None, branch_token_index=None, traj=NS(tool_calls=[call(20), call(40)]))
    # forked right after the parent's first result (token 20): call 1 is inherited, its own call at
    # 55 and one whose result never arrived (length) are its own
    branch = NS(parent_id=0, branch_token_index=20, traj=NS(tool_calls=[call(20), call(55), call(0)]))
    assert issued_calls(parent) == 2 and issued_calls(branch) == 2
    m = metrics_of([dict(stat([]), issued=2), dict(stat([], branch=True), issued=0)])
    assert m["tool_calls_issued"] == 2 and m["tool_calls_per_traj"] == 1.0


def test_aepo_preset_switches_on_its_rollout_features():
    from arpo.settings import AlgoConfig, RolloutConfig
    from arpo.training.trainer import rollout_config

    ro = RolloutConfig(group_size=8, initial_rollouts=4)
    aepo = rollout_config(ro, AlgoConfig(preset="aepo").resolve())
    assert aepo.dynamic_budget and aepo.consecutive_branch_penalty == 0.05
    arpo = rollout_config(ro, AlgoConfig(preset="arpo").resolve())
    assert not arpo.dynamic_budget and arpo.consecutive_branch_penalty == 0.0 and arpo.initial_rollouts == 4
    grpo = rollout_config(ro, AlgoConfig(preset="grpo").resolve())
    assert grpo.initial_rollouts == 8
    own = rollout_config(RolloutConfig(group_size=8, initial_rollouts=4, consecutive_branch_penalty=0.1),
                         AlgoConfig(preset="aepo").resolve())
    assert own.consecutive_branch_penalty == 0.1  # the config's own value wins


def test_a_set_false_or_zero_wins_over_the_aepo_preset():
    """Issue 64: with algo.preset=aepo, `rollout.dynamic_budget: false` gave true and
    `consecutive_branch_penalty: 0` gave 0.05 (`x or preset.x`); unset (null) means the preset's."""
    from arpo.config import load_config
    from arpo.settings import TrainConfig
    from arpo.training.trainer import rollout_config

    def resolved(*over):
        cfg = load_config(TrainConfig, None, ["algo.preset=aepo", *over])
        return rollout_config(cfg.rollout, cfg.algo.resolve())

    off = resolved("rollout.dynamic_budget=false", "rollout.consecutive_branch_penalty=0")
    assert off.dynamic_budget is False and off.consecutive_branch_penalty == 0.0
    unset = resolved()
    assert unset.dynamic_budget is True and unset.consecutive_branch_penalty == 0.05


def test_a_run_saved_before_the_aepo_options_became_null_resumes():
    """A run saved `dynamic_budget: false`, `consecutive_branch_penalty: 0.0` when those meant "the
    preset's" (issue 64): its config resumes under the new default null, while a value that differs
    in effect (true, or a penalty of 0.1) is still a change."""
    from arpo.training.rundir import unsafe_changes

    saved = {"rollout": {"dynamic_budget": False, "consecutive_branch_penalty": 0.0, "group_size": 8}}
    now = {"rollout": {"dynamic_budget": None, "consecutive_branch_penalty": None, "group_size": 8}}
    assert unsafe_changes(saved, now) == []
    changed = {"rollout": {"dynamic_budget": True, "consecutive_branch_penalty": 0.1, "group_size": 8}}
    assert [k for k, _, _ in unsafe_changes(changed, now)] == ["rollout.consecutive_branch_penalty",
                                                                "rollout.dynamic_budget"]
