"""Optimizer, learning-rate schedule and (optionally) a LoRA adapter, from config sections."""

from __future__ import annotations

import contextlib
import math

import torch
from safetensors.torch import load_file

from arpo.errors import ArpoError
from arpo.models import load_model, lora_adapter, pick_device


def build_optimizer(model, cfg) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters; no weight decay on biases and norm weights."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    if not decay and not no_decay:
        raise ArpoError("the model has no trainable parameters")
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), foreach=False)


def lr_lambda(cfg, total_steps: int):
    def f(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        span = max(1, total_steps - cfg.warmup_steps)
        t = min(1.0, (step - cfg.warmup_steps) / span)
        shape = 0.5 * (1 + math.cos(math.pi * t)) if cfg.schedule == "cosine" else 1 - t
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape

    return f


def build_scheduler(optimizer, cfg, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total_steps))


def clip_gradients(model, max_norm: float) -> float:
    """Clip the global gradient norm to max_norm (0: don't) and return the norm before clipping.
    With FSDP the gradients are DTensor shards and the norm is reduced over ranks."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    sharded = hasattr(params[0].grad, "full_tensor")  # a DTensor
    if max_norm and max_norm > 0 or sharded:  # max_norm inf: clip_grad_norm_ only scales by 1.0
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm and max_norm > 0 else float("inf"))
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    return float(torch.norm(torch.stack([p.grad.detach().norm() for p in params])))


def apply_lora(model, cfg):
    """Wrap the model with a peft LoRA adapter (only adapter weights train)."""
    if not cfg.enabled:
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ArpoError("lora.enabled needs peft: pip install 'arpo[train]'") from e
    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    targets = [t for t in cfg.target_modules if t in present]
    if not targets:
        raise ArpoError(f"lora.target_modules {cfg.target_modules} match no module of this model")
    return get_peft_model(model, LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                            target_modules=targets, task_type="CAUSAL_LM"))


def decoder_layers(model):
    """The list of decoder blocks of a transformers causal LM (model.model.layers and the like)."""
    inner = getattr(base_model(model), "model", None)
    for obj in (inner, getattr(inner, "decoder", None), getattr(base_model(model), "transformer", None)):
        for name in ("layers", "h"):
            layers = getattr(obj, name, None) if obj is not None else None
            if isinstance(layers, torch.nn.ModuleList):
                return layers
    raise ArpoError("model.train_layers: cannot find the decoder layers of this model")


def freeze_lower_layers(model, n_top: int):
    """Train only the top `n_top` decoder blocks and the final norm: every other weight (embeddings,
    a tied or separate output head, the lower blocks) gets requires_grad=False. 0: unchanged."""
    if not n_top:
        return model
    layers = decoder_layers(model)
    if not 1 <= n_top <= len(layers):
        raise ArpoError(f"model.train_layers={n_top}: must be in [0, {len(layers)}] (this model's layers)")
    keep = {id(p) for blk in layers[len(layers) - n_top:] for p in blk.parameters()}
    norm = getattr(getattr(base_model(model), "model", None), "norm", None)
    if norm is not None:
        keep |= {id(p) for p in norm.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    return model


def checkpoint_activations(model):
    """memory.activation_checkpointing: every decoder layer recomputes its activations in the
    backward instead of keeping them (transformers' gradient_checkpointing_enable with torch's
    non-reentrant checkpoint: the same gradients, works inside FSDP2's per-layer groups, and needs
    no input that requires grad, so LoRA and frozen lower layers work unchanged). Only in train
    mode: generation (eval mode) runs the layers as before."""
    base_model(model).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def base_model(model):
    """The transformers model under a peft wrapper (for .model / get_output_embeddings)."""
    get = getattr(model, "get_base_model", None)
    return get() if get is not None else model


HALF = ("bfloat16", "float16")


def compute_dtype(dtype: str, device: str) -> str:
    """model.dtype as the dtype the policy computes in: auto is bfloat16 on CUDA, float32 elsewhere."""
    if dtype == "auto":
        return "bfloat16" if pick_device(device).startswith("cuda") else "float32"
    return dtype


def master_compute(model_cfg, lora_cfg) -> torch.dtype | None:
    """The compute dtype when the policy keeps float32 master weights, else None.

    Full-parameter training with a 16-bit model.dtype (bfloat16, float16) keeps the weights and
    AdamW's moments in float32 and computes in the 16-bit dtype (autocast in one process, FSDP2's
    MixedPrecisionPolicy under torchrun): an AdamW update is ~lr, and bfloat16's spacing near a
    weight w is 2^(⌊log2|w|⌋−7) (1.2e-4 at 0.02), so at lr 1e-6 a bf16 weight would round almost
    every update away (issue 60). LoRA keeps its frozen base in the 16-bit dtype (peft keeps the
    adapter's trainable weights in float32 already): None."""
    dt = compute_dtype(model_cfg.dtype, model_cfg.device)
    if dt not in HALF or lora_cfg.resolve(model_cfg.name).enabled:
        return None
    return getattr(torch, dt)


def autocast(model, dtype: torch.dtype | None):
    """A context that computes `model`'s forward (and its backward) in `dtype` (None: a no-op)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=dtype)


def load_policy(model_cfg, lora_cfg, ckpt=None):
    """(model, tokenizer) to train: the configured model, or a checkpoint's weights on resume; with
    LoRA, the base model wrapped in an adapter (restored from the checkpoint on resume). A model
    that is a LoRA adapter (a run of sft/train with lora) trains that adapter on (lora.enabled
    null or true), or is merged into its base and trains all weights (lora.enabled false).
    With a 16-bit model.dtype and full-parameter training the weights load in float32: the master
    weights (master_compute); checkpoints then hold them in float32."""
    lora = lora_cfg.resolve(model_cfg.name)
    if getattr(model_cfg, "train_layers", 0) and lora.enabled:
        raise ArpoError("model.train_layers and lora.enabled do not combine; choose one"
                        + (f" (model.name {model_cfg.name} is a LoRA adapter: set lora.enabled=false to merge it "
                           "and train the top layers)" if lora_cfg.enabled is None else ""))
    continued = lora.enabled and lora_adapter(model_cfg.name) is not None
    src = str(ckpt / "model") if ckpt is not None and not lora.enabled else model_cfg.name
    dtype = "float32" if master_compute(model_cfg, lora_cfg) is not None else model_cfg.dtype
    model, tok = load_model(src, model_cfg.device, dtype, merge_adapter=not continued)
    if getattr(model_cfg, "train_layers", 0):
        freeze_lower_layers(model, model_cfg.train_layers)
    if lora.enabled:
        if not continued:
            model = apply_lora(model, lora)
        if ckpt is not None:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(model, load_file(str(ckpt / "model" / "adapter_model.safetensors")))
    return model, tok
