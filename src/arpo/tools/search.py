"""The `<search>` tool: top-k passages from a local index or from a retrieval server (spec §1).

Output format (what the agent reads inside <result>):

    Page 1: Title
    passage text, cut to max_chars with "…"

    Page 2: ...

Never raises: an unreachable or failing server, a timeout or a bad response becomes an
`ok=False` result whose text says so, and the rollout goes on.
"""

from __future__ import annotations

import threading
import time

from arpo.tools.base import ToolResult


def format_passages(hits, max_chars: int = 1000) -> str:
    blocks = []
    for i, h in enumerate(hits, 1):
        title, text = (h["title"], h["text"]) if isinstance(h, dict) else (h.title, h.text)
        if len(text) > max_chars:
            text = text[:max_chars].rstrip() + "…"
        blocks.append(f"Page {i}: {title}\n{text}")
    return "\n\n".join(blocks)


class SearchTool:
    name = "search"

    def __init__(self, index=None, url: str | None = None, top_k: int = 10, max_chars: int = 1000,
                 mode: str = "bm25", timeout_s: float = 5.0):
        if (index is None) == (url is None):
            raise ValueError("SearchTool needs exactly one of index= or url=")
        self.index, self.url = index, (url.rstrip("/") if url else None)
        self.top_k, self.max_chars, self.mode, self.timeout_s = top_k, max_chars, mode, timeout_s
        self.calls = self.failures = 0
        self._lock = threading.Lock()
        self._client = None

    def __call__(self, query: str) -> ToolResult:
        return self.search_many([query])[0]

    def _remote(self, queries: list[str]) -> list[list[dict]]:
        import httpx

        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout_s)
        r = self._client.post(f"{self.url}/search", json={"queries": queries, "top_k": self.top_k, "mode": self.mode})
        r.raise_for_status()
        res = r.json()["results"]
        if len(res) != len(queries):
            raise ValueError(f"server answered {len(res)} result lists for {len(queries)} queries")
        return res

    def search_many(self, queries: list[str]) -> list[ToolResult]:
        t0 = time.perf_counter()
        qs = [q.strip() for q in queries]
        with self._lock:
            self.calls += len(qs)
        try:
            if self.url:
                results = self._remote(qs)
            else:
                results = self.index.search(qs, k=self.top_k, mode=self.mode)
        except Exception as e:  # never into the rollout
            with self._lock:
                self.failures += len(qs)
            where = self.url or "local index"
            msg = f"Error: search service unavailable ({where}): {type(e).__name__}: {str(e)[:200]}"
            return [ToolResult(msg, ok=False, elapsed_s=time.perf_counter() - t0) for _ in qs]
        dt = time.perf_counter() - t0
        out = []
        for q, hits in zip(qs, results):
            text = format_passages(hits, self.max_chars) if hits else f"No results found for '{q}'."
            out.append(ToolResult(text, ok=True, elapsed_s=dt / max(1, len(qs))))
        return out

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
