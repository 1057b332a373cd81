"""What deterministic tool-result delivery costs (issue 38): ARPO rollout wall time with
`agent.tool_delivery: step` (a result joins exactly `tool_delivery_lag` engine steps after its call,
waiting for it if need be; a seed gives one run), at lag 0 and at `--lag`, vs `arrival` (results join
as soon as they are done; timing changes the trees), side by side.

Tools: the real python sandbox, and a 50 ms tool (a sleep, like a search API call). The agent is
scripted (every segment opens with free tokens sampled from the model, a pseudo-random 3-60 of them
chosen by the tokens themselves, then a tool call; three calls, then an answer), so both settings
decode the same kind of work with the model's real forward passes. Runs are interleaved, one of
each setting per repeat, and the medians are reported.

    python benchmarks/bench_tool_delivery.py [--model tiny|smollm2-135m-instruct] [--prompts 4] [--m 8] \\
        [--n 4] [--lag 8] [--repeats 3] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SCRIPT = ["<python> print(17 * 23) </python>", "<python> print(2 + 2) </python>", "<python> print(3 ** 4) </python>",
          "<answer> \\boxed{4} </answer>"]


class Sleep50:
    """A tool that answers after 50 ms (a search or web API's latency), named python for the script."""

    name = "python"

    def __call__(self, text):
        from arpo.tools.base import ToolResult

        time.sleep(0.05)
        return ToolResult("391\n")


def varied_hook(tok):
    """Like arpo.testing.scripted_hook, but each segment's free part ends at the first sampled token
    (after 3) whose id is 0 mod 8, or at 60: segment lengths vary between sequences, as a real model's
    do, so tool calls start at different steps."""
    import torch

    targets = [tok.encode(s, add_special_tokens=False) for s in SCRIPT]
    banned = [tok.eos_token_id] + [i for i in range(len(tok)) if "<" in tok.decode([i]) or ">" in tok.decode([i])]

    def hook(seq, logits):
        mask = seq.gen_mask
        k = sum(1 for i in range(len(mask)) if mask[i] == 0 and (i + 1 == len(mask) or mask[i + 1] == 1))
        pos = 0
        while pos < len(mask) and mask[len(mask) - 1 - pos] == 1:
            pos += 1
        seg = seq.tokens[len(seq.tokens) - pos:] if pos else []
        free = next((i + 1 for i, t in enumerate(seg) if i >= 3 and t % 8 == 0), None)
        if k < len(targets) and free is None and pos < 60:
            out = logits.clone()
            out[banned] = float("-inf")
            return out
        j = pos - (free or 60)
        forced = torch.full_like(logits, float("-inf"))
        forced[targets[k][j] if k < len(targets) and j < len(targets[k]) else tok.eos_token_id] = 0.0
        return forced

    return hook


def one(model, tok, tools, delivery: str, lag: int, args) -> dict:
    from arpo.engine.hf import HFEngine
    from arpo.rollout.arpo import ARPORollout
    from arpo.settings import AgentConfig, RolloutConfig
    from arpo.testing import hook_rollout

    agent = AgentConfig(max_response_tokens=400, tool_delivery=delivery, tool_delivery_lag=lag)
    ro = ARPORollout(HFEngine(model, tok), tools, agent, RolloutConfig(group_size=args.m, initial_rollouts=args.n))
    hook_rollout(ro, varied_hook(tok))
    prompts = [tok(f"Question {i}: what is {i} + {i}?")["input_ids"] for i in range(args.prompts)]
    t = time.perf_counter()
    trees = ro.run(prompts, seed=1)
    secs = time.perf_counter() - t
    ts = [x for tr in trees for x in tr.trajectories]
    return {"seconds": secs, "calls": sum(len(x.traj.tool_calls) for x in ts),
            "tokens": sum(x.traj.n_generated_tokens for x in ts)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--lag", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    import torch

    from arpo.tools import build_tools
    from arpo.tools.registry import ToolRegistry

    torch.set_num_threads(args.threads)
    if args.model == "tiny":
        from arpo.testing import tiny_model, tiny_tokenizer

        tok = tiny_tokenizer()
        model = tiny_model(tok)
    else:
        from arpo.models import load_model

        model, tok = load_model(args.model, "cpu", "float32")
    tools = {"python": build_tools(["python"]), "sleep_50ms": ToolRegistry([Sleep50()])}
    settings = {"arrival": ("arrival", 0), "step": ("step", 0), f"step_lag{args.lag}": ("step", args.lag)}
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.repeats):
        for tname, reg in tools.items():
            for name, (delivery, lag) in settings.items():
                runs.setdefault((tname, name), []).append(one(model, tok, reg, delivery, lag, args))
    rows = []
    for tname in tools:
        for name in settings:
            rs = runs[(tname, name)]
            med = statistics.median(r["seconds"] for r in rs)
            base = statistics.median(r["seconds"] for r in runs[(tname, "arrival")])
            rows.append({"tool": tname, "delivery": name, "median_s": round(med, 3), "vs_arrival": round(med / base, 3),
                         "calls": rs[0]["calls"], "tokens": rs[0]["tokens"],
                         "all_s": [round(r["seconds"], 3) for r in rs]})
    out = {"model": args.model, "prompts": args.prompts, "m": args.m, "n": args.n, "lag": args.lag,
           "threads": args.threads, "repeats": args.repeats, "rows": rows}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"model {args.model}, {args.prompts} prompts, M {args.m}, N {args.n}, {args.threads} thread(s), "
              f"median of {args.repeats}")
        for r in rows:
            print(f"  {r['tool']:<11} {r['delivery']:<11} {r['median_s']:7.2f} s   x{r['vs_arrival']:.2f} of arrival   "
                  f"({r['calls']} calls, {r['tokens']} tokens; runs {r['all_s']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
