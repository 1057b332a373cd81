"""`arpo plot` (metric curves of a run, entropy figure of a dump) and `arpo analyze entropy`."""

from __future__ import annotations

import json
from pathlib import Path

from arpo.commands import HELP, POS_INT
from arpo.errors import ArpoError

EXAMPLES = """examples:
  arpo plot runs/train                          # RUN_DIR/plots/{reward,accuracy,tool_calls,entropy,...}.png
  arpo plot --rollouts rollouts.jsonl --out figs  # entropy by position after tool results (paper Fig. 1)
  arpo analyze entropy rollouts.jsonl --json     # the same numbers"""


def register(sub) -> None:
    p = sub.add_parser("plot", help="PNG figures of a run's metrics or of a rollout dump's entropies",
                       epilog=EXAMPLES, formatter_class=HELP)
    p.add_argument("run_dir", nargs="?", help="training/SFT run directory (reads metrics.jsonl)")
    p.add_argument("--rollouts", help="an `arpo rollout` dump: plot entropy after tool results")
    p.add_argument("--out", help="output directory (default: RUN_DIR/plots or the dump's directory)")
    p.add_argument("--window", type=POS_INT, default=50, help="token positions per segment to plot")
    p.set_defaults(func=run_plot)
    a = sub.add_parser("analyze", help="analyses of rollout dumps (entropy after tool results)",
                       epilog=EXAMPLES, formatter_class=HELP)
    a.add_argument("what", choices=["entropy"])
    a.add_argument("dump", help="an `arpo rollout` JSONL dump")
    a.add_argument("--window", type=POS_INT, default=50, help="token positions per segment")
    a.add_argument("--json", action="store_true", help="print the numbers as JSON")
    a.add_argument("--png", help="also write the figure here")
    a.set_defaults(func=run_analyze)


def run_plot(args) -> int:
    from arpo.analysis.curves import plot_run
    from arpo.analysis.entropy import entropy_by_position, plot_entropy, read_dump
    from arpo.training.logger import read_metrics

    if not args.run_dir and not args.rollouts:
        raise ArpoError("give a RUN_DIR and/or --rollouts DUMP")
    if args.out:
        from arpo.jsonl import prepare_output

        prepare_output(args.out, directory=True)  # adds PNGs only
    written = []
    if args.run_dir:
        if not Path(args.run_dir).is_dir():
            raise ArpoError(f"{args.run_dir}: not a directory")
        written += plot_run(read_metrics(args.run_dir), args.out or Path(args.run_dir) / "plots")
    if args.rollouts:
        stats = entropy_by_position(read_dump(args.rollouts), args.window)
        out = Path(args.out or Path(args.rollouts).parent) / "entropy_after_tools.png"
        written.append(plot_entropy(stats, out))
    for p in written:
        print(p)
    if args.run_dir:
        print_run_table(read_metrics(args.run_dir))
    return 0


TABLE_KEYS = {"reward_mean": "reward", "accuracy": "acc", "format_error_rate": "fmt_err",
              "tool_format_rate": "tool_fmt", "tool_calls_per_traj": "calls", "branches": "branch",
              "branch_rate": "br_rate", "delta_entropy": "dH",
              "initial_entropy": "H_init", "post_tool_entropy": "H_tool", "loss": "loss"}


def print_run_table(rows: list[dict]) -> None:
    """The run's key metrics per step, in the terminal (what the PNGs show)."""
    from rich.console import Console
    from rich.table import Table

    from arpo.analysis.curves import warnings_by_step

    keys = [k for k in TABLE_KEYS if any(k in r for r in rows)]
    if not rows or not keys:
        return
    warned = warnings_by_step(rows)
    t = Table(title="per step (" + ", ".join(f"{v} = {k}" for k, v in TABLE_KEYS.items() if k in keys) + ")")
    t.add_column("step", justify="right")
    for k in keys:
        t.add_column(TABLE_KEYS[k], justify="right")
    if warned:
        t.add_column("warnings")
    for r in rows:
        cells = [f"{r[k]:.3f}" if isinstance(r.get(k), (int, float)) else "" for k in keys]
        t.add_row(str(r.get("step")), *cells, *([", ".join(warned.get(r.get("step", -1), []))] if warned else []))
    Console(width=max(Console().width, 11 * (len(keys) + 1))).print(t)  # never truncate a number (pipes: 80 cols)


def run_analyze(args) -> int:
    from arpo.analysis.entropy import entropy_by_position, plot_entropy, read_dump

    if args.png:
        from arpo.data.sources import input_paths
        from arpo.jsonl import prepare_output

        prepare_output(args.png, "--png", inputs=input_paths([args.dump]))
    stats = entropy_by_position(read_dump(args.dump), args.window)
    if args.png:
        plot_entropy(stats, args.png)
    if args.json:
        print(json.dumps(stats))
        return 0
    i, a = stats["initial_first20_mean"], stats["after_tool_first20_mean"]
    print(f"{stats['trajectories']} trajectories, {stats['tool_results']} tool results")
    def show(v, why):
        return f"{v:.4f}" if v is not None else f"n/a ({why})"

    print(f"mean entropy of the first 20 tokens: response start {show(i, 'no trajectories')}, "
          f"after a tool result {show(a, 'no tool results in the dump')}")
    return 0
