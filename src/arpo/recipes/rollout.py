"""Rollout recipe: dataset -> ARPO rollout trees -> one JSON line per trajectory.

    arpo rollout --config configs/rollout_gsm8k.yaml --limit 4 --out rollouts.jsonl

The dump is the project's main debugging and analysis artifact (format: RolloutTree.to_records, plus
`tokens`: each response token's text piece); `arpo view rollouts.jsonl` shows its trees.
Lines are flushed after every batch of prompts, so a crash loses at most the batch in flight.
"""

from __future__ import annotations

import json
import time

import arpo.models
from arpo.data.datasets import load_examples
from arpo.data.prompts import prompts_for
from arpo.eval.judge_reward import reward_from_spec
from arpo.rewards import score_trees
from arpo.rewards.budget import RewardShaping
from arpo.rewards.custom import check_reward
from arpo.settings import RolloutJobConfig
from arpo.tools import tools_from_config
from arpo.training.progress import Bar
from arpo.training.rollout_log import token_texts


def run(cfg: RolloutJobConfig, out_path: str, quiet: bool = False) -> dict:
    from arpo.engine.hf import HFEngine  # noqa: PLC0415 - loads torch; kept out of this light module's import
    from arpo.rollout.arpo import ARPORollout  # noqa: PLC0415 - loads torch; kept out of this light module's import

    reward_fn = reward_from_spec(cfg.reward.fn, **cfg.reward.options())
    examples = load_examples(cfg.data.path, cfg.data.limit, cfg.data.task)

    check_reward(reward_fn, examples, cfg.reward.math_scorer, cfg.reward.fn)  # before the model loads
    tools = tools_from_config(cfg.tools)
    model, tok = arpo.models.load_model(cfg.model.name, cfg.model.device, cfg.model.dtype)
    ro = ARPORollout(HFEngine(model, tok), tools, cfg.agent, cfg.rollout)
    stats = {"prompts": 0, "trajectories": 0, "branches": 0, "tool_calls": 0, "reward_sum": 0.0, "seconds": 0.0}
    t0 = time.perf_counter()
    with open(out_path, "w") as f, Bar(enabled=not quiet) as bar:
        task = bar.add_task("rollout", total=len(examples))
        for b in range(0, len(examples), cfg.prompts_per_batch):
            batch = examples[b : b + cfg.prompts_per_batch]
            prompts = prompts_for(batch, tok, tools, cfg.data.template, cfg.agent.tool_format)
            trees = ro.run(prompts, prompt_ids=[ex["id"] for ex in batch], seed=cfg.rollout.seed + b, examples=batch)
            for tree, ex in zip(trees, batch, strict=True):
                tree.example = ex
            score_trees(trees, reward_fn, cfg.reward.math_scorer, tools.names,
                        RewardShaping.of(cfg.reward, cfg.agent.max_response_tokens))
            for tree in trees:
                for rec in tree.to_records():
                    rec["tokens"] = token_texts(tok, rec["response_token_ids"])  # per-token text, for `arpo view`
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    stats["trajectories"] += 1
                    stats["branches"] += rec["parent_id"] is not None
                    stats["tool_calls"] += len(rec["tool_calls"])
                    stats["reward_sum"] += rec.get("reward", 0.0)
            f.flush()
            stats["prompts"] += len(batch)
            bar.advance(task, len(batch))
    tools.close()
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    stats["reward_mean"] = round(stats.pop("reward_sum") / max(1, stats["trajectories"]), 4)
    return stats
