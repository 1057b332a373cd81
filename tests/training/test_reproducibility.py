"""The same seed gives the same run (issue 38): two `arpo train` runs of ARPO, AEPO and GRPO with a
real tool whose latency is randomly jittered give identical trees, metrics and final weights.

Reproduced first: with results delivered as they arrived (`agent.tool_delivery: arrival`, the old
behaviour) the arrival order decided who shared each decode batch (log-probs move by ~1e-5) and, for
ARPO/AEPO, the order of the branch draws; these runs then differed in their recorded log-probs,
losses and weights (and ARPO's trees). FAILED before for all three presets."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from arpo.testing import save_tiny_model

# arpo.testing:jitter_echo sleeps U(0, 3 ms) from the OS's entropy, so results arrive in a new order each run
SCRIPT = ["<jitter_echo> a </jitter_echo>", "<jitter_echo> bb </jitter_echo>", "<answer> \\boxed{4} </answer>"]
TIMING = ("seconds", "tokens_per_s", "time_", "tool_seconds", "elapsed_s")


def _untimed(x):
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if not any(t in k for t in TIMING)}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def _outcome(run_dir: Path):
    from arpo.training.rollout_log import read_run_trees

    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    ck = run_dir / "checkpoints"
    weights = load_file(str(ck / (ck / "latest").read_text().strip() / "model" / "model.safetensors"))
    return _untimed(read_run_trees(run_dir)), _untimed(rows), weights


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):  # conftest.py's, with four questions instead of six
    d = tmp_path_factory.mktemp("repro")
    save_tiny_model(d / "model")
    (d / "q.jsonl").write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i),
                                                   "task": "math"}) + "\n" for i in range(4)))
    return d


@pytest.mark.parametrize("preset", ["arpo", "aepo", "grpo", "arpo@top_entropy"])  # preset@branch_rule
def test_same_seed_same_trees_metrics_and_weights_with_a_jittered_tool(tiny_dir, tmp_path, scripted_training, preset):
    outcomes = []
    for name in ("a", "b"):
        ov = {"model.name": tiny_dir / "model", "data.path": tiny_dir / "q.jsonl",
              "tools.enabled": "[arpo.testing:jitter_echo]", "tools.cache": "false",
              "algo.preset": preset.partition("@")[0], "rollout.branch_rule": preset.partition("@")[2] or "auto",
              "agent.max_response_tokens": 80, "rollout.group_size": 4, "rollout.initial_rollouts": 2,
              "rollout.branch_threshold": 0.3, "reward.fn": "arpo.testing:toy_reward", "steps": 2,
              "prompts_per_step": 2, "optim.lr": 1e-3, "run.dir": tmp_path / name, "run.save_every": 0,
              "run.tensorboard": "false", "run.seed": 3, "run.threads": 1}
        scripted_training(ov, SCRIPT, free_tokens=4)
        outcomes.append(_outcome(tmp_path / name))
    (trees_a, rows_a, w_a), (trees_b, rows_b, w_b) = outcomes
    assert sum(r["tool_calls_issued"] for r in rows_a) > 0  # the tool ran
    if preset != "grpo":
        assert sum(r["branches"] for r in rows_a) > 0  # and the trees branched
    assert trees_a == trees_b
    assert rows_a == rows_b
    assert w_a.keys() == w_b.keys() and all(torch.equal(w_a[k], w_b[k]) for k in w_a)
