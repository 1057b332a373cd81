"""The `<web_search>` tool: one tool, the search provider chosen in config (settings/web.py).

    ddgs      the ddgs package (keyless metasearch; it does its own HTTP)
    serper    POST {url}/search, header X-API-KEY              -> organic[{title, link, snippet}]
    tavily    POST {url}/search, Authorization: Bearer KEY      -> results[{title, url, content}]
    brave     GET  {url}/res/v1/web/search?q=&count=, header X-Subscription-Token
                                                                -> web.results[{title, url, description}]
    exa       POST {url}/search, header x-api-key               -> results[{title, url, text}]
    searxng   GET  {url}/search?q=&format=json (SearXNG's JSON API) -> results[{title, url, content}]
    local     searxng's API at `arpo web serve` (default http://127.0.0.1:8090)

All but ddgs go through httpx with the timeout, the per-provider rate limit and retries on 429 /
5xx (tools/web/webhttp.py). A redirect is followed only within the provider's origin (scheme, host and
port), at most MAX_REDIRECTS times: the API key never goes to another server. What the agent reads:

    1. Title
    URL: https://...
    snippet cut to snippet_chars with "…"

    2. ...

Never raises: a missing key, an unreachable or failing provider or a bad response is an `ok=False`
result starting "Error: web search failed" and the rollout goes on; no hits is a normal result.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from arpo.errors import ArpoError
from arpo.settings.web import KEY_REQUIRED, WebConfig
from arpo.tools.base import Tool, ToolResult
from arpo.tools.web.webhttp import WebError, limiter_for, request, retry_delay

if TYPE_CHECKING:
    import httpx

FAILED = "Error: web search failed"
MAX_REDIRECTS = 3


def require_local_web(cfg: WebConfig) -> None:
    """With provider local: one search request to the local web, which must answer (a run with it
    down searched in silence for minutes, then wrote nothing). ArpoError naming the URL and how to
    start it."""
    import httpx

    if cfg.provider != "local":
        return
    try:
        httpx.get(cfg.base_url + "/search", params={"q": "test", "format": "json"}, timeout=cfg.timeout_s)
    except httpx.HTTPError as e:
        raise ArpoError(f"the local web at {cfg.base_url} does not answer ({type(e).__name__}: {e}); start it "
                        "with `arpo web serve --corpus FILE.jsonl` (or `arpo web serve` for the built-in corpus; "
                        "--port to match), or set --web-url") from None


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, the port made explicit."""
    u = urlsplit(url)
    return u.scheme.lower(), (u.hostname or "").lower(), u.port or {"http": 80, "https": 443}.get(u.scheme.lower())


def _cut(text: str | None, n: int) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= n else text[:n].rstrip() + "…"


def format_results(hits: list[dict], snippet_chars: int = 300) -> str:
    """Numbered "i. title / URL: url / snippet" blocks separated by blank lines."""
    return "\n\n".join(f"{i}. {_cut(h.get('title') or h['url'], 200)}\nURL: {h['url']}\n"
                       f"{_cut(h.get('snippet'), snippet_chars)}".rstrip() for i, h in enumerate(hits, 1))


# ---- providers: (request kwargs, parse) ------------------------------------------------------------
def _rows(items, title: str, url: str, snippet: str) -> list[dict]:
    if not isinstance(items, list):
        raise ValueError(f"expected a list of results, got {type(items).__name__}")
    out = []
    for it in items:
        if isinstance(it, dict) and isinstance(it.get(url), str) and it[url]:
            out.append({"title": str(it.get(title) or ""), "url": it[url], "snippet": str(it.get(snippet) or "")})
    return out


def _serper(cfg, key, q):
    return ("POST", "/search", {"json": {"q": q, "num": cfg.top_k}, "headers": {"X-API-KEY": key}},
            lambda b: _rows(b.get("organic", []), "title", "link", "snippet"))


def _tavily(cfg, key, q):
    return ("POST", "/search", {"json": {"query": q, "max_results": cfg.top_k, "search_depth": "basic"},
                                "headers": {"Authorization": f"Bearer {key}"}},
            lambda b: _rows(b["results"], "title", "url", "content"))


def _brave(cfg, key, q):
    return ("GET", "/res/v1/web/search", {"params": {"q": q, "count": cfg.top_k},
                                          "headers": {"X-Subscription-Token": key, "Accept": "application/json"}},
            lambda b: _rows((b.get("web") or {}).get("results", []), "title", "url", "description"))


def _exa(cfg, key, q):
    return ("POST", "/search", {"json": {"query": q, "numResults": cfg.top_k,
                                         "contents": {"text": {"maxCharacters": cfg.snippet_chars}}},
                                "headers": {"x-api-key": key}},
            lambda b: _rows(b["results"], "title", "url", "text"))


def _searxng(cfg, key, q):
    headers = {"Accept": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    return ("GET", "/search", {"params": {"q": q, "format": "json", "pageno": 1}, "headers": headers},
            lambda b: _rows(b["results"], "title", "url", "content"))


HTTP_PROVIDERS = {"serper": _serper, "tavily": _tavily, "brave": _brave, "exa": _exa, "searxng": _searxng,
                  "local": _searxng}


class WebSearchTool(Tool):
    """`<web_search>query</web_search>`: the top results of the configured provider. Thread-safe;
    `calls` / `failures` count queries."""

    name = "web_search"
    description = "Searches the web and returns numbered results: title, URL and snippet."
    schema = {"type": "function", "function": {
        "name": "web_search", "description": description,
        "parameters": {"type": "object", "required": ["query"],
                       "properties": {"query": {"type": "string", "description": "what to search for"}}}}}

    def __init__(self, config: WebConfig | None = None):
        self.cfg = config or WebConfig()  # parsed and checked with its config (a dict: settings.web.web_config)
        self.limiter = limiter_for(self.cfg.provider, self.cfg.base_url, self.cfg.requests_per_s)
        self.calls = self.failures = 0
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None

    def __repr__(self) -> str:
        return f"WebSearchTool({self.cfg.provider}, {self.cfg.base_url or 'ddgs'}, top_k={self.cfg.top_k})"

    def _http(self):
        import httpx

        with self._lock:
            if self._client is None:
                self._client = httpx.Client(timeout=self.cfg.timeout_s, follow_redirects=False,
                                            headers={"User-Agent": "arpo-web-search/1"})
            return self._client

    def search(self, query: str) -> list[dict]:
        """[{title, url, snippet}] for `query` (at most top_k); raises WebError."""
        cfg = self.cfg
        key = None
        if cfg.key_env:
            key = os.environ.get(cfg.key_env) or None
            if key is None and cfg.provider in KEY_REQUIRED:
                raise WebError(f"no API key for {cfg.provider}: set the environment variable {cfg.key_env}")
        if cfg.provider == "ddgs":
            return self._ddgs(query)
        method, path, kwargs, parse = HTTP_PROVIDERS[cfg.provider](cfg, key, query)
        label = f"{cfg.provider} ({cfg.base_url})"
        url = cfg.base_url + path
        for _ in range(MAX_REDIRECTS + 1):
            r = request(self._http(), method, url, limiter=self.limiter, retries=cfg.retries,
                        backoff_s=cfg.backoff_s, label=label, **kwargs)
            if not r.is_redirect:
                break
            target = urljoin(url, r.headers.get("location", ""))
            if origin(target) != origin(url):  # the request carries the key: never to another server
                raise WebError(f"HTTP {r.status_code} from {label}: a redirect to another server ({target[:200]}), "
                               "not followed (the API key is only sent to the provider's own address; set "
                               "tools.web.url to the address the provider moved to)")
            url = target
        else:
            raise WebError(f"more than {MAX_REDIRECTS} redirects from {label}")
        if r.status_code in (401, 403):
            raise WebError(f"HTTP {r.status_code} from {label}: the API key in {cfg.key_env} was refused")
        if r.status_code != 200:
            raise WebError(f"HTTP {r.status_code} from {label}: {' '.join(r.text.split())[:200]}")
        try:
            return parse(r.json())[: cfg.top_k]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise WebError(f"bad response from {label} ({type(e).__name__}: {str(e)[:200]})") from e

    def _ddgs(self, query: str) -> list[dict]:
        try:
            from ddgs import DDGS
            from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException
        except ImportError as e:
            raise WebError("provider ddgs needs the ddgs package: pip install 'arpo[web]'") from e

        last = ""
        for attempt in range(self.cfg.retries + 1):
            self.limiter.acquire()
            try:
                items = DDGS(timeout=int(max(1, self.cfg.timeout_s))).text(query, max_results=self.cfg.top_k)
                return _rows(items or [], "title", "href", "body")[: self.cfg.top_k]
            except (RatelimitException, TimeoutException) as e:
                last = f"ddgs: {type(e).__name__}: {str(e)[:200]}"
            except DDGSException as e:  # "No results found." is one of these
                if "no results" in str(e).lower():
                    return []
                last = f"ddgs: {str(e)[:200]}"
            if attempt < self.cfg.retries:
                time.sleep(retry_delay(attempt, self.cfg.backoff_s))
        raise WebError(f"{last} (after {self.cfg.retries + 1} attempts)")

    def __call__(self, query: str) -> ToolResult:
        t0 = time.perf_counter()
        q = " ".join(str(query).split())
        with self._lock:
            self.calls += 1
        if not q:
            with self._lock:
                self.failures += 1
            return ToolResult("Error: empty search query; write it between <web_search> and </web_search>.", ok=False)
        try:
            hits = self.search(q)
        except WebError as e:
            with self._lock:
                self.failures += 1
            return ToolResult(f"{FAILED}: {e}", ok=False, elapsed_s=time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - never into the rollout
            with self._lock:
                self.failures += 1
            return ToolResult(f"{FAILED}: {type(e).__name__}: {str(e)[:200]}", ok=False,
                              elapsed_s=time.perf_counter() - t0)
        dt = time.perf_counter() - t0
        if not hits:
            return ToolResult(f"No results found for '{q}'. Try other keywords.", ok=True, elapsed_s=dt,
                              meta={"n_hits": 0, "urls": [], "titles": []})
        return ToolResult(format_results(hits, self.cfg.snippet_chars), ok=True, elapsed_s=dt,
                          meta={"n_hits": len(hits), "urls": [h["url"] for h in hits],
                                "titles": [h["title"] for h in hits]})

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
