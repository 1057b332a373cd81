"""`arpo sft`: cold-start supervised fine-tuning on tool-use trajectories (spec §6)."""

from __future__ import annotations

import argparse
import json

EXAMPLES = """examples:
  arpo sft-data gsm8k --limit 500 --out sft_gsm8k.jsonl        # real trajectories, real tool outputs
  arpo sft --config configs/sft_quickstart.yaml
  arpo sft data.paths=[sft_gsm8k.jsonl,sft_hotpotqa.jsonl] max_steps=20 run.dir=runs/sft
  arpo sft --config configs/sft_quickstart.yaml --resume       # continue after a crash, exactly

RUN_DIR gets metrics.jsonl, tensorboard/, config.yaml and checkpoints/step_N/model (a Hugging Face
directory: pass it to `arpo chat --model`, `arpo eval --model` or as model.name of `arpo train`)."""


def register(sub) -> None:
    p = sub.add_parser("sft", help="cold-start SFT on tool-use trajectories (result tokens masked)",
                       description="Fine-tune a causal LM on agent-protocol trajectories; tool results and the "
                       "prompt are masked out of the loss.", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML config (sections: model, data, optim, lora, run)")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR's latest checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a run dir that already has checkpoints (deletes them and its metrics)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. optim.lr=1e-5 batch_size=4")
    p.set_defaults(func=run)


def run(args) -> int:
    from arpo.config import load_config
    from arpo.recipes import sft

    cfg = load_config(sft.SFTConfig, args.config, list(args.overrides))
    print(json.dumps(sft.run(cfg, resume=args.resume, quiet=args.quiet, overwrite=args.overwrite)))
    return 0
