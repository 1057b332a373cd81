"""Checks a server makes before it starts listening, and a free port to give one."""

from __future__ import annotations

import socket

from arpo.errors import ArpoError


def require_port_free(host: str, port: int) -> None:
    """Raise ArpoError naming host:port when nothing can listen there (port taken, address not local).

    uvicorn only logs such a failure and exits, so servers call this first for a clear message."""
    listen(host, port).close()


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (port 0: a free one, read back with .getsockname()[1]), for
    uvicorn's `sockets=`; ArpoError naming host:port when nothing can listen there."""
    try:
        return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as e:
        raise ArpoError(f"cannot listen on {host}:{port} ({e.strerror or e}); is another server running? "
                        "pick another --port") from e


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS's choice for port 0)."""
    with listen(host, 0) as s:
        return int(s.getsockname()[1])
