"""The collapse monitor (training/health.py): each rule on hand-computed metrics, the monitor's history
and patience, the rollout metrics it reads (constant_groups, calls_frac/k), and the guard in a real run."""

from __future__ import annotations

import pytest

from arpo.training import health
from arpo.training.health import HealthMonitor, check
from arpo.training.rollout_metrics import metrics_of


def test_each_rule_fires_on_its_pattern_and_not_beside_it():
    first = {"format_error_rate": [0.1], "accuracy": [0.69], "tool_calls_per_traj": [2.0], "entropy": [0.5]}
    assert set(check({"constant_groups": 0.9}, {})) == {"no_signal"}
    assert check({"constant_groups": 0.89}, {}) == {}
    assert set(check({"format_error_rate": 1.0}, {})) == {"all_malformed"}  # no history: the others wait
    assert "format_rising" in check({"format_error_rate": 0.5}, {"format_error_rate": [0.2]})  # 0.5 >= 0.2 + 0.3
    assert "format_rising" not in check({"format_error_rate": 0.49}, {"format_error_rate": [0.1]})  # < 0.5
    assert "format_rising" not in check({"format_error_rate": 0.6}, {"format_error_rate": [0.31]})  # < f1 + 0.3
    # the committed hop2 collapse (paper's rule seed 2): 0.69, 0.19, 0.00; best/4 = 0.1725
    assert "accuracy_collapse" not in check({"accuracy": 0.19}, first)
    assert "accuracy_collapse" in check({"accuracy": 0.17}, first)
    assert "accuracy_collapse" not in check({"accuracy": 0.0}, {"accuracy": [0.19]})  # never learned (< 0.2)
    assert "heldout_collapse" in check({"val/pass@1": 0.2}, {"val/pass@1": [0.8]})  # 0.2 <= 0.8 / 4
    assert "heldout_collapse" not in check({"val/pass@1": 0.21}, {"val/pass@1": [0.8]})
    assert "heldout_collapse" not in check({"accuracy": 0.5}, {"val/pass@1": [0.8]})  # no validation this step
    assert "fewer_calls" in check({"tool_calls_per_traj": 1.2}, first)  # 1.2 <= 0.6 * 2.0
    assert "fewer_calls" not in check({"tool_calls_per_traj": 1.21}, first)
    assert "entropy_collapse" in check({"entropy": 0.1}, first)  # 0.1 <= 0.2 * 0.5
    assert "entropy_collapse" not in check({"entropy": 0.11}, first)
    msg = check({"accuracy": 0.0}, first)["accuracy_collapse"]
    assert msg == "sampled accuracy 0.00, the run's best was 0.69"


def test_monitor_keeps_history_marks_metrics_and_waits_for_patience():
    mon = HealthMonitor(patience=2)
    steps = [{"accuracy": 0.69, "format_error_rate": 0.0}, {"accuracy": 0.19, "format_error_rate": 0.0},
             {"accuracy": 0.0, "format_error_rate": 0.0}, {"accuracy": 0.0, "format_error_rate": 0.0}]
    seen = []
    for m in steps:
        seen.append((sorted(mon.observe(m)), mon.should_stop()))
    assert seen == [([], None), ([], None), (["accuracy_collapse"], None), (["accuracy_collapse"], "accuracy_collapse")]
    assert steps[2]["warn/accuracy_collapse"] == 1.0 and "warn/accuracy_collapse" not in steps[1]
    assert mon.history["accuracy"] == [0.69, 0.19, 0.0, 0.0]
    # a step without the collapse resets its count
    mon.observe({"accuracy": 0.5, "format_error_rate": 0.0})
    assert mon.should_stop() is None and mon.held == {}
    assert mon.observe({"skipped": 1, "reason": "every rollout failed"}) == {}


def test_only_collapses_count_for_the_guard():
    assert health.COLLAPSE == {"all_malformed", "format_rising", "accuracy_collapse", "heldout_collapse"}
    mon = HealthMonitor(patience=1)
    mon.observe({"constant_groups": 1.0, "tool_calls_per_traj": 2.0})
    mon.observe({"constant_groups": 1.0, "tool_calls_per_traj": 0.5})  # no_signal and fewer_calls only
    assert mon.should_stop() is None


def _stat(reward, calls, size, const, ended="answer"):
    return {"reward": reward, "correct": float(reward > 0), "format_error": 0.0, "calls": [("t", True, 0.0)] * calls,
            "post": [], "init": None, "branch": False, "length": 1, "decisions": [], "issued": calls, "probe": 0,
            "group_size": size, "group_constant": const, "ended": ended}


def test_constant_groups_and_calls_distribution_from_trajectory_stats():
    # group A: 2 trajectories, rewards 1 and 0 (not constant); group B: 4 trajectories all 0 (constant)
    stats = ([_stat(1.0, 2, 2, False), _stat(0.0, 1, 2, False, "tool_cap")] + [_stat(0.0, 0, 4, True, "length")] * 3
             + [_stat(0.0, 2, 4, True)])
    m = metrics_of(stats)
    assert (m["ended/answer"], m["ended/length"], m["ended/tool_cap"]) == (2 / 6, 3 / 6, 1 / 6)
    assert m["constant_groups"] == pytest.approx(0.5)  # 1 of 2 groups
    assert (m["calls_frac/0"], m["calls_frac/1"], m["calls_frac/2"]) == (3 / 6, 1 / 6, 2 / 6)
    assert "calls_frac/3" not in m


def test_guard_stops_a_run_whose_rollouts_are_all_malformed(tmp_path, capsys):
    """The tiny random model writes no well-formed answer: all_malformed at every step; with patience 2
    the guard stops after step 2 of 4, with a checkpoint, and says why."""
    from arpo.config import load_config
    from arpo.recipes import train
    from arpo.settings import TrainConfig
    from arpo.training.checkpoint import latest_checkpoint
    from arpo.training.logger import read_metrics

    run_dir = tmp_path / "r"
    cfg = load_config(TrainConfig, "configs/train_tiny.yaml",
                      [f"run.dir={run_dir}", "steps=4", "run.tensorboard=false", "monitor.guard=stop",
                       "monitor.patience=2", "run.save_every=0", "reward.fn=arpo"])
    out = train.run(cfg, quiet=True)
    assert out["stopped_by"] == "monitor.guard:all_malformed"
    assert latest_checkpoint(run_dir).name == "step_000002"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2] and all(r["warn/all_malformed"] == 1.0 for r in rows)
    err = capsys.readouterr().err
    assert "train: warning [all_malformed] at step 1" in err and "stopped at step 2/4 by monitor.guard" in err


def test_plot_marks_the_warned_steps_and_draws_the_health_panel(tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from arpo.analysis.curves import draw_panel, panel_keys, plot_run, warnings_by_step
    from arpo.commands.plot import print_run_table

    rows = [{"step": 1, "accuracy": 0.7, "constant_groups": 0.25, "calls_frac/0": 0.0, "calls_frac/2": 1.0,
             "calls_frac/10": 0.0},
            {"step": 2, "accuracy": 0.0, "constant_groups": 1.0, "calls_frac/0": 1.0, "warn/no_signal": 1.0,
             "warn/accuracy_collapse": 1.0}]
    assert warnings_by_step(rows) == {2: ["accuracy_collapse", "no_signal"]}
    keys = panel_keys(rows)
    assert keys["health"] == ["constant_groups", "calls_frac/0", "calls_frac/2", "calls_frac/10"]  # k in number order
    assert not any(k.startswith("warn/") for ks in keys.values() for k in ks)  # flags are marks, not curves
    fig = draw_panel(rows, "accuracy", keys["accuracy"])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["accuracy", "collapse warning"]
    assert [t.get_text() for t in ax.texts] == ["accuracy_collapse,no_signal"]
    plt.close(fig)
    assert (tmp_path / "health.png") in plot_run(rows, tmp_path)
    print_run_table(rows)
    out = capsys.readouterr().out
    assert "warnings" in out and "accuracy_collapse, no_signal" in out


def test_the_guard_replayed_on_the_committed_studies():
    """docs/training_health.md's measurement: the rules over the 60 committed branch-rules runs' metrics. At
    the default patience (3) the guard stops exactly the four hop2 runs whose sampled accuracy ended at 0, and
    no webhop run (whose collapses show in the greedy held-out policy, not the sampled metrics)."""
    from pathlib import Path

    from arpo.settings import TrainConfig
    from arpo.training.logger import read_metrics

    def stops(study: str, patience: int) -> dict:
        out = {}
        for d in sorted(Path(f"docs/results/{study}/rl").iterdir()):
            mon = HealthMonitor(patience)
            for r in read_metrics(d):
                mon.observe(dict(r))
                if mon.should_stop():
                    out[d.name] = (r["step"], mon.should_stop())
                    break
        return out

    assert TrainConfig().monitor.patience == 3
    assert stops("branch_rules_hop2", 3) == {"arpo_seed2": (5, "accuracy_collapse"),
                                             "arpo@top_entropy_seed2": (4, "accuracy_collapse"),
                                             "arpo@top_entropy_seed4": (9, "accuracy_collapse"),
                                             "arpo@zscore_seed4": (9, "accuracy_collapse")}
    assert stops("branch_rules_webhop", 3) == {}
    assert set(stops("branch_rules_hop2", 2)) - set(stops("branch_rules_hop2", 3)) == {"arpo_seed1",
                                                                                       "arpo@top_entropy_seed0"}
