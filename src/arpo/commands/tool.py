"""`arpo tool`: run one tool call by hand, exactly as the agent's environment would."""

from __future__ import annotations

import json
import sys
import time

from arpo.commands import HELP
from arpo.commands.agent_flags import add_agent_flags
from arpo.errors import ArpoError

EXAMPLES = """examples:
  arpo tool python "print(sum(range(10)))"
  echo "import os; print(os.getuid())" | arpo tool python -      # code from stdin
  arpo tool python --json "while True: pass"                    # a timeout, reported, not raised
  arpo tool python --json "print(1)"                  # also: which sandbox protections are active here
  arpo tool search "Scott Derrickson nationality" --search-top-k 3
  arpo tool search --search-url http://127.0.0.1:8001 "Ed Wood" --json
  arpo tool web_search "Ed Wood director"                  # the local web (arpo web serve) by default
  arpo tool browse "http://127.0.0.1:8090/wiki/Ed_Wood_(film) | who directed it"
  arpo tool mypkg.tools:lookup_order '{"order_id": "A17"}'      # your own tool (module.path:function)
  arpo tool multiply '{"a": 6, "b": 7}' --tools-config mcp.yaml  # a tool of an MCP server in that file

Your own tools and MCP tools take the input the agent writes between their tags: a JSON object of
arguments (a tool with one string argument: the text as it is). --tools-config FILE is a YAML tools
section (train's `tools:` keys): `mcp: [{command: python, args: [server.py]}]` or `[{url: ...}]`, and
`options:` of your own tools. The output is exactly the text the agent receives between <result> and
</result>."""


def register(sub) -> None:
    p = sub.add_parser("tool", help="run one tool call (python, search, web_search, browse, your own, an MCP "
                       "server's) and print its result",
                       description="Run one tool call through the same sandbox / index the agent uses.",
                       epilog=EXAMPLES, formatter_class=HELP)
    p.add_argument("tool", help="the tool to call: python, search, web_search, browse, your own as "
                   "module.path:function, or the name of a tool of an MCP server in --tools-config")
    p.add_argument("input", help="code, query or JSON arguments; '-' reads stdin")
    add_agent_flags(p, "tool")  # --timeout, --max-output-chars, --search-*, --tools-config, --web-*
    p.add_argument("--json", action="store_true", help="print {output, ok, elapsed_s, truncated, ...}")
    p.add_argument("--quiet", action="store_true", help="only the result: no warnings or notes on stderr")
    p.set_defaults(func=run)


BUILT_IN = ("python", "search", "web_search", "browse")


def _registry(args):
    """The registry holding the one tool asked for: a built-in, your own (module.path:function, with its
    tools.options from --tools-config), or the MCP servers of --tools-config (whose tool is asked for)."""
    from dataclasses import replace

    from arpo.commands.agent_flags import resolve
    from arpo.tools import tools_from_config
    from arpo.tools.plugins.function import snake_case

    r = resolve(args, "tool").tools
    if args.tool in BUILT_IN or ":" in args.tool:
        attr = args.tool.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        options = {k: v for k, v in r.options.items() if k in (attr, snake_case(attr))}
        return tools_from_config(replace(r, enabled=[args.tool], mcp=[], options=options))
    if not r.mcp:
        raise ArpoError(f"unknown tool {args.tool!r}: choose {', '.join(BUILT_IN)}, your own as "
                        "module.path:function, or a tool of an MCP server given in --tools-config FILE "
                        "(mcp: [{command: ...}] or [{url: ...}])")
    return tools_from_config(replace(r, enabled=[], options={}))


def _name(asked: str, reg) -> str:
    """The registry name of the tool asked for (your own tool registers under its own name)."""
    if asked in reg.names:
        return asked
    if ":" in asked and len(reg.names) == 1:
        return reg.names[0]
    raise ArpoError(f"no tool {asked!r} here; the MCP servers of --tools-config offer: "
                    f"{', '.join(reg.names) or 'none'}")


def _protections(tool) -> dict:
    inner = getattr(tool, "tool", tool)  # unwrap a CachedTool
    return getattr(inner, "protections", {})


def _isolation(tool) -> str:
    """The python tool's sandbox mode (PythonTool.isolation)."""
    return tool.isolation


def run(args) -> int:
    if args.quiet:
        import warnings

        warnings.simplefilter("ignore")  # e.g. the sandbox's note about protections this machine lacks
    text = sys.stdin.read() if args.input == "-" else args.input
    if not text.strip():
        raise ArpoError("empty input")
    reg = _registry(args)
    try:
        t0 = time.perf_counter()
        tool = reg[_name(args.tool, reg)]
        r = tool(text)
        wall = time.perf_counter() - t0
        if args.json:
            out = {"tool": args.tool, "output": r.output, "ok": r.ok, "elapsed_s": round(r.elapsed_s or wall, 4),
                   "truncated": r.truncated, **({"isolation": _isolation(tool), "protections": _protections(tool)}
                                                if args.tool == "python" else {})}
            print(json.dumps(out, ensure_ascii=False))
        else:
            from arpo.terminal import for_stream

            print(for_stream(r.output, sys.stdout))  # a terminal sees the program's escapes, not their effects
    finally:
        reg.close()
    return 0 if r.ok else 1
