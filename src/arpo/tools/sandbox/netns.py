"""The call's own network namespace: loopback up, per-socket buffer caps.

Runs in the sandbox's init. Loaded inside the zygote (see the package docstring): standard library only."""

from __future__ import annotations

import fcntl
import logging
import socket
import struct

log = logging.getLogger(__name__)


# per-socket caps inside the call's network namespace (bytes: min, default, max), so one socket
# cannot take the whole budget: net.ipv4.tcp_rmem / tcp_wmem are per namespace (net.core.rmem_max
# is not, on this 6.18 kernel: writing it from a namespace other than the host's is EACCES, so an
# SO_RCVBUF up to twice the host's rmem_max passes), as is net.core.somaxconn. These only narrow TCP
# where a tool asked for it (`loopback_tcp`); by default the call has no TCP (seccomp.IP_STREAM_TYPES).
_NETNS_SYSCTLS = (("ipv4/tcp_rmem", "4096 131072 1048576"), ("ipv4/tcp_wmem", "4096 16384 1048576"),
                  ("core/somaxconn", "16"))
_NETNS_SYSCTLS_NO_TCP = (("core/somaxconn", "128"),)  # the backlog of AF_UNIX listeners too


def loopback_up() -> None:
    """A fresh network namespace has `lo` down; up, it lets code use localhost inside itself."""
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | IFF_UP))


def limit_netns(tcp: bool = True) -> None:
    """Per-socket buffer caps of this (private) network namespace (see _NETNS_SYSCTLS); `tcp`:
    whether the call may have TCP at all (else the TCP caps are moot: seccomp denies the sockets)."""
    for name, value in _NETNS_SYSCTLS if tcp else _NETNS_SYSCTLS_NO_TCP:
        try:
            with open(f"/proc/sys/net/{name}", "w") as f:
                f.write(value)
        except OSError as e:
            log.debug("sandbox: net.%s: %s", name.replace("/", "."), e)
