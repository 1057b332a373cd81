"""An RL step where every rollout is malformed learns nothing (rewards all the format penalty,
advantages 0): `arpo train` says so, naming the step (it printed "done" and nothing else). The
warning is training/health.py's all_malformed rule."""

import json

from arpo.cli import main
from arpo.training.health import all_malformed


def test_the_warning_only_when_every_rollout_is_malformed():
    m = {"trajectories": 4, "format_error_rate": 1.0, "reward_mean": -1.0}
    w = all_malformed(m, {})
    assert w is not None and w.startswith("all 4 rollouts are malformed (reward -1.00 each)")
    assert "every advantage is 0" in w and "arpo sft" in w
    assert all_malformed({**m, "format_error_rate": 0.75}, {}) is None  # one well-formed: a signal
    assert all_malformed({"skipped": 1, "reason": "every rollout failed"}, {}) is None


def test_train_warns_on_a_step_of_malformed_rollouts(tmp_path, capsys):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "What is 2+2?", "answer": "4", "task": "math"}) + "\n")
    # 4 tokens of a random model: never an <answer>, so every rollout is a format error
    assert main(["train", "model.name=tiny-random", f"data.path={data}", "steps=1", "prompts_per_step=1",
                 "rollout.group_size=2", "rollout.initial_rollouts=2", "agent.max_response_tokens=4",
                 f"run.dir={tmp_path / 'run'}", "run.tensorboard=false", "run.save_every=0", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "train: warning [all_malformed] at step 1: all 2 rollouts are malformed" in err, err[-2000:]
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert row["format_error_rate"] == 1.0 and row["warn/all_malformed"] == 1.0
