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

Distributed (`torchrun --nproc-per-node W -m arpo train ...`, docs/scaling.md): rank r rolls out
its contiguous slice of the step's global prompt list (whole trees; rollout seeds follow the
global prompt index), mini-batches are the same global groups of trees, each rank scales its loss
by its share of the global loss denominator and the gradients are summed (FSDP2 or DDP,
training/distributed.py) — so a step on W ranks computes the one-process step. Metrics are
reduced over ranks; rank 0 logs and writes; checkpoints are DCP (resumable on any rank count).
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
from arpo.rollout.arpo import ARPORollout, RolloutConfig


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
    kl_type: str | None = None  # k1 | k2 | k3 (unclamped; verl's "k3" is low_var_kl) | low_var_kl
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
    path: str | None = None  # held-out data spec (e.g. svamp:test, a file); None disables validation
    limit: int = 16
    every: int = 10  # steps
    samples: int = 1
    temperature: float = 0.0  # 0: greedy

    def validate(self) -> None:
        from arpo.errors import require

        require(self.limit >= 1, "validation.limit", f"must be >= 1, got {self.limit}")
        require(self.every >= 0, "validation.every", f"must be >= 0 (0: never), got {self.every}")
        require(self.samples >= 1, "validation.samples", f"must be >= 1, got {self.samples}")
        require(self.temperature >= 0, "validation.temperature", f"must be >= 0, got {self.temperature}")


@dataclass
class TrainRunConfig(RunConfig):
    distributed: str = "fsdp"  # under torchrun: fsdp (sharded, FSDP2) | ddp (a full replica per rank)
    save_rollouts: int = 1  # keep the trees in RUN_DIR/rollouts/ every k steps for `arpo view` (0: off)
    rollout_trees: int = 8  # trees kept per saved step (0: all); size: training/rollout_log.py

    def validate(self) -> None:
        super().validate()
        if self.distributed not in ("fsdp", "ddp"):
            raise ArpoError(f"run.distributed: {self.distributed!r}; choose fsdp or ddp")
        if self.save_rollouts < 0 or self.rollout_trees < 0:
            raise ArpoError("run.save_rollouts and run.rollout_trees must be >= 0")


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
    run: TrainRunConfig = field(default_factory=lambda: TrainRunConfig(dir="runs/train"))
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    steps: int = 10
    prompts_per_step: int = 4
    minibatches: int = 1  # optimizer steps per PPO epoch (trees split evenly)
    packed: bool = True  # tree-packed log-probs/backward (False: flat per-trajectory)
    micro_tokens: int = 4096  # model tokens per forward/backward micro-batch
    # the behaviour policy's log-probs (old_logp): rollout = the values the engine recorded while
    # sampling (saves a forward pass); recompute = a no-grad forward over the batch; auto = rollout
    # where they are exact (hf engine, float32, no top-k/top-p truncation), else recompute
    old_logprobs: str = "auto"
    engine: str = "hf"  # rollout engine: hf (transformers; decodes with the policy itself) | vllm (arpo[vllm])
    # keyword options of the engine, e.g. vllm: {max_model_len: 4096, kv_cache_gib: 20, enable_sleep_mode: true}
    engine_options: dict = field(default_factory=dict)

    def validate(self) -> None:
        self.optim.validate()
        self.tools.validate()
        self.rollout.validate()
        if self.steps < 1 or self.prompts_per_step < 1:
            raise ArpoError("steps and prompts_per_step must be >= 1")
        if not 1 <= self.minibatches <= self.prompts_per_step:
            raise ArpoError(f"minibatches must be in [1, prompts_per_step={self.prompts_per_step}]")
        from arpo.errors import require

        require(self.agent.temperature > 0, "agent.temperature",
                f"must be > 0 for training, got {self.agent.temperature}: greedy rollouts give identical samples, "
                "zero advantages and no gradient (spec §2 trains at 1.0)")
        require(self.micro_tokens >= 1, "micro_tokens", f"must be >= 1, got {self.micro_tokens}")
        for sec in (self.model, self.data, self.agent, self.lora, self.run, self.validation):
            sec.validate()
        if self.old_logprobs not in ("auto", "rollout", "recompute"):
            raise ArpoError(f"old_logprobs: {self.old_logprobs!r}; choose auto, rollout or recompute")
        from arpo.engine import ENGINES

        if self.engine not in ENGINES:
            raise ArpoError(f"engine: {self.engine!r}; choose one of {', '.join(ENGINES)}")


# ------------------------------------------------------------------------------------------------
# The pieces of one step
# ------------------------------------------------------------------------------------------------


def rollout_config(rollout: RolloutConfig, preset) -> RolloutConfig:
    """The rollout settings of a run: the config's, with the preset's N, and the preset's rollout-side
    features switched on (AEPO: dynamic budget, consecutive-branch penalty) unless the config sets them."""
    return dataclasses.replace(
        rollout, initial_rollouts=preset.initial_rollouts,
        dynamic_budget=rollout.dynamic_budget or preset.dynamic_budget,
        consecutive_branch_penalty=rollout.consecutive_branch_penalty or preset.consecutive_branch_penalty)


def step_advantages(trees, preset, gather=None) -> list[torch.Tensor]:
    """Trajectory advantages of a step, one (M_t,) tensor per tree (spec §3). The estimator sees the
    whole step at once, one group per tree: group estimators (GRPO, Dr.GRPO) normalize within each
    tree, batch estimators (REINFORCE++) over every trajectory of the step. `gather`
    (training.distributed.gather) adds the other ranks' trees in global order, so a step on W ranks
    normalizes over the same batch as one process."""
    from arpo.algos.advantages import compute_advantages

    mine = [[t.reward for t in tr.trajectories] for tr in trees]
    parts = gather(mine) if gather is not None else [mine]  # every rank joins, with or without trees
    me = _my_rank() if gather is not None else 0
    flat = [(g, r) for g, r in enumerate(tree for part in parts for tree in part) for r in r]
    if not flat:
        return []
    adv = compute_advantages(preset.advantage_estimator, torch.tensor([r for _, r in flat], dtype=torch.float64),
                             [g for g, _ in flat])
    first = sum(len(tree) for part in parts[:me] for tree in part)  # this rank's trajectories start here
    out, at = [], first
    for rewards in mine:
        out.append(adv[at : at + len(rewards)])
        at += len(rewards)
    return out


def _my_rank() -> int:
    from arpo.training import distributed

    return distributed.rank()


def token_advantages(tree, adv: torch.Tensor, attribution: str) -> list[torch.Tensor]:
    """Per-token advantages of each trajectory of one tree from its trajectory advantages (spec §3)."""
    from arpo.algos.advantages import hard_attribution, soft_attribution

    lengths = [len(t.traj.response_ids) for t in tree.trajectories]
    if attribution == "hard":
        return hard_attribution(adv, tree.parents, tree.branch_at, lengths)
    return soft_attribution(adv, lengths)


def issued_calls(t) -> int:
    """Tool calls trajectory `t` issued itself: a branch inherits its parent's calls up to the branch
    point (results delivered at or before branch_token_index), which ran once, for the parent."""
    at = t.branch_token_index
    if t.parent_id is None or at is None:
        return len(t.traj.tool_calls)
    return sum(not (0 < c.result_span[1] <= at) for c in t.traj.tool_calls)


def traj_stats(trees) -> list[dict]:
    """What rollout metrics are computed from: plain numbers, one dict per trajectory (so the ranks
    of a distributed run can gather them and compute the metrics of the global batch)."""
    return [{"reward": t.reward, "correct": float(t.result.correct), "format_error": float(not t.result.format_ok),
             "calls": [(c.tool, c.ok, c.elapsed_s) for c in t.traj.tool_calls], "post": list(t.step_entropies),
             "init": t.initial_entropy, "branch": t.parent_id is not None, "length": t.traj.n_generated_tokens,
             "decisions": [(d["delta_entropy"], d["branched"]) for d in t.branch_decisions],
             "issued": issued_calls(t)}
            for tree in trees for t in tree.trajectories]


def metrics_of(stats: list[dict]) -> dict:
    rewards = [s["reward"] for s in stats]
    calls = [c for s in stats for c in s["calls"]]  # (tool, ok, elapsed_s)
    post = [h for s in stats for h in s["post"]]
    init = [s["init"] for s in stats if s["init"] is not None]
    decisions = [d for s in stats for d in s.get("decisions", ())]  # (ΔH, branched) of every branch decision
    m = {
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "accuracy": statistics.fmean(s["correct"] for s in stats),
        "format_error_rate": statistics.fmean(s["format_error"] for s in stats),
        # the protocol followed AND at least one tool used (what cold-start SFT and RL must teach)
        "tool_format_rate": statistics.fmean((not s["format_error"]) and len(s["calls"]) > 0 for s in stats),
        "tool_calls_per_traj": len(calls) / len(stats),
        # calls the rollouts actually ran (a branch's inherited prefix calls once): ARPO's saving
        "tool_calls_issued": sum(s.get("issued", len(s["calls"])) for s in stats),
        "tool_failures": sum(not ok for _, ok, _ in calls),
        "branches": sum(s["branch"] for s in stats),
        # of the branch decisions taken (one per tool result while the group had room), the fraction
        # that branched, and their mean ΔH = H_after_tool − H_initial (rollout/arpo.py)
        "branch_decisions": len(decisions),
        "branch_rate": statistics.fmean(b for _, b in decisions) if decisions else 0.0,
        "delta_entropy": statistics.fmean(h for h, _ in decisions) if decisions else 0.0,
        "trajectories": len(stats),
        "initial_entropy": statistics.fmean(init) if init else 0.0,
        "post_tool_entropy": statistics.fmean(post) if post else 0.0,
        "response_length": statistics.fmean(s["length"] for s in stats),
        "tool_seconds": sum(e for _, _, e in calls),
    }
    for tool in sorted({c[0] for c in calls}):
        m[f"tool_calls_per_traj/{tool}"] = sum(c[0] == tool for c in calls) / len(stats)
    return m


def rollout_metrics(trees) -> dict:
    return metrics_of(traj_stats(trees))


class ShardRollout(ARPORollout):
    """ARPORollout for one rank's slice of a step's prompts: with `offset` k, group i draws its
    randomness as group k + i of the whole list does (rollout/arpo.py seeds group i with
    "{seed}:{i}" before its first sample), so trees do not depend on the number of ranks.
    offset 0 is ARPORollout unchanged."""

    def run(self, prompts, prompt_ids=None, seed=None, offset: int = 0):
        self._offset, self._base, self._seeded = offset, self.cfg.seed if seed is None else seed, set()
        return super().run(prompts, prompt_ids=prompt_ids, seed=seed)

    def _add_global(self, gi, g, states) -> None:
        if self._offset and id(g) not in self._seeded:
            self._seeded.add(id(g))
            g.rng.seed(f"{self._base}:{self._offset + gi}")
        super()._add_global(gi, g, states)


def rollout_step(ro, prompts, examples, seed: int, log_error, offset: int = 0) -> list:
    """Roll out all prompts together; if that raises, retry one prompt at a time and drop (and log)
    the groups that still fail, so one bad rollout never kills the run. `offset`: the global index
    of prompts[0] in the step's prompt list (a rank's slice; needs a ShardRollout)."""
    ids = [ex["id"] for ex in examples]
    try:
        trees = ro.run(prompts, prompt_ids=ids, seed=seed, **({"offset": offset} if offset else {}))
    except Exception:
        trees = []
        for k, (p, ex) in enumerate(zip(prompts, examples)):
            try:
                trees += ro.run([p], prompt_ids=[ex["id"]], seed=seed + 7919 * (offset + k + 1))
            except Exception as e:  # contained: logged, group dropped
                log_error(f"rollout of prompt {ex['id']} failed, group dropped: {type(e).__name__}: {e}\n"
                          + traceback.format_exc())
    by_id = {ex["id"]: ex for ex in examples}
    for tr in trees:
        tr.example = by_id.get(tr.prompt_id)
    return trees


def build_batch(trees, preset, advantages: list[torch.Tensor] | None = None):
    """The step's TreeBatch with per-token advantages; `advantages`: step_advantages(trees, ...)
    (computed here, for one process, when not given)."""
    from arpo.training.batch import TreeBatch

    layouts = [tr.to_training() for tr in trees]
    batch = TreeBatch.from_trees([t for t, _ in layouts], [m for _, m in layouts])
    adv = torch.zeros(batch.mask.shape)
    advantages = step_advantages(trees, preset) if advantages is None else advantages
    for ti, (tr, a_traj) in enumerate(zip(trees, advantages)):
        for i, a in enumerate(token_advantages(tr, a_traj, preset.attribution)):
            adv[batch.rows[(ti, i)], : len(a)] = a
    batch.advantages = adv
    return batch


def use_rollout_logprobs(cfg: TrainConfig, model) -> bool:
    """Whether old_logp comes from the engine's records (see TrainConfig.old_logprobs)."""
    if cfg.old_logprobs != "auto":
        return cfg.old_logprobs == "rollout"
    exact = cfg.agent.top_p >= 1.0 and cfg.agent.top_k == 0 and cfg.agent.temperature > 0
    return cfg.engine == "hf" and exact and next(model.parameters()).dtype == torch.float32


def old_logprobs_from_rollout(trees, batch):
    """batch.old_logp and the old entropies from the trajectories' engine records."""
    from arpo.training.batch import rollout_logprobs

    vals = {(ti, i): (t.traj.logprobs, t.traj.entropies) for ti, tr in enumerate(trees)
            for i, t in enumerate(tr.trajectories)}
    return rollout_logprobs(batch, vals)


def make_loss_fn(batch, preset, agg_normalizer: float | None = None):
    """agg_normalizer: overrides preset.agg_normalizer (a distributed run passes the global width)."""
    from arpo.algos.losses import policy_loss

    norm = preset.agg_normalizer if agg_normalizer is None else agg_normalizer

    def fn(logp, ent):
        return policy_loss(
            logp, batch.old_logp, batch.advantages, batch.mask, loss_type=preset.loss_type, agg=preset.loss_agg,
            agg_normalizer=norm, clip_low=preset.clip_low, clip_high=preset.clip_high,
            dual_clip=preset.dual_clip, ref_logp=batch.ref_logp, kl_coef=preset.kl_coef, kl_type=preset.kl_type,
            entropy=ent, entropy_coef=preset.entropy_coef,
        )

    return fn


def minibatch_order(n_trees: int, minibatches: int, seed: int, step: int, epoch: int) -> list[list[int]]:
    """Mini-batches of (global) tree indices."""
    g = torch.Generator().manual_seed(seed * 7_000_003 + step * 131 + epoch)
    order = torch.randperm(n_trees, generator=g).tolist()
    return [order[k::minibatches] for k in range(minibatches) if order[k::minibatches]]


# ------------------------------------------------------------------------------------------------
# Splitting a step over ranks
# ------------------------------------------------------------------------------------------------

# loss aggregation -> its denominator over a batch (algos/losses.py): valid tokens, or valid sequences
LOSS_DENOMINATORS = {
    "token-mean": lambda mask: float(mask.sum()),
    "seq-mean-token-sum": lambda mask: float((mask.sum(-1) > 0).sum()),
    "seq-mean-token-mean": lambda mask: float((mask.sum(-1) > 0).sum()),
    "seq-mean-token-sum-norm": lambda mask: float((mask.sum(-1) > 0).sum()),
}
LOSS_LIKE_DIAGS = ("loss", "pg_loss", "kl", "entropy")  # aggregated like the loss; other diagnostics are token means


def global_diagnostics(parts: list[tuple[float, float, dict | None]]) -> dict:
    """Diagnostics of a global mini-batch from every rank's (loss denominator, valid tokens,
    diagnostics): loss-like values weighted by denominator shares, token means by token shares."""
    den = sum(p[0] for p in parts) or 1.0
    tok = sum(p[1] for p in parts) or 1.0
    keys = list(dict.fromkeys(k for _, _, d in parts if d for k in d))
    return {k: sum((n / den if k in LOSS_LIKE_DIAGS else t / tok) * d[k] for n, t, d in parts if d and k in d)
            for k in keys}


def entropy_aware_advantage_global(adv, ent, mask, alpha: float, eps: float = 1e-6):
    """algos.advantages.entropy_aware_advantage (AEPO) with the entropy mean and std taken over the
    valid tokens of every rank's trees (gathered in global order: the same numbers, in the same
    order, as one process sees). adv None: this rank has no trees (it joins the gather)."""
    from arpo.training import distributed

    h = ent.detach().float() if adv is not None else None
    mine = h[mask.bool()] if adv is not None else torch.zeros(0)
    vals = torch.cat([v.cpu() for v in distributed.gather(mine.cpu())])
    if adv is None or vals.numel() < 2:
        return adv
    z = torch.where(mask.bool(), (h - vals.mean().to(h.device)) / (vals.std().to(h.device) + eps), torch.zeros_like(h))
    return adv * (1 + alpha * z).to(adv.dtype)


# ------------------------------------------------------------------------------------------------
# Setup, one step, the loop
# ------------------------------------------------------------------------------------------------


@dataclass
class Trainer:
    """Everything a step needs, built once by `setup` (one job per field; no per-step state)."""

    cfg: TrainConfig
    preset: object  # algos.presets.AlgoPreset
    model: object  # the policy (what is trained and checkpointed)
    tok: object
    par: object  # training.distributed.ParallelModel: rollout / train views of the policy
    opt: object
    sched: object
    engine: object
    tools: object
    ro: ShardRollout
    reward_fn: object
    examples: list
    ref_model: object = None
    multi: bool = False
    log_error: object = print  # (message) -> None: errors.log
    stale: bool = False  # the policy changed since the engine last received its weights
    on_lap: object = None  # (phase name) -> None, called as each phase of a step ends (benchmarks: sync, memory)

    @property
    def lp_kw(self) -> dict:
        cfg, pad = self.cfg, self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        temp = cfg.agent.temperature if cfg.agent.temperature > 0 else 1.0
        return dict(packed=cfg.packed, max_tokens=cfg.micro_tokens, temperature=temp, pad_id=pad)

    def engine_ready(self) -> None:
        """Before a rollout: eval mode, the generation replica in sync, vLLM awake with fresh weights."""
        from arpo.engine import sync_weights

        self.model.eval()
        self.par.sync_rollout()
        if hasattr(self.engine, "wake_up"):
            self.engine.wake_up()
        if self.stale:
            sync_weights(self.engine, self.par.rollout)
            self.stale = False

    def close(self) -> None:
        self.tools.close()
        if hasattr(self.engine, "close"):
            self.engine.close()


def setup(cfg: TrainConfig, preset, examples: list, reward_fn, ckpt=None, multi: bool = False,
          log_error=print, model_and_tok=None) -> Trainer:
    """Policy (from `ckpt` on resume), π_ref, optimizer, scheduler, tools, engine and rollout.
    `model_and_tok`: use this (model, tokenizer) instead of loading cfg.model (benchmarks)."""
    from arpo.engine import make_engine
    from arpo.models import load_model
    from arpo.training import distributed
    from arpo.training.optim import build_optimizer, build_scheduler, load_policy

    model_cfg = dataclasses.replace(cfg.model, device=distributed.local_device(cfg.model.device))
    torch.manual_seed(cfg.run.seed)
    model, tok = model_and_tok or load_policy(model_cfg, cfg.lora, ckpt)
    # π_ref is the starting policy (also on resume, where `model` holds the checkpoint's weights)
    ref_model = load_model(cfg.model.name, model_cfg.device, cfg.model.dtype)[0].eval() if preset.kl_coef else None
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    # one process: `par` hands `model` through; torchrun: FSDP2-sharded or DDP-replicated (run.distributed)
    par = distributed.ParallelModel(model, cfg.run.distributed if multi else None, pad)
    opt = build_optimizer(model, cfg.optim)
    sched = build_scheduler(opt, cfg.optim, cfg.steps * cfg.minibatches * preset.ppo_epochs)
    tools = cfg.tools.build()
    # hf decodes with par.rollout itself; vllm starts from the model directory and gets the policy's
    # weights pushed in after every update, before the next rollout (Trainer.engine_ready)
    engine = make_engine(cfg.engine, par.rollout, tok, model_dir=cfg.model.name, **cfg.engine_options)
    ro = ShardRollout(engine, tools, cfg.agent, rollout_config(cfg.rollout, preset))
    return Trainer(cfg, preset, model, tok, par, opt, sched, engine, tools, ro, reward_fn, examples, ref_model,
                   multi, log_error)


def train_step(tr: Trainer, step: int) -> tuple[dict, list]:
    """One ARPO step (the module docstring's diagram): returns (metrics, this rank's trees).
    Metrics include the time split: time_generation, time_rewards, time_batch, time_old_logprobs,
    time_backward, time_optimizer, time_training (everything after generation) and step_seconds."""
    from arpo.data.prompts import prompts_for
    from arpo.recipes.sft import batch_indices
    from arpo.rewards import score_trees
    from arpo.training import distributed

    cfg, preset, multi = tr.cfg, tr.preset, tr.multi
    clock = {"t": time.perf_counter()}
    times: dict[str, float] = {}

    def lap(name: str) -> None:
        if tr.on_lap is not None:
            tr.on_lap(name)
        now = time.perf_counter()
        times[name] = times.get(name, 0.0) + now - clock["t"]
        clock["t"] = now

    t0 = clock["t"]
    picked = batch_indices(len(tr.examples), cfg.prompts_per_step, cfg.run.seed, step)
    mine = distributed.shard(len(picked))  # this rank's slice of the global prompt list
    batch_ex = [tr.examples[picked[k]] for k in mine]
    prompts = prompts_for(batch_ex, tr.tok, tr.tools, cfg.data.template, cfg.agent.tool_format)
    tr.engine_ready()
    trees = rollout_step(tr.ro, prompts, batch_ex, cfg.run.seed * 100_003 + step, tr.log_error, offset=mine.start)
    if hasattr(tr.engine, "sleep"):  # vllm on GPU with enable_sleep_mode: free its memory for training
        tr.engine.sleep(level=1)
    lap("time_generation")
    n_rolled = distributed.total(len(trees))
    if not n_rolled:
        return {"skipped": 1, "reason": "every rollout failed"}, trees
    score_trees(trees, tr.reward_fn, cfg.reward.math_scorer, tr.tools.names)
    stats = traj_stats(trees)
    metrics = metrics_of([s for part in distributed.gather(stats) for s in part] if multi else stats)
    if preset.dynamic_sampling:  # DAPO: groups whose rewards are all equal carry no signal
        trees = [t for t in trees if len({x.reward for x in t.trajectories}) > 1]
    counts = distributed.gather(len(trees))  # kept trees per rank, in global order
    n_trees, off = sum(counts), sum(counts[: distributed.rank()])
    if preset.dynamic_sampling:
        metrics["groups_dropped"] = n_rolled - n_trees
    lap("time_rewards")
    if n_trees:
        metrics.update(policy_update(tr, trees, n_trees, off, step, lap))
    gen_tokens = distributed.total(sum(t.traj.n_generated_tokens for x in trees for t in x.trajectories))
    times["step_seconds"] = time.perf_counter() - t0
    times["time_training"] = times["step_seconds"] - times["time_generation"]
    if multi:  # the slowest rank's times
        times = dict(zip(times, distributed.all_reduce(list(times.values()), op="max")))
    metrics.update(times)
    metrics.update({"lr": tr.sched.get_last_lr()[0], "tokens_per_s": gen_tokens / max(times["time_generation"], 1e-9)})
    return metrics, trees


def policy_update(tr: Trainer, trees: list, n_trees: int, off: int, step: int, lap) -> dict:
    """Advantages → old log-probs → PPO epochs over mini-batches of (global) trees (spec §3, §4).
    `off`: the global index of this rank's first tree; `lap(name)`: adds elapsed time to a phase."""
    from arpo.algos.advantages import entropy_aware_advantage
    from arpo.training import distributed
    from arpo.training.batch import loss_and_backward, token_logprobs
    from arpo.training.mismatch import mismatch_metrics, mismatch_sums
    from arpo.training.optim import clip_gradients
    from arpo.training.rollout_log import keep_trained_values

    cfg, preset, multi, par, lp_kw = tr.cfg, tr.preset, tr.multi, tr.par, tr.lp_kw
    mismatch: dict = {}
    device = next(tr.model.parameters()).device  # the batch's tensors live with the policy
    advs = step_advantages(trees, preset, distributed.gather if multi else None)
    batch, old_ent = (build_batch(trees, preset, advs).to(device), None) if trees else (None, None)
    lap("time_batch")
    rollout_lp = None  # what the engine recorded while sampling (for the train–inference mismatch)
    if batch is not None:
        if use_rollout_logprobs(cfg, tr.model):  # what the engine recorded while sampling: no extra forward
            batch.old_logp, old_ent = old_logprobs_from_rollout(trees, batch)
            rollout_lp = batch.old_logp
        else:
            try:
                rollout_lp = old_logprobs_from_rollout(trees, batch)[0]
            except (ValueError, KeyError):  # an engine that records no log-probs: no mismatch metrics
                rollout_lp = None
            batch.old_logp, old_ent = token_logprobs(par.rollout, batch, with_entropy=True, **lp_kw)
        if tr.ref_model is not None:
            batch.ref_logp, _ = token_logprobs(tr.ref_model, batch, **lp_kw)
    if preset.entropy_aware_advantage and multi:
        adv = entropy_aware_advantage_global(*((batch.advantages, old_ent, batch.mask) if batch
                                               else (None, None, None)), preset.entropy_aware_alpha)
        if batch is not None:
            batch.advantages = adv
    elif preset.entropy_aware_advantage:
        batch.advantages = entropy_aware_advantage(batch.advantages, old_ent, batch.mask, preset.entropy_aware_alpha)
    if batch is not None:  # each trajectory keeps the values it trains with (RUN_DIR/rollouts, arpo view)
        keep_trained_values(trees, batch)
    lap("time_old_logprobs")
    tr.model.train()
    diags, gnorms, first = [], [], True
    for epoch in range(preset.ppo_epochs):
        for mb in minibatch_order(n_trees, cfg.minibatches, cfg.run.seed, step, epoch):
            local = [t - off for t in mb if off <= t < off + len(trees)]  # this rank's trees
            sub = batch.subset(local) if local else None  # None: none of mb is on this rank
            cur, record, was_first = None, None, first
            if first and sub is not None:  # weights unchanged since old_logp: reuse it (on-policy)
                rows = [batch.rows[(t, i)] for t in local for i in range(len(batch.trees[t]["responses"]))]
                cur = (batch.old_logp[rows][:, : sub.width], old_ent[rows][:, : sub.width])
                record = torch.zeros(sub.mask.shape, dtype=torch.float32, device=sub.mask.device)
            elif not first:  # par.run: FSDP ranks run equally many forwards (dummies for None)
                cur = par.run(sub, lambda: token_logprobs(par.train, sub, with_entropy=True, **lp_kw),
                              grad=False, **lp_kw)
            first = False
            scale, norm = 1.0, None
            if multi:  # this rank's share of the global mini-batch's loss denominator
                den = LOSS_DENOMINATORS[preset.loss_agg](sub.mask) if sub else 0.0
                shares = distributed.gather((den, float(sub.mask.sum()) if sub else 0.0, sub.width if sub else 0))
                scale = den / max(sum(x[0] for x in shares), 1.0)
                norm = (preset.agg_normalizer if preset.agg_normalizer is not None
                        else float(max(x[2] for x in shares)))  # the global padded width
            out = par.run(sub, lambda: loss_and_backward(
                par.train, sub, make_loss_fn(sub, preset, norm), need_entropy=True, current=cur,
                scale=scale, record=record, **lp_kw), grad=True, **lp_kw)
            if was_first:  # the training forward before any update vs the rollout's records
                mm = (mismatch_sums(rollout_lp[rows][:, : sub.width], record, sub.mask)
                      if record is not None and rollout_lp is not None else (0.0, 0.0, 0.0))
                mismatch = mismatch_metrics(distributed.gather(mm) if multi else [mm])
            par.reduce_grads()
            lap("time_backward")
            gnorms.append(clip_gradients(tr.model, cfg.optim.grad_clip))
            tr.opt.step()
            tr.sched.step()
            tr.opt.zero_grad(set_to_none=True)
            tr.stale = True
            lap("time_optimizer")
            diag = {k: float(v) for k, v in out[1].items()} if out else None
            if multi:
                diag = global_diagnostics([(x[0], x[1], d) for x, d in zip(shares, distributed.gather(diag))])
            diags.append(diag)
    m = {k: statistics.fmean(d[k] for d in diags) for k in diags[0]}
    m.update(mismatch)
    m["grad_norm"] = statistics.fmean(gnorms)
    m["trained_tokens"] = distributed.total(batch.n_tokens(cfg.packed) if batch else 0)
    return m


def validate(tr: Trainer, val_examples: list) -> dict:
    """Held-out metrics (rank 0 evaluates alone; the others wait at the next collective)."""
    from arpo.eval.evaluate import evaluate
    from arpo.training import distributed

    tr.engine_ready()
    if not distributed.is_main():
        return {}
    cfg = tr.cfg
    vm = evaluate(tr.engine, tr.tools, tr.tok, val_examples, reward_fn=tr.reward_fn, agent=cfg.agent,
                  samples=cfg.validation.samples, temperature=cfg.validation.temperature,
                  template=cfg.data.template, seed=cfg.run.seed)
    return {f"val/{k}": v for k, v in vm.items() if isinstance(v, (int, float))}


def run(cfg: TrainConfig, resume: bool = False, quiet: bool = False, overwrite: bool = False) -> dict:
    """The recipe: validate everything → claim the run dir → setup → steps (log, validate,
    checkpoint) → summary. SIGINT/SIGTERM stop it after the current step, with a checkpoint."""
    from arpo.data.datasets import load_examples
    from arpo.models import check_model
    from arpo.rewards import get_reward_fn
    from arpo.training import distributed
    from arpo.training.checkpoint import (is_distributed_checkpoint, latest_checkpoint, load_distributed_state,
                                          load_trainer_state, save_checkpoint, save_distributed_checkpoint)
    from arpo.training.logger import MetricsLogger
    from arpo.training.progress import StepProgress
    from arpo.training.rollout_log import RolloutLog
    from arpo.training.rundir import RunDir
    from arpo.training.signals import GracefulStop

    cfg.validate()
    preset = cfg.algo.resolve(cfg.rollout)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    multi = distributed.init(cfg.model.device)  # under torchrun: this process is one of W ranks
    if multi:
        if preset.loss_agg not in LOSS_DENOMINATORS:
            raise ArpoError(f"distributed training cannot split the loss aggregation {preset.loss_agg!r}")
        if cfg.prompts_per_step < distributed.world_size():
            raise ArpoError(f"prompts_per_step={cfg.prompts_per_step} < {distributed.world_size()} ranks")
    main = distributed.is_main()
    # everything that can be wrong with the config fails here, before the run dir is touched
    reward_fn = get_reward_fn(cfg.reward.fn)
    examples = load_examples(cfg.data.path, cfg.data.limit, cfg.data.task)
    val_examples = (load_examples(cfg.validation.path, cfg.validation.limit, cfg.data.task)
                    if cfg.validation.path else [])
    check_model(cfg.model.name, cfg.model.device)
    run_dir = Path(cfg.run.dir)
    rd = RunDir(run_dir, resume=resume, overwrite=overwrite, main=main, command="train").open()
    tr = log = None
    try:
        rd.check_resume_config(dataclasses.asdict(cfg))
        ckpt = rd.checkpoint  # every rank reads the same checkpoint
        errors_path, pending = run_dir / "errors.log", []

        def log_error(msg: str) -> None:  # distributed: gathered to rank 0 after each step
            pending.append(msg)

        tr = setup(cfg, preset, examples, reward_fn, ckpt, multi, log_error)
        start = 0
        if ckpt is not None and (multi or is_distributed_checkpoint(ckpt)):  # DCP: reshards to this rank count
            start = load_distributed_state(ckpt, tr.model, tr.opt, tr.sched)["step"]
        elif ckpt is not None:
            start = load_trainer_state(ckpt, tr.opt, tr.sched)["step"]
        rd.begin(dataclasses.asdict(cfg))
        log = MetricsLogger(run_dir, resume_step=start if ckpt is not None else None, tensorboard=cfg.run.tensorboard,
                            enabled=main, wandb_project=cfg.run.wandb, config=dataclasses.asdict(cfg))
        rollouts = RolloutLog(run_dir, cfg.run.save_rollouts, cfg.run.rollout_trees, tr.tok,
                              start if ckpt is not None else None, enabled=main,
                              meta={"preset": preset.name, "attribution": preset.attribution})
        last: dict = {}
        with GracefulStop() as stop, StepProgress("train", cfg.steps, start, enabled=main and not quiet) as bar:
            for step in range(start, cfg.steps):
                metrics, trees = train_step(tr, step)
                rollouts.write(step + 1, trees)
                msgs = [m for part in distributed.gather(pending) for m in part] if multi else list(pending)
                pending.clear()
                if main and msgs:
                    with open(errors_path, "a") as f:
                        f.write("".join(m + "\n" for m in msgs))
                done = step + 1
                if val_examples and cfg.validation.every and done % cfg.validation.every == 0:
                    metrics.update(validate(tr, val_examples))
                log.log(done, metrics)
                last = metrics
                stopping = stop.requested(multi)
                if (cfg.run.save_every and done % cfg.run.save_every == 0) or done == cfg.steps or stopping:
                    save = save_distributed_checkpoint if multi else save_checkpoint
                    save(run_dir, done, tr.model, tr.tok, tr.opt, tr.sched, {"kind": "train", "total_steps": cfg.steps},
                         keep=cfg.run.keep_checkpoints)
                    rd.checkpoint_written()
                bar.update(done, metrics)
                if stopping:
                    if main:
                        stop.report("train", done, cfg.steps, run_dir)
                    break
    finally:
        if tr is not None:
            tr.close()
        if log is not None:
            log.close()
        rd.close()
    final = latest_checkpoint(run_dir)
    return {"steps": cfg.steps, "final": {k: v for k, v in last.items() if not k.startswith("tool_calls_per_traj/")},
            "checkpoint": str(final) if final else None, "stopped_by": stop.signal}
