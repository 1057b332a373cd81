"""`arpo web serve | sft-data`: the local web (arpo/web/) and deep-search SFT data made on it; and
the `--web-*` / `--browse-*` flags that `arpo chat / eval / serve agent` share for the web tools."""

from __future__ import annotations

import json

from arpo.commands import HELP, POS_INT, number

EXAMPLES = """examples:
  arpo web serve                                   # the built-in HotpotQA corpus on http://127.0.0.1:8090
  arpo web serve --corpus my_pages.jsonl --port 8091    # your own pages: rows {title, text, url?}
  arpo eval --data hotpotqa:dev --limit 20 --tools web_search,browse      # the agent on the local web
  arpo web sft-data --data hotpotqa:train --limit 64 --out sft_deep_search.jsonl
  arpo web serve --corpus webhop:pages   # the built-in two-hop web task (examples/deep_search/run.sh)

The web tools reach the local web over HTTP as they reach the internet: web_search with
--web-provider local (the default) and browse, which may fetch from it (loopback is allowed for
the local web only). On the internet: --web-provider ddgs (no key), serper / tavily / brave / exa
(keys from SERPER_API_KEY, TAVILY_API_KEY, BRAVE_API_KEY, EXA_API_KEY) or searxng --web-url URL."""


def add_web_args(p) -> None:
    """The web tools' flags (used when --tools names web_search or browse)."""
    from arpo.settings.web import PROVIDERS

    g = p.add_argument_group("web tools (web_search, browse)")
    g.add_argument("--web-provider", default=None, choices=list(PROVIDERS),
                   help="web_search provider (default: local, the local web of `arpo web serve`)")
    g.add_argument("--web-url", default=None,
                   help="the provider's base URL (default: its own; local: http://127.0.0.1:8090)")
    g.add_argument("--web-top-k", type=POS_INT, default=None, help="results per web search (default: 5)")
    g.add_argument("--web-snippet-chars", type=POS_INT, default=None,
                   help="characters per search result snippet (default: 300)")
    g.add_argument("--web-allow-private", action="store_true",
                   help="browse may fetch private and loopback addresses (the local web is always allowed)")
    g.add_argument("--browse-window-chars", type=POS_INT, default=None,
                   help="characters per window of a browsed page (default: 2000)")
    g.add_argument("--browser-url", default=None,
                   help="summarize long pages with the model behind this OpenAI-compatible endpoint "
                   "(base URL with /v1, e.g. arpo serve agent's)")
    g.add_argument("--browser-model", default=None, help="the summarizer's model name at --browser-url")


def web_options(args) -> dict:
    """tools.web keys from the flags that were given (flags a namespace lacks count as not given)."""
    flags = {"provider": "web_provider", "url": "web_url", "top_k": "web_top_k",
             "snippet_chars": "web_snippet_chars", "window_chars": "browse_window_chars",
             "summarizer_url": "browser_url", "summarizer_model": "browser_model"}
    out = {k: getattr(args, f, None) for k, f in flags.items()}
    out = {k: v for k, v in out.items() if v is not None}
    if getattr(args, "web_allow_private", False):
        out["allow_private"] = True
    return out


def register(sub) -> None:
    p = sub.add_parser("web", help="the local web for offline deep search (serve, SFT data)",
                       description="A corpus as a web site (HTML pages + SearXNG's JSON search API), and "
                       "deep-search SFT trajectories made through the real web tools.",
                       epilog=EXAMPLES, formatter_class=HELP)
    s = p.add_subparsers(dest="web_cmd", metavar="{serve,sft-data}")
    sv = s.add_parser("serve", help="serve a corpus as a local web", epilog=EXAMPLES, formatter_class=HELP,
                      description="Host a corpus as HTML pages at /wiki/<Title> (or the path of each row's url) "
                      "with a search endpoint speaking SearXNG's JSON API: /search?q=...&format=json.")
    sv.add_argument("--corpus", nargs="+", default=None, metavar="FILE",
                    help="JSONL files of {title, text, url?} (or any layout `arpo index build` reads); "
                    "default: the built-in HotpotQA corpus")
    sv.add_argument("--search-index", default=None, help="serve the documents of this index dir instead")
    sv.add_argument("--index-dir", default=None, help="where to build --corpus's index (default: a temporary dir)")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on")
    sv.add_argument("--port", type=number(int, 0, 65535), default=8090, help="port to listen on (0: any free port)")
    sv.add_argument("--per-page", type=POS_INT, default=10, help="search results per page (SearXNG: 10)")
    sv.set_defaults(func=run_serve)
    sd = s.add_parser("sft-data", help="deep-search SFT trajectories through the real web tools",
                      epilog=EXAMPLES, formatter_class=HELP,
                      description="For each HotpotQA / MuSiQue row: web_search each supporting page's title, browse "
                      "the page found for the question, answer; rows whose pages lack the answer are dropped. "
                      "webhop rows (`arpo web serve --corpus webhop:pages`) get that task's two-hop trajectory.")
    sd.add_argument("--data", default="hotpotqa:train",
                    help="multi-hop rows: HotpotQA (supporting_facts), MuSiQue (is_supporting paragraphs), a "
                    "`supporting` list of titles, or webhop:train")
    sd.add_argument("--limit", type=POS_INT, default=None, help="rows to write (default: all that check out)")
    sd.add_argument("--max-pages", type=POS_INT, default=2, help="supporting pages searched and read per row")
    sd.add_argument("--out", required=True, help="output JSONL")
    sd.add_argument("--quiet", action="store_true", help="no progress bar")
    add_web_args(sd)
    sd.set_defaults(func=run_sft_data)
    p.set_defaults(func=lambda a: p.print_help() or 0)


def run_serve(args) -> int:
    from arpo.web.server import load_site, serve

    site = load_site(args.corpus, args.search_index, args.index_dir)
    serve(site, host=args.host, port=args.port, per_page=args.per_page)
    return 0


def run_sft_data(args) -> int:
    from arpo.data.sources import input_paths
    from arpo.jsonl import prepare_output
    from arpo.recipes.web_sft_data import build_deep_search_sft
    from arpo.settings.web import web_config

    prepare_output(args.out, inputs=input_paths([args.data]))  # --out equal to --data emptied the data
    stats = build_deep_search_sft(args.data, args.out, web=web_config(web_options(args)), limit=args.limit,
                                  max_pages=args.max_pages, progress=not args.quiet)
    print(json.dumps(stats))
    return 130 if stats.get("interrupted") else 0 if stats["written"] else 1

