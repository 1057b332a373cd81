"""Data-parallel training on W processes (`torchrun`): process group, prompt shards, the sharded
(FSDP2) or replicated (DDP) policy, and collectives over plain numbers.

    torchrun --nproc-per-node 8 -m arpo train --config ...        (docs/scaling.md)

Without torchrun's environment (RANK, WORLD_SIZE) nothing here does anything: `init()` returns
False, `shard(n)` is range(n), the collectives return their input and `ParallelModel` hands the
model through unchanged — a single process runs exactly as before.

`ParallelModel(model, mode)` is the policy as train.run uses it:

* `fsdp`: parameters, gradients and optimizer states are sharded with `fully_shard` (one group per
  decoder layer plus a root). FSDP communicates inside every forward and backward, so every rank
  must run the same number of them: `run(batch, fn, grad)` agrees on the largest number of
  micro-batches any rank has before `fn` runs them, then pads with one-token dummy passes.
  Generation (each rank its own number of decode steps) runs on a full-weight replica, refreshed
  by `sync_rollout()` from the shards.
* `hsdp`: the same FSDP2 code on a 2-D device mesh (replicate, shard): parameters are sharded
  within each group of `shard_size` ranks (default: the ranks of one node) and replicated across
  the groups; gradients are reduce-scattered inside a group and all-reduced across groups, so the
  slow inter-node links carry one all-reduce of a shard instead of every layer's all-gather.
* `ddp`: every rank holds the whole model; `reduce_grads()` sums the gradients over ranks
  (bucketed all-reduce) before the optimizer step. The ranks never wait on each other while
  they compute, so no padding is needed.

Gradients are *summed* over ranks in both modes: train.run scales each rank's loss by its share of
the global mini-batch's loss denominator, so the sum is the one-process gradient of that batch.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from arpo.errors import ArpoError
from arpo.training.batch import _micro_packs
from arpo.training.packing import pack_trees, packed_token_logprobs

TIMEOUT = datetime.timedelta(minutes=60)  # ranks wait on each other while one rolls out a long tree
MODES = ("fsdp", "hsdp", "ddp")
SHARDED = ("fsdp", "hsdp")


def launched() -> bool:
    """True under torchrun (or any launcher that sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """Only rank 0 logs, shows progress and writes files."""
    return rank() == 0


def init(device: str = "auto") -> bool:
    """Join torchrun's process group (NCCL when the model lives on CUDA, else gloo). Idempotent;
    False (and a no-op) in a plain single process."""
    if not launched():
        return False
    if not active():
        cuda = torch.cuda.is_available() and not device.startswith("cpu")
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=TIMEOUT)
    return True


def local_device(device: str) -> str:
    """The model device of this rank: under torchrun, CUDA means this rank's GPU (LOCAL_RANK)."""
    if not launched() or device.startswith("cpu") or not torch.cuda.is_available():
        return device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"


def hsdp_mesh_shape(world: int, shard_size: int, local_world: int) -> tuple[int, int]:
    """(replicate, shard) of an HSDP mesh over `world` ranks: groups of shard_size ranks (0: the
    ranks of one node, local_world), replicated world / shard_size times."""
    shard = shard_size or local_world
    if shard < 1 or world % shard:
        raise ArpoError(f"run.hsdp_shard_size={shard_size}: {shard} ranks per shard group must divide the "
                        f"{world} ranks (e.g. the GPUs of one node)")
    return world // shard, shard


def shutdown() -> None:
    if active():
        dist.destroy_process_group()


# ---- prompts and numbers --------------------------------------------------------------------------
def shard(n: int) -> range:
    """This rank's contiguous slice of a global list of n items (sizes differ by at most one);
    concatenating the slices in rank order gives the global order back."""
    r, w = rank(), world_size()
    return range(n * r // w, n * (r + 1) // w)


def _comm_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Element-wise sum (or max) of a list of numbers over ranks (float64)."""
    if not active():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t.tolist()


def total(n):
    """Sum of a number over ranks, of the same type (int stays int)."""
    return n if not active() else type(n)(all_reduce([n])[0])


def gather(obj) -> list:
    """Every rank's `obj` (picklable), in rank order, on every rank."""
    if not active():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if active():
        dist.barrier()


# ---- the model --------------------------------------------------------------------------------------
def _base(model):
    get = getattr(model, "get_base_model", None)  # a peft wrapper: LoRA layers live inside
    return get() if get is not None else model


class _Body(torch.nn.Module):
    """The FSDP root: its forward is the transformer body that batch.py's packed forward calls
    (`model.model(...)`), and the whole model — LM head included, so tied embeddings stay tied —
    is in its subtree."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, **kw):
        return _base(self.lm).model(**kw)


class _TrainView:
    """What token_logprobs / loss_and_backward get in FSDP mode: `.model(**batch)` runs the FSDP
    root; the head's weight is read after it (the root keeps its parameters gathered until the
    backward, reshard_after_forward=False)."""

    def __init__(self, body: _Body, device: torch.device):
        self.model, self.device = body, device  # device: where the inputs go (the shards may be on the CPU)

    def get_output_embeddings(self):
        return _base(self.model.lm).get_output_embeddings()

    @property
    def config(self):  # the transformers config its layers read (tree_attention switches their attention)
        return _base(self.model.lm).config


def generation_copy(model, dtype: torch.dtype | None = None):
    """A frozen eval-mode copy of `model` for generation, its parameters cast to `dtype` (None: as they
    are); buffers (rotary inv_freq) keep their dtype, as in a model loaded in `dtype`."""
    out = copy.deepcopy(model).requires_grad_(False).eval()
    if dtype is not None:
        for p in out.parameters():
            p.data = p.data.to(dtype)
    return out


class ParallelModel:
    """The policy on W ranks (see the module docstring). mode None: one process, all no-ops."""

    def __init__(self, model, mode: str | None, pad_id: int = 0, shard_size: int = 0, replica: bool = True,
                 compute_dtype: torch.dtype | None = None, cpu_offload: bool = False):
        if mode not in (None, *MODES):
            raise ValueError(f"run.distributed: {mode!r}; choose {', '.join(MODES)}")
        if cpu_offload and mode not in SHARDED:
            raise ArpoError("memory.cpu_offload needs torchrun with run.distributed fsdp or hsdp (FSDP2's "
                            "CPUOffloadPolicy; one GPU: torchrun --nproc-per-node 1)")
        self.model, self.mode, self.pad_id = model, mode, pad_id
        self.device = next(model.parameters()).device  # where the passes compute (offloaded shards live on the CPU)
        self.rollout = self.train = model  # generation / old log-probs, and the training passes
        # compute_dtype (bf16/fp16 over float32 master weights, optim.master_compute): the training passes
        # compute in it (autocast; FSDP2's MixedPrecisionPolicy under fsdp/hsdp, gradients reduced in float32)
        # and generation runs on a replica in it (not on the float32 master: decoding reads every weight per token)
        self.compute = compute_dtype
        # FSDP: a full replica for generation (hf/vllm engines). replica=False (a remote engine, vllm_server,
        # generates elsewhere): none; `rollout` is the sharded policy, old log-probs go through `run`
        self.replica = replica or mode not in SHARDED
        self._copy = (replica and compute_dtype is not None) or (self.replica and mode in SHARDED)
        if self._copy:
            self.rollout = generation_copy(model, compute_dtype)
        if mode == "ddp":
            with torch.no_grad():  # identical replicas, whatever each rank's load did
                for t in list(model.parameters()) + list(model.buffers()):
                    dist.broadcast(t.data, src=0)
        elif mode in SHARDED:
            dev = next(model.parameters()).device.type
            if mode == "hsdp":  # fully_shard on a 2-D mesh is HSDP: replicate over dim 0, shard over dim 1
                shape = hsdp_mesh_shape(world_size(), shard_size, int(os.environ.get("LOCAL_WORLD_SIZE", world_size())))
                mesh = init_device_mesh(dev, shape, mesh_dim_names=("replicate", "shard"))
            else:
                mesh = init_device_mesh(dev, (world_size(),))
            mp = (MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
                  if compute_dtype is not None else MixedPrecisionPolicy())
            off = CPUOffloadPolicy(pin_memory=self.device.type == "cuda") if cpu_offload else OffloadPolicy()
            for layer in getattr(_base(model).model, "layers", []):
                fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=off)
            body = _Body(model)
            # fully_shard converts body in place and returns it, typed as the FSDPModule side
            self.fsdp = fully_shard(body, mesh=mesh, reshard_after_forward=False, mp_policy=mp, offload_policy=off)
            for m in body.modules():
                if isinstance(m, FSDPModule):
                    m.set_gradient_divide_factor(1.0)  # sum, not mean: the loss is pre-scaled
                    # a plain SUM reduce-scatter: with factor 1 FSDP2 would pick PREMUL_SUM for fp32/bf16
                    # gradients, which gloo (CPU) does not have; SUM with no scaling is the same math
                    m.set_force_sum_reduction_for_comms(True)
            self.train = _TrainView(body, self.device)
            self._synced = False

    def autocast(self):
        """The context of a pass through the unsharded policy: autocast to compute_dtype (FSDP casts itself)."""
        if self.compute is None or self.mode in SHARDED:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute)

    def sync_rollout(self) -> None:
        """Copy the current weights into the generation replica (FSDP: from the shards; every rank calls
        it). No replica (one process in the weights' own dtype, a remote engine): nothing to do."""
        if not self._copy:
            return
        if self.mode not in SHARDED:
            with torch.no_grad():
                for p, s in zip(self.rollout.parameters(), self.model.parameters(), strict=True):
                    p.copy_(s)
            return

        self.fsdp.reshard()
        src = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, p in self.rollout.named_parameters():
                s = src[name]
                if self._synced and not s.requires_grad:
                    continue  # frozen (LoRA base): copied once
                p.copy_(s.full_tensor() if isinstance(s, DTensor) else s)
        self._synced = True

    def old_logprobs(self, batch, fn, packed: bool = True, max_tokens: int = 4096, **_):
        """fn(model) with the weights the update starts from (π_old): one process / ddp, the policy itself
        (under autocast over float32 masters); FSDP, the replica, or without one the sharded train view
        through `run` (then every rank calls this, batch None on a rank without data). Returns fn's result,
        or None where batch is None."""
        if self.mode not in SHARDED:  # the policy itself, as the training passes compute (a bf16 generation
            if batch is None:  # copy would differ from autocast over float32 masters by bf16 rounding)
                return None
            with self.autocast():
                return fn(self.model)
        if self.replica:
            return fn(self.rollout) if batch is not None else None
        return self.run(batch, lambda: fn(self.train), grad=False, packed=packed, max_tokens=max_tokens)

    def run(self, batch, fn, grad: bool, packed: bool = True, max_tokens: int = 4096, **_):
        """fn(): token_logprobs or loss_and_backward of `batch` through self.train (batch None: this
        rank has no data, fn is not called). FSDP: every rank then runs as many passes as the rank
        with the most micro-batches, padding with dummy passes. The count must be agreed before any
        pass starts: each pass is a sequence of collectives that all ranks must join."""
        if self.mode not in SHARDED:
            if batch is None:
                return None
            with self.autocast():
                return fn()

        n = len(_micro_packs(batch, packed, max_tokens)) if batch is not None else 0
        (most,) = all_reduce([n], op="max")
        out = fn() if batch is not None else None
        for _pad in range(int(most) - n):
            self._dummy_pass(grad)
        if not grad:
            self.fsdp.reshard()
        return out

    def _dummy_pass(self, grad: bool) -> None:
        pack = pack_trees([{"prompt": [self.pad_id], "responses": [[self.pad_id]], "parent": [-1], "branch_at": [0]}])
        with torch.set_grad_enabled(grad):
            ((lp, _),) = packed_token_logprobs(self.train, pack)
            if grad:
                (lp.sum() * 0.0).backward()  # same collectives as a real pass, zero gradient

    def reduce_grads(self) -> None:
        """DDP: sum the gradients over ranks (FSDP reduce-scatters them in backward)."""
        if self.mode != "ddp":
            return
        params = [p for p in self.model.parameters() if p.requires_grad]
        # a parameter without gradient on every rank keeps none (as in one process); else zeros join in
        has = all_reduce([float(p.grad is not None) for p in params], op="max")
        for p, h in zip(params, has, strict=True):
            if h and p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params if p.grad is not None]
        bucket: list[torch.Tensor] = []
        for i, g in enumerate(grads):
            bucket.append(g)
            nxt = grads[i + 1] if i + 1 < len(grads) else None
            if nxt is None or nxt.dtype != g.dtype or sum(b.numel() for b in bucket) >= 2**25:
                flat = torch._utils._flatten_dense_tensors(bucket)  # one all-reduce per ~32M values
                dist.all_reduce(flat)
                for b, s in zip(bucket, torch._utils._unflatten_dense_tensors(flat, bucket), strict=True):
                    b.copy_(s)
                bucket = []
