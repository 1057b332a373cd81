"""The transformers backend of the engine (see engine/base.py for the interface).

Many sequences decode together in one batched forward per step over a slot-based KV cache
(engine/kv.py). Sequences that join — new prompts, resumed ones with appended tool-result tokens,
forks — are prefilled first, only on their new tokens, against their own cached prefix. A fork copies
no computation: it references the parent's K/V for the shared tokens and recomputes at most the one
last shared token (whose K/V was not yet cached when the parent sampled past it).

For Llama-family models (Llama, Qwen2, Mistral) the forward is arpo's own (engine/static.py: fused,
prepacked matmuls; `static=False` uses the transformers module), and `compile=True` runs each decode
step — forward, sampling, log-prob and entropies — as one torch.compile graph. `graph=True` runs it
over static, bucketed buffers as one CUDA-graph replay with one device-to-host copy (engine/graph.py;
eagerly on CPU, same results).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from arpo.engine.base import SamplingParams, Sequence, SequenceTable, StepOutput, check_new, fork_point, segment_end
from arpo.engine.graph import GraphStep
from arpo.engine.kv import KVBatch, SlotCache
from arpo.engine.rng import child_key, key_of, uniforms_for
from arpo.engine.sampling import sample, sample_stats, token_stats, topk_entropy, truncate
from arpo.engine.static import StaticForward, unsupported
from arpo.errors import ArpoError

if TYPE_CHECKING:
    from arpo.engine.graph import GraphStep
    from arpo.engine.static import StaticForward

_ATTN = "arpo_sdpa_gqa"


def _sdpa_gqa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """SDPA with native grouped-query attention. transformers' own sdpa path repeats the K/V heads
    (a full copy of the cache per layer per step) whenever a mask is given, which on CPU costs more
    than the attention itself; the engine always passes its 4D mask, so it uses this instead."""
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling,
        is_causal=attention_mask is None and query.shape[2] > 1, enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(_ATTN, _sdpa_gqa)


class _State:
    """Engine-private per-sequence data next to the public Sequence."""

    __slots__ = ("past", "pending", "key", "forks", "seg_start")

    def __init__(self, past, pending, key, seg_start):
        self.past = past  # (layers, 2, H, L, D) K/V of tokens[:L] while out of the batch, or None
        self.pending = pending  # tokens whose K/V is not cached yet (fed at the next forward)
        self.key = key  # 64-bit RNG key (engine/rng.py): token n is sampled with uniform(key, n)
        self.forks = 0  # unseeded forks made so far (each child's key derives from key and this count)
        self.seg_start = seg_start  # token index where the current generated segment began


class HFEngine(SequenceTable):
    def __init__(self, model, tokenizer, max_prefill_tokens: int = 4096, eos_token_ids=None, topk_entropy: int = 10,
                 share_prompts: bool = True, static: bool = True, compile: bool = False, graph: bool = False):
        _register_attention()
        self.share_prompts = share_prompts  # identical joining prompts share one prefill
        self.model, self.tokenizer = model.eval(), tokenizer
        cfg = model.config
        n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        p = next(model.parameters())
        self.kv = KVBatch(cfg.num_hidden_layers, n_kv, head_dim, p.dtype, p.device, fixed=graph)
        self.device = p.device
        self.max_prefill_tokens = max_prefill_tokens
        self.context_len = getattr(cfg, "max_position_embeddings", None)  # add() refuses longer prompts
        self.topk_entropy = topk_entropy  # also record -sum p log p over the top-k tokens (0 = off)
        eos = set(eos_token_ids or [])
        if not eos:
            for src in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
                eos |= set(src if isinstance(src, (list, tuple)) else [src] if src is not None else [])
        self.eos = eos
        self.seqs: dict[int, Sequence] = {}
        self._st: dict[int, _State] = {}
        self._slot: dict[int, int] = {}  # sid -> slot while in the batch
        self._next_sid = 0
        # static: arpo's own forward (engine/static.py) when the architecture is known, else transformers'
        self.static: StaticForward | None = None
        self.static_off: str | None = "off (static=False)"
        if static:
            self.static_off = unsupported(model)
            if self.static_off is None:
                self.static = StaticForward(model, compile=compile)
        if compile and self.static is None:
            raise ArpoError(f"engine option compile: needs arpo's own forward (Llama, Qwen2, Mistral), which is off "
                            f"for this model: {self.static_off}")
        self._graph: GraphStep | None = None
        self._dirty = True
        if graph:
            if self.static is None:
                raise ArpoError(f"engine option graph: needs arpo's own forward (Llama, Qwen2, Mistral), which is "
                                f"off for this model: {self.static_off}")

            self._graph = GraphStep(self.static, self.kv, topk_entropy)
        self.stats = {"prefill_tokens": 0, "decode_tokens": 0, "forwards": 0, "compactions": 0,
                      "shared_prefill_tokens": 0}  # prompt tokens not prefilled again: identical prompts

    # ---- public interface -----------------------------------------------------------------------
    def add(self, prompt_ids: list[int], params: SamplingParams | None = None) -> int:
        params = check_new(prompt_ids, params, self.context_len)
        sid = self._new_sid()
        self.seqs[sid] = Sequence(sid, list(prompt_ids), len(prompt_ids), params, status="waiting")
        self._st[sid] = _State(None, list(prompt_ids), key_of(params.seed), len(prompt_ids))
        return sid

    def append(self, sid: int, token_ids: list[int]) -> None:
        """Give a paused sequence tokens it did not generate (mask 0); it resumes on the next step."""
        s, st = self.seqs[sid], self._st[sid]
        s.append_unsampled(token_ids, topk=bool(self.topk_entropy))
        st.pending += list(token_ids)
        st.seg_start = len(s.tokens)

    def finish(self, sid: int, reason: str = "stop") -> None:
        """End a paused sequence for good (e.g. the tool-call cap was reached)."""
        s = self.seqs[sid]
        if s.status == "running":
            self._leave(sid)
        s.status, s.finish_reason = "finished", reason

    def fork(self, sid: int, n: int, at: int | None = None, seeds: list[int] | None = None) -> list[int]:
        """n new sequences that share `tokens[:at]` (default: all tokens) with `sid` and continue
        independently. The shared K/V is referenced, not recomputed."""
        s = self.seqs[sid]
        at = fork_point(s, n, at, seeds)
        past = self._cached_prefix(sid, at - 1)
        kids = []
        for i in range(n):
            params = s.params if seeds is None else _with_seed(s.params, seeds[i])
            k = self._new_sid()
            r = at - s.prompt_len
            self.seqs[k] = Sequence(
                k, s.tokens[:at], s.prompt_len, params, s.gen_mask[:r], s.logprobs[:r], s.entropies[:r],
                s.topk_entropies[:r], status="waiting", parent=sid, fork_at=at,
            )
            if seeds is not None:
                key = key_of(params.seed)
            else:
                key = child_key(self._st[sid].key, self._st[sid].forks)
                self._st[sid].forks += 1
            self._st[k] = _State(past, [s.tokens[at - 1]], key, at)
            kids.append(k)
        return kids

    def release(self, sid: int) -> None:
        if sid in self._slot:
            self.kv.free(self._slot.pop(sid))
            self._dirty = True
        self._st.pop(sid, None)
        self.seqs.pop(sid, None)

    @torch.no_grad()
    def step(self) -> list[StepOutput]:
        """Prefill whatever joins, then one decode step for all running sequences."""
        outs: list[StepOutput] = []
        waiting = [sid for sid, s in self.seqs.items() if s.status == "waiting"]
        if waiting:
            outs += self._prefill(waiting)
        running = [sid for sid in self._slot if self.seqs[sid].status == "running"]
        if running:
            outs += self._decode()
        return outs

    # ---- internals ------------------------------------------------------------------------------
    # ---- lifecycle (the Engine protocol): this engine runs the policy module itself ---------------
    def load_weights(self, model) -> int:
        """Nothing to push: generation reads the policy's own parameters. Returns 0 tensors sent."""
        return 0

    def sleep(self, level: int = 1) -> bool:
        """No separate accelerator memory to free; returns False (unsupported), as vLLM on CPU does."""
        return False

    def wake_up(self) -> bool:
        return False

    def close(self) -> None:
        for sid in list(self.seqs):
            self.release(sid)

    def _new_sid(self) -> int:
        self._next_sid += 1
        return self._next_sid - 1

    def _cached_prefix(self, sid: int, n: int) -> torch.Tensor | None:
        """K/V of the sequence's first n tokens. If some of them are still pending (e.g. a fork right
        after a tool result that was not prefilled yet), prefill exactly those first, so parent and
        forks share that computation too."""
        if n == 0:
            return None
        st = self._st[sid]
        cached = len(self.seqs[sid].tokens) - len(st.pending)
        if cached < n:
            head, tail = st.pending[: n - cached], st.pending[n - cached :]
            status = self.seqs[sid].status
            st.pending = head
            self._prefill([sid], sample_next=False)
            self._leave(sid)
            st.pending, self.seqs[sid].status = tail, status
        if sid in self._slot:
            return self.kv.extract(self._slot[sid], n)
        return st.past[:, :, :, :n]

    def _leave(self, sid: int) -> None:
        """Move a sequence out of the batch, taking its K/V along (for resume or fork)."""
        self._dirty = True
        slot = self._slot.pop(sid)
        self._st[sid].past = self.kv.extract(slot)
        self.kv.free(slot)

    def _remap(self, mapping):
        if mapping is not None:
            self._dirty = True
            self.stats["compactions"] += 1
            self._slot = {sid: mapping[slot] for sid, slot in self._slot.items()}

    def _prefill(self, sids: list[int], sample_next: bool = True) -> list[StepOutput]:
        # Already-running sequences that need prefill (forced by fork) must leave their slot first.
        for sid in sids:
            if sid in self._slot:
                self._leave(sid)
        if sample_next and self.share_prompts:
            self._share_identical_prompts(sids)
        sids = sorted(sids, key=lambda s: len(self._st[s].pending))
        outs = []
        # groups of similar pending length, each one forward, bounded in tokens
        groups: list[list[int]] = []
        cur: list[int] = []
        for sid in sids:
            q = len(self._st[sid].pending)
            if cur and (q > 1.25 * len(self._st[cur[0]].pending) + 8 or (len(cur) + 1) * q > self.max_prefill_tokens):
                groups.append(cur)
                cur = []
            cur.append(sid)
        groups.append(cur)
        for g in groups:
            outs += self._prefill_group(g, sample_next)
        return outs

    def _share_identical_prompts(self, sids: list[int]) -> None:
        """Sequences joining with the same tokens and no K/V yet (a group's samples of one prompt)
        share one prefill: the first of each set computes all tokens but the last, the others
        reference that K/V as a fork would, and every one of them then prefills its last token
        alone (so each samples its first token from its own logits and RNG key)."""
        same: dict[tuple[int, ...], list[int]] = {}
        for sid in sids:
            st = self._st[sid]
            if st.past is None and len(st.pending) > 1:
                same.setdefault(tuple(st.pending), []).append(sid)
        heads = [g for g in same.values() if len(g) > 1]
        if not heads:
            return
        tails = {}
        for g in heads:
            st = self._st[g[0]]
            tails[g[0]], st.pending = st.pending[-1:], st.pending[:-1]
        self._prefill([g[0] for g in heads], sample_next=False)
        for g in heads:
            first = g[0]
            self._leave(first)
            self._st[first].pending = tails[first]
            for sid in g[1:]:
                self._st[sid].past, self._st[sid].pending = self._st[first].past, list(tails[first])
                self.stats["shared_prefill_tokens"] += self._st[first].past.shape[-2]

    def _prefill_group(self, sids: list[int], sample_next: bool) -> list[StepOutput]:
        self._dirty = True  # slots join
        kv, sts = self.kv, [self._st[s] for s in sids]
        q = max(len(st.pending) for st in sts)
        longest_past = max(0 if st.past is None else st.past.shape[-2] for st in sts)
        self._remap(kv.ensure(len(sids), q + 1, longest_past))
        end = max(kv.ptr, longest_past)  # past K/V end here; the new block is [end, end + q)
        free = kv.free_slots()[: len(sids)]
        past_lens = [0 if st.past is None else st.past.shape[-2] for st in sts]
        for sid, st, slot in zip(sids, sts, free, strict=True):
            kv.place(slot, sid, st.past, end)
            st.past = None
            self._slot[sid] = slot
        rows = torch.tensor(free, device=self.device)
        ids = torch.zeros(len(sids), q, dtype=torch.long)
        pos = torch.zeros(len(sids), q, dtype=torch.long)
        mask = torch.zeros(len(sids), 1, q, end + q, dtype=torch.bool)
        causal = torch.ones(q, q, dtype=torch.bool).tril()
        for i, (st, slot) in enumerate(zip(sts, free, strict=True)):
            n, off = len(st.pending), q - len(st.pending)
            ids[i, off:] = torch.tensor(st.pending)
            pos[i, off:] = torch.arange(kv.lens[slot], kv.lens[slot] + n)
            mask[i, 0, off:, :end] = kv.valid[slot, :end]
            mask[i, 0, :, end:] = causal
            mask[i, 0, :, end : end + off] = False
            mask[i, 0, torch.arange(off), end + torch.arange(off)] = True  # pad queries see themselves only
        kv.ptr = end
        logits = self._forward(ids, pos, mask, SlotCache(kv, end, rows))
        for st, slot in zip(sts, free, strict=True):
            n = len(st.pending)
            kv.valid[slot, end + q - n : end + q] = True
            kv.grow_len([slot], n)
            st.pending = []
        kv.ptr = end + q
        self.stats["prefill_tokens"] += sum(kv.lens[slot] for slot in free) - sum(p0 for p0 in past_lens)
        for sid in sids:
            self.seqs[sid].status = "running"
        if not sample_next:
            return []
        return self._sample(sids, logits)

    def _decode(self) -> list[StepOutput]:
        """One new token for every running sequence: a column of the slot cache, one forward (arpo's
        static step, or the transformers module), then sampling."""
        kv = self.kv
        self._remap(kv.ensure(0, 1))  # one column for this step's tokens
        ptr = kv.ptr
        live = [(sid, slot) for sid, slot in self._slot.items() if self.seqs[sid].status == "running"]
        if self._graph is not None:
            outs = self._decode_graph(self._graph, live, ptr)
            if outs is not None:
                return outs
            self._dirty = True  # this step runs eagerly: the graph's state must be uploaded again
        ids = torch.zeros(kv.n_slots, dtype=torch.long)
        for sid, slot in live:
            ids[slot] = self._st[sid].pending[0]
        live_rows = torch.tensor([slot for _, slot in live])
        kv.valid[live_rows, ptr] = True  # the static step's mask covers columns < ptr only
        if self.static is not None:
            sampled, logits, u = self._forward_static(self.static, ids, live, ptr)
        else:
            mask = kv.valid[:, : ptr + 1].clone()
            mask[:, ptr] = True  # free slots attend to themselves (finite garbage, never read)
            logits = self._forward(ids[:, None], kv.npos.clone()[:, None], mask[:, None, None, :], SlotCache(kv, ptr))
            sampled, u = None, None
        kv.ptr = ptr + 1
        kv.grow_len([slot for _, slot in live], 1)
        for sid, _ in live:
            self._st[sid].pending = []
        self.stats["decode_tokens"] += len(live)
        sids = [sid for sid, _ in live]
        if sampled is None:
            return self._sample(sids, logits[live_rows], None if u is None else u[live_rows])
        toks, chosen, ent, topk = (t[live_rows.to(self.device)].cpu() for t in sampled)
        return self._record([self.seqs[s] for s in sids], toks, chosen, ent, topk if self.topk_entropy else None)

    def _decode_graph(self, g: GraphStep, live, ptr) -> list[StepOutput] | None:
        """The decode step as one graph replay (engine/graph.py), or None when a running sequence needs
        the eager sampler (top-k/top-p, a logits hook). The per-slot state is uploaded only after
        something changed it (`_dirty`); a steady step touches the device once: the replay and the
        copy of its results."""
        kv = self.kv
        seqs = [self.seqs[sid] for sid, _ in live]
        if self._dirty:
            if any(_eager_sampling(s.params) for s in seqs):
                return None
            g.upload([slot for _, slot in live], [self._st[sid].pending[0] for sid, _ in live],
                     [s.params.temperature for s in seqs], [self._st[sid].key for sid, _ in live])
            self._dirty = False
        host = g.run().tolist()
        kv.ptr = ptr + 1
        for sid, slot in live:
            kv.lens[slot] += 1  # the device positions moved inside the graph
            self._st[sid].pending = []
        self.stats["decode_tokens"] += len(live)
        self.stats["forwards"] += 1
        rows = [host[slot] for _, slot in live]
        return self._record(seqs, [int(r[0]) for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                            [r[3] for r in rows] if self.topk_entropy else None)

    def _forward_static(self, static: StaticForward, ids, live, ptr):
        """The decode step through engine/static.decode_step, which returns the new K/V (written here at
        column ptr) and, unless a sequence truncates or hooks its logits, the sampled tokens with their
        statistics. Returns (sampled or None, logits, the uniforms each slot's sample uses)."""
        kv, n, d = self.kv, self.kv.n_slots, self.device
        seqs = [self.seqs[sid] for sid, _ in live]
        temp = torch.ones(n, dtype=torch.float32)
        u = torch.full((n,), 0.5)
        for (_, slot), s in zip(live, seqs, strict=True):
            temp[slot] = s.params.temperature
        u[[slot for _, slot in live]] = uniforms_for([self._st[sid].key for sid, _ in live],
                                                     [len(s.tokens) for s in seqs])
        eager_sample = any(_eager_sampling(s.params) for s in seqs)
        bias = torch.zeros(n, ptr, dtype=kv.dtype, device=d).masked_fill_(~kv.valid[:, :ptr], float("-inf"))
        self.stats["forwards"] += 1
        out = static.decode(ids.to(d), kv.npos.to(d), bias, kv.buf, temp.to(d), u.to(d), self.topk_entropy,
                                 not eager_sample)
        logits, nk, nv = out[:3]
        kv.buf[:, 0, :, :, ptr] = nk
        kv.buf[:, 1, :, :, ptr] = nv
        return (None if eager_sample else out[3:]), logits, u

    def _forward(self, ids, pos, mask, cache) -> torch.Tensor:
        self.stats["forwards"] += 1
        if self.static is not None:  # a prefill (decode steps take _forward_static)
            d = self.device
            rows = cache.rows if cache.rows is not None else torch.arange(self.kv.n_slots, device=d)
            return self.static.prefill(ids.to(d), pos.to(d), mask.to(d), self.kv.buf, cache.col, rows)
        cfg = self.model.config
        saved = cfg._attn_implementation
        if saved in ("sdpa", _ATTN):  # eager / flash-attention users keep their kernel
            cfg._attn_implementation = _ATTN
        try:
            out = self.model(
                input_ids=ids.to(self.device), position_ids=pos.to(self.device), attention_mask=mask.to(self.device),
                past_key_values=cache, use_cache=True, logits_to_keep=1,
            )
        finally:
            cfg._attn_implementation = saved
        return out.logits[:, -1, :]  # (B, V)

    def _sample(self, sids: list[int], logits: torch.Tensor, uniforms: torch.Tensor | None = None) -> list[StepOutput]:
        """Sample one token per sequence from its logits (after its logits hook, with its top-k/top-p)."""
        seqs = [self.seqs[s] for s in sids]
        for i, s in enumerate(seqs):
            if s.params.logits_hook is not None:
                logits[i] = s.params.logits_hook(s, logits[i])
        temp = torch.tensor([s.params.temperature for s in seqs], dtype=torch.float32)
        u = uniforms if uniforms is not None else uniforms_for([self._st[s.sid].key for s in seqs],
                                                               [len(s.tokens) for s in seqs])
        logits = logits.cpu()
        if not any(s.params.top_k > 0 or s.params.top_p < 1.0 for s in seqs):
            toks, chosen, ent, topk = sample_stats(logits, temp, u, self.topk_entropy)
            return self._record(seqs, toks, chosen, ent, topk if self.topk_entropy else None)
        logp, ent = token_stats(logits, temp)
        trunc = truncate(
            logp,
            torch.tensor([s.params.top_k for s in seqs]),
            torch.tensor([s.params.top_p for s in seqs], dtype=torch.float32),
        )
        toks = sample(trunc, temp, u)
        chosen = logp.gather(-1, toks[:, None]).squeeze(-1)
        topk = topk_entropy(logp, self.topk_entropy, toks) if self.topk_entropy else None
        return self._record(seqs, toks, chosen, ent, topk)

    def _record(self, seqs: list[Sequence], toks, chosen, ent, topk) -> list[StepOutput]:
        """Append each sequence's sampled token and its statistics; pause or finish those that stop."""
        toks, chosen, ent = _as_list(toks), _as_list(chosen), _as_list(ent)
        topk_ent = _as_list(topk) if topk is not None else None
        outs = []
        for i, s in enumerate(seqs):
            t = toks[i]
            s.tokens.append(t)
            s.gen_mask.append(1)
            s.logprobs.append(chosen[i])
            s.entropies.append(ent[i])
            if topk_ent is not None:
                s.topk_entropies.append(topk_ent[i])
            self._st[s.sid].pending = [t]
            reason = segment_end(s, self._st[s.sid].seg_start, self.tokenizer, self.eos, s.params.max_len)
            if reason is not None:
                s.finish_reason = reason
                s.status = "paused" if reason == "stop" else "finished"
                self._leave(s.sid)
            outs.append(StepOutput(s.sid, t, chosen[i], ent[i], reason))
        return outs


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return replace(params, seed=seed)


def _eager_sampling(p: SamplingParams) -> bool:
    """Whether a sequence's next token needs the eager sampler (after the step's forward)."""
    return p.logits_hook is not None or p.top_k > 0 or p.top_p < 1.0


def _as_list(x) -> list:
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)
