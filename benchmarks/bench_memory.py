"""Peak memory of token log-probs, full logits vs chunked (arpo.algos.logprobs).

One training-step shaped computation, forward + backward of  loss = -(logp * adv).mean()
(optionally  - coef * entropy.mean()),  on random fp32 hidden states (N, D) and an output matrix
(V, D) sized like SmolLM2-135M (D=576, V=49152). Each variant runs in its own subprocess and its
peak resident memory is that process's VmHWM (bench_training.peak_rss_gb: not ru_maxrss, which a
child inherits from its parent; tracemalloc does not see torch's allocations). The "setup" column is
the peak before the computation (python, torch, the inputs), "extra" the peak minus setup.

    python benchmarks/bench_memory.py [--tokens 4096] [--dim 576] [--vocab 49152] [--chunk-size 1024]
                                      [--entropy] [--threads N] [--json]

Exit code 1 when chunked/naive peak RSS > 0.5 (the goal), or the two variants disagree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GOAL = 0.5


def _rss_gb() -> float:
    """This process's own peak RSS in GB (called in the child, which imports torch anyway)."""
    from bench_training import peak_rss_gb  # benchmarks/ is on sys.path: this script's directory

    return peak_rss_gb() * 2**30 / 1e9


def child(args) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from arpo.algos.logprobs import naive_token_logprobs, token_logprobs

    g = torch.Generator().manual_seed(0)
    n, d, v = args.tokens, args.dim, args.vocab
    hidden = (torch.randn(n, d, generator=g)).requires_grad_()
    weight = (torch.randn(v, d, generator=g) * d ** -0.5).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=g)
    adv = torch.randn(n, generator=g)
    fn = naive_token_logprobs if args.variant == "naive" else token_logprobs
    setup = _rss_gb()
    t = time.perf_counter()
    logp, ent = fn(hidden, weight, targets, chunk_size=args.chunk_size, with_entropy=args.entropy)
    loss = -(logp * adv).mean()
    if args.entropy:
        loss = loss - 0.01 * ent.mean()
    loss.backward()
    dt = time.perf_counter() - t
    return {"variant": args.variant, "peak_gb": _rss_gb(), "setup_gb": setup, "time_s": dt,
            "loss": float(loss), "grad_h_norm": float(hidden.grad.norm()), "grad_w_norm": float(weight.grad.norm())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096, help="N = B*T rows")
    ap.add_argument("--dim", type=int, default=576)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--entropy", action="store_true", help="also compute entropies and add -0.01*H to the loss")
    ap.add_argument("--threads", type=int, default=0, help="torch threads in the children (0: torch default)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--variant", choices=["naive", "chunked"], help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args(argv)
    if args.variant:
        print(json.dumps(child(args)))
        return 0

    base = [sys.executable, os.path.abspath(__file__), "--tokens", str(args.tokens), "--dim", str(args.dim),
            "--vocab", str(args.vocab), "--chunk-size", str(args.chunk_size), "--threads", str(args.threads)]
    if args.entropy:
        base.append("--entropy")
    res = {}
    for variant in ("naive", "chunked"):
        out = subprocess.run(base + ["--variant", variant], capture_output=True, text=True)
        if out.returncode:
            sys.stderr.write(out.stderr)
            return 2
        res[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    nv, ch = res["naive"], res["chunked"]
    ratio = ch["peak_gb"] / nv["peak_gb"]
    agree = all(abs(nv[k] - ch[k]) <= 1e-4 * max(1.0, abs(nv[k])) for k in ("loss", "grad_h_norm", "grad_w_norm"))
    ok = ratio <= GOAL and agree
    if args.json:
        print(json.dumps({"config": vars(args), "results": res, "ratio": ratio, "agree": agree, "ok": ok}))
    else:
        print(f"N={args.tokens} D={args.dim} V={args.vocab} chunk={args.chunk_size} entropy={args.entropy} "
              f"threads={args.threads or 'default'}")
        print()
        print("| variant | peak RSS GB | setup GB | extra GB | time s | peak ratio |")
        print("|---|---|---|---|---|---|")
        for r in (nv, ch):
            print(f"| {r['variant']} | {r['peak_gb']:.3f} | {r['setup_gb']:.3f} | {r['peak_gb'] - r['setup_gb']:.3f} "
                  f"| {r['time_s']:.2f} | {r['peak_gb'] / nv['peak_gb']:.3f} |")
        print()
        print(f"chunked/naive peak = {ratio:.3f} (goal <= {GOAL}): {'met' if ratio <= GOAL else 'MISSED'}; "
              f"loss/grad norms agree: {agree} (loss {nv['loss']:.6f} vs {ch['loss']:.6f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
