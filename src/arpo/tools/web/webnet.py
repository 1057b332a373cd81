"""Where `browse` may connect, and one deadline for everything it does on the network.

`browse` fetches URLs that a model wrote, so every connection it opens goes through
`GuardedBackend`, an httpcore network backend:

* the host name is resolved once (getaddrinfo, under the deadline), every address it resolves to
  is checked (`refusal`), and the socket connects to exactly those checked addresses, never to a
  second lookup's answer (DNS rebinding cannot swap in 127.0.0.1 between the check and the connection);
* an address is allowed when it is globally routable (`ipaddress`'s `is_global`, not multicast), and
  so is every IPv4 address embedded in it (IPv4-mapped ::ffff:a.b.c.d, IPv4-compatible ::a.b.c.d,
  6to4 2002::/16, Teredo 2001::/32, NAT64 64:ff9b::/96 and 64:ff9b:1::/48): loopback, private,
  shared (100.64.0.0/10, cloud metadata at 100.100.100.200), link-local (169.254.169.254), reserved,
  documentation and multicast ranges are refused, and so is IPv6 site-local fec0::/10 (deprecated,
  but `is_global` in Python 3.11);
* an address this machine owns is refused however global it is (a public IPv4 or a global IPv6 on an
  interface reaches the servers bound to 0.0.0.0 / :: here: vLLM servers, `serve agent`, notebooks):
  the kernel is asked at every connection, so on every redirect hop too (`own_address`: can a socket be
  bound to it; where the host allows binding to any address, its interface and local-route tables);
* the explicit opt-ins stay: `allow_private` (any address) and `allow_hosts` (a host or host:port
  as written in the URL; `browse` adds the local web of `arpo web serve` when it is the search provider);
* every connect, TLS handshake, read and write gets at most the time left until the deadline set
  with `deadline(...)` (a server that drips its headers a byte at a time is cut at the deadline).

Because the check sits under the HTTP client, it holds for every hop of a redirect and for pooled
connections alike. Proxies from the environment are not used (the client is built with its own
transport): the address checked must be the address connected to.
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Iterator

import httpcore
import httpx

from arpo.tools.web.webhttp import WebError

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("arpo_browse_deadline", default=None)

_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_V4_COMPAT = ipaddress.ip_network("::/96")
_V4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")


# ---- which addresses -------------------------------------------------------------------------------
def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries: IPv4-mapped, IPv4-compatible, IPv4-translated,
    6to4, Teredo (server and client) and NAT64 (well-known and local-use prefixes)."""
    out: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        out.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        out.append(ip.sixtofour)
    if ip.teredo is not None:
        out.extend(ip.teredo)
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if any(ip in n for n in _NAT64) or ip in _V4_TRANSLATED or (ip in _V4_COMPAT and int(ip) > 1):
        out.append(low32)
    return out


def _nonlocal_bind(family: int) -> bool:
    """The host lets sockets bind to addresses it does not own (net.ipv4/ipv6.ip_nonlocal_bind)."""
    name = "ipv4" if family == socket.AF_INET else "ipv6"
    try:
        with open(f"/proc/sys/net/{name}/ip_nonlocal_bind") as f:
            return f.read().strip() != "0"
    except OSError:
        return False


def _local_table(family: int) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """This machine's addresses from /proc: the IPv4 routes of type LOCAL (/proc/net/fib_trie) and
    the IPv6 interface addresses (/proc/net/if_inet6)."""
    nets: list = []
    try:
        if family == socket.AF_INET:
            with open("/proc/net/fib_trie") as f:
                last = None
                for line in f:
                    word = line.strip().lstrip("|-+ ")
                    if line.strip().startswith("|--"):
                        last = word
                    elif last and line.strip().endswith("host LOCAL"):
                        nets.append(ipaddress.ip_network(f"{last}{word.split()[0]}", strict=False))
        else:
            with open("/proc/net/if_inet6") as f:
                for line in f:
                    h = line.split()[0]
                    nets.append(ipaddress.ip_network(":".join(h[i:i + 4] for i in range(0, 32, 4))))
    except (OSError, ValueError):
        pass
    return nets


def own_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """This machine (its network namespace) owns `ip`: a socket can be bound to it (the kernel's own
    answer, local routes such as `ip route add local ...` included), or, where any address may be bound
    (ip_nonlocal_bind), it is on an interface or in a local route."""
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    if _nonlocal_bind(family):
        return any(ip in n for n in _local_table(family))
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((str(ip), 0))
        return True
    except OSError:  # EADDRNOTAVAIL: not ours (EAFNOSUPPORT: no such family here, so not ours either)
        return False


def refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why `ip` may not be fetched (None: it may): it, and every IPv4 address embedded in it, must be
    globally routable, not multicast, not IPv6 site-local, and not an address of this machine."""
    for a in [ip, *(embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else [])]:
        if a.is_loopback:
            return f"the loopback address {ip}"
        if not a.is_global or a.is_multicast or (isinstance(a, ipaddress.IPv6Address) and a.is_site_local):
            return f"the non-public (private, shared, link-local, site-local, reserved or multicast) address {ip}"
        if own_address(a):
            return f"the address {ip} of this machine"
    return None


def host_allowed(host: str, port: int, allow_hosts: Iterable[str]) -> bool:
    """`host` or `host:port` is listed in allow_hosts (case-insensitive; IPv6 with or without brackets)."""
    allowed = {h.lower() for h in allow_hosts}
    host = host.lower().strip("[]")
    return bool({host, f"{host}:{port}", f"[{host}]", f"[{host}]:{port}"} & allowed)


# ---- one deadline ------------------------------------------------------------------------------------
@contextlib.contextmanager
def deadline(at: float) -> Iterator[None]:
    """Within the block, the guarded connections of this thread (context) end at time.monotonic() `at`."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def time_left(timeout: float | None) -> float | None:
    """`timeout` shortened to the time left until the deadline (None: no limit at all)."""
    at = _DEADLINE.get()
    if at is None:
        return timeout
    left = at - time.monotonic()
    return left if timeout is None else min(timeout, left)


def resolve(host: str, port: int, timeout: float | None) -> list[tuple[int, tuple]]:
    """[(family, sockaddr)] of `host` (one getaddrinfo, given at most `timeout` seconds; a lookup still
    running then is left to finish in its daemon thread). Raises WebError."""
    box: dict = {}

    def lookup():
        try:
            box["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        except OSError as e:  # socket.gaierror and friends
            box["error"] = e
        except ValueError as e:  # no host name: an empty or over-long label ("a..b", "x..."), a NUL
            box["error"] = f"not a valid host name: {e.__cause__ or e}"
        except Exception as e:  # noqa: BLE001 - whatever else, the caller's WebError, never a dead thread
            box["error"] = f"{type(e).__name__}: {e}"

    th = threading.Thread(target=lookup, name="arpo-browse-dns", daemon=True)
    th.start()
    th.join(None if timeout is None else max(0.0, timeout))
    if th.is_alive():
        raise WebError(f"cannot resolve {host} in time")
    if "error" in box:
        e = box["error"]
        raise WebError(f"cannot resolve {host} ({getattr(e, 'strerror', None) or e})")
    return [(fam, addr) for fam, _t, _p, _c, addr in box["infos"] if fam in (socket.AF_INET, socket.AF_INET6)]


# ---- the httpcore backend ----------------------------------------------------------------------------
class _Stream(httpcore.NetworkStream):
    """A blocking socket whose every operation gets at most the time left until the deadline."""

    def __init__(self, sock: socket.socket):
        self._sock = sock

    def _timeout(self, timeout: float | None, exc: type[Exception]) -> float | None:
        t = time_left(timeout)
        if t is not None and t <= 0:
            raise exc("the deadline has passed")
        return t

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._sock.settimeout(self._timeout(timeout, httpcore.ReadTimeout))
        try:
            return self._sock.recv(max_bytes)
        except TimeoutError as e:
            raise httpcore.ReadTimeout(str(e) or "timed out") from e
        except OSError as e:
            raise httpcore.ReadError(str(e)) from e

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        while buffer:
            self._sock.settimeout(self._timeout(timeout, httpcore.WriteTimeout))
            try:
                n = self._sock.send(buffer)
            except TimeoutError as e:
                raise httpcore.WriteTimeout(str(e) or "timed out") from e
            except OSError as e:
                raise httpcore.WriteError(str(e)) from e
            buffer = buffer[n:]

    def close(self) -> None:
        self._sock.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        t = self._timeout(timeout, httpcore.ConnectTimeout)
        try:
            self._sock.settimeout(t)
            sock = ssl_context.wrap_socket(self._sock, server_hostname=server_hostname)
        except TimeoutError as e:
            self.close()
            raise httpcore.ConnectTimeout(str(e) or "timed out") from e
        except OSError as e:  # ssl.SSLError included
            self.close()
            raise httpcore.ConnectError(str(e)) from e
        return _Stream(sock)

    def get_extra_info(self, info: str):
        if info == "ssl_object" and isinstance(self._sock, ssl.SSLSocket):
            return self._sock  # httpcore reads the negotiated ALPN protocol from it
        if info == "client_addr":
            return self._sock.getsockname()
        if info == "server_addr":
            return self._sock.getpeername()
        if info == "socket":
            return self._sock
        if info == "is_readable":  # an idle pooled connection that is readable was closed by the server
            if self._sock.fileno() < 0:
                return True
            return bool(select.select([self._sock], [], [], 0)[0])
        return None


class GuardedBackend(httpcore.NetworkBackend):
    """Resolve once, check every address (`refusal`) unless allowed, connect to the checked address."""

    def __init__(self, allow_private: bool = False, allow_hosts: Iterable[str] = ()):
        self.allow_private = allow_private
        self.allow_hosts = list(allow_hosts)

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options=None) -> httpcore.NetworkStream:
        t = time_left(timeout)
        if t is not None and t <= 0:
            raise httpcore.ConnectTimeout("the deadline has passed")
        addrs = resolve(host, port, t)
        if not addrs:
            raise WebError(f"cannot resolve {host} (no IPv4 or IPv6 address)")
        if not (self.allow_private or host_allowed(host, port, self.allow_hosts)):
            for _fam, sockaddr in addrs:
                why = refusal(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]))
                if why:
                    raise WebError(f"refused to fetch {host}: it resolves to {why} (allow it with "
                                   "tools.web.allow_hosts or allow_private)")
        last: Exception | None = None
        for fam, sockaddr in addrs:  # the checked addresses themselves: no second lookup
            sock = socket.socket(fam, socket.SOCK_STREAM)
            try:
                t = time_left(timeout)
                if t is not None and t <= 0:
                    raise TimeoutError("the deadline has passed")
                sock.settimeout(t)
                if local_address is not None:
                    sock.bind((local_address, 0))
                for option in socket_options or ():
                    sock.setsockopt(*option)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.connect(sockaddr)
                return _Stream(sock)
            except TimeoutError as e:
                sock.close()
                raise httpcore.ConnectTimeout(str(e) or "timed out") from e
            except OSError as e:
                sock.close()
                last = e
        raise httpcore.ConnectError(str(last))

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options=None):
        raise WebError("browse does not connect to unix sockets")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def guarded_client(*, allow_private: bool = False, allow_hosts: Iterable[str] = (), **kwargs):
    """An httpx.Client whose every connection goes through GuardedBackend (kwargs: httpx.Client's)."""
    transport = httpx.HTTPTransport()
    # the pool httpx would build, with our network backend (httpx has no argument for it)
    transport._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(),
                                              network_backend=GuardedBackend(allow_private, allow_hosts))
    return httpx.Client(transport=transport, trust_env=False, **kwargs)
