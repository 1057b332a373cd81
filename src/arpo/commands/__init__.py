"""CLI subcommands, one module each (see arpo.cli), and what they share: the help formatter (keeps
the examples' layout and shows every default), range-checked number types (a bad value is an
argparse error naming the flag) and deprecated spellings of renamed flags. The agent commands' flags
are made from the settings sections in one place: commands/agent_flags.py.

One vocabulary across commands (and config keys):
  --top-k / --top-p / --temperature   sampling (agent.top_k, agent.top_p, agent.temperature)
  --search-top-k / --search-max-chars passages per search / characters per passage
                                      (tools.search_top_k, tools.search_max_chars)
  --search-index / --search-url       the search tool's local index / retrieval server
  --max-tool-calls                    tool calls per trajectory (agent.max_tool_calls)
  --max-response-tokens               the response budget, tool results included (agent.max_response_tokens)
"""

from __future__ import annotations

import argparse
import sys


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Examples keep their line breaks; every option's help ends with its default."""

    def _get_help_string(self, action):
        h = action.help or ""
        d = action.default  # `is`, not `in`: 0 == False, and a default of 0 must show (--seed, --temperature)
        if "%(default)" in h or d is None or d is False or d is argparse.SUPPRESS or not action.option_strings:
            return h
        return f"{h} (default: %(default)s)"


HELP = HelpFormatter


def number(kind, lo=None, hi=None, lo_open: bool = False):
    """An argparse type: `kind` (int/float) within [lo, hi] (lo excluded when lo_open)."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if lo is not None and (v <= lo if lo_open else v < lo):
            raise argparse.ArgumentTypeError(f"must be {'>' if lo_open else '>='} {lo}, got {text}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi}, got {text}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


POS_INT = number(int, 1)
NONNEG_INT = number(int, 0)
NONNEG = number(float, 0.0)
POSITIVE = number(float, 0.0, lo_open=True)
PROB = number(float, 0.0, 1.0, lo_open=True)  # top-p


def TOOL_LIST(text: str) -> str:
    """--tools: comma-separated tool names, normalized; '' or 'none' is no tools at all, in every command
    (eval and serve used to fall back to their default tools)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["none"]:
        return ""
    if "none" in names:
        raise argparse.ArgumentTypeError(f"{text!r}: 'none' means no tools; it does not combine with tool names")
    return ",".join(names)


def deprecated(p, old: str, new: str, **kw) -> None:
    """Accept the old spelling of a renamed flag with a warning on stderr."""

    class Warn(argparse.Action):
        def __call__(self, parser, ns, values, option_string=None):
            print(f"arpo: {old} is deprecated, use {new}", file=sys.stderr)
            setattr(ns, self.dest, values)

    p.add_argument(old, action=Warn, help=argparse.SUPPRESS, **kw)


def add_engine_flags(p, what: str) -> None:
    """--engine hf | vllm | vllm_server and --servers (eval, serve agent): `what` names the command's unit
    of work in the help."""
    p.add_argument("--engine", default="hf", choices=["hf", "vllm", "vllm_server"],
                   help=f"generation engine for {what}: hf (transformers, default), vllm (needs vLLM installed) or "
                        "vllm_server (running vLLM servers that serve --model: --servers)")
    p.add_argument("--servers", nargs="+", default=None, metavar="URL",
                   help="--engine vllm_server: base URLs of the servers (docs/vllm_backend.md; `arpo rollout-servers` "
                        "prints the lines that start them)")


def check_engine_flags(args) -> None:
    """--servers goes with --engine vllm_server and the other way round (an error, not a silent default)."""
    from arpo.errors import ArpoError

    if args.engine == "vllm_server" and not args.servers:  # it got the message of the opposite mistake
        raise ArpoError("--engine vllm_server needs --servers URL ... (the servers that serve --model; "
                        "`arpo rollout-servers` starts them)")
    if args.servers and args.engine != "vllm_server":
        raise ArpoError("--servers goes with --engine vllm_server (the URLs of servers that serve --model)")
