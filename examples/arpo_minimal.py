"""ARPO in one file: a training step written out top to bottom (CleanRL style).

Each numbered line of `arpo_step` is one stage of the data flow

    dataset → rollout trees → rewards → advantages → old log-probs → clipped surrogate → AdamW

and calls the same library function `arpo train` calls for it, so this file is the map of the
library: `tests/examples/test_arpo_minimal.py` checks that `arpo_step` leaves the policy with the
weights one `training.trainer.train_step` gives (one process, one PPO epoch, one mini-batch; what
`train_step` adds is bookkeeping: metrics, timing, several ranks, dynamic sampling, mini-batches).

    python examples/arpo_minimal.py --steps 3      # the embedded SmolLM2-135M on SVAMP with the python tool

The untrained 135M model rarely calls the tool (cold-start SFT first: ./quickstart.sh); any run's
model works: --model runs/quickstart/sft.
"""

from __future__ import annotations

import argparse

import torch

from arpo.algos.presets import get_preset
from arpo.data.datasets import load_examples
from arpo.data.order import round_indices
from arpo.data.prompts import prompts_for
from arpo.engine.hf import HFEngine
from arpo.models import load_model
from arpo.rewards import arpo_reward, score_trees
from arpo.rollout.arpo import ARPORollout
from arpo.settings import AgentConfig, OptimConfig, RolloutConfig
from arpo.tools import build_tools
from arpo.training.batch import loss_and_backward, token_logprobs
from arpo.training.optim import build_optimizer, build_scheduler, clip_gradients
from arpo.training.step_batch import build_batch, make_loss_fn


def arpo_step(policy, tok, rollout, tools, examples, preset, opt, sched, *, step: int, seed: int = 0,
              prompts_per_step: int = 2, reward_fn=arpo_reward, grad_clip: float = 1.0, temperature: float = 1.0):
    """One ARPO step on `prompts_per_step` examples; returns (trees, loss, diagnostics)."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    lp_kw = dict(packed=True, max_tokens=4096, temperature=temperature, pad_id=pad)
    # 1. the step's questions: a pure function of (seed, step)
    picked = [examples[i] for i in round_indices(len(examples), prompts_per_step, seed, step, 0, set())]
    prompts = prompts_for(picked, tok, tools, None)
    # 2. rollout trees: N global samples per question; after a tool result whose entropy rose
    #    (P = α + β·ΔH > τ) a partial rollout branches, until M trajectories exist (spec §2)
    policy.eval()
    trees = rollout.run(prompts, prompt_ids=[ex["id"] for ex in picked], seed=seed * 100_003 + step)
    for tree, ex in zip(trees, picked, strict=True):
        tree.example = ex
    # 3. a reward per trajectory: format, answer, multi-tool bonus (spec §5)
    score_trees(trees, reward_fn, "math_equal", tools.names)
    # 4. advantages normalized within each tree, soft or hard attribution over shared prefixes (spec §3);
    #    the loss mask leaves tool results out
    batch = build_batch(trees, preset)
    # 5. π_old's log-probs: one tree-packed forward, each shared prefix computed once
    batch.old_logp, old_ent = token_logprobs(policy, batch, with_entropy=True, **lp_kw)
    # 6. the clipped surrogate (spec §4), its backward, gradient clipping and the AdamW step
    policy.train()
    loss, diag = loss_and_backward(policy, batch, make_loss_fn(batch, preset), need_entropy=True,
                                   current=(batch.old_logp, old_ent), **lp_kw)
    clip_gradients(policy, grad_clip)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return trees, float(loss), diag


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a built-in name, HF model dir or run dir")
    ap.add_argument("--data", default="svamp:train[0:64]", help="a data spec (`arpo data list`)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    policy, tok = load_model(args.model)
    examples = load_examples(args.data)
    tools = build_tools(["python"])
    agent = AgentConfig(max_response_tokens=96, temperature=1.0)
    preset = get_preset("arpo")
    rollout = ARPORollout(HFEngine(policy, tok), tools, agent,
                          RolloutConfig(group_size=8, initial_rollouts=4))  # M = 8 trajectories, N = 4 global
    optim = OptimConfig(lr=3e-5)
    opt = build_optimizer(policy, optim)
    sched = build_scheduler(opt, optim, args.steps)
    try:
        for step in range(args.steps):
            trees, loss, diag = arpo_step(policy, tok, rollout, tools, examples, preset, opt, sched,
                                          step=step, seed=args.seed, grad_clip=optim.grad_clip)
            rewards = [t.reward for tree in trees for t in tree.trajectories]
            branches = sum(len(tree.trajectories) for tree in trees) - len(trees) * rollout.cfg.initial_rollouts
            print(f"step {step}: {len(rewards)} trajectories, mean reward {sum(rewards) / len(rewards):+.3f}, "
                  f"{max(branches, 0)} from branches, loss {loss:.4f}")
    finally:
        tools.close()


if __name__ == "__main__":
    main()
