"""`arpo web serve`: a local web for offline deep search. The web tools reach it over HTTP exactly as
they reach the internet: `web_search` with provider `local` (or `searxng`) and `browse`.

    GET /                           home page
    GET /wiki/<Title>               a document as an HTML page (a user corpus: the path of its `url`)
    GET /search?q=...&format=json   SearXNG's JSON API: {query, number_of_results, results[{url, title,
                                    content, engine, score, ...}], answers, suggestions, ...}
    GET /search?q=...               the same results as an HTML page
    GET /health                     {"status": "ok", "pages": N, "corpus": ...}

`pageno` pages through the results (`per_page` each, 10 by default, as SearXNG). Unknown pages are
HTTP 404 with an HTML body; a missing `q` is HTTP 400. A loopback-bound server answers only loopback
Host names, and request bodies over 64 KiB get HTTP 413 (arpo/http_guard.py); it has no key (browse
sends none): bound beyond loopback it serves its pages to anyone who reaches it, and says so.
"""

# No `from __future__ import annotations`: FastAPI must see the function-local `Request` class itself
# in the handler's signature (a string annotation of it would not resolve).
import atexit
import shutil
import tempfile

import arpo.ports
from arpo.errors import ArpoError
from arpo.retrieval import load_index
from arpo.web.site import Site, render_home, render_page, render_results, searxng_json

DEFAULT_PORT = 8090
MAX_PAGENO = 50
MAX_BODY_BYTES = 64 * 1024  # the site only answers GETs


def create_app(site: Site, per_page: int = 10, snippet_chars: int = 300, bind_host: str = "127.0.0.1"):
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse

    from arpo.http_guard import RequestGuard, allowed_hosts  # noqa: PLC0415 - loads starlette; kept out of this light module's import

    app = FastAPI(title="arpo local web", version="1", docs_url="/docs",
                  description=f"{len(site)} pages from the {site.name} corpus, and SearXNG's search API")
    app.add_middleware(RequestGuard, allowed=allowed_hosts(bind_host), max_body_bytes=MAX_BODY_BYTES)

    @app.get("/", response_class=HTMLResponse)
    def home():
        return render_home(site)

    @app.get("/health")
    def health():
        return {"status": "ok", "pages": len(site), "corpus": site.name}

    @app.get("/search")
    def search(request: Request, q: str = "", format: str = "html", pageno: int = 1):
        if not q.strip():
            msg = "missing query: /search?q=...&format=json"
            return JSONResponse({"error": msg}, status_code=400) if format == "json" else \
                HTMLResponse(f"<p>{msg}</p>", status_code=400)
        pageno = min(max(pageno, 1), MAX_PAGENO)
        ranked = site.search(q, per_page * pageno)[per_page * (pageno - 1):]
        if format == "json":
            return searxng_json(site, str(request.base_url), q, ranked, pageno, snippet_chars)
        return HTMLResponse(render_results(site, q, ranked, snippet_chars))

    @app.get("/{path:path}", response_class=HTMLResponse)
    def page(path: str):
        i = site.page("/" + path)
        if i is None:
            return HTMLResponse("<!DOCTYPE html><html><head><title>Not found</title></head><body>"
                                "<h1>Not found</h1><p>No such page on this local web.</p></body></html>",
                                status_code=404)
        d = site.index.docs[i]
        related = [j for j, _ in site.search(d.title or d.text[:100], 4)]
        return render_page(site, i, related)

    return app


def load_site(corpus: list[str] | None = None, search_index: str | None = None, index_dir: str | None = None) -> Site:
    """The site to serve: the default HotpotQA index, an index directory (`arpo index build`), or user
    corpus files indexed into `index_dir` (default: a temporary directory)."""
    if corpus and search_index:
        raise ArpoError("give --corpus or --search-index, not both")
    if corpus:
        if index_dir is None:
            tmp = tempfile.mkdtemp(prefix="arpo-web-")
            atexit.register(shutil.rmtree, tmp, True)
            index_dir = f"{tmp}/index"
        return Site.from_corpus(corpus, index_dir)

    index = load_index(search_index)
    return Site.from_index(index, name="hotpotqa" if search_index is None else str(index.path.name))


def serve(site: Site, host: str = "127.0.0.1", port: int = DEFAULT_PORT, per_page: int = 10,
          log_level: str = "warning") -> None:
    """Serve `site` until interrupted; the URL it listens on is printed once the socket listens
    (`--port 0`: a free port, which was never printed)."""
    import uvicorn

    from arpo.http_guard import warn_bind  # noqa: PLC0415 - loads starlette; kept out of this light module's import

    sock = arpo.ports.listen(host, port)
    port = sock.getsockname()[1]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    print(f"arpo web: {len(site)} pages ({site.name}) on {url}  "
          f"(search: /search?q=...&format=json, pages: {site.paths[0] if site.paths else '-'} ...)", flush=True)
    if site.merged is not None:  # paragraphs that share a title are sections of one page: say so
        print(f"arpo web: {site.merged.line()}", flush=True)
    warn_bind("arpo web serve", host, port, False)
    # lifespan off: the app has no startup/shutdown handlers, and uvicorn's lifespan task could print a
    # CancelledError traceback on Ctrl-C (seen 2 in ~15 interrupts)
    config = uvicorn.Config(create_app(site, per_page=per_page, bind_host=host), log_level=log_level, lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
