"""`arpo train --resume` never unpickles (issue 61): a checkpoint's trainer state and in-flight trees are
JSON + safetensors, and an older checkpoint's pickles (trainer.pt, in_flight*.pt) are read only with
--trust-pickled-checkpoint. Before, resuming a downloaded run executed its trainer.pt."""

import json
import os
import subprocess
import sys

import pytest
import torch

from arpo.errors import ArpoError
from arpo.training.checkpoint import load_trainer_state, save_checkpoint
from arpo.training.pipeline import RolloutPipeline, restore_in_flight


class Payload:
    """Unpickling it writes a marker file (what a hostile trainer.pt does)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def hostile_pickle(path, marker):
    torch.save({"optimizer": None, "scheduler": None, "rng": None, "x": Payload(marker)}, path)


def small_run(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 / (k + 1))
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    sched.step()

    class Saveable(torch.nn.Module):  # save_checkpoint calls model.save_pretrained
        def save_pretrained(self, d, **kw):
            os.makedirs(d, exist_ok=True)

    ck = save_checkpoint(tmp_path / "run", 1, Saveable(), optimizer=opt, scheduler=sched, state={"kind": "train"},
                         files={"in_flight.json": [__import__("arpo.rollout.tree", fromlist=["x"]).RolloutTree(
                             "p0", [1, 2], [], policy_version=0)]})
    return model, opt, sched, ck


def test_a_checkpoint_holds_no_pickle_and_restores_exactly(tmp_path):
    model, opt, sched, ck = small_run(tmp_path)
    names = sorted(p.name for p in ck.iterdir())
    assert names == ["in_flight.json", "in_flight.safetensors", "model", "state.json", "trainer.json",
                     "trainer.safetensors"]
    torch.manual_seed(7)
    want_rng = torch.rand(3)
    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda k: 1 / (k + 1))
    torch.manual_seed(123)
    load_trainer_state(ck, opt2, sched2)
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"] and sched.state_dict() == sched2.state_dict()
    for i in a["state"]:
        for k, v in a["state"][i].items():
            assert torch.equal(v, b["state"][i][k]), (i, k)
    assert not torch.equal(torch.rand(3), want_rng)  # the checkpoint's RNG state, not seed 123's


def test_an_older_pickled_trainer_state_is_refused_without_the_flag(tmp_path):
    _, opt, sched, ck = small_run(tmp_path)
    (ck / "trainer.json").unlink()
    marker = tmp_path / "ran.marker"
    hostile_pickle(ck / "trainer.pt", marker)
    with pytest.raises(ArpoError, match="--trust-pickled-checkpoint"):
        load_trainer_state(ck, opt, sched)
    assert not marker.exists()
    with pytest.raises((TypeError, AttributeError, KeyError)):  # with the flag it is read: its code runs
        load_trainer_state(ck, opt, sched, allow_pickle=True)
    assert marker.read_text() == "ran"


def test_older_pickled_in_flight_trees_are_refused_without_the_flag(tmp_path):
    marker = tmp_path / "ran.marker"
    hostile_pickle(tmp_path / "in_flight.pt", marker)
    pipe = RolloutPipeline()
    try:
        with pytest.raises(ArpoError, match="--trust-pickled-checkpoint"):
            restore_in_flight(pipe, tmp_path, {"in_flight": {"step": 2, "files": ["in_flight.pt"]}})
    finally:
        pipe.close()
    assert not marker.exists()


def test_a_state_file_cannot_name_another_type(tmp_path):
    from arpo.training.safe_state import load_state, save_state

    save_state({"a": (1, 2.5, None), 3: "int key"}, tmp_path / "s.json")
    assert load_state(tmp_path / "s.json") == {"a": (1, 2.5, None), 3: "int key"}
    (tmp_path / "s.json").write_text(json.dumps({"__dataclass__": "Popen", "fields": {"args": ["true"]}}))
    with pytest.raises(ArpoError, match="may not hold"):
        load_state(tmp_path / "s.json")
    with pytest.raises(TypeError, match="cannot save"):
        save_state({"x": subprocess}, tmp_path / "t.json")


def test_train_resume_of_a_pickled_checkpoint_names_the_flag(tiny_dir, tmp_path):
    run = tmp_path / "run"
    args = ["train", f"model.name={tiny_dir / 'model'}", f"data.path={tiny_dir / 'q.jsonl'}", "tools.enabled=[]",
            "agent.max_response_tokens=4", "rollout.group_size=2", "rollout.initial_rollouts=2",
            "reward.fn=arpo.testing:toy_reward", "steps=1", "prompts_per_step=1", f"run.dir={run}",
            "run.tensorboard=false", "run.threads=1", "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "arpo", *args], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    ck = run / "checkpoints" / "step_000001"
    for f in ("trainer.json", "trainer.safetensors"):
        (ck / f).unlink()
    marker = tmp_path / "ran.marker"
    hostile_pickle(ck / "trainer.pt", marker)
    args[args.index("steps=1")] = "steps=2"
    p = subprocess.run([sys.executable, "-m", "arpo", *args, "--resume"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode != 0 and "--trust-pickled-checkpoint" in p.stderr, p.stderr[-2000:]
    assert not marker.exists()
