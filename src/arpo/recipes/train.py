"""ARPO RL recipe: `arpo train --config configs/train_gsm8k.yaml [key=value ...] [--resume]`.

A plain script over the parts: validate everything → claim the run dir → set up the trainer →
steps (log, validate, checkpoint) → summary. What one step does is training/trainer.py
(`train_step`: rollout trees → rewards → advantages → old log-probs → PPO epochs); the config is
settings/train.py; what changes on W torchrun ranks is training/sharded.py.

Determinism: the prompts of step s, the rollout seeds and the mini-batch order are pure functions
of (run.seed, s), and checkpoints hold model, optimizer, scheduler and RNG states, so `--resume`
continues a run exactly (tests/training/test_resume.py kills a run with SIGKILL and checks).

Distributed (`torchrun --nproc-per-node W -m arpo train ...`, docs/scaling.md): rank r rolls out its
contiguous slice of the step's prompts, the ranks' losses are scaled so that the summed gradients
are the one-process gradient (FSDP2 or DDP, training/distributed.py); metrics are reduced over
ranks; rank 0 logs and writes; checkpoints are DCP (resumable on any rank count).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from arpo.data.datasets import load_examples
from arpo.errors import ArpoError
from arpo.eval.judge_reward import reward_from_spec
from arpo.models import check_model
from arpo.rewards.custom import check_reward
from arpo.settings import AlgoConfig, TrainConfig, TrainRunConfig, ValidationConfig
from arpo.tools import check_web
from arpo.training import distributed
from arpo.training.checkpoint import (
    is_distributed_checkpoint,
    latest_checkpoint,
    load_distributed_state,
    load_trainer_state,
    save_checkpoint,
    save_distributed_checkpoint,
)
from arpo.training.health import HealthMonitor
from arpo.training.logger import MetricsLogger, read_metrics
from arpo.training.memory import check_fits
from arpo.training.pipeline import check_off_policy, in_flight_checkpoint, restore_in_flight
from arpo.training.progress import Heartbeat, MicroBatches, Phases, StepProgress, generation_beat, step_phases
from arpo.training.rollout_log import RolloutLog
from arpo.training.rundir import RunDir
from arpo.training.sharded import LOSS_DENOMINATORS
from arpo.training.signals import GracefulStop
from arpo.training.trainer import setup, train_step, validate

__all__ = ["AlgoConfig", "TrainConfig", "TrainRunConfig", "ValidationConfig", "run"]


def run(cfg: TrainConfig, resume: bool = False, quiet: bool = False, overwrite: bool = False,  # noqa: C901 - the recipe read top to bottom: checks before the run dir, resume, the step loop
        allow_pickle: bool = False) -> dict:
    """The recipe: validate everything → claim the run dir → setup → steps (log, validate,
    checkpoint) → summary. SIGINT/SIGTERM stop it after the current step, with a checkpoint."""
    cfg.validate()
    # the LoRA in effect (a LoRA run as model.name continues its adapter): config.yaml records it, and a
    # resume compares it as runs always recorded it (true/false, never null)
    cfg = dataclasses.replace(cfg, lora=cfg.lora.resolve(cfg.model.name))
    preset = cfg.algo.resolve()
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    multi = distributed.init(cfg.model.device)  # under torchrun: this process is one of W ranks
    if multi:
        if preset.loss_agg not in LOSS_DENOMINATORS:
            raise ArpoError(f"distributed training cannot split the loss aggregation {preset.loss_agg!r}")
    check_fits(cfg, distributed.world_size())  # the estimate per GPU (training/memory.py) vs its memory
    check_off_policy(cfg, preset, multi)  # rollout.max_off_policy_steps: what the pipeline supports
    main = distributed.is_main()
    # everything that can be wrong with the config fails here, before the run dir is touched
    reward_fn = reward_from_spec(cfg.reward.fn, **cfg.reward.options())  # a built-in, yours, a rubric or a judge
    examples = load_examples(cfg.data.path, cfg.data.limit, cfg.data.task)
    check_reward(reward_fn, examples, cfg.reward.math_scorer, cfg.reward.fn)  # one call, before the model loads
    getattr(reward_fn, "pop_metrics", dict)()  # a judge's check call counts in no step's metrics
    cfg.tools.check_keys()  # serper with no key trained on, every search an error
    check_web(cfg.tools)  # the local web down: every search an error result, rc 0
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

        phase = Phases("train", enabled=main and not quiet)  # it printed nothing for 23 min before step 1
        phase(f"loading the model {ckpt or cfg.model.name}, the reference model and the rollout engine")
        tr = setup(cfg, preset, examples, reward_fn, ckpt, multi, log_error)
        state: dict = {}
        if ckpt is not None and (multi or is_distributed_checkpoint(ckpt)):  # DCP: reshards to this rank count
            state = load_distributed_state(ckpt, tr.model, tr.opt, tr.sched, allow_pickle=allow_pickle)
        elif ckpt is not None:
            state = load_trainer_state(ckpt, tr.opt, tr.sched, allow_pickle=allow_pickle)
        start = tr.version = state.get("step", 0)
        if tr.pipe is not None:  # one step off-policy: the trees the saving run had generated for step `start`
            restore_in_flight(tr.pipe, ckpt, state, distributed.rank(), distributed.world_size(), allow_pickle)
        rd.begin(dataclasses.asdict(cfg))
        log = MetricsLogger(run_dir, resume_step=start if ckpt is not None else None, tensorboard=cfg.run.tensorboard,
                            enabled=main, wandb_project=cfg.run.wandb, config=dataclasses.asdict(cfg))
        rollouts = RolloutLog(run_dir, cfg.run.save_rollouts, cfg.run.rollout_trees, tr.tok,
                              start if ckpt is not None else None, enabled=main,
                              meta={"preset": preset.name, "attribution": preset.attribution})
        health = HealthMonitor(cfg.monitor.patience)
        for row in read_metrics(run_dir) if ckpt is not None else []:  # a resumed run's history, as logged
            health.observe(dict(row))
        last: dict = {}
        guard_stop = None
        now = {"step": start}
        beat = Heartbeat("train", enabled=main and not quiet)  # one for the phases and within the generation
        tr.on_lap = step_phases(tr.on_lap, beat, now, start, cfg.steps)
        tr.on_generate = generation_beat(beat, cfg.steps, cfg.rollout.group_size,
                                         " (rank 0's prompts)" if multi else "")
        micro = MicroBatches(beat, lambda: f"step {now['step'] + 1}/{cfg.steps}")  # each done; timed while one runs
        tr.on_micro = micro
        if start < cfg.steps:
            phase(f"step {start + 1}/{cfg.steps}: generating the rollouts of {cfg.prompts_per_step} prompts × "
                  f"{cfg.rollout.group_size}")
        with GracefulStop() as stop, StepProgress("train", cfg.steps, start, enabled=main and not quiet) as bar, \
                beat.ticking(micro.running):
            for step in range(start, cfg.steps):
                now["step"] = step
                metrics, trees = train_step(tr, step)
                rollouts.write(step + 1, trees)
                mine = [pending.pop(0) for _ in range(len(pending))]  # off-policy: the rollout thread may append
                msgs = [m for part in distributed.gather(mine) for m in part] if multi else mine
                if main and msgs:
                    with open(errors_path, "a") as f:
                        f.write("".join(m + "\n" for m in msgs))
                done = step + 1
                if val_examples and cfg.validation.every and done % cfg.validation.every == 0:
                    metrics.update(validate(tr, val_examples))
                if cfg.monitor.guard != "off":
                    for name, msg in health.observe(metrics).items():
                        if main:
                            print(f"train: warning [{name}] at step {done}: {msg}", file=sys.stderr, flush=True)
                    if cfg.monitor.guard == "stop":  # rank 0's decision (only it has the held-out metrics), on all
                        guard_stop = health.should_stop()
                        if multi:
                            guard_stop = distributed.gather(guard_stop)[0]
                last = metrics
                stopping = stop.requested(multi) or guard_stop is not None
                if done % cfg.run.log_every == 0 or done == cfg.steps or stopping:
                    log.log(done, metrics)
                if (cfg.run.save_every and done % cfg.run.save_every == 0) or done == cfg.steps or stopping:
                    save = save_distributed_checkpoint if multi else save_checkpoint
                    extra, files = (in_flight_checkpoint(tr.pipe, distributed.rank(), distributed.world_size(),
                                                         distributed.gather if multi else None)
                                    if tr.pipe is not None else ({}, {}))
                    save(run_dir, done, tr.model, tr.tok, tr.opt, tr.sched,
                         {"kind": "train", "total_steps": cfg.steps, **extra}, keep=cfg.run.keep_checkpoints,
                         files=files)
                    rd.checkpoint_written()
                bar.update(done, metrics)
                if stopping:
                    if main and guard_stop is not None:
                        print(f"train: stopped at step {done}/{cfg.steps} by monitor.guard: {guard_stop} held for "
                              f"{cfg.monitor.patience} steps; checkpoint in {run_dir}/checkpoints", file=sys.stderr)
                    elif main:
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
            "checkpoint": str(final) if final else None,
            "stopped_by": f"monitor.guard:{guard_stop}" if guard_stop else stop.signal}
