"""`arpo serve retriever`: the search index over HTTP (tools/server.py)."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  arpo serve retriever --index ~/.cache/arpo/indexes/hotpotqa --port 8001
  curl -s localhost:8001/search -H 'content-type: application/json' -d '{"queries": ["Ed Wood"], "top_k": 3}'
  arpo train ... tools.search_url=http://127.0.0.1:8001          # use it from training"""


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a retrieval index over HTTP", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="what", metavar="{retriever}")
    r = s.add_parser("retriever", help="POST /search, GET /health, GET /docs", epilog=EXAMPLES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--index", default=None, help="index dir (default: $ARPO_CACHE_DIR/indexes/hotpotqa)")
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--port", type=int, default=8001)
    r.set_defaults(func=run)
    p.set_defaults(func=lambda a: p.print_help() or 0)


def run(args) -> int:
    from arpo.tools import default_index_dir
    from arpo.tools.server import serve

    serve(args.index or str(default_index_dir()), args.host, args.port)
    return 0
