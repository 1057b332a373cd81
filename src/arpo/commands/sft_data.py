"""`arpo sft-data`: write cold-start SFT trajectories from GSM8K / HotpotQA with real tool outputs."""

from __future__ import annotations

import argparse
import json

EXAMPLES = """examples:
  arpo sft-data gsm8k --data gsm8k:train --limit 500 --out sft_gsm8k.jsonl
  arpo sft-data hotpotqa --data hotpotqa:train --out sft_hotpotqa.jsonl
  arpo sft-data svamp --data "svamp:train[0:320]" --out sft_svamp.jsonl
  arpo sft-data rejection --model runs/quickstart/sft --data gsm8k:train --limit 50 --out rs.jsonl
  arpo sft --config configs/sft_quickstart.yaml data.paths=[sft_gsm8k.jsonl,sft_hotpotqa.jsonl]

GSM8K: each solution line with <<expr=value>> annotations becomes a <python> call run in the real
sandbox (--style stepwise, at most --max-calls calls; the thought before a call says what to compute,
never its result); --style single: one program printing every annotation.
SVAMP (and MAWPS/ASDiv-A rows with an `equation`): one <python>print(expr)</python> call, checked
against the answer; the system prompt is the short `calc` template.
rejection: the model's own trajectories (real tools) with reward > 0, one per question.
HotpotQA: supporting-fact titles become <search> calls answered by the local index (build it first
with `arpo index build hotpotqa`). Rows that do not check out are dropped and
counted in the printed stats."""


def register(sub) -> None:
    p = sub.add_parser("sft-data", help="convert GSM8K / HotpotQA into tool-use SFT trajectories (real tools)",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", choices=["gsm8k", "hotpotqa", "svamp", "rejection"],
                   help="gsm8k / hotpotqa / svamp: convert the dataset; rejection: sample --model and keep reward > 0")
    p.add_argument("--data", required=True, help="the dataset's JSONL file")
    p.add_argument("--out", required=True, help="output JSONL")
    p.add_argument("--limit", type=int, default=None, help="rows to write")
    p.add_argument("--index", default=None, help="search index dir (hotpotqa; default $ARPO_CACHE_DIR/indexes/hotpotqa)")
    p.add_argument("--top-k", type=int, default=3, help="passages per search in the trajectories (default 3)")
    p.add_argument("--max-chars", type=int, default=300, help="characters per passage (default 300)")
    p.add_argument("--style", choices=["stepwise", "single"], default="single",
                   help="gsm8k: one call per solution line, or one program for all (default, what the quick start measured)")
    p.add_argument("--max-calls", type=int, default=3, help="gsm8k stepwise: at most this many calls (default 3)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="rejection: the model to sample")
    p.add_argument("--samples", type=int, default=4, help="rejection: samples per question")
    p.add_argument("--temperature", type=float, default=0.8, help="rejection: sampling temperature")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from arpo.data.sft_data import build_rejection_dataset, build_sft_dataset

    if args.source == "rejection":
        stats = build_rejection_dataset(args.model, args.data, args.out, samples=args.samples,
                                        temperature=args.temperature, limit=args.limit, search_index=args.index,
                                        top_k=args.top_k, max_chars=args.max_chars, progress=not args.quiet)
        print(json.dumps(stats))
        return 0
    stats = build_sft_dataset(args.source, args.data, args.out, args.limit, search_index=args.index,
                              top_k=args.top_k, max_chars=args.max_chars, progress=not args.quiet,
                              style=args.style, max_calls=args.max_calls)
    print(json.dumps(stats))
    return 0
