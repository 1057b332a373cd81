"""MetricsLogger: JSONL source of truth, resume truncation, optional wandb mirror (a fake module here)."""

import sys
import types

import pytest

from arpo.errors import ArpoError
from arpo.training.logger import MetricsLogger, read_metrics


class FakeRun:
    def __init__(self, **kw):
        self.kw, self.logged, self.finished = kw, [], False

    def log(self, row, step):
        self.logged.append((step, row))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    runs = []
    mod = types.SimpleNamespace(util=types.SimpleNamespace(generate_id=lambda: f"id{len(runs)}"))
    mod.init = lambda **kw: runs.append(FakeRun(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return runs


def test_wandb_mirror_and_resume_keeps_run_id(tmp_path, fake_wandb):
    log = MetricsLogger(tmp_path, tensorboard=False, wandb_project="p", config={"lr": 1e-5})
    log.log(1, {"reward_mean": 0.5, "note": "x"})
    log.log(2, {"reward_mean": 0.7})
    log.close()
    run = fake_wandb[0]
    assert run.kw["project"] == "p" and run.kw["config"] == {"lr": 1e-5} and run.finished
    assert run.logged == [(1, {"reward_mean": 0.5}), (2, {"reward_mean": 0.7})]  # numbers only
    log = MetricsLogger(tmp_path, resume_step=1, tensorboard=False, wandb_project="p")  # resume: same wandb run
    log.close()
    assert fake_wandb[1].kw["id"] == run.kw["id"] and fake_wandb[1].kw["resume"] == "allow"
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]  # cut back to the checkpoint's step


def test_wandb_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ArpoError, match="run.wandb is set but wandb is not installed"):
        MetricsLogger(tmp_path, tensorboard=False, wandb_project="p")
