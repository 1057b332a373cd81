"""The HTTP manners of the web tools: a rate limit per provider, retries with exponential backoff
on 429 / 5xx / timeouts / refused connections, and `browse`'s URL check (http/https only; the address
checks are in tools/web/webnet.py, under the HTTP client).

Every failure is a `WebError` whose message is what the agent reads; the tools turn it into an
`ok=False` result and the rollout goes on.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 30.0


class WebError(Exception):
    """A web request failed; the message is shown to the agent."""


class RateLimiter:
    """At most `rate` acquisitions per second, spread evenly: each caller reserves the next free slot
    (now, or 1/rate after the previous one) and sleeps until it. Thread-safe; rate 0: no limit.

    `path`: the slot is kept in this file (wall-clock time, under a file lock), so every process
    that opens the same path shares one rate: the torchrun ranks of a node, and a node's other arpo
    processes, send `rate` requests per second together, not `rate` each. None: this process only."""

    def __init__(self, rate: float, path: str | os.PathLike | None = None):
        self.rate = rate
        self.path = Path(path) if path is not None else None
        self._next = 0.0
        self._lock = threading.Lock()

    def _reserve(self, now: float) -> float:
        """The start of the next free slot (>= now), and book the one after it."""
        if self.path is None:
            at = max(now, self._next)
            self._next = at + 1.0 / self.rate
            return at
        from filelock import FileLock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            try:
                booked = float(self.path.read_text() or 0.0)
            except (FileNotFoundError, ValueError):
                booked = 0.0
            at = max(now, booked)
            self.path.write_text(repr(at + 1.0 / self.rate))
        return at

    def acquire(self) -> float:
        """Wait for a slot; returns the seconds waited."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = time.time() if self.path is not None else time.monotonic()  # a file's slot: every process's clock
            at = self._reserve(now)
        wait = at - now
        if wait > 0:
            time.sleep(wait)
        return wait


_LIMITERS: dict[tuple[str, str], RateLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def shared_rate_dir() -> Path:
    """Where the node's shared rate limits live: $ARPO_RATE_LIMIT_DIR, else a per-user folder in the
    system's temporary directory (local to the machine: one rate per node)."""
    env = os.environ.get("ARPO_RATE_LIMIT_DIR")
    return Path(env) if env else Path(tempfile.gettempdir()) / f"arpo-rate-limits-{os.getuid()}"


def limiter_for(provider: str, base_url: str, rate: float) -> RateLimiter:
    """The limiter of one provider endpoint, shared by all tools and threads of this process and by
    every process on this machine (a file per provider + URL in shared_rate_dir(): torchrun's 8 ranks
    of a node send `rate` requests per second together)."""
    with _LIMITERS_LOCK:
        lim = _LIMITERS.get((provider, base_url))
        if lim is None or lim.rate != rate:
            key = hashlib.sha256(f"{provider} {base_url}".encode()).hexdigest()[:16]
            lim = _LIMITERS[(provider, base_url)] = RateLimiter(rate, shared_rate_dir() / f"{provider}-{key}")
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
    when connecting, on the address connected to (tools/web/webnet.py)."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https"):
        raise WebError(f"only http:// and https:// URLs can be browsed, not {u.scheme or 'a bare'}:// ({url[:200]})")
    if not host_port(url)[0]:
        raise WebError(f"no host in URL {url[:200]!r}")
