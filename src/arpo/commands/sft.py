"""`arpo sft`: cold-start supervised fine-tuning on tool-use trajectories (spec §6)."""

from __future__ import annotations

from arpo.commands import HELP

EXAMPLES = """examples:
  arpo sft-data gsm8k --data gsm8k:train --limit 500 --out sft_gsm8k.jsonl   # real trajectories, real tool outputs
  arpo sft-data hotpotqa --data hotpotqa:train --out sft_hotpotqa.jsonl
  arpo sft data.path=[sft_gsm8k.jsonl,sft_hotpotqa.jsonl] steps=20 run.dir=runs/sft
  arpo sft data.path=[sft_gsm8k.jsonl,sft_hotpotqa.jsonl] steps=40 run.dir=runs/sft --resume  # extend it
  arpo sft --config configs/sft_quickstart.yaml               # the quick start's (after its sft-data step)

steps and prompts_per_step are `arpo train`'s names (the old max_steps and batch_size still work, with
a warning). RUN_DIR gets metrics.jsonl, tensorboard/, config.yaml and checkpoints/step_N/model (a Hugging Face
directory: pass it to `arpo chat --model`, `arpo eval --model` or as model.name of `arpo train`)."""


def register(sub) -> None:
    from arpo.commands.recipe_flags import add_common

    p = sub.add_parser("sft", help="cold-start SFT on tool-use trajectories (result tokens masked)",
                       description="Fine-tune a causal LM on agent-protocol trajectories; tool results and the "
                       "prompt are masked out of the loss.", epilog=EXAMPLES,
                       formatter_class=HELP)
    add_common(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from arpo.commands.recipe_flags import finish, print_config
    from arpo.config import load_config
    from arpo.recipes import sft
    from arpo.settings import SFTConfig

    cfg = load_config(SFTConfig, args.config, list(args.overrides))
    if args.print_config:
        return print_config(cfg, as_json=args.json)
    return finish("sft", sft.run(cfg, resume=args.resume, quiet=args.quiet, overwrite=args.overwrite,
                                   allow_pickle=args.trust_pickled_checkpoint), args.json)
