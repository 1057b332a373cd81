"""Progress within a batch and within a step, the phases named (ARPO_PROGRESS_EVERY_S=0: a line at
every beat): `arpo eval` tells how a batch's generation goes before the batch ends (an eval of 20
questions printed nothing for 54 min), `arpo sft` each micro-batch of a step (one SFT step ran 21.5
min under one line), `arpo train` the loading and each phase of its first step (nothing for 23 min)."""

import json
import os
import subprocess
import sys

from arpo.testing import save_tiny_model

ENV = dict(os.environ, OMP_NUM_THREADS="1", ARPO_PROGRESS_EVERY_S="0")


def _arpo(*argv):
    p = subprocess.run([sys.executable, "-m", "arpo", *map(str, argv)], capture_output=True, text=True, env=ENV,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stderr


def test_eval_lines_within_a_batch(tmp_path):
    err = _arpo("eval", "--model", "tiny-random", "--data", "svamp:test[0:2]", "--max-response-tokens", "6")
    beats = [x for x in err.splitlines() if "batch 1/1: generating," in x]
    assert beats and "answers finished" in beats[0] and "tool calls" in beats[0], err[-2000:]
    assert err.index(beats[0]) < err.index("2/2 (100 %")  # before the batch's answers are counted


def test_sft_lines_within_a_step(tmp_path):
    save_tiny_model(tmp_path / "m")
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1?", "response": f"<answer> \\boxed{{{i + 1}}} </answer>"})
                            + "\n" for i in range(4)))
    err = _arpo("sft", f"model.name={tmp_path / 'm'}", f"data.path=[{data}]", "prompts_per_step=4", "steps=1",
                "micro_tokens=16", f"run.dir={tmp_path / 'run'}", "run.tensorboard=false")
    micro = [x for x in err.splitlines() if x.startswith("sft: step 1/1: forward + backward of micro-batch")]
    assert len(micro) >= 2 and micro[-1].split("micro-batch ")[1].startswith("4/4"), err[-2000:]


def test_train_names_its_phases_before_the_first_step_ends(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "What is 2+2?", "answer": "4", "task": "math"}) + "\n")
    err = _arpo("train", "model.name=tiny-random", f"data.path={data}", "steps=1", "prompts_per_step=1",
                "rollout.group_size=2", "rollout.initial_rollouts=2", "agent.max_response_tokens=6",
                f"run.dir={tmp_path / 'run'}", "run.tensorboard=false", "run.save_every=0")
    lines = err.splitlines()
    want = ["train: loading the model tiny-random", "train: step 1/1: generating the rollouts of 1 prompts × 2",
            "train: step 1/1: rollouts generated", "train: step 1/1: optimizer step done", "train step 1/1"]
    at = [next((i for i, x in enumerate(lines) if x.startswith(w)), None) for w in want]
    assert None not in at and at == sorted(at), (at, err[-3000:])
