"""`arpo rollout`: sample ARPO rollout trees and dump them as JSONL."""

from __future__ import annotations

import json

from arpo.commands import HELP

EXAMPLES = """examples:
  arpo rollout --config configs/rollout_gsm8k.yaml --limit 2 --out rollouts.jsonl
  arpo rollout --config configs/rollout_hotpotqa.yaml --limit 2 --out hp.jsonl rollout.group_size=8
  arpo rollout --out grpo.jsonl rollout.initial_rollouts=16      # GRPO: N = M, no branching

Each output line is one trajectory: prompt_id, reward (spec §5), correct, answer, format_error, traj_id, parent_id, \
branch_token_index,
response_token_ids, loss_mask, text, tool_calls, initial_entropy, step_entropies,
branch_decisions, finish_reason."""


def register(sub) -> None:
    from arpo.commands.recipe_flags import add_common

    p = sub.add_parser("rollout", help="sample ARPO rollout trees for prompts and dump them (JSONL)",
                       description="Sample entropy-branching ARPO rollout trees (spec §2) and write one JSON "
                       "line per trajectory.", epilog=EXAMPLES, formatter_class=HELP)
    p.add_argument("--data", help="data file (overrides data.path)")
    p.add_argument("--limit", type=int, help="number of prompts (overrides data.limit)")
    p.add_argument("--out", help="output JSONL path (required unless --print-config)")
    add_common(p, run_dir=False)
    p.set_defaults(func=run)


def run(args) -> int:
    from arpo.config import load_config
    from arpo.recipes import rollout
    from arpo.settings import RolloutJobConfig

    ov = list(args.overrides)
    if args.data:
        ov.append(f"data.path={args.data}")
    if args.limit is not None:
        ov.append(f"data.limit={args.limit}")
    cfg = load_config(RolloutJobConfig, args.config, ov)
    if args.print_config:
        from arpo.commands.recipe_flags import print_config

        return print_config(cfg)
    from arpo.data.sources import input_paths
    from arpo.errors import ArpoError
    from arpo.jsonl import prepare_output

    if not args.out:
        raise ArpoError("--out is required (the JSONL file the trajectories go to)")
    prepare_output(args.out, inputs=input_paths([cfg.data.path]))
    stats = rollout.run(cfg, args.out, quiet=args.quiet)
    print(json.dumps(stats))
    return 0
