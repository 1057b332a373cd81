"""The `<search>` tool: top-k passages from a local index or from a retrieval server (spec §1).

Output format (what the agent reads inside <result>):

    Page 1: Title
    passage text, cut to max_chars with "…"

    Page 2: ...

Never raises: an unreachable or failing server, a timeout or a bad response becomes an
`ok=False` result "Error: search service unavailable: ...", and the rollout goes on.
A query without hits is a normal result: "No results found for '...'."
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

from arpo.retrieval.server import KEY_ENV  # the key of `arpo serve retriever`, sent when set
from arpo.tools.base import Tool, ToolResult

if TYPE_CHECKING:
    import httpx

UNAVAILABLE = "Error: search service unavailable"
REQUEST_BATCH = 256  # queries per HTTP request


def _title_text(h) -> tuple[str, str]:
    return (h["title"], h["text"]) if isinstance(h, dict) else (h.title, h.text)


def _truncate(text: str, max_chars: int) -> tuple[str, bool]:
    if max_chars <= 0 or len(text) <= max_chars:
        return text, False
    return text[:max_chars].rstrip() + "…", True


def format_passages(hits, max_chars: int = 1000) -> str:
    """"Page i: Title\\ntext" blocks separated by blank lines; each text is cut to `max_chars`
    characters (then "…" is appended). `hits`: Hit objects or {title, text} dicts."""
    return _format(hits, max_chars)[0]


def _format(hits, max_chars: int) -> tuple[str, bool]:
    blocks, any_cut = [], False
    for i, h in enumerate(hits, 1):
        title, text = _title_text(h)
        text, cut = _truncate(text, max_chars)
        any_cut |= cut
        blocks.append(f"Page {i}: {title}\n{text}")
    return "\n\n".join(blocks), any_cut


class SearchTool(Tool):
    """`<search>query</search>` over `index` (an arpo.retrieval.index.Index) or a retrieval server at
    `url` (`arpo serve retriever`). Thread-safe; `calls` / `failures` count queries."""

    name = "search"
    description = "Searches a Wikipedia corpus and returns the top passages."
    schema = {"type": "function", "function": {
        "name": "search", "description": description,
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "what to look up"}},
                       "required": ["query"]}}}

    def __init__(self, index=None, url: str | None = None, top_k: int = 10, max_chars: int = 1000,
                 mode: str = "bm25", timeout_s: float = 5.0):
        from arpo.retrieval.index import MODES  # noqa: PLC0415 - loads numpy; kept out of this light module's import

        if (index is None) == (url is None):
            raise ValueError("SearchTool needs exactly one of index= or url=")
        if mode not in MODES:
            raise ValueError(f"search mode {mode!r}; choose one of {', '.join(MODES)}")
        if top_k < 1:
            raise ValueError("top_k must be >= 1")
        self.index, self.url = index, (url.rstrip("/") if url else None)
        self.top_k, self.max_chars, self.mode, self.timeout_s = top_k, max_chars, mode, timeout_s
        self.calls = self.failures = 0
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None

    def __repr__(self) -> str:
        src = self.url or repr(self.index)
        return f"SearchTool({src}, top_k={self.top_k}, mode={self.mode!r})"

    def __call__(self, query: str) -> ToolResult:
        return self.search_many([query])[0]

    # ---- backends ---------------------------------------------------------------------------------
    def _http(self):
        import httpx

        with self._lock:
            if self._client is None:
                key = os.environ.get(KEY_ENV)  # the retriever's key, if it has one (`arpo serve retriever`)
                self._client = httpx.Client(timeout=self.timeout_s,
                                            headers={"Authorization": f"Bearer {key}"} if key else None)
            return self._client

    def _remote(self, queries: list[str]) -> list[list[dict]]:
        out: list[list[dict]] = []
        for b in range(0, len(queries), REQUEST_BATCH):  # the server takes at most 1024 queries a request
            out.extend(self._post(queries[b : b + REQUEST_BATCH]))
        return out

    def _post(self, queries: list[str]) -> list[list[dict]]:
        import httpx

        try:
            r = self._http().post(f"{self.url}/search",
                                  json={"queries": queries, "top_k": self.top_k, "mode": self.mode})
        except httpx.TimeoutException as e:
            raise _Unavailable(f"no answer from {self.url} within {self.timeout_s:g}s ({type(e).__name__})") from e
        except httpx.HTTPError as e:
            raise _Unavailable(f"cannot reach {self.url} ({type(e).__name__}: {e})") from e
        if r.status_code != 200:
            try:
                body = r.json()
                detail = (body.get("message") or body.get("detail")) if isinstance(body, dict) else None
                detail = detail or r.text
            except ValueError:
                detail = r.text
            raise _Unavailable(f"HTTP {r.status_code} from {self.url}/search: {str(detail)[:300]}")
        try:
            res = r.json()["results"]
            if not isinstance(res, list) or len(res) != len(queries):
                n = len(res) if isinstance(res, list) else type(res).__name__
                raise ValueError(f"{n} result lists for {len(queries)} queries")
            for row in res:
                for h in row:
                    h["title"], h["text"]  # shape check: KeyError / TypeError if not a hit
        except (ValueError, KeyError, TypeError) as e:
            raise _Unavailable(f"bad response from {self.url}/search ({type(e).__name__}: {e})") from e
        return res

    # ---- the tool ---------------------------------------------------------------------------------
    def search_many(self, queries: list[str]) -> list[ToolResult]:
        """Search a batch of queries in one index call (or one HTTP request per 256 queries); one
        result per query, in order. Empty queries get an error result and are not sent."""
        t0 = time.perf_counter()
        qs = [" ".join(str(q).split()) for q in queries]
        out: list[ToolResult | None] = [None] * len(qs)
        todo = []
        for j, q in enumerate(qs):
            if q:
                todo.append(j)
            else:
                out[j] = ToolResult("Error: empty search query; write the query between <search> and </search>.",
                                    ok=False)
        with self._lock:
            self.calls += len(qs)
            self.failures += len(qs) - len(todo)
        if todo:
            batch = [qs[j] for j in todo]
            try:
                if self.url:
                    results = self._remote(batch)
                else:
                    results = self.index.search(batch, k=self.top_k, mode=self.mode)
                error = None
            except _Unavailable as e:
                error = f"{UNAVAILABLE}: {e}"
            except Exception as e:  # noqa: BLE001 - never into the rollout
                where = self.url or "local index"
                error = f"{UNAVAILABLE}: {where}: {type(e).__name__}: {str(e)[:300]}"
            dt = (time.perf_counter() - t0) / len(todo)
            if error is not None:
                with self._lock:
                    self.failures += len(todo)
                for j in todo:
                    out[j] = ToolResult(error, ok=False, elapsed_s=dt)
            else:
                for j, hits in zip(todo, results, strict=True):
                    if hits:
                        text, cut = _format(hits, self.max_chars)
                        titles = [_title_text(h)[0] for h in hits]
                        out[j] = ToolResult(text, ok=True, elapsed_s=dt, truncated=cut,
                                            meta={"n_hits": len(hits), "titles": titles})
                    else:
                        out[j] = ToolResult(f"No results found for '{qs[j]}'. Try other keywords.", ok=True,
                                            elapsed_s=dt, meta={"n_hits": 0, "titles": []})
        return out  # type: ignore[return-value]

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class _Unavailable(Exception):
    """The retrieval server could not answer (message is shown to the agent)."""
