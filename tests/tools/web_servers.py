"""Real HTTP servers on localhost for the web tools' tests (no mock of the HTTP layer): a scripted
server (http.server in a thread) that records every request, and the local web (`arpo web serve`'s
app under uvicorn) over a small corpus."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass
class Req:
    method: str
    path: str
    query: dict
    headers: dict
    body: bytes
    t: float

    def json(self):
        return json.loads(self.body)


@dataclass
class Scripted:
    """`handle(req) -> (status, headers, body)`; body: bytes, str, a dict/list (sent as JSON), or an
    iterator of bytes chunks (each sent as it comes). Every request is kept in `requests`."""
    handle: object
    requests: list = field(default_factory=list)
    url: str = ""


@contextmanager
def scripted_server(handle):
    srv = Scripted(handle)

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _do(self):
            u = urlsplit(self.path)
            n = int(self.headers.get("content-length") or 0)
            req = Req(self.command, u.path, {k: v[0] for k, v in parse_qs(u.query).items()},
                      {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(n) if n else b"",
                      time.monotonic())
            srv.requests.append(req)
            status, headers, body = srv.handle(req)
            if isinstance(body, (dict, list)):
                body, headers = json.dumps(body).encode(), {"content-type": "application/json", **headers}
            elif isinstance(body, str):
                body = body.encode()
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            if isinstance(body, bytes):
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:  # a generator of chunks: no length, close when done
                self.send_header("connection", "close")
                self.end_headers()
                try:
                    for chunk in body:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

        do_GET = do_POST = _do

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.daemon_threads = True
    th = threading.Thread(target=httpd.serve_forever, daemon=True)
    th.start()
    srv.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield srv
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def uvicorn_app(app):
    """Serve an ASGI app on 127.0.0.1:<free port> in a thread; yields its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        th.join(10)
        sock.close()
