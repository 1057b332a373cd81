"""Token log-probs and entropies from hidden states, in chunks: never the whole (tokens, vocab) logits.

With a 49k vocabulary the logits of 4096 tokens are 0.8 GB in fp32, and a plain autograd graph
keeps them, their softmax and their gradient alive at once. `token_logprobs` is an
autograd.Function that, in forward, computes the logits of `chunk_size` rows at a time and keeps
only the per-row log-sum-exp; backward recomputes each chunk's logits and turns them straight into
the gradients of the hidden states and of the output matrix. Peak extra memory: one chunk.

For row n with logits z = W h / T, p = softmax(z), target y:
    logp   = z_y − lse(z)                    d logp / dz   = onehot(y) − p
    H      = lse(z) − Σ_j p_j z_j            d H / dz_j    = −p_j (z_j − Σ_k p_k z_k)
and dz/dh = W / T, dz/dW = h / T.
"""

from __future__ import annotations

import torch


def _cdt(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)  # bf16/fp16 -> fp32; fp64 stays fp64


def _chunk_stats(h, weight, bias, targets, temperature, with_entropy):
    cdt = _cdt(h)
    z = (h @ weight.t()).to(cdt)
    if bias is not None:
        z = z + bias.to(cdt)
    z = z / temperature
    lse = torch.logsumexp(z, -1)
    logp = z.gather(-1, targets[:, None])[:, 0] - lse
    ent = None
    if with_entropy:
        p = torch.softmax(z, -1)
        ent = lse - (p * z).sum(-1)
    return z, lse, logp, ent


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_size, temperature, with_entropy):
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.promote_types(hidden.dtype, torch.float32))
        ent = torch.empty_like(logp) if with_entropy else None
        for s in range(0, n, chunk_size):
            _, _, lp, en = _chunk_stats(hidden[s : s + chunk_size], weight, bias, targets[s : s + chunk_size],
                                        temperature, with_entropy)
            logp[s : s + chunk_size] = lp
            if with_entropy:
                ent[s : s + chunk_size] = en
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.chunk_size, ctx.temperature, ctx.with_entropy = chunk_size, temperature, with_entropy
        if with_entropy:
            return logp, ent
        return logp, logp.new_zeros(0)

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, bias, targets = ctx.saved_tensors
        cs, temp = ctx.chunk_size, ctx.temperature
        use_ent = ctx.with_entropy and g_ent is not None and g_ent.numel() > 0
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        g_h = torch.zeros_like(hidden) if need_h else None
        cdt = _cdt(hidden)
        g_w = torch.zeros(weight.shape, dtype=cdt, device=weight.device) if need_w else None
        g_b = torch.zeros(weight.shape[0], dtype=cdt, device=weight.device) if need_b else None
        for s in range(0, hidden.shape[0], cs):
            h = hidden[s : s + cs]
            z, lse, _, _ = _chunk_stats(h, weight, bias, targets[s : s + cs], temp, False)
            p = torch.exp(z - lse[:, None])  # (c, V)
            gl = g_logp[s : s + cs].to(cdt) if g_logp is not None else torch.zeros_like(lse)
            gz = -p * gl[:, None]  # d logp: onehot − p
            gz.scatter_add_(-1, targets[s : s + cs, None], gl[:, None])
            if use_ent:
                mean_z = (p * z).sum(-1, keepdim=True)
                gz -= g_ent[s : s + cs].to(cdt)[:, None] * p * (z - mean_z)
            gz /= temp
            if need_h:
                g_h[s : s + cs] = (gz.to(weight.dtype) @ weight).to(hidden.dtype)
            if need_w:
                g_w += gz.t() @ h.to(cdt)
            if need_b:
                g_b += gz.sum(0)
        return (g_h, g_w.to(weight.dtype) if need_w else None, g_b.to(bias.dtype) if need_b else None,
                None, None, None, None)


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, chunk_size: int = 1024,
                   temperature: float = 1.0, with_entropy: bool = False, bias: torch.Tensor | None = None):
    """log π(target | row) and (optionally) the full-vocabulary entropy, per row, in chunks.
    hidden (N, D) final hidden states, weight (V, D) output matrix, targets (N,) -> (N,), (N,) | None.
    Values are float32 (or float64 for float64 inputs); gradients flow to hidden, weight and bias."""
    if hidden.ndim != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be (N, D) and targets (N,), got {tuple(hidden.shape)}, {tuple(targets.shape)}")
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    logp, ent = _ChunkedLogprobs.apply(hidden, weight, bias, targets, int(chunk_size), float(temperature),
                                       bool(with_entropy))
    return logp, (ent if with_entropy else None)


def naive_token_logprobs(hidden, weight, targets, *, chunk_size: int = 0, temperature: float = 1.0,
                         with_entropy: bool = False, bias=None):
    """Reference: full logits + log_softmax (what a plain training step does). Same signature."""
    z = (hidden @ weight.t()).to(_cdt(hidden))
    if bias is not None:
        z = z + bias.to(z.dtype)
    lsm = torch.log_softmax(z / temperature, -1)
    logp = lsm.gather(-1, targets[:, None])[:, 0]
    ent = -(lsm.exp() * lsm).sum(-1) if with_entropy else None
    return logp, ent


def model_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                         chunk_size: int = 1024, temperature: float = 1.0, with_entropy: bool = False, **kwargs):
    """log-probs of input_ids[:, 1:] given their prefixes under a HF causal LM, chunked.
    (B, T) -> (B, T−1) log-probs and entropies (or None)."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if get_base is not None else model
    out = base.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
    h = out.last_hidden_state[:, :-1]
    b, t, d = h.shape
    head = base.get_output_embeddings()
    logp, ent = token_logprobs(h.reshape(-1, d), head.weight, input_ids[:, 1:].reshape(-1), chunk_size=chunk_size,
                               temperature=temperature, with_entropy=with_entropy, bias=getattr(head, "bias", None))
    return logp.view(b, t), (ent.view(b, t) if ent is not None else None)
