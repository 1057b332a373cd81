"""The HTTP manners of the web tools: a rate limit per provider, retries with exponential backoff
on 429 / 5xx / timeouts / refused connections, and `browse`'s URL check (http/https only; the address
checks are in tools/webnet.py, under the HTTP client).

Every failure is a `WebError` whose message is what the agent reads; the tools turn it into an
`ok=False` result and the rollout goes on.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 30.0


class WebError(Exception):
    """A web request failed; the message is shown to the agent."""


class RateLimiter:
    """At most `rate` acquisitions per second, spread evenly: each caller reserves the next free slot
    (now, or 1/rate after the previous one) and sleeps until it. Thread-safe; rate 0: no limit."""

    def __init__(self, rate: float):
        self.rate = rate
        self._next = 0.0
        self._lock = threading.Lock()

    def acquire(self) -> float:
        """Wait for a slot; returns the seconds waited."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = time.monotonic()
            at = max(now, self._next)
            self._next = at + 1.0 / self.rate
        wait = at - now
        if wait > 0:
            time.sleep(wait)
        return wait


_LIMITERS: dict[tuple[str, str], RateLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def limiter_for(provider: str, base_url: str, rate: float) -> RateLimiter:
    """The process-wide limiter of one provider endpoint (all tools and threads share it)."""
    with _LIMITERS_LOCK:
        lim = _LIMITERS.get((provider, base_url))
        if lim is None or lim.rate != rate:
            lim = _LIMITERS[(provider, base_url)] = RateLimiter(rate)
        return lim


def retry_delay(attempt: int, backoff_s: float, retry_after: str | None = None) -> float:
    """Seconds to wait before retry number `attempt` (0-based): the server's Retry-After seconds when
    given (capped at 30 s), else backoff_s * 2**attempt."""
    if retry_after:
        try:
            return min(max(float(retry_after), 0.0), MAX_RETRY_AFTER_S)
        except ValueError:
            pass  # an HTTP date: fall back to our own backoff
    return backoff_s * (2 ** attempt)


def _detail(r) -> str:
    try:
        body = r.json()
        if isinstance(body, dict):
            d = body.get("message") or body.get("error") or body.get("detail") or body
            return str(d)[:200]
    except ValueError:
        pass
    return " ".join(r.text.split())[:200]


def request(client, method: str, url: str, *, limiter: RateLimiter, retries: int, backoff_s: float,
            label: str, **kwargs):
    """One HTTP request through `client` (httpx.Client) with the rate limit and retries; returns the
    response of the first attempt that is not 429/5xx (4xx included: the caller decides), or raises
    WebError saying what the last attempt got."""
    import httpx

    last = "no attempt"
    for attempt in range(retries + 1):
        limiter.acquire()
        retry_after = None
        try:
            r = client.request(method, url, **kwargs)
        except httpx.TimeoutException as e:
            last = f"no answer from {label} within {client.timeout.read or 0:g}s ({type(e).__name__})"
        except httpx.HTTPError as e:
            last = f"cannot reach {label} ({type(e).__name__}: {str(e)[:200]})"
        else:
            if r.status_code not in RETRY_STATUS:
                return r
            retry_after = r.headers.get("retry-after")
            last = f"HTTP {r.status_code} from {label}: {_detail(r)}"
        if attempt < retries:
            time.sleep(retry_delay(attempt, backoff_s, retry_after))
    raise WebError(f"{last} (after {retries + 1} attempt{'s' * (retries > 0)})")


# ---- browse: which addresses may be fetched --------------------------------------------------------
def host_port(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    return (u.hostname or "").lower(), port


def check_url(url: str) -> None:
    """Raise WebError unless `url` is http(s) with a host. Which addresses may be reached is checked
    when connecting, on the address connected to (tools/webnet.py)."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https"):
        raise WebError(f"only http:// and https:// URLs can be browsed, not {u.scheme or 'a bare'}:// ({url[:200]})")
    if not host_port(url)[0]:
        raise WebError(f"no host in URL {url[:200]!r}")
