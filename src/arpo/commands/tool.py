"""`arpo tool`: run one tool call by hand, exactly as the agent's environment would."""

from __future__ import annotations

import json
import sys
import time

from arpo.errors import ArpoError

from arpo.commands import HELP, POS_INT, POSITIVE
from arpo.tools import SEARCH_MAX_CHARS, SEARCH_TOP_K

EXAMPLES = """examples:
  arpo tool python "print(sum(range(10)))"
  echo "import os; print(os.getuid())" | arpo tool python -      # code from stdin
  arpo tool python --json "while True: pass"                    # a timeout, reported, not raised
  arpo tool python --json "print(1)"                  # also: which sandbox protections are active here
  arpo tool search "Scott Derrickson nationality" --search-top-k 3
  arpo tool search --search-url http://127.0.0.1:8001 "Ed Wood" --json
  arpo tool web_search "Ed Wood director"                  # the local web (arpo web serve) by default
  arpo tool browse "http://127.0.0.1:8090/wiki/Ed_Wood_(film) | who directed it"

The output is exactly the text the agent receives between <result> and </result>."""


def register(sub) -> None:
    p = sub.add_parser("tool", help="run one tool call (python, search, web_search, browse) and print its result",
                       description="Run one tool call through the same sandbox / index the agent uses.",
                       epilog=EXAMPLES, formatter_class=HELP)
    p.add_argument("tool", choices=["python", "search", "web_search", "browse"], help="the tool to call")
    p.add_argument("input", help="code or query; '-' reads stdin")
    p.add_argument("--timeout", type=POSITIVE, default=5.0, help="python wall-clock timeout in seconds")
    p.add_argument("--max-output-chars", type=POS_INT, default=2000, help="python output cut to this many characters")
    p.add_argument("--search-index", default=None,
                   help="index dir (default: $ARPO_CACHE_DIR/indexes/hotpotqa, built on first use)")
    p.add_argument("--search-url", default=None, help="retrieval server URL instead of a local index")
    p.add_argument("--search-top-k", type=POS_INT, default=SEARCH_TOP_K, help="passages per search")
    p.add_argument("--search-max-chars", type=POS_INT, default=SEARCH_MAX_CHARS, help="characters per passage")
    p.add_argument("--json", action="store_true", help="print {output, ok, elapsed_s, truncated, ...}")
    from arpo.commands.web import add_web_args

    add_web_args(p)
    p.add_argument("--quiet", action="store_true", help="only the result: no warnings or notes on stderr")
    p.set_defaults(func=run)


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
    from arpo.commands.web import web_options
    from arpo.tools import build_tools

    text = sys.stdin.read() if args.input == "-" else args.input
    if not text.strip():
        raise ArpoError("empty input")
    reg = build_tools([args.tool], python_timeout_s=args.timeout, max_output_chars=args.max_output_chars,
                      search_index=args.search_index, search_url=args.search_url,
                      search_top_k=args.search_top_k, search_max_chars=args.search_max_chars,
                      web=web_options(args))
    try:
        t0 = time.perf_counter()
        tool = reg[args.tool]
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
