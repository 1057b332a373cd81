"""The ARPO trainer: `setup` builds everything a step needs once, `train_step` runs one step.

One step (data flows one way; each line is one call below):

    prompts ─► ARPO rollout trees (engine + tools, entropy branching, spec §2)      rollout_step
            ─► rewards per trajectory (spec §5) and rollout metrics                 score_trees, metrics_of
            ─► group-normalized advantages, soft or hard attribution (spec §3)    step_batch.build_batch
            ─► old log-probs (tree-packed: shared prefixes computed once)          token_logprobs
            ─► PPO epochs over mini-batches of trees: clipped surrogate (spec §4) → AdamW

The step is written for one process. On W torchrun ranks the same code runs with a ShardedComm
(training/sharded.py) that slices the prompts, gathers metrics and advantages, and scales each
rank's loss, so a step on W ranks computes the one-process step; with LocalComm those calls are
the identity.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from arpo.algos.presets import AlgoPreset
from arpo.data.order import round_indices
from arpo.data.prompts import prompts_for
from arpo.engine import make_engine, sync_weights
from arpo.engine.base import Engine
from arpo.errors import ArpoError
from arpo.eval.evaluate import evaluate
from arpo.models import load_model
from arpo.rewards import score_trees
from arpo.rewards.budget import RewardShaping
from arpo.rollout.arpo import ARPORollout
from arpo.settings import RolloutConfig, TrainConfig
from arpo.tools import tools_from_config
from arpo.tools.registry import ToolRegistry
from arpo.training import distributed
from arpo.training.batch import loss_and_backward, token_logprobs
from arpo.training.distributed import ParallelModel
from arpo.training.mismatch import mismatch_metrics, mismatch_sums
from arpo.training.optim import (
    build_optimizer,
    build_scheduler,
    checkpoint_activations,
    clip_gradients,
    load_policy,
    master_compute,
)
from arpo.training.pipeline import RolloutPipeline, VersionedEngine, lag_metrics, snapshot, tag_versions
from arpo.training.rollout_log import keep_trained_values
from arpo.training.rollout_metrics import metrics_of, traj_stats
from arpo.training.sharded import LocalComm, step_comm
from arpo.training.step_batch import (
    build_batch,
    make_loss_fn,
    mask_nonfinite,
    minibatch_order,
    old_logprobs_from_rollout,
    step_advantages,
    use_rollout_logprobs,
    weight_lagged_tokens,
)


@dataclass
class Trainer:
    """Everything a step needs, built once by `setup` (one job per field; no per-step state)."""

    cfg: TrainConfig
    preset: AlgoPreset
    model: Any  # the policy (what is trained and checkpointed): a transformers or peft model
    tok: Any  # its tokenizer
    par: ParallelModel  # rollout / train views of the policy
    opt: torch.optim.Optimizer
    sched: Any  # torch.optim.lr_scheduler.LRScheduler
    engine: Engine
    tools: ToolRegistry
    ro: ARPORollout
    reward_fn: Callable[..., Any]  # rewards.RewardFn
    examples: list
    ref_model: Any = None  # π_ref for the KL term (None without one)
    comm: LocalComm = dataclasses.field(default_factory=LocalComm)  # ShardedComm under torchrun
    log_error: Callable[[str], None] = print  # (message) -> None: errors.log
    stale: bool = False  # the policy changed since the engine last received its weights
    on_lap: Callable[[str], None] | None = None  # called as each phase of a step ends (benchmarks: sync, memory)
    # (step, prompts, states) after each engine step of a step's rollout (arpo train: its heartbeat)
    on_generate: Callable[[int, int, Mapping], None] | None = None
    on_micro: Callable[[int, int], None] | None = None  # (done, of): 0 before the first micro-batch, then after each
    pipe: RolloutPipeline | None = None  # rollout.max_off_policy_steps > 0: the trees of the next step (pipeline.py)
    version: int = 0  # the policy's version: steps trained so far (step n trains version n)

    @property
    def lp_kw(self) -> dict:
        cfg, pad = self.cfg, self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        temp = cfg.agent.temperature if cfg.agent.temperature > 0 else 1.0
        return dict(packed=cfg.packed, max_tokens=cfg.micro_tokens, temperature=temp, pad_id=pad)

    def engine_ready(self) -> None:
        """Before a rollout: eval mode, the generation replica in sync, vLLM awake with fresh weights."""
        if isinstance(self.engine, VersionedEngine):  # under FSDP sync_rollout refreshes what hf decodes with
            self.engine.check_idle("weights pushed")
        self.model.eval()
        self.par.sync_rollout()
        self.engine.wake_up()
        if self.stale:
            sync_weights(self.engine, self.par.rollout)
            self.stale = False
        if isinstance(self.engine, VersionedEngine):
            self.engine.set_version(self.version)

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close()
        self.tools.close()
        self.engine.close()


def rollout_config(rollout: RolloutConfig, preset) -> RolloutConfig:
    """The rollout settings of a run: the config's; N = M for a preset without branching (GRPO and the
    other trajectory-level baselines), and the preset's rollout-side features switched on (AEPO: dynamic
    budget, consecutive-branch penalty; Tree-GRPO: node expansion) unless the config sets them."""
    if rollout.mode == "tree_grpo" and not preset.branching:
        raise ArpoError(f"rollout.mode: tree_grpo expands the nodes of N < M chains, but preset {preset.name!r} "
                        "samples N = M chains (no branching): use algo.preset tree_grpo (or arpo)")
    return dataclasses.replace(
        rollout.with_defaults(preset.dynamic_budget, preset.consecutive_branch_penalty),
        initial_rollouts=rollout.initial_rollouts if preset.branching else rollout.group_size,
        mode="tree_grpo" if preset.node_expansion else rollout.mode)


def shaping_of(cfg: TrainConfig) -> RewardShaping:
    """The run's reward shaping (rewards/budget.py): overlong penalty and filter, tool efficiency."""
    return RewardShaping.of(cfg.reward, cfg.agent.max_response_tokens)


def setup(cfg: TrainConfig, preset, examples: list, reward_fn, ckpt=None, multi: bool = False,
          log_error=print, model_and_tok=None) -> Trainer:
    """Policy (from `ckpt` on resume), π_ref, optimizer, scheduler, tools, engine and rollout.
    `model_and_tok`: use this (model, tokenizer) instead of loading cfg.model (benchmarks)."""
    model_cfg = dataclasses.replace(cfg.model, device=distributed.local_device(cfg.model.device))
    torch.manual_seed(cfg.run.seed)
    model, tok = model_and_tok or load_policy(model_cfg, cfg.lora, ckpt)
    if cfg.memory.activation_checkpointing:
        checkpoint_activations(model)
    # π_ref is the starting policy (also on resume, where `model` holds the checkpoint's weights)
    ref_model = load_model(cfg.model.name, model_cfg.device, cfg.model.dtype)[0].eval() if preset.kl_coef else None
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    # one process: `par` hands `model` through; torchrun: FSDP2-sharded or DDP-replicated (run.distributed)
    # a remote engine (vllm_server) generates on its servers: no full replica of the policy on the ranks
    # a 16-bit model.dtype: float32 master weights and AdamW moments, 16-bit compute (optim.master_compute)
    compute = master_compute(model_cfg, cfg.lora) if next(model.parameters()).dtype == torch.float32 else None
    par = distributed.ParallelModel(model, cfg.run.distributed if multi else None, pad, cfg.run.hsdp_shard_size,
                                    replica=cfg.engine != "vllm_server", compute_dtype=compute,
                                    cpu_offload=cfg.memory.cpu_offload)
    opt = build_optimizer(model, cfg.optim)
    sched = build_scheduler(opt, cfg.optim, cfg.steps * cfg.minibatches * preset.ppo_epochs)
    tools = tools_from_config(cfg.tools)
    # hf decodes with par.rollout itself; vllm starts from the model directory and gets the policy's
    # weights pushed in after every update, before the next rollout (Trainer.engine_ready)
    # vllm_server: the servers of rollout.servers, which start from the model directory; the policy's
    # weights (a resumed checkpoint, merged LoRA) are pushed before the first rollout (stale)
    opts = cfg.engine_options.kwargs(cfg.engine)  # the keys the config sets (settings/engine.py)
    if cfg.engine == "vllm_server":
        opts["servers"] = cfg.rollout.servers
    # one step off-policy: the engine generates while the policy trains, so hf decodes with a snapshot:
    # under FSDP the generation replica is one (only sync_rollout writes it), else a copy of the policy
    off = cfg.rollout.max_off_policy_steps > 0
    gen = (par.rollout if par.rollout is not model else snapshot(model)) if off and cfg.engine == "hf" else None
    engine: Engine = make_engine(cfg.engine, gen if gen is not None else par.rollout, tok, model_dir=cfg.model.name,
                                 **opts)
    if off:
        engine = VersionedEngine(engine, gen)
    ro = ARPORollout(engine, tools, cfg.agent, rollout_config(cfg.rollout, preset))
    return Trainer(cfg, preset, model, tok, par, opt, sched, engine, tools, ro, reward_fn, examples, ref_model,
                   step_comm(multi), log_error, stale=cfg.engine == "vllm_server",
                   pipe=RolloutPipeline() if off else None)


def rollout_step(ro, prompts, examples, seed: int, log_error, offset: int = 0, on_step=None) -> list:
    """Roll out all prompts together; if that raises, retry one prompt at a time and drop (and log)
    the groups that still fail, so one bad rollout never kills the run. `offset`: the global index
    of prompts[0] in the step's prompt list (a rank's slice); `on_step(outs, states)`: ARPORollout.run's."""
    ids = [ex["id"] for ex in examples]
    try:
        trees = ro.run(prompts, prompt_ids=ids, seed=seed, group_offset=offset, examples=examples, on_step=on_step)
    except Exception:  # noqa: BLE001 - one bad rollout must not kill the run: retry one prompt at a time
        trees = []
        for k, (p, ex) in enumerate(zip(prompts, examples, strict=True)):
            try:
                trees += ro.run([p], prompt_ids=[ex["id"]], seed=seed + 7919 * (offset + k + 1), examples=[ex],
                                on_step=on_step)
            except Exception as e:  # noqa: BLE001 - contained: logged with its traceback, group dropped
                log_error(f"rollout of prompt {ex['id']} failed, group dropped: {type(e).__name__}: {e}\n"
                          + traceback.format_exc())
    by_id = {ex["id"]: ex for ex in examples}
    for tr in trees:
        tr.example = by_id.get(tr.prompt_id)
    return trees


class _Laps:
    """Wall time per phase of a step: lap(name) adds the time since the previous lap to `name` and
    tells `on_lap` that phase ended; lap(name, announce=False) only adds the time (a phase that already
    ended once this step: on-policy, the engine's sleep after the rewards counts as generation)."""

    def __init__(self, on_lap=None):
        self.on_lap, self.times, self.t0 = on_lap, {}, time.perf_counter()
        self._last = self.t0

    def __call__(self, name: str, announce: bool = True) -> None:
        if announce and self.on_lap is not None:
            self.on_lap(name)
        now = time.perf_counter()
        self.times[name] = self.times.get(name, 0.0) + now - self._last
        self._last = now


def train_step(tr: Trainer, step: int) -> tuple[dict, list]:
    """One ARPO step (the module docstring's diagram): returns (metrics, this rank's trees).
    Metrics include the time split: time_generation, time_rewards, time_batch, time_old_logprobs,
    time_backward, time_optimizer, time_training (everything after generation) and step_seconds."""
    cfg, preset, comm = tr.cfg, tr.preset, tr.comm
    lap = _Laps(tr.on_lap)
    tr.version = step
    # 1-2. this step's prompts (a pure function of seed and step), their rollout trees, rewards
    lagged: dict = {}
    if tr.pipe is None:
        tr.engine_ready()
        trees, stats, n_rolled, sampling = sample_groups(tr, step, lap)  # lapped generation, then rewards
        tr.engine.sleep(level=1)  # vllm on GPU with enable_sleep_mode frees its memory for training; else a no-op
        lap("time_generation", announce=False)  # said once: sample_groups named it (it was said twice)
    else:  # one step off-policy: the trees of step+1 generate while this step trains
        trees, stats, n_rolled, lagged = off_policy_groups(tr, step)
        sampling = {}
        lap("time_generation")
    tr.version = step + 1  # the weights this step leaves (unchanged if it skips)
    if not n_rolled:
        return {"skipped": 1, "reason": "every rollout failed"}, trees
    metrics = metrics_of(comm.all_stats(stats))
    metrics.update(lagged)
    metrics.update(getattr(tr.reward_fn, "pop_metrics", dict)())  # a judge's calls and tokens (eval/judge_reward.py)
    n_trees, off = comm.kept(len(trees))
    if preset.dynamic_sampling:
        metrics.update({"groups_dropped": sampling["uniform"], "groups_trained": n_trees,
                        "sampling_rounds": sampling["rounds"], "groups_short": cfg.prompts_per_step - n_trees})
    # 3. advantages, old log-probs, PPO epochs
    if n_trees:
        metrics.update(policy_update(tr, trees, n_trees, off, step, lap))
    gen_tokens = comm.total(sum(t.traj.n_generated_tokens for x in trees for t in x.trajectories))
    times = lap.times
    times["step_seconds"] = time.perf_counter() - lap.t0
    times["time_training"] = times["step_seconds"] - times["time_generation"]
    metrics.update(comm.slowest(times))  # distributed: the slowest rank's times
    metrics.update({"lr": tr.sched.get_last_lr()[0],
                    "tokens_per_s": gen_tokens / max(metrics["time_generation"], 1e-9)})
    return metrics, trees


def round_trees(tr: Trainer, step: int, rnd: int, used: set[int]) -> tuple[list, list[int]]:
    """The rollout trees (not yet scored) of this rank's slice of generation round `rnd` of `step`,
    and the dataset rows of the whole round."""
    cfg, comm = tr.cfg, tr.comm
    picked = round_indices(len(tr.examples), cfg.prompts_per_step, cfg.run.seed, step, rnd, used)
    mine = comm.shard(len(picked))  # this rank's slice of the round's prompts (one process: all)
    batch_ex = [tr.examples[picked[k]] for k in mine]
    prompts = prompts_for(batch_ex, tr.tok, tr.tools, cfg.data.template, cfg.agent.tool_format)
    hook = tr.on_generate
    on_step = None if hook is None else (lambda outs, states: hook(step, len(prompts), states))
    got = rollout_step(tr.ro, prompts, batch_ex, cfg.run.seed * 100_003 + step + 1_000_003 * rnd, tr.log_error,
                       offset=mine.start, on_step=on_step)
    return got, picked


def produce_trees(tr: Trainer, step: int) -> list:
    """The scored trees of `step` (round 0), each tagged with the one policy version that generated it.
    Runs in the pipeline's thread: nothing here touches the trained policy or a collective."""
    engine = tr.engine
    assert isinstance(engine, VersionedEngine)
    if tr.cfg.run.threads:  # this thread's torch ops: the run's thread count, as the main thread's
        torch.set_num_threads(tr.cfg.run.threads)
    engine.begin()
    try:
        got, _ = round_trees(tr, step, 0, set())
        tag_versions(got, engine)
    finally:
        engine.end()
    score_trees(got, tr.reward_fn, tr.cfg.reward.math_scorer, tr.tools.names, shaping_of(tr.cfg))
    return got


def off_policy_groups(tr: Trainer, step: int) -> tuple[list, list, int, dict]:
    """Like sample_groups (without dynamic sampling), one step off-policy (training/pipeline.py): this
    step's trees from the pipeline (generated under version step − 1 while the previous step trained; the
    first step's now), then the engine synced to this version and the next step's trees started. Trees
    lagging more than rollout.max_off_policy_steps versions are rejected. Returns (trees, stats,
    n_rolled, lag metrics)."""
    cfg, pipe = tr.cfg, tr.pipe
    assert pipe is not None
    got = pipe.take(step)  # this rank's batch joined; the barrier: every rank's (shared servers)
    tr.comm.barrier()  # so the sync below never reaches a server another rank's rollout thread still uses
    # weights reach the engine here only, with no tree in flight on any rank; also on the last step: under
    # FSDP the generation replica computes this step's old log-probs (π_old: version `step`)
    tr.engine_ready()
    if got is None:  # the first step (or a resume without an in-flight batch): generated now
        got = produce_trees(tr, step)
    if step + 1 < cfg.steps:
        pipe.start(step + 1, lambda: produce_trees(tr, step + 1))
    lags = [step - t.policy_version for t in got]
    keep = [t for t, lag in zip(got, lags, strict=True) if lag <= cfg.rollout.max_off_policy_steps]
    kept_lags = [lag for lag in lags if lag <= cfg.rollout.max_off_policy_steps]
    every = tr.comm.per_rank((kept_lags, len(got) - len(keep)))  # all ranks' trees (main thread)
    metrics = lag_metrics([lag for ls, _ in every for lag in ls], sum(n for _, n in every))
    return keep, traj_stats(keep), tr.comm.total(len(got)), metrics


def sample_groups(tr: Trainer, step: int, lap) -> tuple[list, list, int, dict]:
    """This step's rollout trees, scored (spec §5), with every rolled-out trajectory's stats, the
    number of groups rolled out (all ranks) and {rounds, uniform}. One round of prompts_per_step
    prompts; DAPO's dynamic sampling (preset.dynamic_sampling) drops groups whose rewards are all
    equal (no signal) and rolls out fresh prompts until prompts_per_step groups are kept, counted
    over all ranks, or dynamic_sampling_max_rounds rounds ran (then the step trains on what it has)."""
    cfg, preset, comm = tr.cfg, tr.preset, tr.comm
    trees, stats, need, n_rolled, n_uniform = [], [], cfg.prompts_per_step, 0, 0
    used: set[int] = set()
    rounds = preset.dynamic_sampling_max_rounds if preset.dynamic_sampling else 1
    for rnd in range(rounds):
        got, picked = round_trees(tr, step, rnd, used)
        used.update(picked)
        lap("time_generation")
        n_rolled += comm.total(len(got))
        score_trees(got, tr.reward_fn, cfg.reward.math_scorer, tr.tools.names, shaping_of(cfg))
        stats += traj_stats(got)
        lap("time_rewards")
        if not preset.dynamic_sampling:
            return got, stats, n_rolled, {"rounds": 1, "uniform": 0}
        keep = [t for t in got if len({x.reward for x in t.trajectories}) > 1]
        counts = comm.per_rank(len(keep))  # non-uniform groups per rank this round, in global order
        n_uniform += comm.total(len(got)) - sum(counts)
        take = max(0, min(len(keep), need - sum(counts[: comm.rank])))  # the first `need`, globally
        trees += keep[:take]
        need -= min(sum(counts), need)
        if need == 0:
            break
    return trees, stats, n_rolled, {"rounds": rnd + 1, "uniform": n_uniform}


def policy_update(tr: Trainer, trees: list, n_trees: int, off: int, step: int, lap) -> dict:
    """Advantages → behaviour log-probs → PPO epochs over mini-batches of (global) trees (spec §3, §4).
    `off`: the global index of this rank's first tree; `lap(name)`: adds elapsed time to a phase.
    Under torchrun a rank may hold no trees of the step, or of a mini-batch: its batch is then None, and
    it still joins every collective (the gathers, and FSDP's passes through `par.run`). None, not a
    zero-row TreeBatch, on purpose: such a rank computes nothing, but FSDP needs it to run as many
    forward/backward passes as the busiest rank, so `par.run` gives it dummy passes of a one-token pack
    whatever its batch; a zero-row batch would add zero-width paths to packing, the losses' token
    normalizers and unpacking, for no pass saved. "No rows here" is one `is None` where rows are read
    (behaviour_logprobs, minibatch_step, the AEPO scaling, the kept values, the token count), and
    tests/training/test_distributed.py::test_hsdp_with_checkpointing_and_fewer_prompts_than_ranks runs a
    rank without trees."""
    cfg, preset = tr.cfg, tr.preset
    device = tr.par.device  # the batch's tensors live where the policy computes
    advs = step_advantages(trees, preset, tr.comm.gather, tr.comm.rank)
    batch = build_batch(trees, preset, advs).to(device) if trees else None
    lap("time_batch")
    behav_lp, old_ent = behaviour_logprobs(tr, trees, batch)
    if preset.entropy_aware_advantage:  # AEPO: advantages scaled by the tokens' entropy
        tr.comm.entropy_aware(batch, old_ent, preset.entropy_aware_alpha)
    mismatch: dict = {}
    if batch is not None:  # each trajectory keeps the values it trains with (RUN_DIR/rollouts, arpo view)
        mismatch.update(weight_lagged_tokens(batch, behav_lp, cfg.rollout))  # off-policy: w = min(π_old/π_behav, C)
        keep_trained_values(trees, batch)
    lap("time_old_logprobs")
    tr.model.train()
    diags, gnorms = [], []
    for epoch in range(preset.ppo_epochs):
        for k, mb in enumerate(minibatch_order(n_trees, cfg.minibatches, cfg.run.seed, step, epoch)):
            local = [t - off for t in mb if off <= t < off + len(trees)]  # this rank's trees (one process: all)
            first = epoch == 0 and k == 0  # the weights are still those of old_logp
            diag, gnorm, mm = minibatch_step(tr, batch, local, first, behav_lp, old_ent, lap)
            diags.append(diag)
            gnorms.append(gnorm)
            mismatch.update(mm)
    m = {k: statistics.fmean(d[k] for d in diags) for k in diags[0]}
    m.update(mismatch)
    m["grad_norm"] = statistics.fmean(gnorms)
    m["trained_tokens"] = tr.comm.total(batch.n_tokens(cfg.packed) if batch else 0)
    return m


def behaviour_logprobs(tr: Trainer, trees: list, batch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Set batch.old_logp (π_old) and batch.ref_logp (π_ref, with a KL term); return (the log-probs the
    engine recorded while sampling, or None for an engine that records none; the old entropies).

    π_old is the engine's records when `use_rollout_logprobs` (no extra forward), else a forward of the
    generation weights: the replica, or (FSDP without one) the shards, where every rank joins, with or
    without a batch."""
    if use_rollout_logprobs(tr.cfg, tr.par.rollout):  # (the weights the engine decodes with)
        if batch is None:
            return None, None
        batch.old_logp, old_ent = old_logprobs_from_rollout(trees, batch)
        bad = mask_nonfinite(batch, batch.old_logp)  # a NaN record never reaches the loss
        if bad:
            tr.log_error(f"old_logprobs rollout: {bad} response tokens with a non-finite recorded log-prob "
                         "were left out of the loss")
        behav = batch.old_logp
    else:
        behav, old_ent = None, None
        if batch is not None:
            try:
                behav = old_logprobs_from_rollout(trees, batch)[0]
            except (ValueError, KeyError):  # an engine that records no log-probs: no mismatch metrics
                behav = None
        old = tr.par.old_logprobs(batch, lambda m, b=batch: token_logprobs(m, b, with_entropy=True, **tr.lp_kw),
                                  **tr.lp_kw)
        if old is not None and batch is not None:
            batch.old_logp, old_ent = old
    if batch is not None and tr.ref_model is not None:
        batch.ref_logp, _ = token_logprobs(tr.ref_model, batch, **tr.lp_kw)
    return behav, old_ent


def minibatch_step(tr: Trainer, batch, local: list[int], first: bool, behav_lp: torch.Tensor | None,
                   old_ent: torch.Tensor | None, lap) -> tuple[dict, float, dict]:
    """One optimizer step on a mini-batch, of which this rank holds the trees `local` (maybe none).
    `first`: the weights are unchanged since π_old, so its log-probs are the current ones (no forward),
    and the training forward is compared with the engine's records (the train–inference mismatch).
    Returns (the mini-batch's diagnostics, gathered over ranks; the gradient norm; mismatch metrics)."""
    cfg, preset, comm, par, lp_kw = tr.cfg, tr.preset, tr.comm, tr.par, tr.lp_kw
    sub = batch.subset(local) if local and batch is not None else None  # None: none of it is on this rank
    rows = ([batch.rows[(t, i)] for t in local for i in range(len(batch.trees[t]["responses"]))]
            if sub is not None else [])  # the mini-batch's rows of the step's (B, T) tensors
    cur, record = None, None
    if first and sub is not None:
        assert batch.old_logp is not None and old_ent is not None  # both set by behaviour_logprobs
        cur = (batch.old_logp[rows][:, : sub.width], old_ent[rows][:, : sub.width])
        record = torch.zeros(sub.mask.shape, dtype=torch.float32, device=sub.mask.device)
    elif not first:  # par.run: FSDP ranks run equally many forwards (dummies for None)
        cur = par.run(sub, lambda sub=sub: token_logprobs(par.train, sub, with_entropy=True, **lp_kw),
                      grad=False, **lp_kw)
    scale, norm, share = comm.loss_share(sub, preset)  # one process: 1, the preset's normalizer
    out = par.run(sub, lambda sub=sub: loss_and_backward(
        par.train, sub, make_loss_fn(sub, preset, norm), need_entropy=True, current=cur, scale=scale,
        record=record, on_micro=tr.on_micro, **lp_kw), grad=True, **lp_kw)
    mismatch = {}
    if first:  # every rank joins the gather, with or without trees here
        sums = (mismatch_sums(behav_lp[rows][:, : sub.width], record, sub.mask)
                if sub is not None and record is not None and behav_lp is not None else (0.0, 0.0, 0.0))
        mismatch = mismatch_metrics(comm.per_rank(sums))
    par.reduce_grads()
    lap("time_backward")
    gnorm = clip_gradients(tr.model, cfg.optim.grad_clip)
    tr.opt.step()
    tr.sched.step()
    tr.opt.zero_grad(set_to_none=True)
    tr.stale = True
    lap("time_optimizer")
    # one process: every mini-batch has trees here; several: the dict gathered from the ranks (sharded.py)
    diag = comm.diagnostics(share, {k: float(v) for k, v in out[1].items()} if out else None)
    assert diag is not None
    return diag, gnorm, mismatch


def validate(tr: Trainer, val_examples: list) -> dict:
    """Held-out metrics (rank 0 evaluates alone; the others wait at the next collective)."""
    if tr.pipe is not None:  # the next step's trees finish first, on every rank: then the engine takes the weights
        tr.pipe.wait()
        tr.comm.barrier()
    tr.engine_ready()
    if not tr.comm.is_main:
        return {}
    cfg = tr.cfg
    vm = evaluate(tr.engine, tr.tools, tr.tok, val_examples, reward_fn=tr.reward_fn, agent=cfg.agent,
                  samples=cfg.validation.samples, temperature=cfg.validation.temperature,
                  template=cfg.data.template, seed=cfg.run.seed)
    return {f"val/{k}": v for k, v in vm.items() if isinstance(v, (int, float))}
