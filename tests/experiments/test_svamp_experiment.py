"""The SVAMP ARPO-vs-GRPO experiment's plumbing, end to end with the tiny random model."""

import json

import pytest

from experiments import common
from experiments import svamp as X


def test_seed_spread():
    s = {"per_seed_ratio": [{"ratio": 0.5}, {"ratio": None}, {"ratio": 1.0}]}
    assert X.seed_spread(s) == {"n": 2, "mean": 0.75, "sd": pytest.approx(0.25 * 2 ** 0.5), "min": 0.5, "max": 1.0}
    assert X.seed_spread({"per_seed_ratio": []}) == {"n": 0}


def test_quick_svamp_experiment_end_to_end(tmp_path):
    cfg = X.SvampExperimentConfig.quick(out=str(tmp_path / "q"), threads=2)
    res = X.run(cfg)
    data = json.loads((tmp_path / "q" / "results.json").read_text())
    assert data["sft"]["data"]["written"] == 8 and data["eval_questions"] == 4
    for m in cfg.methods:
        (r,) = data["runs"][m]
        assert [p["step"] for p in r["curve"]] == [0, 2]
        assert [p["tool_calls"] for p in r["curve"]] == sorted(p["tool_calls"] for p in r["curve"])  # cumulative
        assert all(0 <= p["ci_low"] <= p["accuracy"] <= p["ci_high"] <= 1 for p in r["curve"])
        # same budget: M trajectories per prompt for both methods, every step
        assert [s["trajectories"] for s in r["per_step"]] == [8, 8]
        assert r["final_vs_sft"]["common"] == 4
    assert data["runs"]["grpo"][0]["branches_total"] == 0
    assert data["train_config"]["model"]["name"] == data["sft"]["model"]
    for png in ("accuracy_vs_step.png", "accuracy_vs_tool_calls.png", "training_and_branch_rate.png"):
        assert (tmp_path / "q" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert res["summary"]["start_accuracy"] == data["start"]["accuracy"]
    rep = (tmp_path / "q" / "report.md").read_text()
    assert "| ARPO | 0 |" in rep and "| GRPO | 0 |" in rep and "Tool calls to reach" in rep


def test_a_rerun_reuses_finished_checkpoints_and_cached_evaluations(tmp_path, monkeypatch):
    """An interrupted or extended experiment does not train or evaluate twice; a changed config does."""
    from arpo.recipes import train

    cfg = X.SvampExperimentConfig.quick(out=str(tmp_path / "q"), threads=2, methods=["arpo"], steps=2, eval_every=1)
    first = X.run(cfg)["runs"]["arpo"][0]
    assert [p["step"] for p in first["curve"]] == [0, 1, 2] and first["reused_steps"] == []
    evals = []
    real_eval = common.evaluate_model
    monkeypatch.setattr(common, "evaluate_model", lambda *a, **k: evals.append(a[0]) or real_eval(*a, **k))

    def no_training(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(train, "run", no_training)
    again = dict(cfg.__dict__, sft_from=json.loads((tmp_path / "q" / "results.json").read_text())["sft"]["model"])
    second = X.run(X.SvampExperimentConfig(**again))["runs"]["arpo"][0]
    assert second["reused_steps"] == [1, 2] and evals == []
    assert second["curve"][1:] == [dict(p, seconds=q["seconds"])
                                   for p, q in zip(first["curve"][1:], second["curve"][1:], strict=True)]
    assert second["per_step"] == first["per_step"]
    # a change that alters training (the learning rate) is not reused: the run is trained again
    changed = X.SvampExperimentConfig(**dict(again, train_overrides=cfg.train_overrides + ["optim.lr=1e-3"]))
    with pytest.raises(AssertionError, match="trained again"):
        X.run(changed)


def test_ctrl_c_ends_the_experiment(tmp_path, monkeypatch):
    """Ctrl-C during an RL run: that run checkpoints and stops, and so does the experiment (it used to
    go on with the next segment and method, and end with a summary as if complete)."""
    import os
    import signal

    from arpo.recipes import train

    real_step = train.train_step

    def signalled_step(tr, step):
        os.kill(os.getpid(), signal.SIGINT)  # caught by train.run's GracefulStop: finish this step, stop
        return real_step(tr, step)

    monkeypatch.setattr(train, "train_step", signalled_step)
    cfg = X.SvampExperimentConfig.quick(out=str(tmp_path / "q"), threads=2, steps=2, eval_every=1)
    with pytest.raises(KeyboardInterrupt):
        X.run(cfg)
    rl = tmp_path / "q" / "rl"
    assert sorted(p.name for p in rl.iterdir()) == [f"{cfg.methods[0]}_seed0"]  # the second method never started
    assert not (tmp_path / "q" / "results.json").exists()


def test_seed_curves_use_the_sample_sd():
    """Three seeds are a sample: the spread is the ddof-1 sd (the population sd is ≈ 22 % too small)."""
    from experiments.common import mean_curve

    runs = [{"curve": [{"step": 5, "accuracy": a, "tool_calls": c}]} for a, c in ((0.2, 10), (0.3, 20), (0.4, 60))]
    c = mean_curve(runs)
    assert c["accuracy_mean"] == [pytest.approx(0.3)] and c["accuracy_std"] == [pytest.approx(0.1)]
    assert c["tool_calls_std"] == [pytest.approx(26.457513, rel=1e-6)]  # sqrt(((-20)^2 + (-10)^2 + 30^2) / 2)
    assert mean_curve(runs[:1])["accuracy_std"] == [0.0]
