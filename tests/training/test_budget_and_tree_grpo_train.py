"""Issue 59 end to end: `arpo train` one step with Tree-GRPO's node expansion (algo.preset tree_grpo),
and one step with the budget settings (final answer turn, call-cap and truncation penalties, overlong
filter and penalty, OTC), on a tiny random model with a scripted agent and a real plug-in tool."""

import json
import math
from pathlib import Path

import pytest

from arpo.testing import save_tiny_model
from arpo.training.rollout_log import read_run_trees

SCRIPT = ["<think> go </think><echo> a </echo>", "<echo> bb </echo>", "<answer> \\boxed{4} </answer>"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("i59")
    save_tiny_model(d / "model")
    (d / "q.jsonl").write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": "4",
                                                   "task": "math"}) + "\n" for i in range(4)))
    return d


def _train(tiny_dir: Path, run: Path, scripted_training, **over):
    ov = {"model.name": tiny_dir / "model", "data.path": tiny_dir / "q.jsonl", "tools.enabled": "[arpo.testing:echo]",
          "tools.cache": "false", "agent.max_response_tokens": 90, "rollout.group_size": 5,
          "rollout.initial_rollouts": 1, "steps": 1, "prompts_per_step": 2, "optim.lr": 1e-3, "run.dir": run,
          "run.save_every": 0, "run.tensorboard": "false", "run.seed": 2, "run.threads": 1, **over}
    scripted_training(ov, SCRIPT, free_tokens=3)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return rows, read_run_trees(run)


def test_one_tree_grpo_step(tiny_dir, tmp_path, scripted_training):
    rows, trees = _train(tiny_dir, tmp_path / "run", scripted_training, **{"algo.preset": "tree_grpo",
                                                                              "reward.fn": "arpo.testing:toy_reward"})
    (row,) = rows
    assert row["trajectories"] == 2 * 5 and row["branches"] == 2 * 4  # N = 1 chain, M = 5: four expansions each
    assert row["branch_decisions"] == 0  # no entropy decision: nodes were drawn
    assert all(math.isfinite(v) for v in row.values() if isinstance(v, float))
    assert row["grad_norm"] > 0
    assert len(trees) == 2
    for tree in trees:
        trajs = tree["trajectories"]
        assert len(trajs) == 5 and sum(t["parent"] is None for t in trajs) == 1
        assert all(t["advantage"] is not None for t in trajs)  # every trajectory trained
        # every branch starts right after one of its parent's own tool results
        for t in trajs:
            if t["parent"] is not None:
                parent = trajs[t["parent"]]
                ends = [c["result_span"][1] for c in parent["tool_calls"] if c["result_span"][1] > parent["start"]]
                assert t["branch_at"] in ends


def test_one_step_with_the_budget_settings(tiny_dir, tmp_path, scripted_training):
    """max_tool_calls 1 with the final turn: the second call is not run, the model answers after the notice
    and the answer counts: arpo reward 1 (OTC's factor is 1: every correct answer made one call), less
    the overlong penalty of its last 60 budget tokens; one the budget cut gets truncated_penalty 0 less 1."""
    rows, trees = _train(tiny_dir, tmp_path / "run", scripted_training, **{
        "agent.max_tool_calls": 1, "agent.final_answer_turn": "true", "reward.call_cap_penalty": -0.5,
        "reward.truncated_penalty": 0.0, "reward.overlong_buffer": 60, "agent.max_response_tokens": 200,
        "reward.overlong_filter": "true",
        "reward.tool_efficiency": "otc"})
    (row,) = rows
    assert row["tool_calls_issued"] > 0
    seen = set()
    for tree in trees:
        trajs = tree["trajectories"]
        texts: list[str] = []
        for t in trajs:  # a branch's text: its parent's up to the branch point, then its own tokens
            pieces = [] if t["parent"] is None else texts[t["parent"]][: t["branch_at"]]
            texts.append(pieces + t["tokens"])
        for t, pieces in zip(trajs, texts, strict=True):
            seen.add(t["finish_reason"])
            assert len(t["tool_calls"]) == 1  # the second call never ran
            assert t["finish_reason"] in ("answer", "length")
            if t["finish_reason"] == "answer":
                assert "The tool-call budget is used up" in "".join(pieces)
                assert t["correct"] and t["format_error"] is None
                assert t["reward"] == pytest.approx(1.0 - min(1.0, max(0, t["n_tokens"] - 140) / 60))
            else:  # truncated_penalty 0 plus the full overlong penalty (cut: longer than the budget)
                assert t["reward"] == pytest.approx(-1.0)
    assert "answer" in seen
