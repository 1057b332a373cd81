"""`arpo train`: ARPO reinforcement learning (or a baseline preset) with real tools."""

from __future__ import annotations

from arpo.commands import HELP

EXAMPLES = """examples:
  arpo train --config configs/train_gsm8k.yaml
  arpo train --config configs/train_gsm8k.yaml algo.preset=grpo run.dir=runs/grpo   # the paper's baseline
  arpo train --config configs/train_gsm8k.yaml algo.attribution=hard optim.lr=2e-6
  arpo train --config configs/train_gsm8k.yaml --resume          # continue exactly after a crash
  torchrun --nproc-per-node 2 -m arpo train --config ...         # data-parallel (docs/scaling.md)

Sections: model, data, tools, agent, rollout (branching: group_size M, initial_rollouts N,
entropy_weight, branch_threshold, ...), algo (preset + loss overrides), reward, optim, lora, run,
validation. Under torchrun, run.distributed=fsdp (default: sharded) | hsdp (sharded per node,
replicated across nodes) | ddp (replicated) picks how ranks share the model; --print-config ends with the
memory per GPU (memory.*). An unknown or ill-typed key is an error naming it. RUN_DIR (run.dir) gets config.yaml,
metrics.jsonl, tensorboard/, errors.log and checkpoints/ (`arpo plot RUN_DIR` draws the metrics).
One process writes a run dir at a time (RUN_DIR/.lock); Ctrl-C / SIGTERM stop after the current
step with a checkpoint and print the command that resumes (exit code 130 / 143)."""


def register(sub) -> None:
    from arpo.commands.recipe_flags import add_common

    p = sub.add_parser("train", help="ARPO RL training: rollout trees, rewards, advantages, PPO updates",
                       description="Train a tool-using agent with ARPO (spec §2-§5) or a baseline preset.",
                       epilog=EXAMPLES, formatter_class=HELP)
    add_common(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from arpo.commands.recipe_flags import finish, print_config
    from arpo.config import load_config
    from arpo.recipes import train
    from arpo.settings import TrainConfig
    from arpo.training import distributed

    cfg = load_config(TrainConfig, args.config, list(args.overrides))
    if args.print_config:
        return print_config(cfg, as_json=args.json)
    try:
        out = train.run(cfg, resume=args.resume, quiet=args.quiet, overwrite=args.overwrite,
                        allow_pickle=args.trust_pickled_checkpoint)
        code = finish("train", out, args.json) if distributed.is_main() else 0  # under torchrun: rank 0 prints
    finally:
        distributed.shutdown()
    return code
