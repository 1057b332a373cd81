"""`arpo view`: see runs in a browser: training curves, rollout trees, entropy after tool results."""

from __future__ import annotations

from arpo.commands import HELP, number

EXAMPLES = """examples:
  arpo view runs/arpo_gsm8k                          # serve http://127.0.0.1:8765/
  arpo view arpo=runs/arpo grpo=runs/grpo --port 0    # two runs overlaid; any free port
  arpo view rollouts.jsonl                           # an `arpo rollout` dump (or a rollouts/step_N.jsonl.gz)
  arpo view runs/arpo_gsm8k --export site/           # a static copy: open site/index.html from the disk

Pages: Run (curves, hover for values, click a step for its trees) · Trees (a step's rollout trees;
a tree with its branch decisions; click a path for its tokens shaded by entropy or advantage) ·
Entropy (entropy by position after the response start vs after tool results, the paper's Fig. 1).
`arpo train` saves the trees every run.save_rollouts steps (run.rollout_trees trees per step)."""


def register(sub) -> None:
    p = sub.add_parser("view", help="a local web page for runs: curves, rollout trees, entropy after tool results",
                       description="Serve a local web page (or --export a static one) for training runs and "
                       "rollout files.", epilog=EXAMPLES, formatter_class=HELP)
    p.add_argument("sources", nargs="+", metavar="RUN_DIR|ROLLOUTS",
                   help="run directories of `arpo train` and/or rollouts .jsonl(.gz) files; LABEL=PATH names one")
    p.add_argument("--port", type=number(int, 0, 65535), default=8765, help="port (0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1: this machine only)")
    p.add_argument("--export", metavar="DIR", help="write a static site to DIR instead of serving")
    p.add_argument("--steps", help="with --export: only these saved steps, e.g. 1,10,20 (default: all)")
    p.set_defaults(func=run)


def run(args) -> int:
    from arpo.errors import ArpoError
    from arpo.view.data import Catalog

    if args.export:
        from arpo.data.sources import input_paths
        from arpo.jsonl import prepare_output

        prepare_output(args.export, "--export", inputs=input_paths([s.rpartition("=")[2] for s in args.sources]),
                       directory=True)
    catalog = Catalog(args.sources)
    if args.export:
        from arpo.view.export import export_site

        try:
            steps = {int(x) for x in args.steps.split(",") if x.strip()} if args.steps else None
        except ValueError as e:
            raise ArpoError(f"--steps {args.steps!r}: give step numbers separated by commas") from e
        res = export_site(catalog, args.export, steps)
        print(f"wrote {res['files']} data files ({res['bytes'] / 1e6:.1f} MB) to {res['dir']}; "
              f"open {res['dir']}/index.html in a browser")
        return 0
    if args.steps:
        raise ArpoError("--steps goes with --export")
    from arpo.view.server import serve

    names = ", ".join(s.name for s in catalog.sources)
    serve(catalog, args.host, args.port,
          on_ready=lambda url: print(f"arpo view: {names} at {url}  (Ctrl-C to stop)", flush=True))
    return 0
