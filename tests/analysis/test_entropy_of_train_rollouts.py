"""`arpo analyze entropy` reads a training run's own saved trees (RUN_DIR/rollouts/step_N.jsonl.gz);
it refused them ("field 'entropies' missing")."""

import json

from arpo.cli import main


def test_analyze_entropy_on_a_train_runs_rollouts(tmp_path, capsys):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "What is 2+2?", "answer": "4", "task": "math"}) + "\n")
    assert main(["train", "model.name=tiny-random", f"data.path={data}", "steps=1", "prompts_per_step=1",
                 "rollout.group_size=2", "rollout.initial_rollouts=2", "agent.max_response_tokens=8",
                 f"run.dir={tmp_path / 'run'}", "run.tensorboard=false", "run.save_every=0", "--quiet"]) == 0
    capsys.readouterr()
    dump = tmp_path / "run" / "rollouts" / "step_1.jsonl.gz"
    assert main(["analyze", "entropy", str(dump), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["trajectories"] == 2 and stats["initial_first20_mean"] > 0, stats
