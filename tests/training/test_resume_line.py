"""A training run stopped inside another command (`arpo experiment`) prints a resume line that runs:
the run's own config with --resume (it printed the placeholder `arpo train ... --resume`)."""

import sys

from arpo.config import load_config
from arpo.settings import TrainConfig
from arpo.training.signals import GracefulStop


def test_the_resume_line_of_a_run_started_by_an_experiment(tmp_path, monkeypatch, capsys):
    run = tmp_path / "rl" / "arpo_seed1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"run:\n  dir: {run}\nsteps: 4\n")
    monkeypatch.setattr(sys, "argv", ["arpo", "experiment", "hop2-arpo-vs-grpo", "--quick"])
    stop = GracefulStop()
    stop.report("train", 2, 4, run)
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1].strip()
    assert line == f"arpo train --config {run}/config.yaml --resume" and "..." not in err, err
    cfg = load_config(TrainConfig, f"{run}/config.yaml")  # the line's config loads, and names the run
    assert cfg.run.dir == str(run) and cfg.steps == 4
