"""`arpo serve retriever`: the search index over HTTP (tools/server.py)."""

from __future__ import annotations

import argparse

from arpo.commands import HELP, deprecated, number

EXAMPLES = """examples:
  arpo serve retriever --search-index ~/.cache/arpo/indexes/hotpotqa --port 8001
  curl -s localhost:8001/health
  curl -s localhost:8001/search -H 'content-type: application/json' \\
       -d '{"queries": ["Ed Wood director"], "top_k": 3, "mode": "bm25"}'
  arpo rollout --config configs/rollout_hotpotqa.yaml tools.search_url=http://127.0.0.1:8001

POST /search {queries: [str], top_k: int = 10, mode: bm25|dense|hybrid} -> {results: [[{id, title, text, score}]]}
GET /health -> {status, n_docs, dense};  GET /docs: interactive API documentation."""


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a retrieval index over HTTP",
                       description="Serve components over HTTP so several processes share them.",
                       epilog=EXAMPLES, formatter_class=HELP)
    s = p.add_subparsers(dest="what", metavar="{retriever}")
    r = s.add_parser("retriever", help="serve a search index: POST /search, GET /health, GET /docs",
                     description="Serve a search index built by `arpo index build`.", epilog=EXAMPLES,
                     formatter_class=HELP)
    r.add_argument("--search-index", default=None, help="index directory (default: $ARPO_CACHE_DIR/indexes/hotpotqa, "
                   "built on first use from the built-in HotpotQA corpus)")
    deprecated(r, "--index", "--search-index", dest="search_index")
    r.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 for all)")
    r.add_argument("--port", type=number(int, 1, 65535), default=8001, help="port")
    r.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level")
    r.set_defaults(func=run)
    p.set_defaults(func=lambda a: p.print_help() or 0)


def run(args) -> int:
    from arpo.tools.server import serve

    serve(args.search_index, args.host, args.port, log_level=args.log_level)
    return 0
