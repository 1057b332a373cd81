"""A slot-based batched KV cache that lets sequences join, leave and fork without recomputation.

Layout: one buffer `(layers, 2, slots, kv_heads, capacity, head_dim)`. All slots share one write
column `ptr`; each slot has a boolean row of valid columns, so a slot's tokens need not be contiguous
(a prefill that other slots sit out leaves a masked gap in their rows, which costs a little attention
compute but no copy). Positions come from each slot's own token count. A sequence that leaves the
batch takes its K/V with it as a compact tensor `(layers, 2, kv_heads, L, head_dim)`; a fork of it
references that tensor's prefix (a view, no copy) until it joins a slot.

Compaction (copy every live slot's valid columns, right-aligned, into a fresh buffer) runs only when
capacity runs out or too much of the buffer is dead.

`fixed=True` (the graph step, engine/graph.py): the buffer, the valid rows and the positions are views
of one storage that is allocated in bucketed sizes (slots and columns rounded up to powers of two) and
reused — compaction copies within it — so a captured CUDA graph that reads
`storage[:, :, :S, :, :W]` stays valid across joins, leaves, forks and compactions. The storage is
reallocated only when it must grow (`generation` counts that; graphs are then captured again).

`lens` mirrors `npos` on the host, so bookkeeping never reads the device.
"""

from __future__ import annotations

import torch


def bucket(n: int, smallest: int = 1) -> int:
    """The smallest power of two >= max(n, smallest)."""
    b = max(1, smallest)
    while b < n:
        b *= 2
    return b


class KVBatch:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, dtype, device, fixed: bool = False,
                 min_slots: int = 8, min_width: int = 256):
        self.shape = (n_layers, n_kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.fixed, self.min_slots, self.min_width = fixed, min_slots, min_width
        self.generation = 0  # storage reallocations (fixed mode)
        # fixed mode: (buf, valid, npos) at bucketed sizes
        self.store: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.buf = torch.zeros(n_layers, 2, 0, n_kv_heads, 0, head_dim, dtype=dtype, device=device)
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=device)  # (S, cap)
        self.npos = torch.zeros(0, dtype=torch.long, device=device)  # (S,) tokens held per slot
        self.lens: list[int] = []  # host copy of npos
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
        return max(self.lens, default=0)

    def grow_len(self, slots: list[int], n: int) -> None:
        """`n` more tokens cached in each of these slots (device positions and the host copy)."""
        for s in slots:
            self.lens[s] += n
        if len(slots) == 1:
            self.npos[slots[0]] += n
        elif slots:
            self.npos[torch.tensor(slots, device=self.device)] += n

    def _alloc(self, n_slots: int, cap: int):
        """(buf, valid, npos) for n_slots x cap: fresh tensors, or (fixed) views of the storage, grown
        to bucketed sizes when too small; valid and npos come back zeroed."""
        nl, h, d = self.shape
        if not self.fixed:
            return (torch.zeros(nl, 2, n_slots, h, cap, d, dtype=self.dtype, device=self.device),
                    torch.zeros(n_slots, cap, dtype=torch.bool, device=self.device),
                    torch.zeros(n_slots, dtype=torch.long, device=self.device))
        if self.store is None or self.store[0].shape[2] < n_slots or self.store[0].shape[4] < cap:
            S = bucket(n_slots, max(self.min_slots, 0 if self.store is None else self.store[0].shape[2]))
            W = bucket(cap, max(self.min_width, 0 if self.store is None else self.store[0].shape[4]))
            self.store = None  # free the old storage first (its live content was copied out)
            self.store = (torch.zeros(nl, 2, S, h, W, d, dtype=self.dtype, device=self.device),
                          torch.zeros(S, W, dtype=torch.bool, device=self.device),
                          torch.zeros(S, dtype=torch.long, device=self.device))
            self.generation += 1
        buf, valid, npos = self.store
        valid.zero_()
        npos.zero_()
        return buf[:, :, :n_slots], valid[:n_slots], npos[:n_slots]

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
        self.lens[slot] = 0

    def reshape(self, n_slots: int, q: int, past_len: int = 0, headroom: int = 256) -> dict[int, int]:
        """Compact into a fresh buffer holding the live slots first, then empty ones, with room for a
        `q`-token block after max(ptr, past_len). Returns old slot -> new slot for the live ones."""
        live = self.live_slots()
        n_slots = max(n_slots, len(live))
        width = self.max_len()
        cap = max(width, past_len) + q + headroom
        # fixed: the new buffer is the old one's storage, so copy every live slot out first
        moved = {old: self.extract(old) for old in live if self.lens[old]} if self.fixed else {}
        lens = self.lens
        buf, valid, npos = self._alloc(n_slots, cap)
        mapping = {}
        for new, old in enumerate(live):
            n = lens[old]
            if n:
                buf[:, :, new, :, width - n : width] = moved.pop(old) if self.fixed else self.extract(old)
                valid[new, width - n : width] = True
            npos[new] = n
            mapping[old] = new
        self.owner = [self.owner[o] for o in live] + [None] * (n_slots - len(live))
        self.lens = [lens[o] for o in live] + [0] * (n_slots - len(live))
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
        if past is not None and n:
            self.buf[:, :, slot, :, end - n : end] = past
            self.valid[slot, end - n : end] = True
        self.npos[slot] = n
        self.lens[slot] = n


class SlotCache:
    """What the HF model sees as `past_key_values` for one forward: new K/V are written at columns
    [col, col+q) of the given slots (all slots when `rows` is None) and the attended K/V returned."""

    def __init__(self, kv: KVBatch, col: int, rows: torch.Tensor | None = None):
        self.kv, self.col, self.rows = kv, col, rows
        self.is_sliding = [False] * kv.shape[0]
        self.layers: list[object] = []

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
