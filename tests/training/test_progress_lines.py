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


def _arpo(*argv, env=ENV):
    p = subprocess.run([sys.executable, "-m", "arpo", *map(str, argv)], capture_output=True, text=True, env=env,
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


def _generating(err: str) -> list[tuple[int, int, int]]:
    """(finished, of, tool calls) of each "train: step 1/1: generating, ..." line."""
    got = []
    for x in err.splitlines():
        if x.startswith("train: step 1/1: generating, "):
            done, rest = x.split("generating, ")[1].split(" trajectories finished, ")
            got.append((*map(int, done.split("/")), int(rest.split(" tool calls")[0])))
    return got


def test_train_lines_within_the_generation(tmp_path):
    """A step's generation tells how it goes while it runs (a step printed nothing until it ended): with
    initial_rollouts=2 of group_size=4 the two fill-up samples start once the first two finished, so the
    finished count climbs 0 → 2 → 4 before "rollouts generated"; then each micro-batch of the backward;
    --quiet prints none of it."""
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "What is 2+2?", "answer": "4", "task": "math"}) + "\n")
    argv = ["train", "model.name=tiny-random", f"data.path={data}", "steps=1", "prompts_per_step=1",
            "rollout.group_size=4", "rollout.initial_rollouts=2", "agent.max_response_tokens=5",
            "run.tensorboard=false", "run.save_every=0", "micro_tokens=16"]
    err = _arpo(*argv, f"run.dir={tmp_path / 'run'}")
    beats = _generating(err)
    assert beats, err[-3000:]
    done = [d for d, _, _ in beats]
    assert done == sorted(done) and done[0] < done[-1] == 4 and 2 in done, beats
    assert {n for _, n, _ in beats} == {4} and all(c == 0 for _, _, c in beats), beats  # no tool calls: math
    lines = err.splitlines()
    last = max(i for i, x in enumerate(lines) if x.startswith("train: step 1/1: generating, "))
    assert last < next(i for i, x in enumerate(lines) if x.startswith("train: step 1/1: rollouts generated"))
    # the policy update's backward, micro-batch by micro-batch (a 285 s backward said nothing)
    micro = [x for x in lines if x.startswith("train: step 1/1: forward + backward of micro-batch")]
    done, of = micro[-1].split("micro-batch ")[1].split()[0].split("/") if micro else ("", "")
    assert len(micro) >= 2 and done == of, micro
    assert not _generating(_arpo(*argv, f"run.dir={tmp_path / 'quiet'}", "--quiet"))


def test_generation_lines_count_a_branch_inherited_calls_once():
    """The tool calls said within the generation are those the rollout ran: a branch forked after its
    parent's first call inherits it (as tool_calls_issued counts); later calls of either count."""
    import io

    from arpo.rollout.agent import ToolCallRecord
    from arpo.rollout.arpo import _Traj
    from arpo.training.progress import Heartbeat, generation_beat

    out = io.StringIO()
    on_generate = generation_beat(Heartbeat("train", every_s=0, stream=out), 3, 4)
    call = ToolCallRecord("search", "q", "r", True, 0.1)
    states = {0: _Traj(seg_start=5, calls=[call])}
    on_generate(1, 1, states)
    states[1] = _Traj(seg_start=9, calls=[call], parent_sid=0)  # forked after call 1: inherits it
    on_generate(1, 1, states)
    states[1].calls.append(call)
    states[0].finish_reason = "eos"
    on_generate(1, 1, states)
    lines = [x.split(" (elapsed")[0] for x in out.getvalue().splitlines()]
    assert lines == ["train: step 2/3: generating, 0/4 trajectories finished, 1 tool calls",
                     "train: step 2/3: generating, 0/4 trajectories finished, 1 tool calls",
                     "train: step 2/3: generating, 1/4 trajectories finished, 2 tool calls"], lines


def test_sft_step_of_one_micro_batch_says_it_runs(tmp_path):
    """An SFT step of a single micro-batch printed nothing inside it (its one line came when the micro-batch
    ended; a 130 s step was silent): while a micro-batch runs, a line every ARPO_PROGRESS_EVERY_S on a
    timer; --quiet prints none."""
    save_tiny_model(tmp_path / "m")
    data = tmp_path / "sft.jsonl"
    long = " ".join(f"w{i}" for i in range(300))  # a micro-batch of some hundred ms on the tiny model
    data.write_text("".join(json.dumps({"question": f"{i}+1? {long}", "response": f"{long} <answer> {i + 1} </answer>"})
                            + "\n" for i in range(2)))
    argv = ["sft", f"model.name={tmp_path / 'm'}", f"data.path=[{data}]", "prompts_per_step=2", "steps=1",
            "micro_tokens=100000", "data.max_seq_len=100000", "run.tensorboard=false"]
    env = dict(ENV, ARPO_PROGRESS_EVERY_S="0.01")
    err = _arpo(*argv, f"run.dir={tmp_path / 'run'}", env=env)
    lines = err.splitlines()
    running = [x for x in lines if x.startswith("sft: step 1/1: forward + backward of micro-batch 1/1 running for ")]
    assert running, err[-3000:]
    done = next(i for i, x in enumerate(lines) if x.startswith("sft: step 1/1: forward + backward of micro-batch 1/1 "
                                                               "done"))
    assert lines.index(running[-1]) < done  # while it ran, not after
    quiet = _arpo(*argv, f"run.dir={tmp_path / 'quiet'}", "--quiet", env=env)
    assert "micro-batch" not in quiet, quiet[-2000:]


def test_train_says_each_phase_once_per_step(tmp_path):
    """"rollouts generated; scoring them" was printed twice per on-policy step (a second lap of the
    generation after the rewards were computed); each phase line is said once per step, in order."""
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "What is 2+2?", "answer": "4", "task": "math"}) + "\n")
    err = _arpo("train", "model.name=tiny-random", f"data.path={data}", "steps=2", "prompts_per_step=1",
                "rollout.group_size=2", "rollout.initial_rollouts=2", "agent.max_response_tokens=4",
                f"run.dir={tmp_path / 'run'}", "run.tensorboard=false", "run.save_every=0")
    from arpo.training.progress import NEXT_PHASE

    for k in (1, 2):
        said = [x.split(": ", 2)[2].split(" (elapsed")[0] for x in err.splitlines()
                if x.startswith(f"train: step {k}/2: ") and "micro-batch" not in x and "generating" not in x]
        assert said == list(NEXT_PHASE.values()), (k, said, err[-3000:])


def test_ticking_fills_the_silences_of_a_micro_batch():
    """Heartbeat.ticking: a line every `every_s` while a micro-batch runs and this heartbeat said nothing,
    none between micro-batches, none when disabled; each line whole (one write)."""
    import io
    import time

    from arpo.training.progress import Heartbeat, MicroBatches

    out = io.StringIO()
    beat = Heartbeat("sft", every_s=0.02, stream=out)
    micro = MicroBatches(beat, lambda: "step 1/1")
    with beat.ticking(micro.running):
        time.sleep(0.1)  # no micro-batch yet: nothing to say
        assert out.getvalue() == ""
        micro(0, 1)
        time.sleep(0.2)
        micro(1, 1)
        n = len(out.getvalue().splitlines())
        time.sleep(0.1)  # after the last one: nothing
    lines = out.getvalue().splitlines()
    assert len(lines) == n and n >= 3, lines
    assert all(x.startswith("sft: step 1/1: forward + backward of micro-batch 1/1 running for ") for x in lines[:-1])
    assert lines[-1].startswith("sft: step 1/1: forward + backward of micro-batch 1/1 done (elapsed"), lines
    off = Heartbeat("sft", enabled=False, every_s=0.01, stream=out)
    with off.ticking(lambda: "x"):
        time.sleep(0.05)
    assert out.getvalue().splitlines() == lines
