"""The engine's own forward for Llama-family decoders, and its compiled decode step.

transformers' module forward is general; the engine runs two shapes only — a decode step (one new
token for each of S slots) and a prefill (R rows of q new tokens against their cached prefixes) — so it
can do less (measured on SmolLM2-135M, benchmarks/profile_decode.py):

- q/k/v and gate/up projections are fused into one matmul each (121 weight matmuls per step, not 211);
- on CPU in float32 every weight is prepacked for oneDNN once (`torch.ops.mkldnn._linear_pointwise`):
  at batch 16 a weight matmul is memory-bound, and `F.linear` re-packs the weight on every call, so the
  prepacked one takes about half the time. The packed copies are rebuilt when a parameter changes
  (its version counter moves: an optimizer step, a weight sync), so the engine always decodes with the
  policy's current weights;
- no module hooks, kwargs parsing, mask building or cache objects: one loop over plain tensors.

**The decode step** (`decode_step`) is a pure function: tokens and their rotary factors in; logits,
the new tokens' K/V (returned, written into the slot cache by the caller) and — when no sequence needs
top-k / top-p truncation or a logits hook — the sampled token, its log-prob and the entropies out.
Attention over the cached columns takes an additive mask; the new token attends to itself separately,
so nothing inside the step writes to the cache. That makes it one `torch.compile` graph (engine option
`compile`): inductor on CPU fuses the norms, rotary, attention (one loop over the cache per layer,
not two small batched matmuls), SiLU and the whole sampling (log-softmax, entropy, inverse-CDF
sample) into a few loops, with the prepacked matmuls called as an opaque op (`arpo::linear`). Only
the slot count and the cache width are dynamic (every model size stays a constant, so loops vectorise
without tails), so one compilation serves every batch size and length; inductor's on-disk cache makes
later processes cheaper. `compile=False` runs the same function eagerly; the tests check both agree.

Prefill (`prefill`) runs eagerly with SDPA over the slot cache (its cost is the matmuls, which are
already prepacked). Models whose architecture this does not know run the transformers forward.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.nn.functional as F

from arpo.engine.sampling import entropy_of, topk_entropy

ARCHS = ("llama", "qwen2", "mistral")  # RMSNorm, rotary (default type), GQA, SiLU-gated MLP


def unsupported(model) -> str | None:
    """Why this model cannot run the static forward (None when it can)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in ARCHS:
        return f"model type {getattr(cfg, 'model_type', type(model).__name__)!r} is not one of {', '.join(ARCHS)}"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return f"rope type {rope.get('rope_type', rope.get('type'))!r}"
    if getattr(cfg, "hidden_act", "silu") != "silu" or (getattr(cfg, "pretraining_tp", 1) or 1) != 1:
        return "activation or tensor-parallel layout"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "sliding-window attention"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} has no .model.layers / .lm_head (a wrapped model?)"
    lin = [model.lm_head] + [m for layer in layers for m in (*_attn(layer), *_mlp(layer))]
    if any(type(m) is not torch.nn.Linear for m in lin):
        return "a projection is not a plain nn.Linear (LoRA adapter, quantized layer?)"
    return None


def _attn(layer):
    a = layer.self_attn
    return a.q_proj, a.k_proj, a.v_proj, a.o_proj


def _mlp(layer):
    m = layer.mlp
    return m.gate_proj, m.up_proj, m.down_proj


def _cat_bias(mods):
    if all(m.bias is None for m in mods):
        return None
    return torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features) for m in mods])


# ---- the weight matmuls: prepacked, behind one opaque op ------------------------------------------
# The compiled step calls `arpo::linear(x, i)` for the i-th matmul of the model (0 = lm_head, then 4 per
# layer); the weights come from the Weights object the calling thread made active. The graph therefore
# depends on the architecture only, not on which engine or which weight values run it.
_ACTIVE = threading.local()


def _active() -> Weights:
    w = getattr(_ACTIVE, "weights", None)
    if w is None:
        raise RuntimeError("arpo::linear called outside an engine step (no active weights)")
    return w


def linear(x: torch.Tensor, w) -> torch.Tensor:
    """x (..., in) @ W.T + b for a Weights.lin entry (prepacked for oneDNN or plain)."""
    weight, bias, n_out = w
    if weight.is_mkldnn:
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), weight, bias, "none", [], "")
        return out.view(*x.shape[:-1], n_out)
    return F.linear(x, weight, bias)


def packed_linear(x: torch.Tensor, i: int) -> torch.Tensor:
    """x @ W_i.T + b_i with the active engine's i-th weight (the eager path calls this directly)."""
    return linear(x, _active().lin[i])


# The op the compiled graph calls. Defined with torch.library.Library rather than @custom_op: a call
# costs ≈ 10 µs instead of ≈ 30 µs, and the step makes 121 of them.
_LIB = torch.library.Library("arpo", "DEF")
_LIB.define("linear(Tensor x, int i) -> Tensor")
_LIB.impl("linear", packed_linear, "CompositeExplicitAutograd")


@torch.library.register_fake("arpo::linear")
def _(x, i):
    return x.new_empty(*x.shape[:-1], _active().lin[i][2])


class Weights:
    """The model's weights as the static forward uses them: matmul weights fused and (CPU float32)
    prepacked in `lin`, the small ones (embedding, norms) as the parameters themselves in `small`."""

    def __init__(self, model, batch_hint: int = 16):
        self.model, self.batch_hint = model, batch_hint
        self.params = list(model.parameters())
        p = self.params[0]
        self.packed = p.device.type == "cpu" and p.dtype == torch.float32 and torch.backends.mkldnn.is_available()
        self._seen = None
        self.refreshes = 0
        self.layout = 0  # rebuilds that gave the tensors new addresses (not in-place value updates)
        self.lin: list[tuple[torch.Tensor, torch.Tensor | None, int]] = []
        self.refresh()

    def _state(self):
        return [(t.data_ptr(), t._version) for t in self.params]

    def refresh(self) -> bool:
        """Rebuild the fused/packed copies if any parameter changed since the last build."""
        state = self._state()
        if state == self._seen:
            return False
        m, cfg = self.model, self.model.config
        with torch.no_grad():
            lin = [self._linear(m.lm_head.weight, m.lm_head.bias)]
            small = [m.model.embed_tokens.weight, m.model.norm.weight]
            for layer in m.model.layers:
                q, k, v, o = _attn(layer)
                g, u, d = _mlp(layer)
                lin += [self._linear(torch.cat([q.weight, k.weight, v.weight]), _cat_bias((q, k, v))),
                        self._linear(o.weight, o.bias),
                        self._linear(torch.cat([g.weight, u.weight]), _cat_bias((g, u))),
                        self._linear(d.weight, d.bias)]
                small += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
            same_params = self._seen is not None and [p for p, _ in state] == [p for p, _ in self._seen]
            if same_params and not self.packed and len(lin) == len(self.lin):
                # only values changed (an optimizer step): update the fused copies in place, so every
                # tensor keeps its address (captured CUDA graphs read them; engine/graph.py)
                for (ow, ob, _), (nw, nb, _) in zip(self.lin, lin, strict=True):
                    if ow.data_ptr() != nw.data_ptr():
                        ow.copy_(nw)
                    if ob is not None and ob.data_ptr() != nb.data_ptr():
                        ob.copy_(nb)
            else:
                self.lin, self.layout = lin, self.layout + 1
            self.small = [t.detach() for t in small]
        self.eps = float(cfg.rms_norm_eps)
        rot = m.model.rotary_emb
        self.inv_freq, self.rope_scale = rot.inv_freq.detach().float(), float(getattr(rot, "attention_scaling", 1.0))
        self._seen = state
        self.refreshes += 1
        return True

    def _linear(self, w, b):
        w = w.detach()
        b = None if b is None else b.detach()
        if self.packed:
            return (torch.ops.mkldnn._reorder_linear_weight(w, self.batch_hint), b, w.shape[0])
        return (w, b, w.shape[0])


# ---- the math, as plain functions of tensors -------------------------------------------------------
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm, op for op (float32 statistics)."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(dtype)


def rotary(pos: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B, q, 1, head_dim) of positions (B, q), as transformers' default rotary embedding."""
    f = pos[..., None].float() * inv_freq
    emb = torch.cat((f, f), dim=-1)
    return (emb.cos() * scale).to(dtype)[:, :, None], (emb.sin() * scale).to(dtype)[:, :, None]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


class Arch:
    """The model's shape constants (what a compiled graph is specialised on)."""

    def __init__(self, model):
        cfg = model.config
        self.n_layers = cfg.num_hidden_layers
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.head_dim ** -0.5


def qkv_heads(x, li: int, small: list, eps: float, cos, sin, arch: Arch, mm):
    """Layer li's attention input: norm, the fused q/k/v matmul, split into heads, rotary on q and k.
    x (..., D) -> q (..., heads, hd), k and v (..., kv_heads, hd)."""
    nh, nkv, hd = arch.n_heads, arch.n_kv, arch.head_dim
    qkv = mm(rms_norm(x, small[2 + 2 * li], eps), 1 + 4 * li)
    lead = qkv.shape[:-1]
    q = rotate(qkv[..., : nh * hd].view(*lead, nh, hd), cos, sin)
    k = rotate(qkv[..., nh * hd : (nh + nkv) * hd].view(*lead, nkv, hd), cos, sin)
    return q, k, qkv[..., (nh + nkv) * hd :].view(*lead, nkv, hd)


def mlp_block(x, li: int, small: list, eps: float, mm):
    """Layer li's MLP with its residual: x + down(silu(gate(n)) * up(n)), n = norm(x), gate/up fused."""
    gate, up = mm(rms_norm(x, small[3 + 2 * li], eps), 3 + 4 * li).chunk(2, dim=-1)
    return x + mm(F.silu(gate) * up, 4 + 4 * li)


def attend(qh, kh, vh, keys, values, bias, scale: float, fused: bool) -> torch.Tensor:
    """Attention of one new token per slot over its cached keys/values plus itself.

    qh (S, kv, g, hd) the queries grouped by kv head; kh, vh (S, kv, hd) the new token's key/value;
    keys, values (S, kv, col, hd) the cache; bias (S, 1, 1, col) additive (0 / -inf). The softmax runs
    over [cached columns, new token] without concatenating them: the max and the normaliser are
    combined from both parts. fused (the compiled step): the two products written as multiply-and-sum,
    which inductor turns into one loop over the cache instead of 2 small batched matmuls per layer.
    (The concatenate-then-slice softmax form, fused, with the rotary computed inside the graph and every
    size dynamic, miscompiled in inductor of torch 2.13 — attention outputs off by 1e30, log-probs by
    0.02 in the engine test; tests/engine/test_static.py checks the compiled step against the eager one.)"""
    if fused:
        s_old = (qh[:, :, :, None, :] * keys[:, :, None]).sum(-1)
    else:
        s_old = torch.matmul(qh, keys.transpose(-1, -2))
    s_old = s_old * scale + bias  # (S, kv, g, col)
    s_new = (qh * kh[:, :, None, :]).sum(-1, keepdim=True) * scale  # (S, kv, g, 1)
    m = torch.maximum(s_old.amax(-1, keepdim=True), s_new)
    e_old, e_new = torch.exp(s_old - m), torch.exp(s_new - m)
    z = e_old.sum(-1, keepdim=True) + e_new
    if fused:
        att = (e_old[..., None] * values[:, :, None]).sum(-2)
    else:
        att = torch.matmul(e_old, values)
    return (att + e_new * vh[:, :, None, :]) / z


def step_sample(logits, safe_t, do_sample, uniforms, k_entropy: int):
    """sampling.sample_stats for the decode step, written without a branch on the temperature: the
    caller passes safe_t (the temperature, 1 where it is 0) and do_sample (int64 1 where T > 0, 0 for
    greedy), computed outside the step. Same ops as token_stats + sample on the same values, so the
    same tokens and statistics bit for bit. (Inductor's triton code generation failed on CUDA inside
    token_stats' `torch.where(temperature > 0, ...)` with dynamic slot counts; this form has no
    select on the temperature at all.) Returns token ids, their log-probs, full and top-k entropy (S,)."""
    logp = torch.log_softmax(logits.float() / safe_t[:, None], dim=-1)  # (S, V)
    ent = entropy_of(logp)
    cdf = logp.exp().cumsum(-1)
    u = uniforms.to(cdf.dtype).clamp_min(1e-12) * cdf[:, -1]
    drawn = torch.searchsorted(cdf, u[:, None]).squeeze(-1).clamp_max(logp.shape[-1] - 1)
    greedy = logp.argmax(-1)
    toks = greedy + (drawn - greedy) * do_sample
    chosen = logp.gather(-1, toks[:, None]).squeeze(-1)
    topk = topk_entropy(logp, k_entropy, toks) if k_entropy else torch.zeros_like(ent)  # the sampled token counts
    return toks, chosen, ent, topk


def sampling_inputs(temperature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(safe_t, do_sample) of step_sample from per-slot temperatures (S,)."""
    pos = temperature > 0
    return torch.where(pos, temperature, torch.ones_like(temperature)), pos.long()


def decode_step(arch: Arch, small: list, eps: float, ids, cos, sin, bias, buf, safe_t, do_sample, uniforms,
                k_entropy: int, with_sample: bool, fused: bool = False):
    """One decode step of S slots, pure (writes nothing).

    ids (S,) this step's token per slot; cos, sin (S, 1, hd) the rotary factors of its position
    (computed outside: inside a compiled graph inductor would recompute them in every loop that reads
    q); bias (S, col) additive mask (0 or -inf) over the cached columns [0, col) of buf
    (layers, 2, S, kv_heads, cap, head_dim); safe_t, do_sample, uniforms (S,) (step_sample). Returns
    (logits (S, V), new_k, new_v (layers, S, kv_heads, head_dim), and when with_sample: token ids,
    their log-probs, full entropy, top-k entropy (S,) — step_sample).
    fused (the compiled step): matmuls through the `arpo::linear` op, attention as multiply-and-sum."""
    nh, nkv, hd = arch.n_heads, arch.n_kv, arch.head_dim
    S, g, col = ids.shape[0], nh // nkv, bias.shape[1]
    x = F.embedding(ids, small[0])  # (S, D)
    b = bias[:, None, None, :]  # (S, 1, 1, col)
    mm = torch.ops.arpo.linear if fused else packed_linear
    new_k, new_v = [], []
    for li in range(arch.n_layers):
        qh, kh, vh = qkv_heads(x, li, small, eps, cos, sin, arch, mm)  # (S, heads, hd)
        keys, values = buf[li, 0, :, :, :col], buf[li, 1, :, :, :col]  # (S, kv, col, hd)
        att = attend(qh.view(S, nkv, g, hd), kh, vh, keys, values, b, arch.scale, fused)  # (S, kv, g, hd)
        x = x + mm(att.reshape(S, nh * hd), 2 + 4 * li)
        x = mlp_block(x, li, small, eps, mm)
        new_k.append(kh)
        new_v.append(vh)
    logits = mm(rms_norm(x, small[1], eps), 0)  # (S, V)
    nk, nv = torch.stack(new_k), torch.stack(new_v)
    if not with_sample:
        return logits, nk, nv
    return (logits, nk, nv, *step_sample(logits, safe_t, do_sample, uniforms, k_entropy))


_COMPILED: dict = {}  # one torch.compile'd decode_step per process (graphs are keyed by dynamo's guards)


def compiled_decode_step():
    fn = _COMPILED.get("decode")
    if fn is None:
        fn = _COMPILED["decode"] = torch.compile(decode_step, dynamic=False, fullgraph=True)
    return fn


def _mark_dynamic(ids, cos, sin, bias, buf, safe_t, do_sample, uniforms) -> None:
    """Only the slot count and the cache width vary between steps; every other size (heads, head dim,
    hidden size, vocabulary) stays a constant in the compiled code, which keeps its loops vectorised
    without tails. (maybe_: a size of 1 is specialised, not an error.)"""
    for t in (ids, cos, sin, safe_t, do_sample, uniforms):
        torch._dynamo.maybe_mark_dynamic(t, 0)
    torch._dynamo.maybe_mark_dynamic(bias, 0)
    torch._dynamo.maybe_mark_dynamic(bias, 1)
    torch._dynamo.maybe_mark_dynamic(buf, 2)
    torch._dynamo.maybe_mark_dynamic(buf, 4)


def _dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class StaticForward:
    """The engine's forward: `decode(...)` for a step of every slot, `prefill(...)` for joining rows."""

    def __init__(self, model, compile: bool = False, batch_hint: int = 16):
        self.w = Weights(model, batch_hint)
        self.arch = Arch(model)
        self.dtype = self.w.small[0].dtype
        self.compile = bool(compile)
        self.compile_seconds = 0.0  # wall time of steps that compiled (first step of each new graph)
        self.compiled_steps = 0

    @torch.no_grad()
    def decode(self, ids, pos, bias, buf, temperature, uniforms, k_entropy: int, with_sample: bool):
        """One decode step of every slot (see decode_step); bias (S, col) covers the cached columns."""
        self.w.refresh()
        w = self.w
        cos, sin = rotary(pos[:, None], w.inv_freq, w.rope_scale, self.dtype)
        safe_t, do_sample = sampling_inputs(temperature)
        return self.step(ids, cos[:, 0], sin[:, 0], bias, buf, safe_t, do_sample, uniforms, k_entropy, with_sample)

    def step(self, ids, cos, sin, bias, buf, safe_t, do_sample, uniforms, k_entropy: int, with_sample: bool):
        """decode_step with the current weights, eager or compiled (inputs already prepared; the graph
        step calls this inside its captured body)."""
        w = self.w
        args = (self.arch, w.small, w.eps, ids, cos, sin, bias, buf, safe_t, do_sample, uniforms,
                int(k_entropy), bool(with_sample), self.compile)
        _ACTIVE.weights = w
        try:
            if not self.compile:
                return decode_step(*args)
            _mark_dynamic(ids, cos, sin, bias, buf, safe_t, do_sample, uniforms)
            graphs = _dynamo_graphs()
            t0 = time.perf_counter()
            out = compiled_decode_step()(*args)
            if _dynamo_graphs() > graphs:  # this call compiled a new graph (dynamo's own count)
                self.compile_seconds += time.perf_counter() - t0
            self.compiled_steps += 1
            return out
        finally:
            _ACTIVE.weights = None

    @torch.no_grad()
    def prefill(self, ids, pos, mask, buf, col: int, rows) -> torch.Tensor:
        """Logits of the last position of each row; writes the rows' new K/V into columns [col, col + q)
        of slots `rows`. ids, pos (B, q); mask (B, 1, q, col + q) bool."""
        self.w.refresh()
        w, a = self.w, self.arch
        _ACTIVE.weights = w
        try:
            x = F.embedding(ids, w.small[0])  # (B, q, D)
            cos, sin = rotary(pos, w.inv_freq, w.rope_scale, self.dtype)
            B, q, _ = x.shape
            nh, nkv, hd = a.n_heads, a.n_kv, a.head_dim
            end = col + q
            for li in range(a.n_layers):
                qh, kh, vh = qkv_heads(x, li, w.small, w.eps, cos, sin, a, packed_linear)  # (B, q, heads, hd)
                k_cache, v_cache = buf[li, 0], buf[li, 1]  # (S, kv, cap, hd)
                k_cache[rows, :, col:end] = kh.transpose(1, 2)
                v_cache[rows, :, col:end] = vh.transpose(1, 2)
                att = F.scaled_dot_product_attention(qh.transpose(1, 2), k_cache[rows, :, :end], v_cache[rows, :, :end],
                                                     attn_mask=mask, scale=a.scale, enable_gqa=nkv != nh)
                x = x + packed_linear(att.transpose(1, 2).reshape(B, q, nh * hd), 2 + 4 * li)
                x = mlp_block(x, li, w.small, w.eps, packed_linear)
            return packed_linear(rms_norm(x[:, -1], w.small[1], w.eps), 0)  # (B, V)
        finally:
            _ACTIVE.weights = None
