"""What arpo's own HTTP servers check before a request reaches their handlers: `arpo serve agent`
(serve/app.py), `arpo serve retriever` (retrieval/server.py) and `arpo web serve` (web/server.py).

* The Host header: a server bound to a loopback address answers only requests whose Host names a
  loopback address or the bound name (a web page that rebinds its own DNS name to 127.0.0.1 sends
  its own name as Host: HTTP 400). A server bound to another address cannot know the names it is
  reached by and accepts any Host. ARPO_ALLOWED_HOSTS (comma-separated names; "*": any) replaces the
  list, e.g. behind a reverse proxy.
* The body size: a Content-Length over the limit, or a body that grows over it while it is read,
  gets HTTP 413 before any handler parses it.
* The bind address: `bind_warning` is the text the servers print when they listen beyond loopback
  without an API key.

docs/web_tools.md has the threat model.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import sys
from collections.abc import Callable

from starlette.exceptions import HTTPException

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ENV_ALLOWED_HOSTS = "ARPO_ALLOWED_HOSTS"


def is_loopback(host: str) -> bool:
    """`host` (a bind address or name) is a loopback one."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind_host: str) -> list[str] | None:
    """The Host names a server bound to `bind_host` answers (lower case, no port); None: any.
    ARPO_ALLOWED_HOSTS, when set, replaces the list."""
    env = os.environ.get(ENV_ALLOWED_HOSTS)
    if env is not None and env.strip():
        names = [h.strip().lower().strip("[]") for h in env.split(",") if h.strip()]
        return None if "*" in names else names
    if not is_loopback(bind_host):
        return None
    return sorted({*LOOPBACK_NAMES, bind_host.strip("[]").lower()})


def host_name(header: str) -> str:
    """The name in a Host header, without its port or IPv6 brackets, lower case."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:].split("]", 1)[0]
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def host_ok(header: str, allowed: list[str] | None) -> bool:
    """A request with this Host header may be answered."""
    if allowed is None:
        return True
    name = host_name(header)
    return name in allowed or (name.endswith(".localhost") and "localhost" in allowed)


def bind_warning(server: str, host: str, port: int, has_key: bool) -> str | None:
    """The loud warning for a server listening beyond loopback without an API key (None: no warning)."""
    if is_loopback(host) or has_key:
        return None
    where = "every network interface" if host in ("0.0.0.0", "::", "") else host
    return (f"WARNING: {server} listens on {where} (port {port}) without an API key: anyone who can reach this "
            f"machine's port {port} can use it. Bind to 127.0.0.1 (the default), or set a key "
            "(ARPO_API_KEY, or the server's --api-key) and a firewall.")


def warn_bind(server: str, host: str, port: int, has_key: bool) -> None:
    """Print bind_warning's text to stderr, if any."""
    msg = bind_warning(server, host, port, has_key)
    if msg:
        bar = "!" * min(100, len(msg))
        print(f"{bar}\n{msg}\n{bar}", file=sys.stderr, flush=True)


def _default_error(status: int, message: str) -> dict:
    return {"detail": message, "message": message}


DRAIN_BYTES = 16 * 2**20  # of a refused body, at most this much is read (and dropped) before the 413
DRAIN_SECONDS = 10.0


async def drain(receive, budget: int = DRAIN_BYTES, seconds: float = DRAIN_SECONDS) -> None:
    """Read and drop the rest of a refused request's body (at most `budget` bytes, `seconds` long) before
    the error is sent: a server that closes a socket with unread data sends a TCP reset, and a client
    still sending its body then loses the 413 (httpx: "peer closed connection without sending complete
    message body"). A larger or slower body is cut off as before."""
    async def read() -> None:
        left = budget
        while left > 0:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            left -= len(msg.get("body", b""))
            if not msg.get("more_body", False):
                return

    try:
        await asyncio.wait_for(read(), seconds)
    except (TimeoutError, asyncio.TimeoutError):
        pass


class RequestGuard:
    """ASGI middleware: HTTP 400 for a Host not in `allowed` (None: any), HTTP 413 for a body over
    `max_body_bytes`; `error(status, message) -> dict` is the JSON error body (the app's own format)."""

    def __init__(self, app, *, allowed: list[str] | None, max_body_bytes: int,
                 error: Callable[[int, str], dict] = _default_error):
        self.app, self.allowed, self.max_body_bytes, self.error = app, allowed, max_body_bytes, error

    async def _reply(self, send, status: int, message: str) -> None:
        body = json.dumps(self.error(status, message)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if not host_ok(host, self.allowed):
            return await self._reply(send, 400, f"invalid Host header {host[:100]!r}: this server answers "
                                     f"{', '.join(self.allowed or [])} (set {ENV_ALLOWED_HOSTS} to add names)")
        limit = self.max_body_bytes
        too_big = f"the request body is larger than this server's limit of {limit} bytes"
        try:
            length = int(headers.get("content-length") or 0)
        except ValueError:
            return await self._reply(send, 400, "invalid Content-Length header")
        if length > limit:
            await drain(receive)
            return await self._reply(send, 413, too_big)
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:  # an HTTPException: FastAPI passes it on to the app's error handler
                    raise BodyTooLarge(413, too_big)
            return msg

        async def tracked_send(msg):
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except BodyTooLarge as e:  # raised where no handler turned it into a response
            if started:
                raise
            await drain(receive)
            await self._reply(send, 413, str(e.detail))


class BodyTooLarge(HTTPException):
    """A request body grew over the limit while it was read (HTTP 413)."""
