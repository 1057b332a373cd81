"""Atomic, resumable checkpoints.

    RUN_DIR/checkpoints/step_000004/   model/ (HF save_pretrained: safetensors + config + tokenizer,
                                              or a peft adapter), trainer.json + trainer.safetensors
                                              (optimizer, scheduler, RNG states), state.json (step,
                                              data position, ...)
    RUN_DIR/checkpoints/latest          the name of the newest complete checkpoint

A checkpoint is written into a temporary sibling directory, fsynced, then renamed into place, and
only then does `latest` move (write + os.replace). A crash at any moment leaves the previous
checkpoint intact and never a half-written one under a final name. `state.json` is written last,
so a directory without it is never considered complete.

Nothing in a checkpoint is a pickle (issue 61): trainer state and the off-policy pipeline's in-flight
trees are JSON + safetensors (training/safe_state.py), which load without running code. Checkpoints of
older arpo versions keep them in trainer.pt / in_flight*.pt (pickles, which run whatever code they
hold when read): those resume only with `allow_pickle` (`arpo train|sft --resume
--trust-pickled-checkpoint`), else the error names the flag.

A distributed run (torchrun, training/distributed.py) writes the same layout, with model and
optimizer state in `torch.distributed.checkpoint` (DCP) format instead of inside trainer.pt:

    step_000004/dcp/        every rank's shards of {model, optim} (+ .metadata); LoRA: adapter only
                model/      config, tokenizer and the full weights (gathered to rank 0), as above
                trainer.json (+ .safetensors)  scheduler and rank 0's RNG state;  state.json (+ world_size)

DCP reshards on load, so such a checkpoint resumes on any number of ranks, and in a single
process too (`load_distributed_state`); a single-process checkpoint also resumes under torchrun.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from arpo.errors import ArpoError
from arpo.runs import fsync_dir, list_checkpoints
from arpo.runs import latest_checkpoint as latest_checkpoint  # re-exported: the readers of this layout
from arpo.runs import write_text_atomic as write_text_atomic  # re-exported: the writers of this layout
from arpo.training.safe_state import load_state, save_state

TRAINER = "trainer.json"  # optimizer, scheduler and RNG states (tensors in trainer.safetensors)
LEGACY_TRAINER = "trainer.pt"  # an older arpo's pickle
PICKLE_FLAG = "--trust-pickled-checkpoint"


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer=None, optimizer=None, scheduler=None,
                    state: dict | None = None, keep: int = 2, files: dict | None = None) -> Path:
    """Write checkpoint `step` atomically and prune all but the newest `keep`. Returns its path.
    `files`: {name.json: object} also saved in it (safe_state), e.g. the off-policy pipeline's in-flight trees."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".step_{step:06d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        _write_files(tmp, step, model, tokenizer, optimizer, scheduler, state, files)
    except BaseException as e:  # a full disk: no half-written folder left behind (it was), one line
        shutil.rmtree(tmp, ignore_errors=True)
        from safetensors import SafetensorError  # noqa: PLC0415 - with the weights' writer

        # torch.save reports a failed write as a RuntimeError, safetensors as a SafetensorError
        if isinstance(e, (OSError, RuntimeError, SafetensorError)):
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:200]
            raise ArpoError(f"cannot write the checkpoint of step {step} in {root} ({why}); the earlier checkpoints "
                            "are kept: free space (or set run.dir elsewhere) and resume with --resume") from None
        raise
    _publish(tmp, final, run_dir, keep)
    return final


def _write_files(tmp: Path, step: int, model, tokenizer, optimizer, scheduler, state, files) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(tmp / "model", safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    save_state({
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(),
    }, tmp / TRAINER)
    for name, obj in (files or {}).items():
        save_state(obj, tmp / name)
    with open(tmp / "state.json", "w") as f:
        json.dump({"step": step, **(state or {})}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _publish(tmp: Path, final: Path, run_dir, keep: int) -> None:
    """Make a fully written checkpoint dir visible: fsync its files, rename it into place (replacing
    a re-saved step, e.g. after a resume), point `latest` at it, prune to the newest `keep`."""
    root = final.parent
    for p in tmp.rglob("*"):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(root)
    write_text_atomic(root / "latest", final.name + "\n")
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".latest.tmp-*"):  # a pointer write cut short by a killed process
        stale.unlink(missing_ok=True)


def read_pickle(path: Path, allow_pickle: bool, what: str):
    """An older checkpoint's pickled file, only with `allow_pickle`; else an ArpoError naming PICKLE_FLAG."""
    if not allow_pickle:
        raise ArpoError(f"{path}: {what} of an older arpo's checkpoint is a pickle, and reading a pickle runs any "
                        f"code it holds; resume it only if you wrote it, with {PICKLE_FLAG} (the next checkpoint "
                        "is written without pickles)")
    return torch.load(path, weights_only=False)


def read_trainer(ckpt: Path, allow_pickle: bool = False) -> dict:
    """The checkpoint's optimizer / scheduler / RNG states (TRAINER; LEGACY_TRAINER with allow_pickle)."""
    if (ckpt / TRAINER).is_file():
        return load_state(ckpt / TRAINER)
    if (ckpt / LEGACY_TRAINER).is_file():
        return read_pickle(ckpt / LEGACY_TRAINER, allow_pickle, "the trainer state (trainer.pt)")
    raise ArpoError(f"{ckpt}: no trainer state ({TRAINER}) in this checkpoint")


def load_trainer_state(ckpt: str | Path, optimizer=None, scheduler=None, restore_rng: bool = True,
                       allow_pickle: bool = False) -> dict:
    """Restore optimizer / scheduler / RNG from a checkpoint; returns its state.json dict."""
    ckpt = Path(ckpt)
    state = json.loads((ckpt / "state.json").read_text())
    blob = read_trainer(ckpt, allow_pickle)
    if optimizer is not None and blob.get("optimizer") is not None:
        optimizer.load_state_dict(blob["optimizer"])
    if scheduler is not None and blob.get("scheduler") is not None:
        scheduler.load_state_dict(blob["scheduler"])
    if restore_rng:
        set_rng_state(blob["rng"])
    return state


# ---- distributed (DCP) checkpoints ---------------------------------------------------------------
def is_distributed_checkpoint(ckpt: str | Path) -> bool:
    return (Path(ckpt) / "dcp").is_dir()


def _dsd_options(**kw):
    return StateDictOptions(ignore_frozen_params=True, **kw)  # LoRA: the frozen base is model.name


def _full_weights(model) -> dict:
    """The full (unsharded) state dict, on rank 0 only; tied parameters share one tensor again, so
    save_pretrained drops the duplicates as it does for an unsharded model."""
    full = get_model_state_dict(model, options=_dsd_options(full_state_dict=True, cpu_offload=True))
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if name in full and id(p) in first and first[id(p)] in full:
            full[name] = full[first[id(p)]]
        first.setdefault(id(p), name)
    return full


def save_distributed_checkpoint(run_dir: str | Path, step: int, model, tokenizer=None, optimizer=None,
                                scheduler=None, state: dict | None = None, keep: int = 2,
                                files: dict | None = None) -> Path:
    """`save_checkpoint` for a torchrun run; every rank calls it. Each rank writes its shards into
    the temporary directory, and its own `files` ({name.json: object}, safe_state; names must differ per
    rank); after a barrier rank 0 adds model/, trainer.pt and state.json and renames it into place
    (same atomicity as save_checkpoint). Returns the final path."""
    main = dist.get_rank() == 0
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".step_{step:06d}.tmp-dcp"  # the same name on every rank (and node)
    if main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    dist.barrier()
    msd, osd = get_state_dict(model, optimizer, options=_dsd_options())
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / "dcp"))
    full = _full_weights(model)
    for name, obj in (files or {}).items():  # this rank's (names differ per rank, e.g. in-flight trees)
        save_state(obj, tmp / name)
    dist.barrier()  # every shard (and every rank's file) is on disk
    if main:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model.save_pretrained(tmp / "model", state_dict=full, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "model")
        save_state({"scheduler": scheduler.state_dict() if scheduler is not None else None, "rng": rng_state()},
                   tmp / TRAINER)
        with open(tmp / "state.json", "w") as f:
            json.dump({"step": step, "world_size": dist.get_world_size(), **(state or {})}, f, indent=1)
        _publish(tmp, final, run_dir, keep)
    dist.barrier()
    return final


def _keyed_by_name(opt_state: dict, model, optimizer) -> dict:
    """A single-process optimizer state dict (parameters numbered in param_groups order) keyed by
    parameter names instead, as torch.distributed.checkpoint.state_dict expects."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    return {"state": {order[i]: v for i, v in opt_state["state"].items()},
            "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in opt_state["param_groups"]]}


def load_distributed_state(ckpt: str | Path, model, optimizer=None, scheduler=None, restore_rng: bool = True,
                           allow_pickle: bool = False) -> dict:
    """Restore model, optimizer, scheduler and RNG from a DCP checkpoint on any number of ranks (or
    in one process), or from a single-process checkpoint into a torchrun run (the model weights then
    come from its model/ directory, loaded before sharding). Returns its state.json dict."""
    ckpt = Path(ckpt)
    state = json.loads((ckpt / "state.json").read_text())
    blob = read_trainer(ckpt, allow_pickle)
    if is_distributed_checkpoint(ckpt):
        msd, osd = get_state_dict(model, optimizer, options=_dsd_options())
        with warnings.catch_warnings():  # in one process: "assuming the intent is to load in a single process"
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.load({"model": msd, "optim": osd}, checkpoint_id=str(ckpt / "dcp"))
        set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd, options=_dsd_options())
    elif optimizer is not None and blob.get("optimizer") is not None:
        set_optimizer_state_dict(model, optimizer, _keyed_by_name(blob["optimizer"], model, optimizer),
                                 options=_dsd_options(full_state_dict=True))
    if scheduler is not None and blob.get("scheduler") is not None:
        scheduler.load_state_dict(blob["scheduler"])
    if restore_rng:
        set_rng_state(blob["rng"])
    return state
