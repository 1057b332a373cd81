"""Atomic, resumable checkpoints.

    RUN_DIR/checkpoints/step_000004/   model/ (HF save_pretrained: safetensors + config + tokenizer,
                                              or a peft adapter), trainer.pt (optimizer, scheduler,
                                              RNG states), state.json (step, data position, ...)
    RUN_DIR/checkpoints/latest          the name of the newest complete checkpoint

A checkpoint is written into a temporary sibling directory, fsynced, then renamed into place, and
only then does `latest` move (write + os.replace). A crash at any moment leaves the previous
checkpoint intact and never a half-written one under a final name. `state.json` is written last,
so a directory without it is never considered complete.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from arpo.errors import ArpoError


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer=None, optimizer=None, scheduler=None,
                    state: dict | None = None, keep: int = 2) -> Path:
    """Write checkpoint `step` atomically and prune all but the newest `keep`. Returns its path."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".step_{step:06d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(tmp / "model", safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    torch.save({
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(),
    }, tmp / "trainer.pt")
    with open(tmp / "state.json", "w") as f:
        json.dump({"step": step, **(state or {})}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    for p in tmp.rglob("*"):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
    if final.exists():  # re-saving the same step (e.g. after a resume): replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    write_text_atomic(root / "latest", final.name + "\n")
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints (those with state.json), oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.glob("step_*") if p.is_dir() and (p / "state.json").is_file()]
    return sorted(done, key=lambda p: int(p.name.split("_")[1]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if pointer.is_file():
        cand = root / pointer.read_text().strip()
        if (cand / "state.json").is_file():
            return cand
    done = list_checkpoints(run_dir)
    return done[-1] if done else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint dir, or a run dir (its latest checkpoint)."""
    p = Path(path)
    if (p / "state.json").is_file():
        return p
    ck = latest_checkpoint(p)
    if ck is None:
        raise ArpoError(f"{path}: no complete checkpoint here (expected RUN_DIR/checkpoints/step_*/state.json)")
    return ck


def load_trainer_state(ckpt: str | Path, optimizer=None, scheduler=None, restore_rng: bool = True) -> dict:
    """Restore optimizer / scheduler / RNG from a checkpoint; returns its state.json dict."""
    ckpt = Path(ckpt)
    state = json.loads((ckpt / "state.json").read_text())
    blob = torch.load(ckpt / "trainer.pt", weights_only=False)
    if optimizer is not None and blob.get("optimizer") is not None:
        optimizer.load_state_dict(blob["optimizer"])
    if scheduler is not None and blob.get("scheduler") is not None:
        scheduler.load_state_dict(blob["scheduler"])
    if restore_rng:
        set_rng_state(blob["rng"])
    return state


def resume_from(run_dir: str | Path, resume: bool) -> Path | None:
    """The checkpoint `--resume` continues from (None without --resume); an error if there is none."""
    if not resume:
        return None
    ck = latest_checkpoint(run_dir)
    if ck is None:
        raise ArpoError(f"--resume: no checkpoint in {run_dir}/checkpoints")
    return ck
