"""Training-side benchmarks on the default model (issue 6, items 3 and 6).

1. Tree-packed vs flat log-prob + backward on the same ARPO-shaped trees: each tree has a
   `--prompt`-token prompt, N global samples of `--resp` tokens and N branches that fork halfway
   through their parent (the shape ARPO's branching produces; token ids random). Same loss
   (token-mean clipped surrogate), same micro-batch size; gradients are equal (tests/training).
   Packed twice: with the block-sparse tree attention (training/tree_attention.py, the default) and
   with dense masked SDPA over the whole pack (the attention before it; same gradients).
2. Peak memory (the process's own peak RSS, VmHWM; one fresh process per variant) of one full
   fine-tuning step on B x T tokens: naive (model(...).logits -> log_softmax, one forward/backward), chunked
   log-probs alone (same single forward), and arpo's training path (chunked log-probs, loss
   back-propagated through dL/dlogp in micro-batches of 1024 tokens; same batch, same gradient).
3. An SFT micro-batch padded to its longest row against its rows end to end in one row (bench_rows).

    python benchmarks/bench_training.py [--json] [--only packing|memory|rows]
Goals: packed/flat time <= 0.6; arpo/naive peak memory <= 0.5 in every run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch


def _trees(n_trees, prompt, resp, n_global, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_trees):
        p = torch.randint(100, vocab, (prompt,), generator=g).tolist()
        rs, par, br = [], [], []
        for _ in range(n_global):
            rs.append(torch.randint(100, vocab, (resp,), generator=g).tolist())
            par.append(-1)
            br.append(0)
        for i in range(n_global):
            b = resp // 2
            rs.append(rs[i][:b] + torch.randint(100, vocab, (resp - b,), generator=g).tolist())
            par.append(i)
            br.append(b)
        out.append({"prompt": p, "responses": rs, "parent": par, "branch_at": br})
    return out


def bench_packing(a) -> dict:
    from arpo.algos.losses import policy_loss
    from arpo.models import load_model
    from arpo.training.batch import TreeBatch, loss_and_backward, token_logprobs

    model, tok = load_model(a.model)
    model.train()
    if a.train_layers:  # the deep-search example's setting (model.train_layers: 10)
        from arpo.training.optim import freeze_lower_layers

        freeze_lower_layers(model, a.train_layers)
    trees = _trees(a.trees, a.prompt, a.resp, a.n_global, len(tok))
    batch = TreeBatch.from_trees(trees, TreeBatch.all_generated(trees))
    adv = torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(1))
    res = {"tree_shape": f"{a.trees} trees x (prompt {a.prompt} + {a.n_global} globals x {a.resp} + "
                         f"{a.n_global} half-way branches)" + (f", top {a.train_layers} layers trained"
                                                                if a.train_layers else ""),
           "tokens_flat": batch.n_tokens(False), "tokens_packed": batch.n_tokens(True)}
    from arpo.training import tree_attention

    sparse_block = tree_attention.BLOCK
    for variant in ("packed", "packed_dense", "flat"):
        packed = variant != "flat"
        # dense: no pack spans two blocks, so tree_sdpa_forward hands every call to transformers' SDPA
        tree_attention.BLOCK = 10**9 if variant == "packed_dense" else sparse_block
        ts = []
        for _ in range(a.repeats):
            model.zero_grad(set_to_none=True)
            t = time.perf_counter()
            old, _ = token_logprobs(model, batch, packed=packed, max_tokens=a.micro_tokens)
            loss_and_backward(model, batch, lambda lp, en, old=old: policy_loss(lp, old, adv, batch.mask),
                              packed=packed, max_tokens=a.micro_tokens, current=(old, None))
            ts.append(time.perf_counter() - t)
        res[f"{variant}_s"] = statistics.median(ts)
    tree_attention.BLOCK = sparse_block
    res["packed_over_flat"] = res["packed_s"] / res["flat_s"]
    res["packed_over_packed_dense"] = res["packed_s"] / res["packed_dense_s"]
    return res


def bench_rows(a) -> dict:
    """An SFT step's micro-batch (8 rows: a 250-token prompt and a 200-400-token response each, NLL,
    linear=True) with its rows padded to the longest (B, S) against end to end in one row (collate
    one_row, the CPU default): the same log-probs (tests/training/test_tree_attention.py); padding
    tokens are computed in the first. Alternating order, median of --repeats."""
    import random

    import arpo.training.packing as P
    from arpo.models import load_model
    from arpo.recipes.sft import nll_loss
    from arpo.training.batch import TreeBatch, loss_and_backward

    model, tok = load_model(a.model)
    model.train()
    rng = random.Random(0)
    trees = [{"prompt": [rng.randrange(100, len(tok)) for _ in range(250)],
              "responses": [[rng.randrange(100, len(tok)) for _ in range(rng.randint(200, 400))]],
              "parent": [-1], "branch_at": [0]} for _ in range(8)]
    batch = TreeBatch.from_trees(trees, TreeBatch.all_generated(trees))
    real = P.collate
    times: dict[str, list[float]] = {"padded": [], "one_row": []}
    try:
        for _ in range(a.repeats):
            for variant in ("padded", "one_row"):
                P.collate = (lambda ps, pad=0, one_row=False, v=variant: real(ps, pad, one_row and v == "one_row"))
                model.zero_grad(set_to_none=True)
                t = time.perf_counter()
                loss_and_backward(model, batch, nll_loss(batch.mask), packed=False, max_tokens=4096, linear=True)
                times[variant].append(time.perf_counter() - t)
    finally:
        P.collate = real
    n = sum(len(t["prompt"]) + len(t["responses"][0]) for t in trees)
    res = {"rows_shape": f"8 SFT rows, {n} tokens, one micro-batch",
           "rows_padded_s": statistics.median(times["padded"]), "rows_one_row_s": statistics.median(times["one_row"]),
           "rows_runs": times}
    res["one_row_over_padded"] = res["rows_one_row_s"] / res["rows_padded_s"]
    return res


def peak_rss_gb() -> float:
    """This process's own peak resident memory (GiB): VmHWM of /proc/self/status. Not ru_maxrss: Linux
    carries the parent's RSS at fork into a child's ru_maxrss across exec, so a child spawned by a
    5.5 GB parent reports at least 5.5 GB whatever it does (this made the ratio jump between runs)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB
    raise RuntimeError("no VmHWM in /proc/self/status (not Linux?)")


def _memory_child(variant: str, b: int, t: int, model_name: str) -> None:
    from arpo.models import load_model

    model, tok = load_model(model_name)
    model.train()
    ids = torch.randint(100, len(tok), (b, t), generator=torch.Generator().manual_seed(0))
    adv = torch.randn(b, t - 1)
    base = peak_rss_gb()
    t0 = time.perf_counter()
    if variant == "naive":
        logits = model(ids).logits[:, :-1]
        lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    elif variant == "chunked":
        from arpo.algos.logprobs import model_token_logprobs

        lp, _ = model_token_logprobs(model, ids, chunk_size=1024)
    else:  # "arpo": the trainer's path: chunked log-probs + backward through dL/dlogp per micro-batch
        from arpo.training.batch import TreeBatch, loss_and_backward

        trees = [{"prompt": r[:1].tolist(), "responses": [r[1:].tolist()], "parent": [-1], "branch_at": [0]}
                 for r in ids]
        batch = TreeBatch.from_trees(trees, TreeBatch.all_generated(trees))
        loss_and_backward(model, batch, lambda lp, en: (-(lp * adv).mean(), {}), packed=False, max_tokens=1024)
        lp = None
    if lp is not None:
        (-(lp * adv).mean()).backward()
    dt = time.perf_counter() - t0
    peak = peak_rss_gb()
    print(json.dumps({"peak_gb": peak, "model_loaded_gb": base, "seconds": dt}))


def _child(a, v) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", v, "--mem-batch", str(a.mem_batch),
                        "--mem-len", str(a.mem_len), "--model", a.model], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_memory(a) -> dict:
    """naive, chunked and arpo once, then (naive, arpo) again until --mem-runs pairs: each a fresh
    process, so every run's peak is its own; the ratio must hold in every run, not on average."""
    out = {"memory_batch": f"{a.mem_batch}x{a.mem_len} tokens, fp32, full fine-tuning step"}
    runs = []
    for i in range(max(1, a.mem_runs)):
        for v in ("naive", "chunked", "arpo") if i == 0 else ("naive", "arpo"):
            d = _child(a, v)
            if i == 0:
                out[f"{v}_peak_gb"], out[f"{v}_step_s"] = d["peak_gb"], d["seconds"]
            if v != "chunked":
                out.setdefault(f"{v}_peak_gb_runs", []).append(d["peak_gb"])
        runs.append(out["arpo_peak_gb_runs"][-1] / out["naive_peak_gb_runs"][-1])
    out["chunked_over_naive_peak"] = out["chunked_peak_gb"] / out["naive_peak_gb"]
    out["arpo_over_naive_peak"] = out["arpo_peak_gb"] / out["naive_peak_gb"]
    out["arpo_over_naive_peak_runs"] = runs
    out["arpo_over_naive_peak_max"] = max(runs)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--trees", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--resp", type=int, default=160)
    ap.add_argument("--n-global", type=int, default=4)
    ap.add_argument("--micro-tokens", type=int, default=2048)
    ap.add_argument("--train-layers", type=int, default=0, help="train only the top N layers (0: all)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--mem-batch", type=int, default=8)
    ap.add_argument("--mem-len", type=int, default=512)
    ap.add_argument("--mem-runs", type=int, default=5, help="fresh-process (naive, arpo) pairs for the memory ratio")
    ap.add_argument("--only", choices=["packing", "memory", "rows"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--child")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.child:
        _memory_child(a.child, a.mem_batch, a.mem_len, a.model)
        return 0
    res = {}
    if a.only in (None, "packing"):
        res.update(bench_packing(a))
    if a.only in (None, "rows"):
        res.update(bench_rows(a))
    if a.only in (None, "memory"):
        res.update(bench_memory(a))
    print(json.dumps(res) if a.json else "\n".join(f"{k:28s} {v}" for k, v in res.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
