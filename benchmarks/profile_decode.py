"""Where a decode step's time goes: arpo's engine vs `model.generate`, same batch and lengths.

torch.profiler over the decode phase (prefill excluded), self CPU time grouped into: weight
matmuls (linear layers incl. the LM head), attention (SDPA), sampling / entropy (softmax, log-probs,
top-k), KV-cache bookkeeping (cat/copy/index), and everything else (norms, activations, python);
plus the wall time per decode step and what is left between ops (framework/python overhead).

    python benchmarks/profile_decode.py [--batch 16] [--prompt 64] [--new 48] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

GROUPS = {
    "matmul": ("aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::linear"),
    "attention": ("aten::_scaled_dot_product", "aten::scaled_dot_product", "aten::_flash_attention"),
    "sampling": ("aten::_log_softmax", "aten::log_softmax", "aten::softmax", "aten::_softmax", "aten::topk",
                 "aten::sort", "aten::exp", "aten::cumsum", "aten::multinomial", "aten::gather"),
    "kv_cache": ("aten::cat", "aten::copy_", "aten::index", "aten::index_put", "aten::slice_scatter", "aten::clone",
                 "aten::scatter", "aten::masked_fill"),
}


def _group(name: str) -> str:
    for g, prefixes in GROUPS.items():
        if any(name.startswith(p) for p in prefixes):
            return g
    return "other_ops"


def _profile(fn, steps: int) -> dict:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        fn()
        wall = time.perf_counter() - t
    by: dict[str, float] = {}
    for ev in prof.key_averages():
        by[_group(ev.key)] = by.get(_group(ev.key), 0.0) + ev.self_cpu_time_total / 1e6
    ops = sum(by.values())
    by["between_ops"] = max(0.0, wall - ops)  # python / framework overhead outside any aten op
    return {"wall_s": wall, "ms_per_step": 1000 * wall / steps,
            "share": {k: round(v / wall, 3) for k, v in sorted(by.items(), key=lambda kv: -kv[1])}}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from arpo.engine.base import SamplingParams
    from arpo.engine.hf import HFEngine
    from arpo.models import load_model

    model, tok = load_model()
    prompt = tok("Once upon a time there was a little robot who wanted to learn tools. " * 20)["input_ids"][: a.prompt]
    ids = torch.tensor([prompt] * a.batch)

    def prefilled_engine():
        eng = HFEngine(model, tok, eos_token_ids=[-1])
        for s in range(a.batch):
            eng.add(prompt, SamplingParams(max_len=a.prompt + a.new, seed=s))
        eng.step()  # prefill + first token, outside the profiled window
        return eng

    with torch.no_grad():  # warm up both paths
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4, do_sample=True,
                       pad_token_id=tok.eos_token_id)
    eng = prefilled_engine()

    def run_engine():
        while eng.has_unfinished():
            eng.step()

    eng_prof = _profile(run_engine, a.new - 1)

    def run_generate():
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.new, min_new_tokens=a.new,
                           do_sample=True, top_k=0, top_p=1.0, temperature=1.0, pad_token_id=tok.eos_token_id)

    def run_generate1():
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=True,
                           pad_token_id=tok.eos_token_id)

    gen_prof = _profile(run_generate, a.new)
    t = time.perf_counter()
    run_generate1()
    prefill = time.perf_counter() - t
    gen_prof["ms_per_step"] = 1000 * (gen_prof["wall_s"] - prefill) / (a.new - 1)  # decode steps only
    out = {"batch": a.batch, "prompt": a.prompt, "new": a.new, "threads": a.threads,
           "engine": eng_prof, "generate": gen_prof,
           "note": "generate's shares include its prefill (one forward of the prompt); ms_per_step excludes it"}
    if a.json:
        print(json.dumps(out))
    else:
        for name in ("engine", "generate"):
            p = out[name]
            shares = "  ".join(f"{k} {v:.0%}" for k, v in p["share"].items())
            print(f"{name:9s} {p['ms_per_step']:7.1f} ms/step   " + shares)
    return out


if __name__ == "__main__":
    main()
