"""The `<browse>` tool: fetch a web page, extract its readable text, and show it in windows, as a
query-focused excerpt, or summarized by a model (the paper's "browser").

Input (tag format; the json format takes {url, page, query}):

    <browse> https://example.org/page </browse>                  page 1 of n (windows of window_chars)
    <browse> https://example.org/page page=2 </browse>           page 2 of n
    <browse> https://example.org/page | when was it built </browse>   the passages most about the query

Fetching: http/https only; at most max_redirects redirects; only globally routable addresses,
checked under the HTTP client for every connection (every redirect hop included) and connected to
exactly as checked (tools/web/webnet.py), unless allowed (tools.web.allow_private / allow_hosts; the
local web of `arpo web serve` is allowed when it is the search provider); at most max_bytes of the
DECODED body read, whatever its Content-Encoding layers (tools/web/webdecode.py); browse_timeout_s is one
deadline for the whole call: name lookup, connect, headers, body and text extraction (which runs in a
worker process killed at the deadline, tools/web/extract_worker.py). HTML goes through trafilatura (the
page's main text, boilerplate removed); text/plain and JSON are shown as they are; other types
are refused. docs/web_tools.md has the threat model.

With tools.web.summarizer_url and summarizer_model set, a page longer than summarize_min_chars is
summarized (for the query when one is given) by that model through the OpenAI chat-completions API
(any compatible server: `arpo serve agent`, vLLM, a hosted API); when the summarizer fails, the
window or excerpt is shown instead with a note.

Never raises: every failure is an `ok=False` result starting "Error: browse failed".
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import urljoin

from arpo.settings.web import WebConfig
from arpo.tools.base import Tool, ToolResult
from arpo.tools.web.extract_worker import ExtractTimeout, pool
from arpo.tools.web.webdecode import ACCEPT_ENCODING, read_decoded
from arpo.tools.web.webhttp import RETRY_STATUS, WebError, check_url, host_port, retry_delay

if TYPE_CHECKING:
    import httpx

FAILED = "Error: browse failed"
_INPUT = re.compile(r"^\s*(\S+)(?:\s+page\s*[=:]?\s*(\d+))?\s*(?:\|\s*(.*?))?\s*$", re.S | re.I)
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset("a an and are as at be by for from how in is it of on or that the this to was were what when "
                  "where which who whom why with did does do".split())


# ---- pure text functions ---------------------------------------------------------------------------
def parse_input(text: str) -> tuple[str, int, str | None]:
    """'URL [page=N] [| query]' -> (url, page, query or None). Raises ValueError when there is no URL."""
    m = _INPUT.match(text or "")
    if not m:
        raise ValueError("write a URL, optionally followed by page=N or by | and a question")
    url, page, query = m.group(1), int(m.group(2) or 1), (m.group(3) or "").strip() or None
    return url.strip("<>\"'"), page, query


def windows(text: str, size: int) -> list[str]:
    """Split `text` into consecutive windows of at most `size` characters, cutting at a paragraph,
    line, sentence or word boundary when one lies in the window's second half; the windows joined
    with "" give `text` back (whitespace at the cuts kept in the earlier window)."""
    out, i = [], 0
    while i < len(text):
        j = min(i + size, len(text))
        if j < len(text):
            for sep in ("\n\n", "\n", ". ", " "):
                k = text.rfind(sep, i + size // 2, j)
                if k >= 0:
                    j = k + len(sep)
                    break
        out.append(text[i:j])
        i = j
    return out or [""]


def _terms(s: str) -> list[str]:
    return [w for w in _WORD.findall(s.lower()) if w not in _STOP]


def passages(text: str, size: int = 400) -> list[str]:
    """The text's paragraphs, long ones cut into windows of `size` characters."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n|\n", text):
        para = para.strip()
        if para:
            out.extend(w.strip() for w in windows(para, size) if w.strip())
    return out


def excerpt(text: str, query: str, max_chars: int) -> str:
    """The passages most about `query`, in the page's order, " … " between gaps, at most `max_chars`.

    A passage's score is sum over the query's distinct terms t in it of idf(t) = ln(1 + N / df(t))
    (N passages, df: passages containing t); ties keep page order. Without any matching passage:
    the page's beginning."""
    ps = passages(text, max(100, max_chars // 4))
    if not ps:
        return ""
    bags = [set(_terms(p)) for p in ps]
    q = set(_terms(query))
    df = {t: sum(t in b for b in bags) for t in q}
    scores = [sum(math.log(1 + len(ps) / df[t]) for t in q if t in b) for b in bags]
    order = sorted(range(len(ps)), key=lambda i: (-scores[i], i))
    if not scores or max(scores) == 0:
        return windows(text, max_chars)[0].strip()
    chosen: list[int] = []
    used = 0
    for i in order:
        if scores[i] == 0 or used + len(ps[i]) > max_chars and chosen:
            continue
        chosen.append(i)
        used += len(ps[i]) + 3
        if used >= max_chars:
            break
    chosen.sort()
    parts = []
    for n, i in enumerate(chosen):
        if n and i != chosen[n - 1] + 1:
            parts.append("…")
        parts.append(ps[i][:max_chars])
    return "\n".join(parts)


# ---- the tool --------------------------------------------------------------------------------------
class BrowseTool(Tool):
    """`<browse>URL [page=N] [| query]</browse>`; see the module docstring. Thread-safe."""

    name = "browse"
    description = ("Opens a web page and returns its text, one window at a time (page=N), or the passages "
                   "about a question (| question).")
    schema = {"type": "function", "function": {
        "name": "browse", "description": description,
        "parameters": {"type": "object", "properties": {
            "url": {"type": "string", "description": "the page's URL (http or https)"},
            "page": {"type": "integer", "description": "which window of the page (1 = the start)"},
            "query": {"type": "string", "description": "show the passages about this question instead"}},
            "required": ["url"]}}}

    def __init__(self, config: WebConfig | None = None):
        self.cfg = config or WebConfig()  # parsed and checked with its config (a dict: settings.web.web_config)
        self.allow_hosts = list(self.cfg.allow_hosts)
        if self.cfg.provider == "local" and self.cfg.browse_local_web:  # the local web is part of the configured world
            h, p = host_port(self.cfg.base_url)
            self.allow_hosts.append(f"{h}:{p}")
        self.calls = self.failures = self.summarized = 0
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._llm: httpx.Client | None = None

    def __repr__(self) -> str:
        return f"BrowseTool(window_chars={self.cfg.window_chars}, summarizer={self.cfg.summarizer_model})"

    def _http(self):
        """The client for the pages: every connection through webnet's address checks."""
        from arpo.tools.web.webnet import guarded_client  # noqa: PLC0415 - loads httpcore (the web extra); kept out of this light module's import

        with self._lock:
            if self._client is None:
                self._client = guarded_client(
                    allow_private=self.cfg.allow_private, allow_hosts=self.allow_hosts,
                    timeout=self.cfg.browse_timeout_s, follow_redirects=False,
                    headers={"User-Agent": "arpo-browse/1", "Accept": "text/html,text/plain;q=0.9,*/*;q=0.5",
                             "Accept-Encoding": ACCEPT_ENCODING})
                pool().warm()
            return self._client

    def _summarizer_http(self):
        """The client for the configured summarizer endpoint (not a model-written URL)."""
        import httpx

        with self._lock:
            if self._llm is None:
                self._llm = httpx.Client(follow_redirects=False, headers={"User-Agent": "arpo-browse/1"})
            return self._llm

    # ---- fetching ---------------------------------------------------------------------------------
    def fetch(self, url: str, deadline: float | None = None) -> tuple[str, bytes, str, bool]:
        """(final url, decoded body, content type, truncated) after the checks and caps; raises WebError.
        `deadline` (time.monotonic()): the end of the whole call (default: browse_timeout_s from now)."""
        import httpx

        from arpo.tools.web.webnet import deadline as net_deadline  # noqa: PLC0415 - loads httpcore (the web extra); kept out of this light module's import

        cfg = self.cfg
        if deadline is None:
            deadline = time.monotonic() + cfg.browse_timeout_s
        late = f"no page from {url} within {cfg.browse_timeout_s:g}s"
        with net_deadline(deadline):
            for attempt in range(cfg.retries + 1):
                hop_url = url
                for _hop in range(cfg.max_redirects + 1):
                    check_url(hop_url)  # the scheme; the addresses are checked when connecting (webnet)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise WebError(late)
                    try:
                        with self._http().stream("GET", hop_url, timeout=left) as r:
                            if r.is_redirect:
                                loc = r.headers.get("location")
                                if not loc:
                                    raise WebError(f"HTTP {r.status_code} redirect without a Location from {hop_url}")
                                hop_url = urljoin(hop_url, loc)
                                continue
                            if r.status_code in RETRY_STATUS:
                                status, retry_after = r.status_code, r.headers.get("retry-after")
                                break
                            if r.status_code != 200:
                                raise WebError(f"HTTP {r.status_code} from {hop_url}")
                            body, cut = read_decoded(r.iter_raw(), r.headers.get("content-encoding"), cfg.max_bytes,
                                                     deadline)
                            return hop_url, body, r.headers.get("content-type", ""), cut
                    except httpx.TimeoutException as e:
                        raise WebError(f"{late} ({type(e).__name__})") from e
                    except httpx.HTTPError as e:
                        raise WebError(f"cannot fetch {hop_url} ({type(e).__name__}: {str(e)[:200]})") from e
                else:
                    raise WebError(f"more than {cfg.max_redirects} redirects from {url}")
                if attempt < cfg.retries:  # a 429 / 5xx: wait and try again
                    time.sleep(min(retry_delay(attempt, cfg.backoff_s, retry_after),
                                   max(0.0, deadline - time.monotonic())))
        raise WebError(f"HTTP {status} from {hop_url} (after {cfg.retries + 1} attempts)")

    # ---- summarizing (the paper's browser) ---------------------------------------------------------
    def summarize(self, url: str, title: str, text: str, query: str | None) -> str:
        """The summarizer model's reading of the page; raises WebError."""
        import httpx

        cfg = self.cfg
        goal = query or "the page's main facts"
        messages = [
            {"role": "system", "content": "You read web pages for a research assistant. Report the facts on the page "
             "that bear on the goal, briefly and exactly, with names, dates and numbers as written. If the page "
             "says nothing about the goal, say so."},
            {"role": "user", "content": f"Goal: {goal}\n\nPage: {title or url}\nURL: {url}\n\n"
             f"{text[: cfg.summarizer_input_chars]}"}]
        headers = {}
        key = os.environ.get(cfg.summarizer_key_env or "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        if not cfg.summarizer_url:
            raise WebError("browse: no summarizer endpoint (set tools.web.summarizer_url)")
        endpoint = cfg.summarizer_url.rstrip("/") + "/chat/completions"
        try:
            r = self._summarizer_http().post(endpoint, headers=headers, timeout=max(cfg.browse_timeout_s, 60.0),
                                  json={"model": cfg.summarizer_model, "messages": messages,
                                        "max_tokens": cfg.summarizer_max_tokens, "temperature": 0.0})
        except httpx.HTTPError as e:
            raise WebError(f"summarizer {endpoint}: {type(e).__name__}: {str(e)[:200]}") from e
        if r.status_code != 200:
            raise WebError(f"summarizer {endpoint}: HTTP {r.status_code}: {' '.join(r.text.split())[:200]}")
        try:
            content = r.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise WebError(f"summarizer {endpoint}: bad response ({type(e).__name__})") from e
        content = str(content or "").strip()
        if not content:
            raise WebError(f"summarizer {endpoint}: an empty answer")
        return content

    # ---- the tool ---------------------------------------------------------------------------------
    def browse(self, url: str, page: int = 1, query: str | None = None) -> ToolResult:
        t0 = time.perf_counter()
        cfg = self.cfg
        with self._lock:
            self.calls += 1
        try:
            if page < 1:
                raise WebError(f"page={page}: pages count from 1")
            deadline = time.monotonic() + cfg.browse_timeout_s  # one deadline: fetch and extraction
            final, body, ctype, cut = self.fetch(url, deadline)
            if time.monotonic() >= deadline:
                raise WebError(f"no page from {url} within {cfg.browse_timeout_s:g}s")

            try:
                title, text = pool().extract(body, ctype, final, deadline)
            except ExtractTimeout as e:
                raise WebError(f"no page from {url} within {cfg.browse_timeout_s:g}s ({e})") from None
            if not text:
                raise WebError(f"no readable text on {final}")
        except WebError as e:
            return self._fail(f"{FAILED}: {e}", t0)
        except Exception as e:  # noqa: BLE001 - never into the rollout
            return self._fail(f"{FAILED}: {type(e).__name__}: {str(e)[:200]}", t0)
        head = f"URL: {final}\n" + (f"Title: {title}\n" if title else "")
        note = " (the page was cut at its size limit)" if cut else ""
        meta = {"url": final, "chars": len(text)}
        if cfg.summarizer_url and len(text) > cfg.summarize_min_chars:
            try:
                summary = self.summarize(final, title, text, query)
                with self._lock:
                    self.summarized += 1
                return ToolResult(f"{head}Summary by {cfg.summarizer_model} for "
                                  f"{query or 'the page'}{note}:\n{summary}", ok=True,
                                  elapsed_s=time.perf_counter() - t0, meta=meta | {"summarized": True})
            except WebError as e:
                note += f" (summarizer unavailable: {e})"
        if query:
            out = excerpt(text, query, cfg.window_chars)
            q = query if len(query) <= 80 else query[:80].rstrip() + "…"
            return ToolResult(f"{head}Passages about '{q}'{note}:\n{out}", ok=True,
                              elapsed_s=time.perf_counter() - t0, truncated=len(out) < len(text), meta=meta)
        ws = windows(text, cfg.window_chars)
        if page > len(ws):
            return self._fail(f"{FAILED}: page={page}, but {final} has {len(ws)} page(s)", t0)
        more = f"; page={page + 1} for more" if page < len(ws) else ""
        return ToolResult(f"{head}[page {page} of {len(ws)}{more}]{note}\n{ws[page - 1].strip()}", ok=True,
                          elapsed_s=time.perf_counter() - t0, truncated=len(ws) > 1 or cut,
                          meta=meta | {"page": page, "pages": len(ws)})

    def _fail(self, msg: str, t0: float) -> ToolResult:
        with self._lock:
            self.failures += 1
        return ToolResult(msg, ok=False, elapsed_s=time.perf_counter() - t0)

    def __call__(self, input: str) -> ToolResult:
        try:
            url, page, query = parse_input(input)
        except ValueError as e:
            with self._lock:
                self.calls += 1
            return self._fail(f"{FAILED}: {e}", time.perf_counter())
        return self.browse(url, page, query)

    def call(self, args: dict) -> ToolResult:
        """Function-calling form: {url, page?, query?}."""
        url, page, query = args.get("url"), args.get("page", 1), args.get("query")
        if not isinstance(url, str) or not url.strip():
            with self._lock:
                self.calls += 1
            return self._fail(f"{FAILED}: the argument url (a string) is required", time.perf_counter())
        try:
            page = int(page or 1)
        except (TypeError, ValueError):
            page = 0
        return self.browse(url.strip(), page, str(query).strip() if query else None)

    def close(self) -> None:
        with self._lock:
            for c in (self._client, self._llm):
                if c is not None:
                    c.close()
            self._client = self._llm = None
