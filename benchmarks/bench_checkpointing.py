"""Peak memory of a training step with and without activation checkpointing (memory.activation_checkpointing),
next to the estimate of training/memory.py.

Each measurement runs in its own subprocess: the child imports torch, notes its resident memory
(VmRSS), resets its high-water mark (`echo 5 > /proc/self/clear_refs`), builds a random-weight
Qwen2-style model (arpo.testing.arch_model, float32), an AdamW, and a batch of `--trees` ARPO-shaped
trees (one prompt, `--group` responses) packed into one micro-batch, then runs `--steps` training
steps (loss_and_backward, the optimizer step, zero_grad) and reports VmHWM - VmRSS-before: what the
model, its optimizer and the steps added at their peak. glibc is told to serve every allocation over
64 KiB with mmap (MALLOC_MMAP_THRESHOLD_), so freed tensors leave the resident set at once and the
high-water mark is the tensors' own peak, not the allocator's hoard.

    python benchmarks/bench_checkpointing.py [--hidden 256] [--layers 4] [--tokens 2048] [--json]

Prints, per variant (off / on): measured peak (MB), the estimate (MB), their ratio, and the step time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status (not Linux?)")


def _trees(tokens: int, group: int, vocab: int, seed: int = 0) -> list[dict]:
    """One tree of `tokens` packed tokens: a prompt of a quarter, `group` root responses sharing the rest."""
    import random

    r = random.Random(seed)
    prompt = tokens // 4
    resp = (tokens - prompt) // group
    ids = lambda n: [r.randrange(8, vocab) for _ in range(n)]  # noqa: E731 - a local helper
    return [{"prompt": ids(prompt), "responses": [ids(resp) for _ in range(group)], "parent": [-1] * group,
             "branch_at": [0] * group}]


def child(a) -> dict:
    import torch

    torch.set_num_threads(1)
    from arpo.testing import arch_model, arch_tokenizer
    from arpo.training.batch import TreeBatch, _micro_packs, loss_and_backward
    from arpo.training.memory import (
        activation_bytes,
        adamw_bytes,
        arch_from_config,
        head_bytes,
        n_params,
        weights_bytes,
    )
    from arpo.training.optim import checkpoint_activations

    tok = arch_tokenizer("qwen2")

    def run(hidden, layers, heads, kv_heads, tokens, steps):
        torch.manual_seed(0)
        model = arch_model("qwen2", tok, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads)
        if a.checkpointing:
            checkpoint_activations(model)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        trees = _trees(tokens, a.group, len(tok))
        batch = TreeBatch.from_trees(trees, TreeBatch.all_generated(trees))

        def loss_fn(lp, en):
            return -(lp * batch.mask).sum() / batch.mask.sum(), {}

        for _ in range(steps):
            loss_and_backward(model, batch, loss_fn, max_tokens=tokens, current=(torch.zeros(batch.mask.shape), None))
            opt.step()
            opt.zero_grad(set_to_none=True)
        return model, batch

    run(16, 1, 2, 1, 64, 1)  # warm-up: the code paths' imports and one-time buffers are not the step's memory
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts from the current RSS
    t0 = time.perf_counter()
    model, batch = run(a.hidden, a.layers, a.heads, a.kv_heads, a.tokens, a.steps)
    seconds = (time.perf_counter() - t0) / a.steps
    peak = _status("VmHWM") - before
    (packs,) = _micro_packs(batch, True, a.tokens)
    arch = arch_from_config(model.config)
    n, t, s = n_params(arch), sum(p.n_tokens for p in packs), max(p.n_tokens for p in packs)
    assert n == sum(p.numel() for p in model.parameters()), (n, sum(p.numel() for p in model.parameters()))
    terms = {"weights": weights_bytes(n, 4), "gradients": weights_bytes(n, 4), "optimizer": adamw_bytes(n, 4),
             "activations": activation_bytes(arch, t, s, 4, a.checkpointing), "head": head_bytes(arch, t, 4)}
    return {"checkpointing": a.checkpointing, "hidden": a.hidden, "layers": a.layers, "tokens": t, "params": n,
            "peak_mb": peak / 1e6, "estimate_mb": sum(terms.values()) / 1e6,
            "terms_mb": {k: round(v / 1e6, 1) for k, v in terms.items()}, "step_seconds": seconds}


def measure(hidden: int, layers: int, tokens: int, checkpointing: bool, heads: int = 4, kv_heads: int = 2,
            group: int = 4, steps: int = 2) -> dict:
    """One variant in a fresh subprocess (see the module docstring)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--child", "--hidden", str(hidden), "--layers", str(layers), "--tokens",
           str(tokens), "--heads", str(heads), "--kv-heads", str(kv_heads), "--group", str(group), "--steps",
           str(steps)] + (["--checkpointing"] if checkpointing else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1, help="off/on pairs, interleaved")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a)))
        return 0
    rows = [measure(a.hidden, a.layers, a.tokens, ck, a.heads, a.kv_heads, a.group, a.steps)
            for _ in range(a.repeats) for ck in (False, True)]
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"qwen2-style h={a.hidden} L={a.layers}, {rows[0]['params'] / 1e6:.2f}M params, fp32, one micro-batch of "
          f"{rows[0]['tokens']} packed tokens, {a.steps} steps; peak = VmHWM - VmRSS before the model")
    print(f"{'checkpointing':>13} {'peak MB':>9} {'estimate MB':>12} {'est/peak':>9} {'s/step':>7}")
    for r in rows:
        print(f"{str(r['checkpointing']).lower():>13} {r['peak_mb']:9.1f} {r['estimate_mb']:12.1f} "
              f"{r['estimate_mb'] / r['peak_mb']:9.3f} {r['step_seconds']:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
