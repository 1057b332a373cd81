"""Cold-start SFT recipe (spec §6): teach the model the tool protocol before RL.

    arpo sft --config configs/sft_quickstart.yaml [key=value ...] [--resume]

Data: JSONL rows {question, response, system?, tool_results?} in the agent's text protocol (what
`arpo sft-data` writes). The loss is the mean next-token NLL over the response's *generated* text:
the prompt and every environment-inserted `<result>…</result>` block are masked out, exactly as in
RL (spec §1), and the tools' text in them is tokenized with special tokens split, as the rollout
does (rollout/tool_tokens.py: a tool that printed `<|im_end|>` does not end a turn). The end-of-turn
token is trained, so the model learns to stop after `</answer>`.

The loop is plain: shuffled batches (order = f(seed, epoch), so a resumed run sees the same
batches) → log-probs in micro-batches → AdamW → metrics.jsonl/tensorboard → atomic checkpoints.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch
import yaml

from arpo.data.order import batch_indices
from arpo.data.prompts import TASK_TOOLS
from arpo.errors import ArpoError
from arpo.models import check_model
from arpo.settings import SFTConfig
from arpo.sft.rows import read_sft_rows, tokenize_row
from arpo.training.batch import TreeBatch, loss_and_backward
from arpo.training.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint, write_text_atomic
from arpo.training.logger import MetricsLogger
from arpo.training.optim import (
    autocast,
    build_optimizer,
    build_scheduler,
    checkpoint_activations,
    clip_gradients,
    load_policy,
    master_compute,
)
from arpo.training.progress import Heartbeat, MicroBatches, Phases, StepProgress
from arpo.training.rundir import RunDir
from arpo.training.signals import GracefulStop


def nll_loss(mask: torch.Tensor):
    def fn(logp, _ent):
        m = mask.to(logp.dtype)
        loss = -(logp * m).sum() / m.sum().clamp_min(1)
        return loss, {"nll": loss.detach()}

    return fn


def agent_yaml(rows: list[dict]) -> dict | None:
    """What an SFT run trained its prompts on, as config sections (RUN_DIR/agent.yaml): the template and
    its tools when every row used the same built-in template, the call format of `sft-data tools` rows.
    None when the rows disagree (then nothing is remembered)."""
    templates = {r.get("system") or ("search" if r.get("task") == "qa" else "math")
                 for r in rows if not isinstance(r.get("system_prompt"), str)}
    formats = {r.get("tool_format", "tags") for r in rows if isinstance(r.get("system_prompt"), str)}
    if len(templates) == 1 and not formats:
        t = templates.pop()
        return {"data": {"template": t}, "tools": {"enabled": list(TASK_TOOLS[t])}}
    if len(formats) == 1 and not templates:
        return {"agent": {"tool_format": formats.pop()}}
    return None


def run(cfg: SFTConfig, resume: bool = False, quiet: bool = False, overwrite: bool = False,
        allow_pickle: bool = False) -> dict:
    """validate everything → claim the run dir → load → steps (log, checkpoint) → summary.
    SIGINT/SIGTERM stop it after the current step, with a checkpoint (training/signals.py)."""
    cfg.validate()
    phase = Phases("sft", enabled=not quiet)
    cfg = dataclasses.replace(cfg, lora=cfg.lora.resolve(cfg.model.name))  # as in recipes/train.py
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    rows = read_sft_rows(cfg.data.path, cfg.data.limit)  # bad data fails here, before the run dir is touched
    check_model(cfg.model.name, cfg.model.device)
    run_dir = Path(cfg.run.dir)
    rd = RunDir(run_dir, resume=resume, overwrite=overwrite, command="sft").open()
    log = None
    try:
        rd.check_resume_config(dataclasses.asdict(cfg))
        ckpt = rd.checkpoint
        torch.manual_seed(cfg.run.seed)
        phase(f"loading the model {ckpt or cfg.model.name}")
        model, tok = load_policy(cfg.model, cfg.lora, ckpt)
        compute = master_compute(cfg.model, cfg.lora)
        if cfg.memory.activation_checkpointing:
            checkpoint_activations(model)
        phase(f"tokenizing {len(rows)} rows")
        model.train()
        data, skipped = [], 0
        for r in rows:
            p, ids, m = tokenize_row(tok, r)
            if len(p) + len(ids) > cfg.data.max_seq_len:
                skipped += 1
                continue
            data.append((p, ids, m))
        if not data:
            raise ArpoError(f"every SFT row is longer than data.max_seq_len={cfg.data.max_seq_len}")
        per_epoch = (len(data) + cfg.prompts_per_step - 1) // cfg.prompts_per_step
        total = cfg.steps or per_epoch * cfg.epochs
        phase(f"{len(data)} rows tokenized ({skipped} longer than data.max_seq_len skipped); {total} steps of "
              f"{cfg.prompts_per_step} rows")
        opt = build_optimizer(model, cfg.optim)
        sched = build_scheduler(opt, cfg.optim, total)
        start = load_trainer_state(ckpt, opt, sched, allow_pickle=allow_pickle)["step"] if ckpt is not None else 0
        rd.begin(dataclasses.asdict(cfg))
        remembered = agent_yaml(rows)  # chat / eval / serve --model RUN_DIR prompt the way it trained
        if remembered:
            write_text_atomic(run_dir / "agent.yaml", "# the prompts this SFT run trained on (arpo.commands.from_run)\n"
                              + yaml.safe_dump(remembered, sort_keys=False))
        log = MetricsLogger(run_dir, resume_step=start if ckpt is not None else None, tensorboard=cfg.run.tensorboard,
                            wandb_project=cfg.run.wandb, config=dataclasses.asdict(cfg))
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        last = {}
        finished = start  # the steps done when it returns (a stopped run did not do `total`)
        if start < total:
            phase(f"step {start + 1}/{total} running")
        beat = Heartbeat("sft", enabled=not quiet)  # within a step: its micro-batches
        now = {"step": start}
        micro = MicroBatches(beat, lambda: f"step {now['step'] + 1}/{total}")  # each done; on a timer while one runs
        with GracefulStop() as stop, StepProgress("sft", total, start, enabled=not quiet) as bar, \
                beat.ticking(micro.running):
            for step in range(start, total):
                now["step"] = step
                t0 = time.perf_counter()
                items = [data[i] for i in batch_indices(len(data), cfg.prompts_per_step, cfg.run.seed, step)]
                trees = [{"prompt": p, "responses": [ids], "parent": [-1], "branch_at": [0]} for p, ids, _ in items]
                batch = TreeBatch.from_trees(trees, [[m] for _, _, m in items])
                with autocast(model, compute):  # 16-bit compute over float32 master weights
                    loss, _ = loss_and_backward(
                        model, batch, nll_loss(batch.mask), packed=False, max_tokens=cfg.micro_tokens, pad_id=pad,
                        linear=True, on_micro=micro)
                gnorm = clip_gradients(model, cfg.optim.grad_clip)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                dt = time.perf_counter() - t0
                n_tok = sum(len(p) + len(ids) for p, ids, _ in items)
                last = {"loss": float(loss), "grad_norm": gnorm, "lr": sched.get_last_lr()[0],
                        "tokens": n_tok, "tokens_per_s": n_tok / dt, "step_seconds": dt,
                        "epoch": step // per_epoch}
                done = finished = step + 1
                stopping = stop.requested()
                if done % cfg.run.log_every == 0 or done == total or stopping:
                    log.log(done, last)
                if (cfg.run.save_every and done % cfg.run.save_every == 0) or done == total or stopping:
                    save_checkpoint(run_dir, done, model, tok, opt, sched, {"kind": "sft", "total_steps": total},
                                    keep=cfg.run.keep_checkpoints)
                    rd.checkpoint_written()
                bar.update(done, last)
                if stopping:
                    stop.report("sft", done, total, run_dir)
                    break
    finally:
        if log is not None:
            log.close()
        rd.close()
    final = latest_checkpoint(run_dir)
    return {"steps": finished, "of_steps": total, "rows": len(data), "skipped_too_long": skipped,
            "final_loss": last.get("loss"),
            "checkpoint": str(final) if final else None, "model": str(final / "model") if final else None,
            "stopped_by": stop.signal}
