"""`arpo sft-data`: write cold-start SFT trajectories from GSM8K / HotpotQA / SVAMP / hop2 with real tool outputs."""

from __future__ import annotations

import json
import sys

from arpo.commands import HELP, POS_INT, deprecated
from arpo.commands.agent_flags import add_agent_flags

EXAMPLES = """examples:
  arpo sft-data gsm8k --data gsm8k:train --limit 500 --out sft_gsm8k.jsonl
  arpo sft-data hotpotqa --data hotpotqa:train --out sft_hotpotqa.jsonl
  arpo sft-data svamp --data "svamp:train[0:320]" --out sft_svamp.jsonl
  arpo sft-data hop2 --data "hop2:train[0:120]" --out sft_hop2.jsonl
  arpo sft-data tools --data worked.jsonl --tools mypkg.tools:lookup_order --out sft_tools.jsonl
  arpo sft-data rejection --model runs/quickstart/sft --data gsm8k:train --limit 50 --out rs.jsonl
  arpo sft --config configs/sft_gsm8k_hotpotqa.yaml data.path=[sft_gsm8k.jsonl,sft_hotpotqa.jsonl]

GSM8K: each solution line with <<expr=value>> annotations becomes a <python> call run in the real
sandbox (--style stepwise, at most --max-tool-calls calls; the thought before a call says what to compute,
never its result); --style single: one program printing every annotation.
SVAMP (and MAWPS/ASDiv-A rows with an `equation`): one <python>print(expr)</python> call, checked
against the answer; the system prompt is the short `calc` template.
hop2 (the built-in two-hop task, ./quickstart.sh): the scripted trajectory through the real lookup tool
(the second lookup's town read off the first result), kept when it reaches the answer; template `hop2`.
rejection: the model's own trajectories (real tools) with reward > 0, one per question.
HotpotQA: supporting-fact titles become <search> calls answered by the local index (build it first
with `arpo index build hotpotqa`). Rows that do not check out are dropped and
counted in the printed stats."""


def register(sub) -> None:
    p = sub.add_parser("sft-data", help="convert GSM8K / HotpotQA / SVAMP / hop2 into tool-use SFT trajectories "
                       "(real tools)",
                       epilog=EXAMPLES, formatter_class=HELP)
    p.add_argument("source", choices=["gsm8k", "hotpotqa", "svamp", "hop2", "tools", "rejection"],
                   help="gsm8k / hotpotqa / svamp / hop2: convert the dataset; tools: worked examples of your own "
                   "tools ({question, calls: [{tool, arguments}], answer}); rejection: sample --model and keep "
                   "reward > 0")
    # --tools (tools: the worked examples' tools), --tool-format, --template, --max-tool-calls (gsm8k
    # stepwise), --max-response-tokens / --temperature (rejection), --search-*: the agent and tools sections
    add_agent_flags(p, "sft-data")
    p.add_argument("--data", required=True, help="a data spec: built-in name (gsm8k:train, svamp:train[0:320]), "
                   "file or glob")
    p.add_argument("--out", required=True, help="output JSONL")
    p.add_argument("--limit", type=POS_INT, default=None, help="rows to write (default: all that check out)")
    deprecated(p, "--index", "--search-index", dest="search_index")
    p.add_argument("--style", choices=["stepwise", "single"], default=None,
                   help="gsm8k only: one call per solution line, or one program for all (what the quick start "
                   "measured) (default: single)")
    deprecated(p, "--max-calls", "--max-tool-calls", dest="max_tool_calls", type=POS_INT)
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="rejection: the model to sample; tools --tool-format json: the tokenizer whose chat "
                   "template renders results")
    p.add_argument("--samples", type=POS_INT, default=4, help="rejection: samples per question")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def run(args) -> int:
    from arpo.data.sources import input_paths
    from arpo.errors import ArpoError
    from arpo.jsonl import prepare_output

    if args.style is not None and args.source != "gsm8k":  # it used to be ignored without a word
        raise ArpoError(f"--style applies to gsm8k (its solution lines); sft-data {args.source} has one form")
    args.style = args.style or "single"
    if args.style == "stepwise" and args.max_tool_calls < 1:
        raise ArpoError(f"--max-tool-calls {args.max_tool_calls}: gsm8k stepwise needs at least 1 call")
    from arpo.commands.agent_flags import resolve

    r = resolve(args, "sft-data")  # the flags over sft-data's defaults (settings.COMMAND_DEFAULTS)

    # first: a bad --out must not cost the work, nor overwrite --data
    prepare_output(args.out, inputs=input_paths([args.data]))
    from arpo.recipes.sft_data import build_rejection_dataset, build_sft_dataset

    if args.source == "tools":
        from arpo.recipes.sft_data import build_tool_sft

        if not args.tools:
            raise ArpoError("sft-data tools needs --tools (the tools the worked examples call)")
        names = [t.strip() for t in args.tools.split(",") if t.strip()]
        stats = build_tool_sft(args.data, args.out, names, r.agent.tool_format, args.model, args.template,
                               args.limit, progress=not args.quiet, tools_cfg=r.tools)
        print(json.dumps(stats))
        return 0
    if args.source == "rejection":
        from arpo.commands.from_run import run_settings, template_line

        r = resolve(args, "sft-data", run=run_settings(args.model))  # a trained run samples with its prompt, tools
        tools = r.tools.enabled if r.tools_chosen else None  # None: the task's (python for math, search for QA)
        print(template_line("sft-data", args.model, r.template, r.source, ",".join(tools or ["the task's"])),
              file=sys.stderr)
        stats = build_rejection_dataset(args.model, args.data, args.out, samples=args.samples, limit=args.limit,
                                        agent=r.agent, tools_cfg=r.tools, progress=not args.quiet,
                                        tools=tools, template=r.template)
        print(json.dumps(stats))
        return 0
    stats = build_sft_dataset(args.source, args.data, args.out, args.limit, tools_cfg=r.tools,
                              progress=not args.quiet, style=args.style, max_calls=args.max_tool_calls)
    print(json.dumps(stats))
    return 130 if stats.get("interrupted") else 0  # Ctrl-C: the rows made are written (sft/rows.py)
