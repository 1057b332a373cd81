"""Train–inference mismatch (issue 31): every training step logs the KL and the max |Δ| between the
log-probs the engine recorded at rollout and the training forward's log-probs of the same tokens; on
CPU in float32 they agree to float rounding."""

import json
import math

import torch

from arpo.config import load_config
from arpo.recipes import train
from arpo.settings import TrainConfig
from arpo.training.mismatch import mismatch_metrics, mismatch_sums


def test_mismatch_sums_are_k3_and_max_over_the_masked_tokens():
    rollout = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -9.0, 0.0]], dtype=torch.float64)
    trained = rollout + torch.tensor([[0.1, -0.2, 5.0], [0.0, 0.3, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # the 5.0 and 7.0 are masked out
    s, n, mx = mismatch_sums(rollout, trained, mask)
    k3 = sum(math.expm1(d) - d for d in (0.1, -0.2, 0.0, 0.3))
    assert n == 4 and abs(s - k3) < 1e-12 and abs(mx - 0.3) < 1e-6
    m = mismatch_metrics([(s, n, mx), (0.0, 0.0, 0.0)])
    assert abs(m["mismatch/kl"] - k3 / 4) < 1e-12 and m["mismatch/tokens"] == 4


def test_every_step_logs_a_zero_mismatch_on_cpu_fp32(tmp_path):
    """configs/train_tiny.yaml (random-weight Llama, float32, CPU), old log-probs both from the
    engine's records and recomputed: the engine's sampler and the trainer's forward agree."""
    for mode in ("rollout", "recompute"):
        run_dir = tmp_path / mode
        cfg = load_config(TrainConfig, "configs/train_tiny.yaml",
                          [f"run.dir={run_dir}", "steps=2", f"old_logprobs={mode}", "run.save_every=0"])
        train.run(cfg, quiet=True)
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "mismatch/kl" in r]
        assert len(steps) == 2, rows
        for r in steps:
            assert r["mismatch/tokens"] > 10
            assert 0.0 <= r["mismatch/kl"] < 1e-10 and r["mismatch/max_abs"] < 1e-4, r
