"""Token sampling with per-sequence RNG, and the per-token statistics ARPO needs.

`logprob` and `entropy` are those of the temperature-scaled full-vocabulary distribution
softmax(logits / T) (spec §2: entropy of the sampling distribution, full estimator). top-k/top-p
truncate only what is sampled from, so the recorded log-probs match what a trainer recomputes
from the same logits at the same temperature.
"""

from __future__ import annotations

import torch


def token_stats(logits: torch.Tensor, temperature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log-softmax of logits/T and the full-vocab entropy. logits (B, V), temperature (B,)."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    logp = torch.log_softmax(logits.float() / t[:, None], dim=-1)  # (B, V)
    return logp, entropy_of(logp)


def entropy_of(logp: torch.Tensor) -> torch.Tensor:
    """−Σ p log p over the last dim of (possibly partial) log-probs; 0·log 0 = 0. (B, K) -> (B,)."""
    return -(logp.exp() * torch.nan_to_num(logp, neginf=0.0)).sum(-1)


def topk_entropy(logp: torch.Tensor, k: int, tokens: torch.Tensor | None = None) -> torch.Tensor:
    """The reference's estimator (spec §2): `−Σ p log p` over the k most likely tokens, not
    renormalized, plus the sampled token's term when it is outside those k. The reference reads
    vLLM's `logprobs=k` map, which holds the top k *and* the sampled token, and sums over all its
    entries (k or k + 1 of them). `tokens` (B,): the sampled ids; None leaves the sampled term out.
    Arithmetic only (no select, no comparison), so it also runs inside the compiled and graph decode
    steps (inductor's CUDA code generation failed on a select there, issue 31).
    logp (B, V) -> (B,)."""
    vals, idx = logp.topk(k, dim=-1)  # (B, k)
    h = entropy_of(vals)
    if tokens is None:
        return h
    tok = tokens.to(idx.device)[:, None].long()  # (B, 1)
    in_top = torch.zeros_like(logp).scatter_(-1, idx, 1.0).gather(-1, tok).squeeze(-1)  # (B,) 1: among the k
    extra = entropy_of(logp.gather(-1, tok))  # (B,) −p log p of the sampled token
    return h + extra * (1.0 - in_top)


def truncate(logp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens outside top-k / the top-p nucleus with -inf. logp (B, V); top_k, top_p (B,)."""
    needs = (top_k > 0) | (top_p < 1.0)
    if not bool(needs.any()):
        return logp
    out = logp.clone()
    rows = needs.nonzero().flatten()
    sorted_lp, order = logp[rows].sort(dim=-1, descending=True)  # (R, V)
    ranks = torch.arange(logp.shape[-1], device=logp.device)[None, :]
    k = top_k[rows]
    drop = (k[:, None] > 0) & (ranks >= k[:, None])
    # nucleus: keep the smallest prefix whose mass reaches top_p (the token crossing it included)
    mass_before = sorted_lp.exp().cumsum(-1) - sorted_lp.exp()
    drop |= mass_before >= top_p[rows, None]
    drop[:, 0] = False
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    out[rows] = torch.full_like(sorted_lp, float("-inf")).scatter(-1, order, sorted_lp)
    return out


def sample(logp: torch.Tensor, temperature: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling with one uniform per row (drawn from each sequence's own generator);
    greedy where temperature == 0. logp (B, V) possibly truncated; uniforms (B,). Returns (B,) ids."""
    probs = logp.exp()
    cdf = probs.cumsum(-1)
    u = uniforms.to(cdf.dtype).clamp_min(1e-12) * cdf[:, -1]
    ids = torch.searchsorted(cdf, u[:, None]).squeeze(-1).clamp_max(logp.shape[-1] - 1)
    greedy = logp.argmax(-1)
    return torch.where(temperature > 0, ids, greedy)


def sample_stats(logits: torch.Tensor, temperature: torch.Tensor, uniforms: torch.Tensor, k_entropy: int):
    """What the engine records for one token per row when no row truncates (top-k/top-p): the sampled
    ids (greedy where temperature == 0), their log-probs, the full-vocab entropy and the top-k entropy
    (the sampled token's term included when it is outside the top k; zeros when k_entropy == 0), all
    (B,). The same function runs eagerly and inside the compiled decode step (engine/static.py), so
    both paths compute the same thing."""
    logp, ent = token_stats(logits, temperature)
    toks = sample(logp, temperature, uniforms)
    chosen = logp.gather(-1, toks[:, None]).squeeze(-1)
    topk = topk_entropy(logp, k_entropy, toks) if k_entropy else torch.zeros_like(ent)
    return toks, chosen, ent, topk
