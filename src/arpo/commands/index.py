"""`arpo index build|info`: build a local search index over a real corpus."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

EXAMPLES = """examples:
  arpo index build ../shared/data/hotpotqa/*.jsonl                 # -> $ARPO_CACHE_DIR/indexes/hotpotqa
  arpo index build corpus.jsonl --out idx/wiki --dense             # BM25 + MiniLM embeddings
  arpo index info ~/.cache/arpo/indexes/hotpotqa

Corpus rows: {id, title, text}, HotpotQA rows (their context paragraphs, deduplicated) or MuSiQue
rows (paragraphs). The index directory is written atomically."""


def register(sub) -> None:
    p = sub.add_parser("index", help="build / inspect a local search index (BM25, optional dense)",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="index_cmd", metavar="{build,info}")
    b = s.add_parser("build", help="build an index from JSONL corpus files", epilog=EXAMPLES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("files", nargs="+")
    b.add_argument("--out", default=None, help="index dir (default: $ARPO_CACHE_DIR/indexes/hotpotqa)")
    b.add_argument("--dense", action="store_true", help="also embed with all-MiniLM-L6-v2 (slow on CPU)")
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(func=build)
    i = s.add_parser("info", help="print an index's meta.json")
    i.add_argument("dir")
    i.set_defaults(func=info)
    p.set_defaults(func=lambda a: p.print_help() or 0)


def build(args) -> int:
    from arpo.tools import default_index_dir
    from arpo.tools.index import Index, load_corpus

    out = Path(args.out) if args.out else default_index_dir()
    t0 = time.perf_counter()
    docs = load_corpus(args.files)
    idx = Index.build(docs, out, dense=args.dense, progress=not args.quiet, sources=[str(f) for f in args.files])
    print(json.dumps({"index": str(out), "docs": len(idx), "dense": args.dense,
                      "seconds": round(time.perf_counter() - t0, 2)}))
    return 0


def info(args) -> int:
    from arpo.errors import ArpoError

    p = Path(args.dir).expanduser() / "meta.json"
    if not p.is_file():
        raise ArpoError(f"{args.dir} is not an arpo index (no meta.json)")
    print(p.read_text())
    return 0
