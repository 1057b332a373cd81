"""Checks a server makes before it starts listening, a free port to give one, and stopping a server
that runs as a child process (`arpo web serve` for a study: web/process.py; an OpenEnv app: envs/openenv.py)."""

from __future__ import annotations

import socket
import subprocess

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


def stop_process(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop a child process and reap it: SIGTERM, up to grace_s seconds to exit (a server's shutdown),
    then SIGKILL. Nothing when it has exited already."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
