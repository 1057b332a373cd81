"""fp32 master weights (issue 60, finding 1): with a bf16 compute dtype the policy's weights and
AdamW's moments stay float32 and the bf16 copy is only what the forward computes with; at lr 1e-6,
where bf16's spacing near a weight of 0.02 (1.2e-4) swallows every update, a few steps still move
nearly every master weight."""

import pytest
import torch
from safetensors.torch import load_file

from arpo.config import load_config
from arpo.settings import TrainConfig


def _overrides(tiny_dir, run_dir, **extra):
    ov = {"model.name": tiny_dir / "model", "model.dtype": "bfloat16", "data.path": tiny_dir / "q.jsonl",
          "tools.enabled": "[]", "agent.max_response_tokens": 12, "rollout.group_size": 4,
          "rollout.initial_rollouts": 2, "rollout.branch_threshold": 0.0, "reward.fn": "arpo.testing:toy_reward",
          "steps": 3, "prompts_per_step": 2, "minibatches": 1, "optim.lr": 1e-6, "optim.grad_clip": 0,
          "run.dir": run_dir, "run.save_every": 3, "run.tensorboard": "false", "run.save_rollouts": 0, **extra}
    return [f"{k}={v}" for k, v in ov.items()]


def _moved(before: dict, after: dict) -> float:
    """The fraction of all weights that differ (in the saved dtype, compared at that dtype)."""
    n = changed = 0
    for k, a in after.items():
        b = before[k].to(a.dtype)
        changed += int((a != b).sum())
        n += a.numel()
    return changed / n


def test_bf16_compute_at_lr_1e6_moves_the_fp32_master_weights(tiny_dir, tmp_path):
    from arpo.recipes import train

    run_dir = tmp_path / "run"
    train.run(load_config(TrainConfig, None, _overrides(tiny_dir, run_dir)), quiet=True)
    ck = run_dir / "checkpoints" / "step_000003"
    after = load_file(str(ck / "model" / "model.safetensors"))
    before = load_file(str(tiny_dir / "model" / "model.safetensors"))
    moved = _moved(before, after)
    assert moved >= 0.95, f"{moved:.2%} of the weights moved"
    assert {t.dtype for t in after.values()} == {torch.float32}  # the master weights are what is saved
    from arpo.training.safe_state import load_state

    blob = load_state(ck / "trainer.json")  # trainer.json + trainer.safetensors: no pickle (issue 61)
    moments = [t for s in blob["optimizer"]["state"].values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq")]
    assert moments and {t.dtype for t in moments} == {torch.float32}


@pytest.mark.parametrize("offload", [False, True])
def test_fsdp_bf16_compute_keeps_fp32_shards_and_moves_them(tiny_dir, tmp_path, offload):
    """torchrun, 2 CPU ranks: FSDP2 shards float32 weights and computes in bf16 (MixedPrecisionPolicy);
    the checkpoint's gathered weights are the float32 masters, moved by lr 1e-6. memory.cpu_offload:
    the same with FSDP2's CPUOffloadPolicy (the shards, gradients and AdamW on the host)."""
    import os
    import subprocess
    import sys

    run_dir = tmp_path / "fsdp"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        "-m", "arpo", "train", *_overrides(tiny_dir, run_dir, steps=2, **{
                            "run.save_every": 2, "memory.cpu_offload": str(offload).lower()}),
                        "run.threads=1", "--quiet"], env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-4000:]
    after = load_file(str(run_dir / "checkpoints" / "step_000002" / "model" / "model.safetensors"))
    before = load_file(str(tiny_dir / "model" / "model.safetensors"))
    assert {t.dtype for t in after.values()} == {torch.float32}
    moved = _moved(before, after)
    assert moved >= 0.95, f"{moved:.2%} of the weights moved"
