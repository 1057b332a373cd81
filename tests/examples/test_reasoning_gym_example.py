"""examples/reasoning_gym: worked examples from reasoning-gym rows, the reward's partial credit the RL
learns from, and run.sh end to end (SFT -> evals -> ARPO per seed -> the per-seed comparison) with the
tiny random model standing in for SmolLM2."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from arpo.data.datasets import load_examples
from arpo.rewards import get_reward_fn

ROOT = Path(__file__).resolve().parents[2]
HELD = "rg:basic_arithmetic?size=100&seed=5000&min_terms=3&max_terms=5&max_digits=2"


def test_a_worked_example_prints_the_tasks_expression():
    from examples.reasoning_gym.make_worked import worked

    spec = 'rg:basic_arithmetic?size=3&seed=0&min_terms=3&max_terms=5&max_digits=2&operators=["+","-","*"]'
    row = load_examples(spec)[0]
    assert row["question"] == "Calculate -33 * -22 - -8 * 30."
    assert worked(row) == {"question": "Calculate -33 * -22 - -8 * 30.",
                           "calls": [{"tool": "python", "arguments": "print(-33 * -22 - -8 * 30)"}], "answer": "966"}


def test_the_held_out_tasks_pay_partial_credit_for_a_float_answer():
    """38 of the 100 held-out tasks divide; python prints 4.0 where the generator's answer is 4, and
    score_answer pays len(gold) / len(answer) for an answer that contains the gold: the room the RL has to learn in."""
    rows = load_examples(HELD)
    assert sum("/" in r["question"] for r in rows) == 38
    div = next(r for r in rows if "/" in r["question"])
    reward = get_reward_fn("rg")
    gold = div["answers"][0]
    float_ans = reward(f"<answer> \\boxed{{{gold}.0}} </answer>", div)
    int_ans = reward(f"<answer> \\boxed{{{gold}}} </answer>", div)
    assert 0 < float_ans.score < 1 and not float_ans.correct and int_ans.score == 1.0 and int_ans.correct


def test_run_sh_runs_the_whole_pipeline_per_seed(tmp_path):
    sizes = {"sft": "model.name=tiny-random steps=1 prompts_per_step=2 run.tensorboard=false",
             "eval": "--limit 3 --max-response-tokens 16 --batch-size 3",
             "train": ("model.train_layers=1 steps=1 prompts_per_step=2 rollout.group_size=2 "
                       "rollout.initial_rollouts=1 agent.max_response_tokens=16 run.tensorboard=false")}
    cases = "\n".join(f'  {k}) set -- "$@" {v} ;;' for k, v in sizes.items())
    wrapper = tmp_path / "arpo"
    py = shlex.quote(sys.executable)
    wrapper.write_text(f'#!/usr/bin/env bash\ncase "$1" in\n{cases}\nesac\nexec {py} -m arpo "$@"\n')
    wrapper.chmod(0o755)
    out = tmp_path / "rg"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ARPO": str(wrapper), "PYTHON": sys.executable, "R": str(out),
           "SEEDS": "0 1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    p = subprocess.run(["bash", "examples/reasoning_gym/run.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    sft = [json.loads(x) for x in (out / "sft_data.jsonl").read_text().splitlines()]
    assert len(sft) == 160 and all("<python>print(" in r["response"] for r in sft)
    res = json.loads((out / "results.json").read_text())
    assert res["seeds"] == 2 and [r["file"] for r in res["runs"]] == [str(out / f"eval_arpo_s{s}.json") for s in (0, 1)]
    assert res["start"]["questions"] == 3 and "sampled_pass@1" in res["runs"][1]
    assert res["provenance"]["commit"]
    for s in (0, 1):
        ev = json.loads((out / f"eval_arpo_s{s}_t1.json").read_text())
        assert ev["temperature"] == 1.0 and next(iter(ev["results"].values()))["samples"] == 2
