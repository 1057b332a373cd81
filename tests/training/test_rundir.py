"""Run-dir rules (issue 15 B): validate before touching, one writer, safe resume, output paths
checked first, SIGTERM/Ctrl-C stop cleanly with a checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arpo.config import load_config
from arpo.errors import ArpoError
from arpo.recipes import train
from arpo.settings import SFTConfig, TrainConfig
from arpo.training.rundir import RunDir


def _ov(tiny_dir, run_dir, steps=1, **extra):
    ov = {"model.name": tiny_dir / "model", "data.path": tiny_dir / "q.jsonl", "tools.enabled": "[]",
          "agent.max_response_tokens": 8, "rollout.group_size": 2, "rollout.initial_rollouts": 2,
          "reward.fn": "arpo.testing:toy_reward", "steps": steps, "prompts_per_step": 2, "optim.lr": 1e-3,
          "run.dir": run_dir, "run.save_every": 1, "run.tensorboard": "false", "run.threads": 1, **extra}
    return [f"{k}={v}" for k, v in ov.items()]


def _train(tiny_dir, run_dir, *, resume=False, overwrite=False, **extra):
    cfg = load_config(TrainConfig, None, _ov(tiny_dir, run_dir, **extra))
    return train.run(cfg, resume=resume, overwrite=overwrite, quiet=True)


@pytest.fixture()
def done_run(tiny_dir, tmp_path):
    run_dir = tmp_path / "run"
    _train(tiny_dir, run_dir)
    assert (run_dir / "checkpoints" / "step_000001").is_dir()
    return run_dir


@pytest.mark.parametrize("bad", [{"data.path": "no_such.jsonl"}, {"reward.fn": "no_such_module:fn"},
                                 {"model.name": "no_such_model_dir"}, {"validation.path": "missing.jsonl"}])
def test_overwrite_with_a_bad_config_touches_nothing(tiny_dir, done_run, bad):
    before = sorted(p.name for p in done_run.iterdir())
    with pytest.raises(ArpoError):
        _train(tiny_dir, done_run, overwrite=True, **bad)
    assert sorted(p.name for p in done_run.iterdir()) == before
    assert (done_run / "checkpoints" / "step_000001" / "state.json").is_file()
    assert (done_run / "metrics.jsonl").read_text().strip()


def test_overwrite_keeps_the_old_run_until_the_new_one_checkpoints(tiny_dir, done_run, monkeypatch):
    old_metrics = (done_run / "metrics.jsonl").read_text()

    def crash(tr, step):
        raise RuntimeError("crash in the first step")

    monkeypatch.setattr(train, "train_step", crash)
    with pytest.raises(RuntimeError):
        _train(tiny_dir, done_run, overwrite=True)
    aside = done_run / ".overwritten"
    assert (aside / "checkpoints" / "step_000001" / "state.json").is_file()  # recoverable
    assert (aside / "metrics.jsonl").read_text() == old_metrics
    monkeypatch.undo()
    _train(tiny_dir, done_run, overwrite=True, steps=2)
    assert not aside.exists()
    assert [json.loads(x)["step"] for x in (done_run / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_an_interrupted_overwrite_is_never_deleted_by_a_plain_run(tiny_dir, done_run, monkeypatch):
    """Issue 29 A: --overwrite killed before its first checkpoint, then a plain run (or --resume): refused
    with the restore command, which brings the old run back so that --resume continues it."""
    old_metrics = (done_run / "metrics.jsonl").read_text()

    def crash(tr, step):
        raise RuntimeError("killed in the first step")

    monkeypatch.setattr(train, "train_step", crash)
    with pytest.raises(RuntimeError):
        _train(tiny_dir, done_run, overwrite=True, **{"optim.lr": 5e-3})
    monkeypatch.undo()
    aside = done_run / ".overwritten"
    for resume in (False, True):
        with pytest.raises(ArpoError, match=r"\.overwritten holds the run an interrupted --overwrite") as e:
            _train(tiny_dir, done_run, resume=resume)
        assert (aside / "checkpoints" / "step_000001" / "state.json").is_file()
    restore = str(e.value).split("Restore it with:\n  ")[1].split("\n")[0]
    subprocess.run(restore, shell=True, check=True)
    assert not aside.exists() and (done_run / "metrics.jsonl").read_text() == old_metrics
    out = _train(tiny_dir, done_run, resume=True, steps=2)  # the old config (lr 1e-3) came back with it
    assert out["checkpoint"].endswith("step_000002")


def test_a_second_writer_is_refused_and_a_dead_lock_is_taken_over(tiny_dir, tmp_path):
    run_dir = tmp_path / "locked"
    holder = RunDir(run_dir, command="train").open()
    try:
        with pytest.raises(ArpoError, match=rf"in use by arpo train \(pid {os.getpid()}"):
            _train(tiny_dir, run_dir)
    finally:
        holder.close()
    # a lock file left by a process that died (its flock went with it) is no obstacle
    (run_dir / ".lock").write_text("arpo train (pid 999999, started long ago)\n")
    _train(tiny_dir, run_dir)
    assert (run_dir / "checkpoints" / "step_000001").is_dir()


def test_two_processes_into_one_run_dir(tiny_dir, tmp_path):
    """A real second `arpo train` process while the first holds the run dir: exit 2, named reason."""
    run_dir = tmp_path / "shared"
    holder = RunDir(run_dir, command="train").open()
    try:
        p = subprocess.run([sys.executable, "-m", "arpo", "train", *_ov(tiny_dir, run_dir), "--quiet"],
                           capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)
    finally:
        holder.close()
    assert p.returncode == 2 and "is in use by arpo train" in p.stderr
    assert not (run_dir / "metrics.jsonl").exists()


def test_resume_refuses_changes_that_break_the_run_and_keeps_a_history(tiny_dir, done_run):
    with pytest.raises(ArpoError) as e:
        _train(tiny_dir, done_run, resume=True, steps=2, **{"optim.lr": 5e-3, "rollout.group_size": 4})
    msg = str(e.value)
    assert "optim.lr: 0.001 -> 0.005" in msg and "rollout.group_size: 2 -> 4" in msg and "steps" not in msg.split(
        "only these")[0]
    out = _train(tiny_dir, done_run, resume=True, steps=2, **{"validation.limit": 3})  # safe changes
    assert out["checkpoint"].endswith("step_000002")
    import yaml

    cfg = yaml.safe_load((done_run / "config.yaml").read_text())
    assert cfg["steps"] == 2 and cfg["optim"]["lr"] == 0.001 and cfg["validation"]["limit"] == 3
    hist = sorted(p.name for p in (done_run / "config_history").iterdir())
    assert len(hist) == 2 and "_start_" in hist[0] and "_resume_" in hist[1]
    with pytest.raises(ArpoError, match="--resume and --overwrite contradict"):
        _train(tiny_dir, done_run, resume=True, overwrite=True)


def test_sft_resume_refuses_a_new_model(tiny_dir, tmp_path):
    from arpo.recipes import sft

    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "response": "<answer> \\boxed{2} </answer>"}) + "\n")
    ov = [f"model.name={tiny_dir / 'model'}", f"data.path=[{data}]", "prompts_per_step=1", "steps=1",
          f"run.dir={tmp_path / 'sft'}", "run.tensorboard=false"]
    sft.run(load_config(SFTConfig, None, ov), quiet=True)
    with pytest.raises(ArpoError, match="model.name: .* -> 'tiny-random'"):
        sft.run(load_config(SFTConfig, None, ov + ["model.name=tiny-random", "steps=2"]), resume=True,
                quiet=True)


def test_output_paths_are_checked_before_the_work(tmp_path, capsys):
    from arpo.cli import main

    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    t0 = time.perf_counter()
    rc = main(["eval", "--model", "tiny-random", "--data", "svamp:test", "--limit", "1", "--out",
               str(blocker / "sub" / "eval.json"), "--quiet"])
    assert rc == 2 and "--out" in capsys.readouterr().err and time.perf_counter() - t0 < 20
    rc = main(["rollout", "--out", str(blocker / "r.jsonl"), "model.name=tiny-random", "--quiet"])
    assert rc == 2 and "cannot write there" in capsys.readouterr().err
    # a missing folder is created
    from arpo.jsonl import prepare_output

    assert prepare_output(tmp_path / "new" / "dir" / "x.json").parent.is_dir()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_after_the_step_with_a_checkpoint(tiny_dir, tmp_path, sig):
    run_dir = tmp_path / "sig"
    args = _ov(tiny_dir, run_dir, steps=200, **{"run.save_every": 0})  # checkpoints only at the end
    p = subprocess.Popen([sys.executable, "-m", "arpo", "train", *args, "--quiet"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.05)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, err[-2000:]
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    last = steps[-1]
    assert 2 <= last < 200 and steps == list(range(1, last + 1))
    ck = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert ck == f"step_{last:06d}"  # the finished step was checkpointed
    assert f"stopped after step {last}/200" in err and "--resume" in err
    assert "stopped early by" in out


def test_a_copied_run_resumes_in_its_new_place(tiny_dir, done_run, tmp_path):
    """Copying a run to continue it (keeping the original) was refused: "--resume with a config that
    changes the run: run.dir: 'run' -> 'copy'"."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(done_run, copy)
    res = _train(tiny_dir, copy, resume=True, steps=2)
    assert res["checkpoint"] and Path(res["checkpoint"]).parent.parent == copy
    assert (copy / "checkpoints" / "step_000002").is_dir() and not (done_run / "checkpoints" / "step_000002").exists()
    assert [json.loads(x)["step"] for x in (copy / "metrics.jsonl").read_text().splitlines()
            if "reward_mean" in json.loads(x)] == [1, 2]


def test_resume_refuses_fewer_steps_and_changed_data(tiny_dir, tmp_path):
    """Issue 29 D: --resume steps=1 on a run at step 2 was "done" (and config.yaml said steps: 1); a
    resume after the data file's content changed was accepted (only the path was compared)."""
    import shutil

    data = tmp_path / "q.jsonl"
    shutil.copy(tiny_dir / "q.jsonl", data)
    run_dir = tmp_path / "run"
    _train(tiny_dir, run_dir, steps=2, **{"data.path": data})
    with pytest.raises(ArpoError, match="steps=1: the run .* is already at step 2"):
        _train(tiny_dir, run_dir, resume=True, steps=1, **{"data.path": data})
    import yaml

    assert yaml.safe_load((run_dir / "config.yaml").read_text())["steps"] == 2
    data.write_text(data.read_text().replace('"4"', '"5"'))
    with pytest.raises(ArpoError, match=r"the content of .*q\.jsonl changed since the run started"):
        _train(tiny_dir, run_dir, resume=True, steps=3, **{"data.path": data})


def test_run_dir_records_the_commit_and_package_versions_at_start_and_resume(tiny_dir, done_run):
    import torch

    from arpo.provenance import git_state

    rec = json.loads((done_run / "provenance.json").read_text())
    assert [r["kind"] for r in rec] == ["start"]
    assert rec[0]["commit"] == git_state(__import__("arpo").__file__)["commit"]
    assert rec[0]["packages"]["torch"] in (torch.__version__, torch.__version__.split("+")[0])
    assert "dirty" in rec[0] and rec[0]["python"]
    _train(tiny_dir, done_run, resume=True, steps=2)
    assert [r["kind"] for r in json.loads((done_run / "provenance.json").read_text())] == ["start", "resume"]
