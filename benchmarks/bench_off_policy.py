"""Step time of `arpo train`, synchronous vs one step off-policy (rollout.max_off_policy_steps: 0 vs 1),
measured side by side in one process, the runs interleaved (sync, off, sync, off, ...) so that a
shared machine's load falls on both alike.

A random-weight Llama-style model (arpo.testing.save_arch_model; --hidden, --layers), the hf engine,
no tools, toy_reward, `--steps` steps of `--prompts` prompts × `--group` trajectories of up to
`--tokens` tokens. Each run's time is the sum of its steps' `step_seconds` (metrics.jsonl) without
the first step (which has nothing to overlap with); off-policy, a step's time is the wait for the
trees generated during the previous step, the weight sync and the training.

    python benchmarks/bench_off_policy.py [--hidden 256] [--layers 4] [--steps 5] [--repeats 2] [--threads 1]

Prints each run's seconds per step and the ratio sync / off-policy (> 1: off-policy is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from arpo.settings import TrainConfig


def one_run(root: Path, name: str, off: int, a) -> tuple[float, float, float, float]:
    """Seconds per step (steps 2..n) of one training run, and of them: generation (off-policy: the wait
    for the trees in flight, and the weight sync) and training (everything after); and the run's CPU
    seconds per wall second (above 1: its threads ran in parallel)."""
    from arpo.config import load_config
    from arpo.recipes import train

    run_dir = root / name
    over = {"model.name": root / "model", "data.path": root / "q.jsonl", "tools.enabled": "[]",
            "agent.max_response_tokens": a.tokens, "rollout.group_size": a.group, "rollout.initial_rollouts": a.group,
            "reward.fn": "arpo.testing:toy_reward", "steps": a.steps, "prompts_per_step": a.prompts,
            "optim.lr": 1e-4, "run.dir": run_dir, "run.save_every": 0, "run.save_rollouts": 0,
            "run.tensorboard": "false", "run.threads": a.threads, "run.seed": 1, "old_logprobs": "recompute",
            "rollout.max_off_policy_steps": off}
    cpu, wall = time.process_time(), time.perf_counter()
    train.run(load_config(TrainConfig, None, [f"{k}={v}" for k, v in over.items()]), quiet=True)
    share = (time.process_time() - cpu) / (time.perf_counter() - wall)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    step, gen, trn = (statistics.fmean(r[k] for r in rows[1:]) for k in ("step_seconds", "time_generation",
                                                                          "time_training"))
    return step, gen, trn, share


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads (each of the two threads off-policy)")
    a = p.parse_args()
    from arpo.testing import save_arch_model

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save_arch_model(root / "model", "llama", hidden=a.hidden, layers=a.layers)
        (root / "q.jsonl").write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i),
                                                          "task": "math"}) + "\n" for i in range(16)))
        times: dict[str, list[tuple[float, float, float, float]]] = {"sync": [], "off-policy 1": []}
        t0 = time.perf_counter()
        for r in range(a.repeats):
            for name, off in (("sync", 0), ("off-policy 1", 1)):
                times[name].append(one_run(root, f"{name.split()[0]}_{r}", off, a))
                step, gen, trn, share = times[name][-1]
                print(f"repeat {r}: {name:13s} {step:.2f} s/step (generation or wait {gen:.2f}, training {trn:.2f}; "
                      f"CPU/wall {share:.2f})", flush=True)
    s, o = (statistics.fmean(t[0] for t in times[k]) for k in ("sync", "off-policy 1"))
    print(f"model hidden={a.hidden} layers={a.layers}, {a.prompts} prompts x {a.group} x <= {a.tokens} tokens, "
          f"{a.steps} steps x {a.repeats} repeats, torch threads {a.threads}; {time.perf_counter() - t0:.0f} s in all")
    print(f"sync {s:.2f} s/step, off-policy 1 {o:.2f} s/step, ratio sync/off = {s / o:.2f}")


if __name__ == "__main__":
    main()
