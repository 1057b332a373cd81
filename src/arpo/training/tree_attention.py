"""Block-sparse attention for tree-packed sequences: the attention of a packed tree costs what its
trajectories need, not the square of the pack.

A pack (training/packing.py) lays a tree out as `[prompt][own tokens of traj 0][own tokens of traj 1]…`
with a boolean tree mask. Dense SDPA over that mask does S² work for a pack of S tokens, although a
token sees only the prompt, its ancestors' tokens and its own prefix: with 4 trees of 8 trajectories
(≈ 3,500 tokens a pack) about 5× more than needed, and 40 % of a training step on the CPU.

Here the queries are cut into blocks of `BLOCK` rows; block [s, e) of batch row b attends only to

    K(b, s, e) = { k : mask[b, q, k] for some q in [s, e) }

(its keys gathered, its mask rows restricted to them), with one SDPA call per block. A key outside
K(b, s, e) is masked for every query of the block, so it adds exp(−∞) = 0 to each softmax: the result
equals dense masked attention up to floating-point summation order, for any boolean mask.

It is a transformers attention function (`AttentionInterface`), switched on only around the packed
forward and backward (`use_tree_attention`); every other call (generation, float masks, short
queries, tensors on a GPU) goes to transformers' own SDPA function unchanged. On a GPU SDPA's fused
kernels take the dense mask without materializing it; whether blocks pay there is not measured, so
the GPU keeps dense SDPA (and training/memory.py's estimate, which counts the dense mask, holds).

Memory (CPU): each block saves its gathered keys and values, 2·|K|·H_kv·d values (grouped heads are
not repeated: SDPA's enable_gqa), and its (rows, |K|) boolean mask, in place of the dense path's
additive (S, S) mask and repeated K/V.
"""

from __future__ import annotations

import contextlib
import functools
import weakref

import torch

NAME = "arpo_tree_sdpa"
BLOCK = 128  # query rows per block: smaller blocks see fewer keys but cost more calls

_plan_cache: dict[str, tuple] = {}  # the last mask's plan (weakref to the mask, its version, the plan)


def block_plan(mask: torch.Tensor, block: int) -> list[list[tuple[int, int, torch.Tensor]]]:
    """Per batch row b, the blocks (s, e, keys): keys = sorted indices k with mask[b, 0, q, k] for some q
    in [s, e). mask: (B, 1, S_q, S_k) bool."""
    plan = []
    for b in range(mask.shape[0]):
        rows = []
        for s in range(0, mask.shape[2], block):
            e = min(s + block, mask.shape[2])
            rows.append((s, e, mask[b, 0, s:e].any(0).nonzero()[:, 0]))
        plan.append(rows)
    return plan


def _cached_plan(mask: torch.Tensor) -> list[list[tuple[int, int, torch.Tensor]]]:
    """The plan of `mask`, computed once per mask (every layer of a forward gets the same tensor). The
    cache holds a weak reference: a new mask at a freed mask's address never reuses its plan."""
    hit = _plan_cache.get("last")
    if hit is not None and hit[0]() is mask and hit[1] == (mask._version, BLOCK):
        return hit[2]
    plan = block_plan(mask, BLOCK)
    _plan_cache["last"] = (weakref.ref(mask), (mask._version, BLOCK), plan)
    return plan


def tree_sdpa_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, **kwargs):
    """transformers attention function: query (B, H, S, D), key/value (B, H_kv, S, D) -> ((B, S, H, D), None).
    Block-sparse for a (B, 1, S, S) boolean mask over at least two blocks; otherwise SDPA as transformers
    does it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (query.device.type != "cpu" or attention_mask is None or attention_mask.dtype != torch.bool
            or attention_mask.dim() != 4
            or attention_mask.shape[1] != 1 or query.shape[2] != key.shape[2] or query.shape[2] < 2 * BLOCK
            or kwargs.get("cache") is not None or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    gqa = query.shape[1] != key.shape[1]  # grouped heads: SDPA repeats K/V itself, nothing repeated is saved
    outs = []
    for b, blocks in enumerate(_cached_plan(attention_mask)):
        row = []
        for s, e, keys in blocks:
            m = attention_mask[b:b + 1, :, s:e][..., keys]
            row.append(torch.nn.functional.scaled_dot_product_attention(
                query[b:b + 1, :, s:e], key[b:b + 1, :, keys], value[b:b + 1, :, keys], attn_mask=m,
                dropout_p=dropout, scale=scaling, enable_gqa=gqa))
        outs.append(torch.cat(row, dim=2))
    return torch.cat(outs, dim=0).transpose(1, 2).contiguous(), None


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, tree_sdpa_forward)


def _config(model):
    get_base = getattr(model, "get_base_model", None)  # a peft wrapper: the config is its base model's
    return getattr(get_base() if get_base is not None else model, "config", None)


def skips_masked_blocks(model, device: torch.device) -> bool:
    """Whether use_tree_attention(model) on `device` attends block-sparse, so that keys no row of a block
    sees cost nothing (packing.collate's one_row layout pays only then): an SDPA model on the CPU."""
    return device.type == "cpu" and getattr(_config(model), "_attn_implementation", None) in ("sdpa", NAME)


@contextlib.contextmanager
def use_tree_attention(model):
    """Run `model` (a transformers model whose attention is SDPA) with tree_sdpa_forward inside the block;
    any other attention implementation (eager, flash, flex) is left as it is."""
    config = _config(model)
    before = getattr(config, "_attn_implementation", None)
    if before != "sdpa":
        yield
        return
    _register()
    assert config is not None
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
