"""ARPO tree rollout vs the naive multi-turn loop (issue 6, item 1).

Both produce M trajectories for each of P prompts with the same model, sampling settings and real
python tool. arpo: `ARPORollout` (N global samples + entropy branching on a shared KV cache; tool
results prefilled only). Naive: what a plain HF loop does — every turn, `model.generate` on the whole
re-tokenized text (batched over all unfinished conversations, left padded, stopping at the tool's
closing tag), then the tool runs and its result is appended as text. Sampled outputs differ between
the two, so the comparison is per generated token as well as per trajectory.

    python benchmarks/bench_rollout.py [--json] [--model runs/quickstart/sft] [--prompts 2] [--m 8]
Goal: arpo wall time / naive wall time <= 0.4 (per generated token).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def naive_rollout(model, tok, tools, prompts, m, max_resp, temperature, max_calls, seed):
    import torch

    torch.manual_seed(seed)
    convs = [{"ids": list(p), "start": len(p), "gen": 0, "calls": 0, "done": False} for p in prompts for _ in range(m)]
    stops = tools.stop_strings()
    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    from arpo.tools.base import format_result

    while True:
        live = [c for c in convs if not c["done"]]
        if not live:
            break
        budget = max(1, max(max_resp - (len(c["ids"]) - c["start"]) for c in live))
        width = max(len(c["ids"]) for c in live)
        ids = torch.tensor([[pad] * (width - len(c["ids"])) + c["ids"] for c in live])
        att = torch.tensor([[0] * (width - len(c["ids"])) + [1] * len(c["ids"]) for c in live])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=budget, do_sample=True,
                                 temperature=temperature, top_p=1.0, top_k=0, stop_strings=stops, tokenizer=tok,
                                 pad_token_id=pad)
        for c, row in zip(live, out[:, width:].tolist(), strict=True):
            # generate pads finished rows (pad may equal eos): drop trailing pad/eos, then read the text
            new = list(row)
            ended = False
            while new and new[-1] in (pad, tok.eos_token_id):
                new.pop()
                ended = True
            if ended and not tok.decode(new).rstrip().endswith(tuple(stops)):
                new.append(tok.eos_token_id)  # a real end of turn
            c["ids"] += new
            c["gen"] += len(new)
            text = tok.decode(new)
            call = tools.parse_last_call(text) if not text.rstrip().endswith("</answer>") else None
            if (not new or new[-1] == tok.eos_token_id or call is None or c["calls"] >= max_calls
                    or len(c["ids"]) - c["start"] >= max_resp):
                c["done"] = True
                continue
            c["calls"] += 1
            res = tok.encode(format_result(tools.run(call).output), add_special_tokens=False)
            c["ids"] += res
            if len(c["ids"]) - c["start"] >= max_resp:
                c["done"] = True
    return {"trajectories": len(convs), "generated_tokens": sum(c["gen"] for c in convs),
            "tool_calls": sum(c["calls"] for c in convs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/quickstart/sft")
    ap.add_argument("--data", default="gsm8k:test")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-resp", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from arpo.data.datasets import load_examples
    from arpo.data.prompts import prompts_for
    from arpo.engine.hf import HFEngine
    from arpo.models import load_model
    from arpo.rollout.arpo import ARPORollout
    from arpo.settings import AgentConfig, RolloutConfig
    from arpo.tools import build_tools

    model, tok = load_model(a.model)
    exs = load_examples(a.data, a.prompts)
    prompts = prompts_for(exs, tok, ["python"], None)
    tools = build_tools(["python"])
    try:
        agent = AgentConfig(max_tool_calls=3, max_response_tokens=a.max_resp, temperature=1.0)
        ro = ARPORollout(HFEngine(model, tok), tools, agent, RolloutConfig(group_size=a.m, initial_rollouts=a.n))
        t = time.perf_counter()
        trees = ro.run(prompts, seed=0)
        t_arpo = time.perf_counter() - t
        trajs = [x for tr in trees for x in tr.trajectories]
        arpo = {"trajectories": len(trajs), "generated_tokens": sum(x.traj.n_generated_tokens for x in trajs),
                "tool_calls": sum(len(x.traj.tool_calls) for x in trajs),
                "branches": sum(x.parent_id is not None for x in trajs), "seconds": t_arpo}
        t = time.perf_counter()
        naive = naive_rollout(model, tok, tools, prompts, a.m, a.max_resp, 1.0, 3, 0)
        naive["seconds"] = time.perf_counter() - t
    finally:
        tools.close()
    per_tok = ((arpo["seconds"] / max(1, arpo["generated_tokens"]))
               / (naive["seconds"] / max(1, naive["generated_tokens"])))
    res = {"model": a.model, "prompts": a.prompts, "group_size": a.m, "arpo": arpo, "naive": naive,
           "wall_ratio": arpo["seconds"] / naive["seconds"], "per_token_ratio": per_tok}
    print(json.dumps(res) if a.json else json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
