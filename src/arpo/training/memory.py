"""Keep a training process's peak memory where the step puts it, run after run.

A full fine-tuning step allocates and frees hundreds of MB-sized tensors (activations of each
micro-batch, logits chunks, gradients). glibc's malloc serves allocations above its mmap threshold with
mmap and returns them to the OS on free — but the threshold is *dynamic*: every freed mmapped block
raises it (up to 32 MB), after which blocks of that size come from the heap arenas, where freed memory
stays in the process and fragments across the autograd and OpenMP threads' arenas. Which blocks land
where depends on timing, so the same step peaked at 3.9 GB in one run and 5.5 GB in another
(BENCHMARKS.md, issue 21). A fixed threshold (which also fixes the trim threshold) and at most two
arenas make every large tensor an mmap that is unmapped when freed: the peak is the step's live memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
_done: dict = {}


def stable_malloc(mmap_threshold: int = 128 * 1024, arena_max: int = 2) -> bool:
    """Set glibc's mmap threshold (fixed: no dynamic adjustment) and arena count for this process.
    Idempotent; returns False where the C library is not glibc (nothing changed)."""
    if "ok" in _done:
        return _done["ok"]
    ok = False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = getattr(libc, "mallopt", None)
        if mallopt is not None:
            ok = bool(mallopt(M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(mallopt(M_ARENA_MAX, int(arena_max)))
            mallopt(M_TRIM_THRESHOLD, int(mmap_threshold))
    except OSError:
        ok = False
    _done["ok"] = ok
    return ok
