"""A slot-based batched KV cache that lets sequences join, leave and fork without recomputation.

Layout: one buffer `(layers, 2, slots, kv_heads, capacity, head_dim)`. All slots share one write
column `ptr`; each slot has a boolean row of valid columns, so a slot's tokens need not be contiguous
(a prefill that other slots sit out leaves a masked gap in their rows, which costs a little attention
compute but no copy). Positions come from each slot's own token count. A sequence that leaves the
batch takes its K/V with it as a compact tensor `(layers, 2, kv_heads, L, head_dim)`; a fork of it
references that tensor's prefix (a view, no copy) until it joins a slot.

Compaction (copy every live slot's valid columns, right-aligned, into a fresh buffer) runs only when
capacity runs out or too much of the buffer is dead.
"""

from __future__ import annotations

import torch


class KVBatch:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, dtype, device):
        self.shape = (n_layers, n_kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.buf = torch.zeros(n_layers, 2, 0, n_kv_heads, 0, head_dim, dtype=dtype, device=device)
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=device)  # (S, cap)
        self.npos = torch.zeros(0, dtype=torch.long, device=device)  # (S,) tokens held per slot
        self.owner: list[int | None] = []  # slot -> sid
        self.ptr = 0

    # ---- bookkeeping -------------------------------------------------------------------------
    @property
    def n_slots(self) -> int:
        return len(self.owner)

    @property
    def capacity(self) -> int:
        return self.valid.shape[1]

    def free_slots(self) -> list[int]:
        return [i for i, o in enumerate(self.owner) if o is None]

    def live_slots(self) -> list[int]:
        return [i for i, o in enumerate(self.owner) if o is not None]

    def max_len(self) -> int:
        return int(self.npos.max()) if self.n_slots else 0

    # ---- moving sequences in and out -----------------------------------------------------------
    def extract(self, slot: int, n: int | None = None) -> torch.Tensor:
        """Copy out the first n cached tokens of a slot as (layers, 2, kv_heads, n, head_dim)."""
        cols = self.valid[slot, : self.ptr].nonzero().flatten()
        if n is not None:
            cols = cols[:n]
        return self.buf[:, :, slot].index_select(-2, cols)

    def free(self, slot: int) -> None:
        self.owner[slot] = None
        self.valid[slot] = False
        self.npos[slot] = 0

    def reshape(self, n_slots: int, q: int, past_len: int = 0, headroom: int = 256) -> dict[int, int]:
        """Compact into a fresh buffer holding the live slots first, then empty ones, with room for a
        `q`-token block after max(ptr, past_len). Returns old slot -> new slot for the live ones."""
        live = self.live_slots()
        n_slots = max(n_slots, len(live))
        width = self.max_len()
        cap = max(width, past_len) + q + headroom
        nl, h, d = self.shape
        buf = torch.zeros(nl, 2, n_slots, h, cap, d, dtype=self.dtype, device=self.device)
        valid = torch.zeros(n_slots, cap, dtype=torch.bool, device=self.device)
        npos = torch.zeros(n_slots, dtype=torch.long, device=self.device)
        mapping = {}
        for new, old in enumerate(live):
            n = int(self.npos[old])
            if n:
                buf[:, :, new, :, width - n : width] = self.extract(old)
                valid[new, width - n : width] = True
            npos[new] = n
            mapping[old] = new
        self.owner = [self.owner[o] for o in live] + [None] * (n_slots - len(live))
        self.buf, self.valid, self.npos, self.ptr = buf, valid, npos, width
        return mapping

    def ensure(self, n_new_slots: int, q: int, past_len: int = 0) -> dict[int, int] | None:
        """Make room for `n_new_slots` more sequences (whose cached prefixes are at most `past_len`
        long) and a `q`-token block; compacts when needed, or when over half the buffer is dead.
        Returns the slot remapping if slots moved."""
        free = len(self.free_slots())
        live = self.n_slots - free
        too_narrow = max(self.ptr, past_len) + q > self.capacity
        dead_cols = self.ptr > 2 * self.max_len() + 128
        dead_slots = free > max(1, self.n_slots // 4) and free > n_new_slots
        if n_new_slots > free or too_narrow or dead_cols or dead_slots:
            return self.reshape(live + n_new_slots, q, past_len)
        return None

    def place(self, slot: int, sid: int, past: torch.Tensor | None, end: int) -> None:
        """Put a sequence's cached K/V (or nothing) into a free slot, ending at column `end`."""
        self.owner[slot] = sid
        self.valid[slot] = False
        n = 0 if past is None else past.shape[-2]
        if n:
            self.buf[:, :, slot, :, end - n : end] = past
            self.valid[slot, end - n : end] = True
        self.npos[slot] = n


class SlotCache:
    """What the HF model sees as `past_key_values` for one forward: new K/V are written at columns
    [col, col+q) of the given slots (all slots when `rows` is None) and the attended K/V returned."""

    def __init__(self, kv: KVBatch, col: int, rows: torch.Tensor | None = None):
        self.kv, self.col, self.rows = kv, col, rows
        self.is_sliding = [False] * kv.shape[0]
        self.layers = []

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.col

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        q = key_states.shape[-2]
        end = self.col + q
        k, v = self.kv.buf[layer_idx, 0], self.kv.buf[layer_idx, 1]  # (S, H, cap, D)
        if self.rows is None:
            k[:, :, self.col : end] = key_states
            v[:, :, self.col : end] = value_states
            return k[:, :, :end], v[:, :, :end]
        k[self.rows, :, self.col : end] = key_states
        v[self.rows, :, self.col : end] = value_states
        return k[self.rows, :, :end], v[self.rows, :, :end]
