"""ARPO RL recipe: the whole training loop of the paper, in one readable file.

    arpo train --config configs/train_gsm8k.yaml [key=value ...] [--resume]

One step (data flows one way):

    prompts ─► ARPO rollout trees (engine + tools, entropy branching, spec §2)
            ─► rewards per trajectory (spec §5)
            ─► group-normalized advantages, soft or hard attribution (spec §3)
            ─► old log-probs (tree-packed: shared prefixes computed once)
            ─► PPO epochs over mini-batches of trees: clipped surrogate (spec §4) → AdamW
            ─► metrics.jsonl / tensorboard, validation, atomic checkpoint

Determinism: the prompts of step s, the rollout seeds and the mini-batch order are pure functions
of (run.seed, s), and checkpoints hold model, optimizer, scheduler and RNG states, so `--resume`
continues a run exactly (tests/training/test_resume.py kills a run with SIGKILL and checks).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from arpo.errors import ArpoError
from arpo.recipes.common import DataConfig, LoraConfig, ModelConfig, OptimConfig, RewardConfig, RunConfig, ToolsConfig
from arpo.rollout.agent import AgentConfig
from arpo.rollout.arpo import RolloutConfig


@dataclass
class AlgoConfig:
    """An algorithm preset (algos/presets.py) and optional overrides of its loss/advantage fields."""

    preset: str = "arpo"  # arpo | grpo | dapo | reinforce_pp | dr_grpo | gspo | aepo
    advantage_estimator: str | None = None
    attribution: str | None = None  # soft | hard
    loss_type: str | None = None
    loss_agg: str | None = None
    clip_low: float | None = None
    clip_high: float | None = None
    dual_clip: float | None = None  # 0 disables
    kl_coef: float | None = None
    kl_type: str | None = None
    entropy_coef: float | None = None
    ppo_epochs: int | None = None

    def resolve(self, rollout: RolloutConfig):
        from arpo.algos.presets import get_preset

        p = get_preset(self.preset)
        over = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "preset" and getattr(self, f.name) is not None}
        if over.get("dual_clip") == 0:
            over["dual_clip"] = None
        over.update(group_size=rollout.group_size, initial_rollouts=rollout.initial_rollouts)
        if not p.branching:
            over["initial_rollouts"] = rollout.group_size
        try:
            return dataclasses.replace(p, **over)
        except ArpoError as e:
            raise ArpoError(f"algo: {e}") from e


@dataclass
class ValidationConfig:
    path: str | None = None  # held-out data; None disables validation
    limit: int = 16
    every: int = 10  # steps
    samples: int = 1
    temperature: float = 0.0  # 0: greedy


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    run: RunConfig = field(default_factory=lambda: RunConfig(dir="runs/train"))
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    steps: int = 10
    prompts_per_step: int = 4
    minibatches: int = 1  # optimizer steps per PPO epoch (trees split evenly)
    packed: bool = True  # tree-packed log-probs/backward (False: flat per-trajectory)
    micro_tokens: int = 4096  # model tokens per forward/backward micro-batch

    def validate(self) -> None:
        self.optim.validate()
        self.tools.validate()
        self.rollout.validate()
        if self.steps < 1 or self.prompts_per_step < 1:
            raise ArpoError("steps and prompts_per_step must be >= 1")
        if not 1 <= self.minibatches <= self.prompts_per_step:
            raise ArpoError(f"minibatches must be in [1, prompts_per_step={self.prompts_per_step}]")


# ------------------------------------------------------------------------------------------------
# The pieces of one step
# ------------------------------------------------------------------------------------------------


def score_trees(trees, reward_fn, math_scorer: str) -> None:
    """Attach a RewardResult to every trajectory (TreeTrajectory.reward = its scalar)."""
    for tree in trees:
        for t in tree.trajectories:
            calls = [{"tool": c.tool, "ok": c.ok} for c in t.traj.tool_calls]
            res = reward_fn(t.traj.text, tree.example, tool_calls=calls, math_scorer=math_scorer)
            t.reward = float(res.reward)
            t.result = res


def tree_advantages(tree, preset) -> list[torch.Tensor]:
    """Per-token advantages of each trajectory of one tree (spec §3)."""
    from arpo.algos.advantages import compute_advantages, hard_attribution, soft_attribution

    rewards = torch.tensor([t.reward for t in tree.trajectories], dtype=torch.float32)
    adv = compute_advantages(preset.advantage_estimator, rewards, [0] * len(rewards))
    lengths = [len(t.traj.response_ids) for t in tree.trajectories]
    if preset.attribution == "hard":
        return hard_attribution(adv, tree.parents, tree.branch_at, lengths)
    return soft_attribution(adv, lengths)


def rollout_metrics(trees) -> dict:
    trajs = [t for tree in trees for t in tree.trajectories]
    rewards = [t.reward for t in trajs]
    calls = [c for t in trajs for c in t.traj.tool_calls]
    post = [h for t in trajs for h in t.step_entropies]
    init = [t.initial_entropy for t in trajs if t.initial_entropy is not None]
    m = {
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "accuracy": statistics.fmean(float(t.result.correct) for t in trajs),
        "format_error_rate": statistics.fmean(float(not t.result.format_ok) for t in trajs),
        "tool_calls_per_traj": len(calls) / len(trajs),
        "tool_failures": sum(not c.ok for c in calls),
        "branches": sum(t.parent_id is not None for t in trajs),
        "trajectories": len(trajs),
        "initial_entropy": statistics.fmean(init) if init else 0.0,
        "post_tool_entropy": statistics.fmean(post) if post else 0.0,
        "response_length": statistics.fmean(t.traj.n_generated_tokens for t in trajs),
        "tool_seconds": sum(c.elapsed_s for c in calls),
    }
    for tool in sorted({c.tool for c in calls}):
        m[f"tool_calls_per_traj/{tool}"] = sum(c.tool == tool for c in calls) / len(trajs)
    return m


def rollout_step(ro, prompts, examples, seed: int, log_error) -> list:
    """Roll out all prompts together; if that raises, retry one prompt at a time and drop (and log)
    the groups that still fail, so one bad rollout never kills the run."""
    ids = [ex["id"] for ex in examples]
    try:
        trees = ro.run(prompts, prompt_ids=ids, seed=seed)
    except Exception:
        trees = []
        for k, (p, ex) in enumerate(zip(prompts, examples)):
            try:
                trees += ro.run([p], prompt_ids=[ex["id"]], seed=seed + 7919 * (k + 1))
            except Exception as e:  # contained: logged, group dropped
                log_error(f"rollout of prompt {ex['id']} failed, group dropped: {type(e).__name__}: {e}\n"
                          + traceback.format_exc())
    by_id = {ex["id"]: ex for ex in examples}
    for tr in trees:
        tr.example = by_id.get(tr.prompt_id)
    return trees


def build_batch(trees, preset):
    from arpo.training.batch import TreeBatch

    layouts = [tr.to_training() for tr in trees]
    batch = TreeBatch.from_trees([t for t, _ in layouts], [m for _, m in layouts])
    adv = torch.zeros(batch.mask.shape)
    for ti, tr in enumerate(trees):
        for i, a in enumerate(tree_advantages(tr, preset)):
            adv[batch.rows[(ti, i)], : len(a)] = a
    batch.advantages = adv
    return batch


def make_loss_fn(batch, preset):
    from arpo.algos.losses import policy_loss

    def fn(logp, ent):
        return policy_loss(
            logp, batch.old_logp, batch.advantages, batch.mask, loss_type=preset.loss_type, agg=preset.loss_agg,
            agg_normalizer=preset.agg_normalizer, clip_low=preset.clip_low, clip_high=preset.clip_high,
            dual_clip=preset.dual_clip, ref_logp=batch.ref_logp, kl_coef=preset.kl_coef, kl_type=preset.kl_type,
            entropy=ent, entropy_coef=preset.entropy_coef,
        )

    return fn


def minibatch_order(n_trees: int, minibatches: int, seed: int, step: int, epoch: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed * 7_000_003 + step * 131 + epoch)
    order = torch.randperm(n_trees, generator=g).tolist()
    return [order[k::minibatches] for k in range(minibatches) if order[k::minibatches]]


# ------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------


def run(cfg: TrainConfig, resume: bool = False, quiet: bool = False) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from arpo.algos.advantages import entropy_aware_advantage
    from arpo.config import save_config
    from arpo.data.datasets import load_examples
    from arpo.engine.hf import HFEngine
    from arpo.models import load_model
    from arpo.recipes.rollout import prompts_for
    from arpo.recipes.sft import batch_indices
    from arpo.rewards import get_reward_fn
    from arpo.rollout.arpo import ARPORollout
    from arpo.training.batch import loss_and_backward, token_logprobs
    from arpo.training.checkpoint import latest_checkpoint, load_trainer_state, resume_from, save_checkpoint
    from arpo.training.logger import MetricsLogger
    from arpo.training.optim import build_optimizer, build_scheduler, clip_gradients, load_policy

    cfg.validate()
    preset = cfg.algo.resolve(cfg.rollout)
    rollout_cfg = dataclasses.replace(cfg.rollout, initial_rollouts=preset.initial_rollouts)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    run_dir = Path(cfg.run.dir)
    ckpt = resume_from(run_dir, resume)
    reward_fn = get_reward_fn(cfg.reward.fn)
    examples = load_examples(cfg.data.path, cfg.data.limit, cfg.data.task)
    torch.manual_seed(cfg.run.seed)
    model, tok = load_policy(cfg.model, cfg.lora, ckpt)
    # π_ref is the starting policy (also on resume, where `model` holds the checkpoint's weights)
    ref_model = load_model(cfg.model.name, cfg.model.device, cfg.model.dtype)[0].eval() if preset.kl_coef else None
    opt = build_optimizer(model, cfg.optim)
    n_updates = cfg.steps * cfg.minibatches * preset.ppo_epochs
    sched = build_scheduler(opt, cfg.optim, n_updates)
    start = load_trainer_state(ckpt, opt, sched)["step"] if ckpt is not None else 0
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    log = MetricsLogger(run_dir, resume_step=start if ckpt is not None else None, tensorboard=cfg.run.tensorboard)
    errors_path = run_dir / "errors.log"

    def log_error(msg: str) -> None:
        with open(errors_path, "a") as f:
            f.write(msg + "\n")

    tools = cfg.tools.build()
    engine = HFEngine(model, tok)
    ro = ARPORollout(engine, tools, cfg.agent, rollout_cfg)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    temp = cfg.agent.temperature if cfg.agent.temperature > 0 else 1.0
    lp_kw = dict(packed=cfg.packed, max_tokens=cfg.micro_tokens, temperature=temp, pad_id=pad)
    val_examples = (load_examples(cfg.validation.path, cfg.validation.limit, cfg.data.task)
                    if cfg.validation.path else [])
    last: dict = {}
    cols = [TextColumn("train"), BarColumn(), TextColumn("{task.completed}/{task.total} {task.fields[info]}"),
            TimeRemainingColumn()]
    try:
        with Progress(*cols, disable=quiet) as bar:
            task = bar.add_task("train", total=cfg.steps, completed=start, info="")
            for step in range(start, cfg.steps):
                t0 = time.perf_counter()
                batch_ex = [examples[i] for i in batch_indices(len(examples), cfg.prompts_per_step, cfg.run.seed, step)]
                prompts = prompts_for(batch_ex, tok, cfg.tools.enabled, cfg.data.template)
                model.eval()
                trees = rollout_step(ro, prompts, batch_ex, cfg.run.seed * 100_003 + step, log_error)
                t_gen = time.perf_counter() - t0
                if not trees:
                    log.log(step + 1, {"skipped": 1, "reason": "every rollout failed"})
                    continue
                score_trees(trees, reward_fn, cfg.reward.math_scorer)
                metrics = rollout_metrics(trees)
                if preset.dynamic_sampling:  # DAPO: groups whose rewards are all equal carry no signal
                    kept = [tr for tr in trees if len({t.reward for t in tr.trajectories}) > 1]
                    metrics["groups_dropped"] = len(trees) - len(kept)
                    trees = kept
                t1 = time.perf_counter()
                train_m: dict = {}
                if trees:
                    batch = build_batch(trees, preset)
                    batch.old_logp, old_ent = token_logprobs(model, batch, with_entropy=True, **lp_kw)
                    if ref_model is not None:
                        batch.ref_logp, _ = token_logprobs(ref_model, batch, **lp_kw)
                    if preset.entropy_aware_advantage:
                        batch.advantages = entropy_aware_advantage(batch.advantages, old_ent, batch.mask,
                                                                   preset.entropy_aware_alpha)
                    model.train()
                    diags, gnorms, first = [], [], True
                    for epoch in range(preset.ppo_epochs):
                        for mb in minibatch_order(len(trees), cfg.minibatches, cfg.run.seed, step, epoch):
                            sub = batch.subset(mb)
                            cur = None
                            if first:  # weights unchanged since old_logp: reuse it (on-policy)
                                rows = [batch.rows[(t, i)] for t in mb for i in range(len(batch.trees[t]["responses"]))]
                                cur = (batch.old_logp[rows][:, : sub.width], old_ent[rows][:, : sub.width])
                            first = False
                            _, diag = loss_and_backward(model, sub, make_loss_fn(sub, preset),
                                                        need_entropy=True, current=cur, **lp_kw)
                            gnorms.append(clip_gradients(model, cfg.optim.grad_clip))
                            opt.step()
                            sched.step()
                            opt.zero_grad(set_to_none=True)
                            diags.append({k: float(v) for k, v in diag.items()})
                    train_m = {k: statistics.fmean(d[k] for d in diags) for k in diags[0]}
                    train_m["grad_norm"] = statistics.fmean(gnorms)
                    train_m["trained_tokens"] = batch.n_tokens(cfg.packed)
                t_train = time.perf_counter() - t1
                dt = time.perf_counter() - t0
                gen_tokens = sum(t.traj.n_generated_tokens for tr in trees for t in tr.trajectories)
                metrics.update(train_m)
                metrics.update({"lr": sched.get_last_lr()[0], "time_generation": t_gen, "time_training": t_train,
                                "step_seconds": dt, "tokens_per_s": gen_tokens / max(t_gen, 1e-9)})
                done = step + 1
                if val_examples and cfg.validation.every and done % cfg.validation.every == 0:
                    from arpo.eval.evaluate import evaluate

                    model.eval()
                    vm = evaluate(engine, tools, tok, val_examples, reward_fn=reward_fn, agent=cfg.agent,
                                  samples=cfg.validation.samples, temperature=cfg.validation.temperature,
                                  template=cfg.data.template, tool_names=cfg.tools.enabled, seed=cfg.run.seed)
                    metrics.update({f"val/{k}": v for k, v in vm.items() if isinstance(v, (int, float))})
                log.log(done, metrics)
                last = metrics
                if (cfg.run.save_every and done % cfg.run.save_every == 0) or done == cfg.steps:
                    save_checkpoint(run_dir, done, model, tok, opt, sched, {"kind": "train", "total_steps": cfg.steps},
                                    keep=cfg.run.keep_checkpoints)
                bar.update(task, completed=done,
                           info=f"reward {metrics['reward_mean']:.3f} acc {metrics['accuracy']:.2f}")
    finally:
        tools.close()
        log.close()
    final = latest_checkpoint(run_dir)
    return {"steps": cfg.steps, "final": {k: v for k, v in last.items() if not k.startswith("tool_calls_per_traj/")},
            "checkpoint": str(final) if final else None}
