"""Token log-probs and entropies from hidden states, in chunks: never the whole (tokens, vocab) logits.

With a 49k vocabulary the logits of 4096 tokens are 0.8 GB in fp32, and a plain autograd graph
keeps them, their log-softmax and their gradient alive at once. `token_logprobs` is an
autograd.Function that, in forward, computes the logits of `chunk_size` rows at a time and keeps
only per-row statistics (log-sum-exp, entropy); backward recomputes each chunk's logits and turns
them straight into the gradients of the hidden states, of the output matrix and of the bias.
Peak extra memory: about two (chunk_size, V) buffers in the compute dtype.

For row n with logits z = (W h + b) / T, p = softmax(z), target y:
    logp = z_y − lse(z)                d logp / dz_j = onehot(y)_j − p_j
    H    = lse(z) − Σ_k p_k z_k        d H / dz_j    = −p_j (z_j − Σ_k p_k z_k) = −p_j (log p_j + H)
and dz/dh = W / T, dz/dW = h / T, dz/db = 1 / T.

Logits are computed in float32 (float64 for float64 inputs) whatever the model dtype: a bf16
matmul output would round logits of magnitude ~20 to ±0.06, which is visible in PPO ratios.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable


def _cdt(*xs: torch.Tensor | None) -> torch.dtype:
    """Compute dtype: at least float32 (bf16/fp16 -> fp32; fp64 stays fp64)."""
    dt = torch.float32
    for x in xs:
        if x is not None:
            dt = torch.promote_types(dt, x.dtype)
    return dt


def _logits(h, w, b, temperature):
    """(c, V) logits of one chunk in the compute dtype of w (a fresh buffer we may overwrite)."""
    h = h.to(w.dtype)
    z = torch.addmm(b, h, w.t()) if b is not None else h @ w.t()
    if temperature != 1.0:
        z.div_(temperature)
    return z


def _rowdot(a, b):
    """Σ_j a_ij b_ij per row without a (c, V) temporary."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def _no_autocast(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run fn with autocast off (the logits stay float32 under a bf16 autocast of the model's forward,
    and so does the backward, which the autograd engine may run with the caller's autocast state)."""

    def wrapped(ctx: Any, *args: Any) -> Any:
        dev = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        with torch.autocast(dev, enabled=False):
            return fn(ctx, *args)

    return wrapped


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    @_no_autocast
    def forward(ctx, hidden, weight, bias, targets, chunk_size, temperature, with_entropy):
        cdt = _cdt(hidden, weight, bias)
        w = weight.to(cdt)
        b = bias.to(cdt) if bias is not None else None
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=cdt, device=hidden.device)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if with_entropy else None
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = _logits(hidden[s:e], w, b, temperature)
            zy = z.gather(-1, targets[s:e, None])[:, 0]
            m = z.amax(-1)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            z.sub_(m[:, None])  # z - max
            if ent is not None:  # with_entropy
                ez = z.exp()
                tot = ez.sum(-1)
                # H = lse - Σ p z = log Σ e^{z'} - Σ e^{z'} z' / Σ e^{z'}   (z' = z - max)
                ent[s:e] = tot.log() - _rowdot(ez, z) / tot
                del ez
            else:
                tot = z.exp_().sum(-1)
            lse[s:e] = m + tot.log()
            logp[s:e] = zy - lse[s:e]
            del z
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None: skip its work
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent)
        ctx.chunk_size, ctx.temperature = chunk_size, temperature
        if with_entropy:
            return logp, ent
        empty = logp.new_zeros(0)
        ctx.mark_non_differentiable(empty)
        return logp, empty

    @staticmethod
    @once_differentiable
    @_no_autocast
    def backward(ctx, g_logp, g_ent):  # type: ignore[override]  # (the decorator types it loosely)
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        cs, temp = ctx.chunk_size, ctx.temperature
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        use_lp = g_logp is not None
        use_ent = ent is not None and g_ent is not None and g_ent.numel() > 0
        if not (use_lp or use_ent) or not (need_h or need_w or need_b):
            return None, None, None, None, None, None, None
        cdt = lse.dtype
        w = weight.to(cdt)
        b = bias.to(cdt) if bias is not None else None
        g_h = torch.empty_like(hidden) if need_h else None
        g_w = torch.zeros(weight.shape, dtype=cdt, device=weight.device) if need_w else None
        g_b = torch.zeros(weight.shape[0], dtype=cdt, device=weight.device) if need_b else None
        n = hidden.shape[0]
        for s in range(0, n, cs):
            e = min(s + cs, n)
            h = hidden[s:e].to(cdt)
            gz = _logits(h, w, b, temp)
            gz.sub_(lse[s:e, None])  # log p
            if use_ent:
                ge = g_ent[s:e].to(cdt)[:, None]
                p = gz.exp()
                # gz = p * (−g_logp − g_ent (log p + H))
                gz.add_(ent[s:e, None]).mul_(-ge)
                if use_lp:
                    gz.sub_(g_logp[s:e].to(cdt)[:, None])
                gz.mul_(p)
                del p
            else:
                gz.exp_().mul_(-g_logp[s:e].to(cdt)[:, None])
            if use_lp:
                gz.scatter_add_(-1, targets[s:e, None], g_logp[s:e].to(cdt)[:, None])
            if temp != 1.0:
                gz.div_(temp)
            if g_h is not None:  # need_h
                g_h[s:e] = (gz @ w).to(hidden.dtype)
            if g_w is not None:  # need_w
                g_w.addmm_(gz.t(), h)
            if g_b is not None:  # need_b
                g_b += gz.sum(0)
            del gz
        return (g_h, g_w.to(weight.dtype) if g_w is not None else None, g_b.to(bias.dtype) if g_b is not None else None,
                None, None, None, None)


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, chunk_size: int = 1024,
                   temperature: float = 1.0, with_entropy: bool = False, bias: torch.Tensor | None = None):
    """log π(target | row) and (optionally) the full-vocabulary entropy, per row, in chunks.

    hidden (N, D) final (already normed) hidden states, weight (V, D) output matrix (lm_head),
    targets (N,) long, bias (V,) or None -> logp (N,), entropy (N,) or None.
    Values are float32 (float64 for float64 inputs); gradients flow to hidden, weight and bias from
    either output or both. Memory: O(chunk_size · V) instead of O(N · V), forward and backward."""
    if hidden.ndim != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be (N, D) and targets (N,), got {tuple(hidden.shape)}, {tuple(targets.shape)}")
    if weight.ndim != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight must be (V, D={hidden.shape[1]}), got {tuple(weight.shape)}")
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    logp, ent = _ChunkedLogprobs.apply(hidden, weight, bias, targets.long(), int(chunk_size), float(temperature),
                                       bool(with_entropy))
    return logp, (ent if with_entropy else None)


def naive_token_logprobs(hidden, weight, targets, *, chunk_size: int = 0, temperature: float = 1.0,
                         with_entropy: bool = False, bias=None):
    """Reference: full (N, V) logits + log_softmax (what a plain training step does). Same signature;
    chunk_size is ignored."""
    cdt = _cdt(hidden, weight, bias)
    z = hidden.to(cdt) @ weight.to(cdt).t()
    if bias is not None:
        z = z + bias.to(cdt)
    lsm = torch.log_softmax(z / temperature, -1)
    logp = lsm.gather(-1, targets.long()[:, None])[:, 0]
    ent = -(lsm.exp() * lsm).sum(-1) if with_entropy else None
    return logp, ent


def model_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                         position_ids: torch.Tensor | None = None, chunk_size: int = 1024, temperature: float = 1.0,
                         with_entropy: bool = False, **kwargs):
    """log-probs of input_ids[:, 1:] given their prefixes under a HF causal LM, without full logits.

    Runs the decoder (`model.model`, a peft wrapper is unwrapped) for last_hidden_state and applies
    `model.get_output_embeddings()` (tied or not, with its bias if any) chunk by chunk.
    (B, T) -> logp (B, T−1), entropy (B, T−1) or None. Extra keyword arguments go to the decoder
    (e.g. past_key_values: then row t is still the log-prob of input_ids[:, t+1] given the cache and
    input_ids[:, :t+1]). Positions whose next token is padding get a value too: mask them yourself."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if get_base is not None else model
    kwargs.setdefault("use_cache", kwargs.get("past_key_values") is not None)
    out = base.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
    h = out.last_hidden_state[:, :-1]
    b, t, d = h.shape
    head = base.get_output_embeddings()
    logp, ent = token_logprobs(h.reshape(-1, d), head.weight, input_ids[:, 1:].reshape(-1), chunk_size=chunk_size,
                               temperature=temperature, with_entropy=with_entropy, bias=getattr(head, "bias", None))
    return logp.view(b, t), (ent.view(b, t) if ent is not None else None)
