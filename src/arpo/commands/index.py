"""`arpo index build|info`: build / inspect a local search index over a real corpus (retrieval/index.py)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from arpo.commands import HELP

EXAMPLES = """examples:
  arpo index build hotpotqa                      # rebuild the default index (built-in HotpotQA corpus)
  arpo index build corpus.jsonl --out idx/wiki   # your own corpus (--out is required for it)
  arpo index build corpus.jsonl --out idx/wiki --dense              # BM25 + MiniLM embeddings (slow on CPU)
  arpo index info ~/.cache/arpo/indexes/hotpotqa
  arpo serve retriever --search-index idx/wiki --port 8001                 # share it over HTTP

Corpus rows (JSONL, layouts may be mixed): {id, title, text}; HotpotQA rows (Hugging Face layout:
each context paragraph becomes a document, deduplicated by title); MuSiQue rows (paragraphs).
The index directory is written atomically: a failed build leaves the previous index untouched.
The default index ($ARPO_CACHE_DIR/indexes/hotpotqa, what <search> uses unless told otherwise) builds
itself on first use from the built-in HotpotQA corpus; `arpo index build hotpotqa` rebuilds it, and no
other `arpo index build` writes there (your corpus needs --out)."""


def register(sub) -> None:
    p = sub.add_parser("index", help="build / inspect a local search index (BM25, optional dense)",
                       description="Build or inspect the local search index used by the <search> tool.",
                       epilog=EXAMPLES, formatter_class=HELP)
    s = p.add_subparsers(dest="index_cmd", metavar="{build,info}")
    b = s.add_parser("build", help="build an index from JSONL corpus files",
                     description="Index JSONL corpus files with BM25 (bm25s) and optionally dense "
                     "all-MiniLM-L6-v2 embeddings.", epilog=EXAMPLES,
                     formatter_class=HELP)
    b.add_argument("files", nargs="+", metavar="FILE",
                   help="JSONL corpus files, globs or built-in dataset names (hotpotqa, hotpotqa:dev)")
    b.add_argument("--out", default=None, help="index directory; required unless FILE is just `hotpotqa` "
                   "(then: the default index, $ARPO_CACHE_DIR/indexes/hotpotqa)")
    b.add_argument("--dense", action="store_true",
                   help="also embed every document with all-MiniLM-L6-v2 (enables mode=dense|hybrid; "
                   "minutes on CPU for ~10k documents)")
    b.add_argument("--quiet", action="store_true", help="no progress output")
    b.set_defaults(func=build)
    i = s.add_parser("info", help="print an index's metadata (meta.json) as JSON",
                     epilog="example:\n  arpo index info ~/.cache/arpo/indexes/hotpotqa",
                     formatter_class=HELP)
    i.add_argument("dir", nargs="?", default=None, help="index directory (default: $ARPO_CACHE_DIR/indexes/hotpotqa)")
    i.set_defaults(func=info)
    p.set_defaults(func=lambda a: p.print_help() or 0)


def build(args) -> int:
    from arpo.data.sources import is_builtin
    from arpo.errors import ArpoError
    from arpo.retrieval.index import DEFAULT_CORPUS, Index, default_index_dir, load_corpus

    if args.out is None and args.files != [DEFAULT_CORPUS]:
        raise ArpoError(f"give --out DIR for the index of {' '.join(args.files)}: without --out only "
                        f"`arpo index build {DEFAULT_CORPUS}` (re)writes the default index {default_index_dir()}")
    out = Path(args.out).expanduser() if args.out else default_index_dir()
    if args.out:
        from arpo.data.sources import input_paths
        from arpo.jsonl import prepare_output

        prepare_output(out, inputs=input_paths(args.files), directory=True)
    t0 = time.perf_counter()
    docs = load_corpus(args.files)
    if not args.quiet:
        print(f"loaded {len(docs)} documents from {len(args.files)} file(s) in {time.perf_counter() - t0:.1f}s; "
              f"indexing into {out}", file=sys.stderr, flush=True)
    # bm25s' tqdm bars only on a terminal: piped or logged, stderr gets the plain lines above and below
    idx = Index.build(docs, out, dense=args.dense, progress=not args.quiet and sys.stderr.isatty(),
                      sources=[f if is_builtin(f) else str(Path(f).expanduser().resolve()) for f in args.files])
    print(json.dumps({"index": str(idx.path), "docs": len(idx), "dense": args.dense,
                      "seconds": round(time.perf_counter() - t0, 2)}))
    return 0


def info(args) -> int:
    from arpo.errors import ArpoError
    from arpo.retrieval import default_index_dir

    d = Path(args.dir).expanduser() if args.dir else default_index_dir()
    p = d / "meta.json"
    if not p.is_file():
        raise ArpoError(f"{d} is not an arpo index (no meta.json); build one with `arpo index build FILES --out {d}`")
    try:
        meta = json.loads(p.read_text())
    except ValueError as e:
        raise ArpoError(f"{p} is not valid JSON ({e}); rebuild the index") from e
    size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    print(json.dumps({"index": str(d.absolute()), **meta, "size_bytes": size}, indent=1))
    return 0
