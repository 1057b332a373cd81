"""Checkpoint state that loads without running code (issue 61): tensors in safetensors, the rest in JSON.

`torch.save` / `torch.load(weights_only=False)` is pickle: reading a downloaded run's `trainer.pt`
ran its code. `save_state(obj, NAME.json)` writes the structure to NAME.json and every tensor to
NAME.safetensors; `load_state` rebuilds it from JSON values, tensors, tuples, dicts with any
hashable JSON keys, numpy arrays, and only the dataclasses in `allowed_classes()` (the rollout
trees'), built by name from that table, never imported from the file. What it saves: optimizer,
scheduler and RNG states, the off-policy pipeline's in-flight trees; what it does not know
(any other type) is refused on save, so nothing is silently lost.

Floats go through JSON as `repr` (exact), tensors byte for byte: a resume is as exact as before.

    encode(x):  tensor -> {"__tensor__": key};  tuple -> {"__tuple__": [...]}
                ndarray -> {"__ndarray__": key, "dtype": d}; dataclass -> {"__dataclass__": name, "fields": {...}}
                dict with non-str or "__"-prefixed keys -> {"__dict__": [[k, v], ...]}
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from arpo.errors import ArpoError
from arpo.rewards.result import RewardResult
from arpo.rollout.agent import ToolCallRecord, Trajectory
from arpo.rollout.tree import Node, RolloutTree, TreeTrajectory


def allowed_classes() -> dict[str, type]:
    """The dataclasses a state file may name: the rollout trees' parts."""
    return {c.__name__: c for c in (RewardResult, ToolCallRecord, Trajectory, Node, RolloutTree, TreeTrajectory)}


def _encode(x, tensors: dict):
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = x.detach().to("cpu", copy=True).contiguous()
        return {"__tensor__": key}
    if isinstance(x, np.ndarray):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(x.astype(np.int64) if x.dtype.kind in "ui" else np.array(x, copy=True))
        return {"__ndarray__": key, "dtype": x.dtype.str}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in x]}
    if isinstance(x, list):
        return [_encode(v, tensors) for v in x]
    if isinstance(x, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in x):
            return {k: _encode(v, tensors) for k, v in x.items()}
        return {"__dict__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in x.items()]}
    if dataclasses.is_dataclass(x) and not isinstance(x, type) and type(x).__name__ in allowed_classes():
        return {"__dataclass__": type(x).__name__,
                "fields": {f.name: _encode(getattr(x, f.name), tensors) for f in dataclasses.fields(x)}}
    raise TypeError(f"cannot save a {type(x).__module__}.{type(x).__qualname__} in a checkpoint's state "
                    "(training/safe_state.py saves JSON values, tensors, arrays and the rollout trees)")


def _key(k):
    return tuple(_key(v) for v in k) if isinstance(k, list) else k


def _decode(x, tensors: dict, classes: dict):
    if isinstance(x, list):
        return [_decode(v, tensors, classes) for v in x]
    if not isinstance(x, dict):
        return x
    if "__tensor__" in x:
        return tensors[x["__tensor__"]]
    if "__ndarray__" in x:
        return tensors[x["__ndarray__"]].numpy().astype(np.dtype(x["dtype"]))
    if "__tuple__" in x:
        return tuple(_decode(v, tensors, classes) for v in x["__tuple__"])
    if "__dict__" in x:
        return {_key(_decode(k, tensors, classes)): _decode(v, tensors, classes) for k, v in x["__dict__"]}
    if "__dataclass__" in x:
        cls = classes.get(x["__dataclass__"])
        if cls is None:
            raise ValueError(f"names the type {x['__dataclass__']!r}, which a checkpoint may not hold")
        return cls(**{k: _decode(v, tensors, classes) for k, v in x["fields"].items()})
    return {k: _decode(v, tensors, classes) for k, v in x.items()}


def tensors_path(path: Path) -> Path:
    return path.with_suffix(".safetensors")


def save_state(obj, path: str | Path) -> None:
    """`obj` as `path` (JSON, ending .json) and its tensors as the same name ending .safetensors."""
    path = Path(path)
    tensors: dict = {}
    doc = _encode(obj, tensors)
    save_file(tensors, str(tensors_path(path)))
    path.write_text(json.dumps(doc))


def load_state(path: str | Path):
    """What save_state wrote; runs no code from the files. Raises ArpoError naming the file."""
    path = Path(path)
    try:
        tensors = load_file(str(tensors_path(path)))
        return _decode(json.loads(path.read_text()), tensors, allowed_classes())
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ArpoError(f"{path}: cannot read the checkpoint's state ({type(e).__name__}: {e})") from e
