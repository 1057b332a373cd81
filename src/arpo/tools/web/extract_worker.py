"""`browse`'s page extraction in child processes that can be killed at the call's deadline.

trafilatura (lxml) runs for tens of seconds on some pages (28 s on 1.9 MB of nested tags) and cannot
be interrupted inside a thread, so `ExtractPool.extract` sends the body to a worker process
(`python -m arpo.tools.web.extract_worker`), waits at most the time left, and kills the worker when the
time is up (the next call starts a fresh one). Idle workers are kept for the next calls (at most
`max_idle`); one is started ahead of the first call (`warm`), and a worker's start-up (importing
trafilatura, about a second) is not charged to a page.

Protocol over the worker's stdin / stdout, each message a 4-byte big-endian length and its bytes:
the parent sends a JSON header {content_type, url} and the body; the worker sends "ready" once, then
per page a JSON object {title, text} or {error, web}. Only JSON comes back, never pickles.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import arpo
from arpo.tools.web.pagetext import extract_text
from arpo.tools.web.webhttp import WebError

START_TIMEOUT_S = 60.0


class ExtractTimeout(WebError):
    """The deadline passed while the page was being read (the worker was killed)."""


def _send(f, data: bytes) -> None:
    f.write(struct.pack(">I", len(data)) + data)
    f.flush()


def _recv_exact(fd: int, n: int, until: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = None if until is None else until - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError
        if not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _recv(fd: int, until: float | None) -> bytes:
    (n,) = struct.unpack(">I", _recv_exact(fd, 4, until))
    return _recv_exact(fd, n, until)


class _Worker:
    def __init__(self):
        src = str(Path(arpo.__file__).resolve().parents[1])  # the arpo this process runs
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                   OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "arpo.tools.web.extract_worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.ready = False

    def wait_ready(self) -> None:
        if not self.ready:
            hello = _recv(self.stdout.fileno(), time.monotonic() + START_TIMEOUT_S)
            if hello != b"ready":  # the worker could not start (trafilatura missing, ...)
                self.kill()
                raise WebError(hello.decode(errors="replace")[:300])
            self.ready = True

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.stdin, self.stdout):
            try:
                f.close()
            except OSError:
                pass


class ExtractPool:
    """Worker processes for `extract_text`; thread-safe (each call has a worker to itself)."""

    def __init__(self, max_idle: int = 4):
        self.max_idle = max_idle
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self.started = self.killed = 0

    def _take(self) -> _Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.started += 1
        return _Worker()

    def _give(self, w: _Worker) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(w)
                return
        w.kill()

    def warm(self) -> None:
        """Start one worker now (in the background), so that the first page does not wait for it."""
        with self._lock:
            if self._idle or self.started:
                return
            self.started += 1

        def start():
            w = _Worker()
            try:
                w.wait_ready()
            except (EOFError, TimeoutError, OSError, WebError):
                w.kill()
                return
            self._give(w)

        threading.Thread(target=start, name="arpo-extract-warm", daemon=True).start()

    def extract(self, body: bytes, content_type: str, url: str, deadline: float) -> tuple[str, str]:
        """(title, text) of the page, as pagetext.extract_text gives them; WebError when the time.monotonic()
        `deadline` passes first (the worker is killed) or the worker fails."""
        w = self._take()
        try:
            w.wait_ready()  # a new worker's start-up: not the page's time
            _send(w.stdin, json.dumps({"content_type": content_type, "url": url}).encode())
            _send(w.stdin, body)
            reply = json.loads(_recv(w.stdout.fileno(), deadline))
        except TimeoutError:
            w.kill()
            with self._lock:
                self.killed += 1
            raise ExtractTimeout("its text extraction was stopped at the deadline") from None
        except (EOFError, OSError, ValueError) as e:
            w.kill()
            raise WebError(f"the page reader failed ({type(e).__name__})") from None
        self._give(w)
        if "error" in reply:
            raise WebError(reply["error"]) if reply.get("web") else RuntimeError(reply["error"])
        return reply["title"], reply["text"]

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()


_POOL: ExtractPool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> ExtractPool:
    """The process-wide pool (closed at exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ExtractPool()
            atexit.register(_POOL.close)
        return _POOL


def main() -> None:
    """The worker: read pages from stdin until it closes, answer each on stdout."""
    out = sys.stdout.buffer
    try:
        import trafilatura  # noqa: F401 - imported before "ready": the start-up is not a page's time
    except ImportError as e:
        _send(out, f"reading pages needs {e.name}: pip install 'arpo[web]'".encode())
        return
    _send(out, b"ready")
    fd = sys.stdin.buffer.fileno()
    while True:
        try:
            head = json.loads(_recv(fd, None))
            body = _recv(fd, None)
        except EOFError:
            return
        reply: dict[str, str | bool]
        try:
            title, text = extract_text(body, head["content_type"], head["url"])
            reply = {"title": title, "text": text}
        except WebError as e:
            reply = {"error": str(e), "web": True}
        except Exception as e:  # noqa: BLE001 - reported to the parent, the worker goes on
            reply = {"error": f"{type(e).__name__}: {str(e)[:200]}", "web": False}
        _send(out, json.dumps(reply).encode())


if __name__ == "__main__":
    main()
