"""One call's output, read under a deadline and a byte cap: the loop the one-shot tool
(tools/python.py) and sessions (tools/python_session.py) share.

Trainer side: never loaded inside the zygote."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass

from .protocol import CallEnd

UNWATCH = object()  # a watch handler's answer once its descriptor is closed: stop polling it


@dataclass
class Captured:
    """What `run_with_limits` read: the output (at most `max_bytes`, plus what the pipe held when the
    call ended), how the call ended as the message that ended it said (None: none came), and which
    limit ended it."""

    raw: bytes
    status: CallEnd | None
    timed_out: bool
    overflow: bool


def run_with_limits(out_fd: int, watch: dict[int, Callable[[], object]], deadline: float, max_bytes: int,
                    status: CallEnd | None = None, stop: Callable[[], None] | None = None) -> Captured:
    """Read a call's output from `out_fd` until one of `watch` reports how the call ended, the
    `deadline` (time.monotonic()) passes (timed_out), or more than `max_bytes` arrive (overflow: a
    flood is stopped, not buffered). `watch`: {fd: handler}; when fd is readable its handler reads
    it and returns a CallEnd (the first one ends the call), None (go on) or UNWATCH (its
    descriptor closed). `status` already known (e.g. the code could not be sent): nothing is waited
    for. Then `stop()` (e.g. kill the call), and, unless the output closed or overflowed, what the
    program wrote before it ended is drained from the pipe without waiting."""
    out, total = bytearray(), 0
    timed_out = overflow = False
    poller = select.poll()
    for fd in (out_fd, *watch):
        poller.register(fd, select.POLLIN)
    out_open = True
    while status is None and not overflow:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        for fd, _ in poller.poll(max(1, int(remaining * 1000 + 0.999))):
            if fd == out_fd:
                chunk = os.read(out_fd, 1 << 16)
                if not chunk:
                    poller.unregister(out_fd)
                    out_open = False
                total += len(chunk)
                out += chunk[: max(0, max_bytes - len(out))]
                overflow = total > max_bytes
                continue
            said = watch[fd]()
            if said is UNWATCH:
                poller.unregister(fd)
            elif status is None and isinstance(said, CallEnd):
                status = said
    if stop is not None:
        stop()
    if out_open and not overflow:  # what the program wrote before it ended is in the pipe
        os.set_blocking(out_fd, False)
        try:
            while len(out) < max_bytes:
                chunk = os.read(out_fd, 1 << 16)
                if not chunk:
                    break
                out += chunk
        except BlockingIOError:
            pass
    return Captured(bytes(out), status, timed_out, overflow)
