"""Counter-based per-sequence random numbers: the same uniform on any device, in or out of a graph.

Each sequence has a 64-bit key (two 32-bit words, from its seed); the uniform that samples the token
at index `n` of its token list is `uniform(key, n)`, a pure integer hash. So a sequence's samples
depend on its seed and its tokens only (not on the batch, the step order or the device), and a
decode step can draw them on the device from the slots' keys and positions — no host generator, no
host-to-device copy, deterministic under CUDA-graph replay.

The hash works in int64 on values below 2**32 with multipliers below 2**31 (no product overflows),
so CPU, CUDA, inductor and triton compute it bit-identically. The mixer is a 32-bit
xorshift-multiply finaliser (hash-prospector's "lowbias32" family), applied per key word.
"""

from __future__ import annotations

import random

import torch

M32 = 0xFFFFFFFF
_C1, _C2 = 0x21F0AAAD, 0x735A2D97  # both < 2**31: x * C stays below 2**63 for x < 2**32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit finaliser on int64 tensors holding values in [0, 2**32): x -> hashed x, same range."""
    x = x & M32
    x = x ^ (x >> 16)
    x = (x * _C1) & M32
    x = x ^ (x >> 15)
    x = (x * _C2) & M32
    return x ^ (x >> 15)


def uniform(k0: torch.Tensor, k1: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """One float32 uniform in (0, 1) per row: hash of (key words k0, k1; counter), all int64 (S,).
    24 bits of the hash, centred in their bin (never 0, never 1)."""
    x = mix32(mix32(counter ^ k0) ^ k1)
    x = mix32(x + k0)
    return ((x >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def _splitmix64(z: int) -> int:
    """SplitMix64's output for state z (Steele, Lea & Flood 2014): z += 0x9E3779B97F4A7C15, then the
    xor-shift-multiply finaliser, all mod 2**64. splitmix64(0) = 0xE220A8397B1DCDAF."""
    z = (z + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def key_of(seed: int | None) -> int:
    """A sequence's 64-bit key from its seed (a fresh random key when the seed is None)."""
    if seed is None:
        return random.SystemRandom().getrandbits(64)
    return _splitmix64(int(seed) & 0xFFFFFFFFFFFFFFFF)


def child_key(parent: int, n: int) -> int:
    """The key of a parent's n-th unseeded fork (deterministic in the parent's key and n)."""
    return _splitmix64(parent ^ _splitmix64(n + 1))


def words(key: int) -> tuple[int, int]:
    """The two 32-bit words of a key, as the device step stores them."""
    return key & M32, (key >> 32) & M32


def uniforms_for(keys: list[int], counters: list[int]) -> torch.Tensor:
    """Host-side: the uniforms of many sequences (S,) float32 on the CPU."""
    w = [words(k) for k in keys]
    k0 = torch.tensor([a for a, _ in w], dtype=torch.long)
    k1 = torch.tensor([b for _, b in w], dtype=torch.long)
    return uniform(k0, k1, torch.tensor(counters, dtype=torch.long))


# ---- keyed draws: a random number named by what it is for, not by when it is drawn -----------------
def fold_key(*parts: int) -> int:
    """One 64-bit key from a tuple of integers (position matters):
    h_0 = 0, h_{i+1} = splitmix64(h_i ⊕ splitmix64(p_i mod 2**64)), key = h_n.
    The rollout keys every random choice by (seed, prompt, what, lineage, index), so a draw does not
    depend on the order in which draws happen (rollout/arpo.py)."""
    h = 0
    for p in parts:
        h = _splitmix64(h ^ _splitmix64(int(p) & 0xFFFFFFFFFFFFFFFF))
    return h


def key_uniform(key: int) -> float:
    """A uniform in (0, 1) from a 64-bit key: u = (⌊key / 2**12⌋ + 0.5) · 2**−52 — its top 52 bits,
    centred in their bin (exact in a double; never 0, never 1)."""
    return ((key >> 12) + 0.5) * 2.0**-52


def key_seed(key: int) -> int:
    """A sequence seed in [0, 2**62) from a 64-bit key: ⌊key / 4⌋."""
    return key >> 2
