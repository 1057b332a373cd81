"""The decode step as one CUDA-graph replay (engine option `graph=True`).

On a GPU the eager step is launch-bound: ~50 kernels a layer, each launched from Python, so a step
takes as long as its launches whatever the batch. Here the whole step — forward, sampling, log-prob,
entropies and the bookkeeping of the slot cache — is one captured graph, replayed each step:

- **static buffers**: the slot cache (engine/kv.py `fixed=True`: one storage, bucketed, reused by
  compaction) and per-slot state on the device: this step's token, sampling inputs, RNG key words,
  a live flag, and the write column `ptr`;
- **buckets**: a step runs at S = the slot count rounded up to a power of two and W = the cache width
  (ptr + 1) rounded up to a power of two (>= 64); padded slots are not live (their rows are computed
  and ignored), padded columns are masked. One graph per (S, W), captured the first time it is needed
  and reused; joins, leaves, forks, appends and compactions change only buffer contents;
- **device-side sampling**: uniforms from each slot's key and position (engine/rng.py), so a replay
  needs nothing from the host;
- **state advanced in the graph**: the new K/V written at column ptr, the live slots' column marked
  valid, their positions + 1, the sampled tokens become next step's input, ptr + 1;
- **one device-to-host copy** per step: (token, log-prob, entropy, top-k entropy) per slot, (S, 4).

The host re-uploads the per-slot state only after something changed it (a join, a leave, a
compaction, an eager step): `upload()`. Where graphs cannot be captured (CPU) the same bucketed body
runs eagerly — that is how its logic is tested without a GPU (tests/engine/test_graph.py).
"""

from __future__ import annotations

import torch

from arpo.engine.kv import KVBatch, bucket
from arpo.engine.rng import uniform, words
from arpo.engine.static import StaticForward, rotary

MIN_WIDTH = 64  # smallest cache-width bucket


class GraphStep:
    def __init__(self, static: StaticForward, kv: KVBatch, k_entropy: int, capture: bool | None = None):
        if not kv.fixed:
            raise ValueError("GraphStep needs a KVBatch with fixed=True (static storage)")
        self.static, self.kv, self.k = static, kv, int(k_entropy)
        self.capture = kv.device.type == "cuda" if capture is None else bool(capture)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph | None] = {}  # None: run eagerly
        self.pool: torch.cuda._POOL_HANDLE | None = None
        # (storage generation, weight layout) the graphs and state were made for
        self._key: tuple[int, int] | None = None
        self.n = 0  # slots of the state tensors (= storage slots)
        self.captures = 0  # graphs captured (or, eagerly, buckets first run) since the last reset
        self.replays = 0
        self.uploads = 0
        self.in_body = False  # tests: True while the captured body runs

    # ---- state ---------------------------------------------------------------------------------
    def _store(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The cache's fixed storage (buf, valid, npos); the engine reshapes the cache before a step."""
        if self.kv.store is None:
            raise RuntimeError("GraphStep: the KVBatch has no fixed storage yet (reshape it before a step)")
        return self.kv.store

    def _valid_key(self) -> None:
        """State tensors sized to the storage (made anew when the storage was reallocated: the engine
        uploads after every compaction anyway); graphs dropped when the storage or the weights moved."""
        if self._key is None or self._key[0] != self.kv.generation:
            d, S = self.kv.device, self._store()[0].shape[2]
            self.n = S
            self.ints = torch.zeros(5, S, dtype=torch.long, device=d)  # token, do_sample, k0, k1, live
            self.safe_t = torch.ones(S, dtype=torch.float32, device=d)
            self.ptr = torch.zeros(1, dtype=torch.long, device=d)
            self.out = torch.zeros(S, 4, dtype=torch.float32, device=d)
            self.host = torch.zeros(S, 4, dtype=torch.float32, pin_memory=d.type == "cuda")
        key = (self.kv.generation, self.static.w.layout)
        if key != self._key:
            self.graphs.clear()
            self._key = key

    def upload(self, slots: list[int], tokens: list[int], temperatures: list[float], keys: list[int]) -> None:
        """Per-slot state from the host (after a join, leave, compaction or eager step): the live
        slots, their input tokens, temperatures and RNG keys; ptr from the cache."""
        self._valid_key()
        ints = torch.zeros(5, self.n, dtype=torch.long)
        safe_t = torch.ones(self.n, dtype=torch.float32)
        if slots:
            w = [words(k) for k in keys]
            idx = torch.tensor(slots)
            ints[0, idx] = torch.tensor(tokens)
            ints[1, idx] = torch.tensor([int(t > 0) for t in temperatures])
            ints[2, idx] = torch.tensor([a for a, _ in w])
            ints[3, idx] = torch.tensor([b for _, b in w])
            ints[4, idx] = 1
            safe_t[idx] = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float32)
        self.ints.copy_(ints)
        self.safe_t.copy_(safe_t)
        self.ptr.fill_(self.kv.ptr)
        self.uploads += 1

    # ---- the step ------------------------------------------------------------------------------
    def _compute(self, S: int, W: int):
        """The step's math at bucket (S, W) from the static buffers; writes nothing."""
        sf, w = self.static, self.static.w
        buf, valid, npos = self._store()
        ids, do_sample, k0, k1 = self.ints[0, :S], self.ints[1, :S], self.ints[2, :S], self.ints[3, :S]
        pos = npos[:S]
        cos, sin = rotary(pos[:, None], w.inv_freq, w.rope_scale, sf.dtype)
        bias = torch.zeros(S, W, dtype=sf.dtype, device=pos.device).masked_fill_(~valid[:S, :W], float("-inf"))
        u = uniform(k0, k1, pos + 1)  # the token sampled now has index pos + 1 in its sequence
        return sf.step(ids, cos[:, 0], sin[:, 0], bias, buf[:, :, :S], self.safe_t[:S], do_sample, u, self.k, True)

    def _body(self, S: int, W: int) -> None:
        """_compute, then advance the state: K/V at column ptr, valid/positions of live slots, the
        sampled tokens as next inputs, ptr + 1, and the results into `out`."""
        self.in_body = True
        try:
            _, nk, nv, toks, chosen, ent, topk = self._compute(S, W)
            buf, valid, npos = self._store()
            live = self.ints[4, :S]
            buf[:, :, :S].index_copy_(4, self.ptr, torch.stack((nk, nv), 1).unsqueeze(4))
            valid[:S].index_copy_(1, self.ptr, live.bool()[:, None])
            npos[:S].add_(live)
            self.ints[0, :S].copy_(torch.where(live.bool(), toks, self.ints[0, :S]))
            self.ptr.add_(1)
            self.out[:S].copy_(torch.stack((toks.to(torch.float32), chosen, ent, topk), -1))
        finally:
            self.in_body = False

    def _capture(self, S: int, W: int) -> torch.cuda.CUDAGraph:
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (lazy inits, a compile): the math only, no state change
            self._compute(S, W)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self._body(S, W)
        return g

    def buckets(self) -> tuple[int, int]:
        """(S, W) of the next step: slot count and cache width (ptr + 1), rounded up to powers of two."""
        return bucket(self.kv.n_slots), bucket(self.kv.ptr + 1, MIN_WIDTH)

    @torch.no_grad()
    def run(self) -> torch.Tensor:
        """One step of every slot; returns the host copy (S, 4): token (as float), log-prob, entropy,
        top-k entropy per slot (rows of slots that are not live are garbage)."""
        self.static.w.refresh()  # weights changed: updated in place (same graphs) or rebuilt (layout moves)
        self._valid_key()
        S, W = self.buckets()
        if self.capture:
            g = self.graphs.get((S, W))
            if g is None:
                g = self.graphs[(S, W)] = self._capture(S, W)
                self.captures += 1
            g.replay()
        else:
            if (S, W) not in self.graphs:
                self.graphs[(S, W)] = None
                self.captures += 1
            self._body(S, W)
        self.replays += 1
        host = self.host[:S]
        host.copy_(self.out[:S])  # the step's one device-to-host copy (waits for the step)
        return host
