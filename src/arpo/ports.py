"""Checks a server makes before it starts listening."""

from __future__ import annotations

import socket

from arpo.errors import ArpoError


def require_port_free(host: str, port: int) -> None:
    """Raise ArpoError naming host:port when nothing can listen there (port taken, address not local).

    uvicorn only logs such a failure and exits, so servers call this first for a clear message."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise ArpoError(f"cannot listen on {host}:{port} ({e.strerror or e}); is another server running? "
                        "pick another --port") from e
