"""Engine vs Hugging Face `generate` on the default model (issue #2, item 8).

1. Decode throughput: B sequences, same prompt length and number of new tokens, sampling at T=1,
   no early stop. Prefill is timed separately (generate with one new token) and subtracted, so the
   number is decode tokens/s for both. The engine runs three ways, side by side: its default (arpo's
   own forward, engine/static.py, eager), `compile=True` (the decode step as one torch.compile graph;
   the compilation happens in a warm-up run, excluded and reported as compile_s) and `static=False`
   (the transformers module's forward, the engine before issue 21). --batch takes a list (16,64).
2. Multi-turn: B conversations, each a 3-turn tool conversation (think + python call, result, ...,
   answer), the model's tokens forced by the same script in both, real python tool. arpo's engine
   keeps every conversation's KV cache and prefills only the tool results; the naive loop calls
   `generate` on the whole re-tokenized text at every turn (batched over conversations, which is
   generous to it).

    python benchmarks/bench_decode.py [--json] [--batch 16] [--prompt 64] [--new 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

SCRIPT = [
    "<think> I need to multiply the two numbers, so I will use python to be exact. </think>\n"
    "<python>\nx = 17 * 23\nprint(x)\n</python>",
    "<think> The product is 391. Let me double check it by dividing back. </think>\n"
    "<python>\nprint(391 / 23)\n</python>",
    "<think> Dividing gives 17, so the product is right. One more check with a sum. </think>\n"
    "<python>\nprint(sum([17] * 23))\n</python>",
    "<think> All checks agree. </think>\n<answer> \\boxed{391} </answer>",
]


def _median_time(fn, repeats):
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def bench_decode(model, tok, batch, prompt_len, new, repeats, variants=("static", "compiled", "hf_forward")):
    from arpo.engine.base import SamplingParams
    from arpo.engine.hf import HFEngine

    text = "Once upon a time there was a little robot who wanted to learn mathematics and tools. " * 20
    prompt = tok(text)["input_ids"][:prompt_len]
    ids = torch.tensor([prompt] * batch)

    def gen(n):
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=True, top_k=0, top_p=1.0, temperature=1.0, pad_token_id=tok.eos_token_id)

    opts = {"static": {}, "compiled": {"compile": True}, "hf_forward": {"static": False},
            "graph": {"graph": True}}  # graph: on CPU the bucketed graph step runs eagerly (no capture)
    info = {}

    def engine_run(kw):
        eng = HFEngine(model, tok, eos_token_ids=[-1], **kw)
        info["engine"] = eng
        for s in range(batch):
            eng.add(prompt, SamplingParams(max_len=prompt_len + new, seed=s))
        t = time.perf_counter()
        eng.step()  # prefill + first token
        t_prefill = time.perf_counter() - t
        while eng.has_unfinished():
            eng.step()
        return t_prefill

    gen(2)  # warm up
    t_gen1 = _median_time(lambda: gen(1), repeats)
    t_gen = _median_time(lambda: gen(new), repeats)
    gen_tps = batch * (new - 1) / (t_gen - t_gen1)
    out = {"decode_tok_s_generate": gen_tps, "total_s_generate": t_gen}
    for v in variants:
        t = time.perf_counter()
        engine_run(opts[v])  # warm-up (compiles, for "compiled")
        warm = time.perf_counter() - t
        if v == "compiled":
            out["compile_s"] = info["engine"].static.compile_seconds
            out["compiled_first_run_s"] = warm
        ts, tps = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            tp = engine_run(opts[v])
            ts.append(time.perf_counter() - t)
            tps.append(tp)
        t_eng, t_eng1 = statistics.median(ts), statistics.median(tps)
        tok_s = batch * (new - 1) / (t_eng - t_eng1)
        key = "engine" if v == "static" else v
        out[f"decode_tok_s_{key}"], out[f"total_s_{key}"] = tok_s, t_eng
        out[f"decode_ratio_{key}_vs_generate" if key != "engine" else "decode_ratio_vs_generate"] = tok_s / gen_tps
    return out


class _Force:
    """generate() logits processor that forces each row's scripted continuation, then EOS."""

    def __init__(self, targets, start_len, eos):
        self.targets, self.start, self.eos = targets, start_len, eos

    def __call__(self, input_ids, scores):
        pos = input_ids.shape[1] - self.start
        out = torch.full_like(scores, float("-inf"))
        for i, t in enumerate(self.targets):
            out[i, t[pos] if pos < len(t) else self.eos] = 0.0
        return out


def bench_multiturn(model, tok, batch, repeats):
    from transformers import LogitsProcessorList

    from arpo.data.prompts import render_prompt, system_prompt
    from arpo.engine.hf import HFEngine
    from arpo.rollout.agent import AgentLoop, TrajState
    from arpo.settings import AgentConfig
    from arpo.testing import scripted_hook
    from arpo.tools.base import format_result
    from arpo.tools.python import PythonTool
    from arpo.tools.registry import ToolRegistry

    system = system_prompt("math", ["python"])
    questions = [f"What is 17*23? Check it in {i + 2} ways. Use python." for i in range(batch)]
    tool = PythonTool()
    reg = ToolRegistry([tool])

    def arpo_run():
        eng = HFEngine(model, tok)
        loop = AgentLoop(eng, reg, AgentConfig(max_response_tokens=1024))
        states = {}
        for q in questions:
            p = render_prompt(tok, q, system)
            params = loop.params(len(p), seed=0)
            params.logits_hook = scripted_hook(tok, SCRIPT)
            states[eng.add(p, params)] = TrajState(seg_start=len(p))
        loop.drive(states)
        return [loop.trajectory(s, st) for s, st in states.items()]

    def naive_run():
        texts = [tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": q}],
                                         tokenize=False, add_generation_prompt=True) for q in questions]
        tok.padding_side = "left"
        for turn, seg in enumerate(SCRIPT):
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            target = tok.encode(seg, add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=len(target) + 1, do_sample=False,
                                     logits_processor=LogitsProcessorList(
                                         [_Force([target] * batch, enc.input_ids.shape[1], tok.eos_token_id)]),
                                     pad_token_id=tok.eos_token_id)
            new = tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
            for i in range(batch):
                texts[i] += new[i]
                if turn < len(SCRIPT) - 1:
                    code = new[i].split("<python>")[-1].split("</python>")[0]
                    texts[i] += format_result(tool(code).output)
        return texts

    arpo_trajs = arpo_run()  # warm up both (and check the scripted conversation ran through)
    naive_run()
    assert all(t.finish_reason == "answer" and len(t.tool_calls) == 3 for t in arpo_trajs), "script did not run"
    t_arpo = _median_time(arpo_run, repeats)
    t_naive = _median_time(naive_run, repeats)
    tool.close()
    return {"multiturn_s_engine": t_arpo, "multiturn_s_naive": t_naive, "multiturn_ratio_vs_naive": t_arpo / t_naive,
            "multiturn_conversations": batch, "multiturn_tool_calls_each": 3,
            "multiturn_generated_tokens_each": arpo_trajs[0].n_generated_tokens}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", default="16,64", help="decode batch sizes, comma-separated (the first is the headline)")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--multiturn-batch", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from arpo.models import load_model

    model, tok = load_model(a.model)
    batches = [int(b) for b in str(a.batch).split(",")]
    res = {"model": a.model, "batch": batches[0], "prompt_tokens": a.prompt, "new_tokens": a.new, "repeats": a.repeats,
           "threads": a.threads, "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}"}
    res |= bench_decode(model, tok, batches[0], a.prompt, a.new, a.repeats)
    for b in batches[1:]:
        res[f"batch_{b}"] = bench_decode(model, tok, b, a.prompt, a.new, a.repeats, variants=("static", "compiled"))
    res |= bench_multiturn(model, tok, a.multiturn_batch, a.repeats)
    if a.json:
        print(json.dumps(res, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"arpo engine vs transformers generate ({res['machine']}, {a.threads} threads, "
                    f"median of {a.repeats})")
    for c in ("what", "arpo engine", "HF generate / naive loop", "ratio"):
        t.add_column(c)
    for b in batches:
        r = res if b == batches[0] else res[f"batch_{b}"]
        for key, name in (("engine", "arpo forward"), ("compiled", "compiled step"),
                          ("hf_forward", "transformers forward")):
            if f"decode_tok_s_{key}" in r:
                ratio = r["decode_ratio_vs_generate"] if key == "engine" else r[f"decode_ratio_{key}_vs_generate"]
                t.add_row(f"decode tok/s, batch {b}, {a.prompt}+{a.new} tokens, {name}",
                          f"{r[f'decode_tok_s_{key}']:.1f}", f"{r['decode_tok_s_generate']:.1f}", f"{ratio:.2f}x")
    t.add_row(f"3-turn python conversation x{a.multiturn_batch}, wall s", f"{res['multiturn_s_engine']:.2f}",
              f"{res['multiturn_s_naive']:.2f}", f"{res['multiturn_ratio_vs_naive']:.2f}")
    Console().print(t)


if __name__ == "__main__":
    sys.exit(main())
