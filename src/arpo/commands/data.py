"""`arpo data list|show`: the datasets that ship inside arpo, and a look at any data spec's rows."""

from __future__ import annotations

import json

from arpo.commands import HELP

EXAMPLES = """examples:
  arpo data list                                  # name, split, rows, license, source; the paper's benchmarks
  arpo data show bench:bamboogle:dev --limit 2    # a benchmark's slice shipped in arpo
  arpo data show bench:gaia --limit 1             # a benchmark from the Hugging Face Hub (network, arpo[hf])
  arpo data show bench:aime25@./aime25.parquet    # ... or from a local copy (parquet, jsonl, csv, save_to_disk)
  arpo data show svamp:test --limit 3             # the first rows as arpo reads them (question, answers, task)
  arpo data show gsm8k:train --limit 1 --raw      # the stored rows themselves
  arpo data show hf:openai/gsm8k:main:test --limit 2   # a Hugging Face dataset (pip install 'arpo[hf]')

A data spec works wherever a data file does (--data, data.path, validation.path, arpo sft-data,
arpo index build): a built-in name NAME:SPLIT, hf:NAME[:CONFIG]:SPLIT[?question=F&answer=F],
bench:NAME[:dev|@LOCAL_COPY] (the paper's benchmarks), a JSONL / JSONL.gz / parquet file, or a glob."""


def register(sub) -> None:
    p = sub.add_parser("data", help="list the built-in datasets / show rows of any data spec",
                       description="The datasets that ship inside arpo (no download needed) and a look at "
                       "the rows of any data spec.", epilog=EXAMPLES,
                       formatter_class=HELP)
    s = p.add_subparsers(dest="data_cmd", metavar="{list,show}")
    ls = s.add_parser("list", help="name, split, rows, license and source of each built-in dataset",
                      epilog=EXAMPLES, formatter_class=HELP)
    ls.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    ls.set_defaults(func=list_cmd)
    sh = s.add_parser("show", help="print the first rows of a data spec", epilog=EXAMPLES,
                      formatter_class=HELP)
    sh.add_argument("spec", metavar="NAME", help="a data spec: svamp:test, hf:..., a file or a glob")
    sh.add_argument("--limit", type=int, default=3, help="rows to print (default: 3)")
    sh.add_argument("--raw", action="store_true", help="the stored rows, not the examples arpo makes of them")
    sh.set_defaults(func=show)
    p.set_defaults(func=lambda a: p.print_help() or 0)


def list_cmd(args) -> int:
    from arpo.data.benchmarks import listing
    from arpo.data.sources import BUILTIN, builtin_path, count_rows

    rows = [{"name": f"{n}:{s}", "split": s, "rows": count_rows(builtin_path(n, s)), "task": b.task,
             "license": b.license, "source": b.source, "file": str(builtin_path(n, s))}
            for n, b in BUILTIN.items() for s in b.splits]
    bench = listing()
    if args.json:
        print("\n".join([json.dumps({"kind": "builtin", **r}) for r in rows] +
                        [json.dumps({"kind": "benchmark", **r}) for r in bench]))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title="built-in datasets (use the name wherever a data file is accepted)")
    for c in ("name", "split", "rows", "task", "license", "source"):
        t.add_column(c, justify="right" if c == "rows" else "left", overflow="fold")
    for r in rows:
        t.add_row(r["name"], r["split"], f"{r['rows']:,}", r["task"], r["license"], r["source"])
    con = Console(width=max(160, Console().width))
    con.print(t)
    t = Table(title="the paper's benchmarks (bench:NAME from the Hugging Face Hub, bench:NAME:dev shipped in arpo, "
              "bench:NAME@LOCAL_COPY)")
    for c in ("name", "domain", "hugging face id", "config:split", "fields", "license", "paper metric", "dev"):
        t.add_column(c, overflow="fold")
    for r in bench:
        fields = ", ".join(f"{k}←{v}" for k, v in r["fields"].items())
        fields += "".join(f"; {x}" for x in (r["filter"], r["transform"]) if x)
        name = r["name"] + "".join(f" ({a})" for a in r["aliases"])
        t.add_row(name, r["domain"], r["hf_id"], f"{r['config'] or '-'}:{r['split']}", fields,
                  r["license"], r["metric"], f"{r['dev_rows']} ({r['dev_license']})" if r["dev"] else "-")
    con.print(t)
    print("paper metric: f1 = token F1 (arpo eval's score); llm-judge = arpo eval --judge (judge_pass@1)")
    return 0


def show(args) -> int:
    from arpo.errors import ArpoError

    if args.limit < 1:
        raise ArpoError(f"--limit must be >= 1, got {args.limit}")
    if args.raw:
        from arpo.data.sources import iter_rows

        for k, (_, row) in enumerate(iter_rows(args.spec)):
            if k >= args.limit:
                break
            print(json.dumps(row, ensure_ascii=False))
        return 0
    from arpo.data.datasets import load_examples

    for ex in load_examples(args.spec, args.limit):
        print(json.dumps(ex, ensure_ascii=False))
    return 0
