"""`arpo train`: ARPO reinforcement learning (or a baseline preset) with real tools."""

from __future__ import annotations

import argparse
import json

EXAMPLES = """examples:
  arpo train --config configs/train_gsm8k.yaml
  arpo train --config configs/train_gsm8k.yaml algo.preset=grpo run.dir=runs/grpo   # the paper's baseline
  arpo train --config configs/train_gsm8k.yaml algo.attribution=hard optim.lr=2e-6
  arpo train --config configs/train_gsm8k.yaml --resume          # continue exactly after a crash
  torchrun --nproc-per-node 2 -m arpo train --config ...         # data-parallel (docs/scaling.md)

Sections: model, data, tools, agent, rollout (branching: group_size M, initial_rollouts N,
entropy_weight, branch_threshold, ...), algo (preset + loss overrides), reward, optim, lora, run,
validation. Under torchrun, run.distributed=fsdp (default: sharded) | ddp (replicated) picks how
ranks share the model. An unknown or ill-typed key is an error naming it. RUN_DIR (run.dir) gets config.yaml,
metrics.jsonl, tensorboard/, errors.log and checkpoints/ (`arpo plot RUN_DIR` draws the metrics)."""


def register(sub) -> None:
    p = sub.add_parser("train", help="ARPO RL training: rollout trees, rewards, advantages, PPO updates",
                       description="Train a tool-using agent with ARPO (spec §2-§5) or a baseline preset.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML config")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR's latest checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a run dir that already has checkpoints (deletes them and its metrics)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.group_size=8 algo.preset=grpo")
    p.set_defaults(func=run)


def run(args) -> int:
    from arpo.config import load_config
    from arpo.recipes import train
    from arpo.training import distributed

    cfg = load_config(train.TrainConfig, args.config, list(args.overrides))
    try:
        out = train.run(cfg, resume=args.resume, quiet=args.quiet, overwrite=args.overwrite)
        if distributed.is_main():  # under torchrun: one summary, from rank 0
            print(json.dumps(out, default=str))
    finally:
        distributed.shutdown()
    return 0
