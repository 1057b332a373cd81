"""`arpo` command line. Each subcommand lives in the module that owns its job and exposes
`register(subparsers)`; this file only assembles them, so `arpo --help` lists everything."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from arpo.errors import explain

# module path -> registers one or more subcommands
COMMAND_MODULES = [
    "arpo.commands.data",
    "arpo.commands.chat",
    "arpo.commands.tool",
    "arpo.commands.index",
    "arpo.commands.serve",
    "arpo.commands.rollout_servers",
    "arpo.commands.rollout",
    "arpo.commands.sft_data",
    "arpo.commands.sft",
    "arpo.commands.train",
    "arpo.commands.export",
    "arpo.commands.eval",
    "arpo.commands.plot",
    "arpo.commands.view",
    "arpo.commands.experiment",
    "arpo.commands.web",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arpo",
        description="Train, evaluate and run multi-turn tool-using LLM agents with ARPO "
        "(Agentic Reinforced Policy Optimization, arXiv 2507.19849).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `arpo COMMAND --help` for the options of each command.",
    )
    from arpo import __version__

    parser.add_argument("--version", action="version", version=f"arpo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:  # an optional extra is missing: keep the rest of the CLI usable
            missing = e.name or name
            sub.add_parser(name.rsplit(".", 1)[-1], help=f"(unavailable: {missing} not installed)")
            continue
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `key=value` overrides may come anywhere on the line (argparse takes positionals only before the
    # first option): collect the stray ones into the command's overrides; anything else is an error
    stray = [a for a in extra if "=" in a and not a.startswith("-")]
    if stray and isinstance(getattr(args, "overrides", None), list):
        args.overrides += stray
        extra = [a for a in extra if a not in stray]
    if extra:
        parser.parse_args(argv)  # prints argparse's usage message and exits 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    from arpo.training.signals import TerminateAsInterrupt

    try:
        with TerminateAsInterrupt():  # SIGTERM outside a training step: cleanups run, as for Ctrl-C
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `arpo ... | head`: the reader is gone; stop quietly, as `cat` does
        _drop_stdout()
        return 141  # 128 + SIGPIPE, what a shell reports for a writer the pipe stopped
    except Exception as e:
        msg = explain(e)
        if msg is None or os.environ.get("ARPO_DEBUG"):
            raise
        print(f"arpo {args.command}: error: {msg}", file=sys.stderr)
        return 2


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
