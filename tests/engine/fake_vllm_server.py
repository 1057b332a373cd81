"""A real local HTTP server with the vLLM dev-mode routes a weight push uses (vllm/entrypoints/rl/online/
api_router.py and serve/dev in vllm 0.32, read from its source): /pause (mode), /resume, /collective_rpc,
/reset_prefix_cache, /update_weight_version, /weight_info, /init_weight_transfer_engine,
/start_weight_update, /update_weights, /finish_weight_update (weight_version), /get_world_size, and
/v1/models. It models the failure the issue found: between start and finish every layer is on the meta
device, so a completion then "crashes the engine" (HTTP 500), as one while paused is refused. It records
every call in order; `stall` makes one route sleep, `stale_version` makes /weight_info lie."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


def _pause(f, body, q):
    if q.get("mode", "abort") not in ("abort", "wait", "keep"):
        return 400, {"error": "mode"}
    f.paused = True
    return 200, {"status": "paused"}


def _resume(f, body, q):
    f.paused = False
    return 200, {"status": "resumed"}


def _completions(f, body, q):
    if f.updating:
        f.crashed = True
        return 500, {"error": "engine dead: weights on the meta device"}
    return (503 if f.paused else 400), {"error": "not served by the fake"}


def _set_version(f, body, q):
    f.version = body["new_version"]
    return 200, {"success": True, "new_version": f.version}


def _start(f, body, q):
    f.updating = True
    return 200, {"message": "Weight update started"}


def _update(f, body, q):
    if not f.updating:
        return 500, {"error": "update_weights outside start/finish"}
    return 200, {"message": "Weights updated"}


def _finish(f, body, q):
    f.updating = False
    if body.get("weight_version") is not None:
        f.version = body["weight_version"]
    return 200, {"message": "Weight update finished"}


POST = {"/pause": _pause, "/resume": _resume, "/v1/completions": _completions,
        "/collective_rpc": lambda f, b, q: (200, {"results": [None]}),
        "/reset_prefix_cache": lambda f, b, q: (200, {"success": True}),
        "/update_weight_version": _set_version,
        "/init_weight_transfer_engine": lambda f, b, q: (200, {"message": "Weight transfer initialized"}),
        "/start_weight_update": _start, "/update_weights": _update, "/finish_weight_update": _finish}
GET = {"/v1/models": lambda f: {"data": [{"id": "fake", "max_model_len": 4096}]},
       "/weight_info": lambda f: {"weight_version": "stale" if f.stale_version else f.version},
       "/get_world_size": lambda f: {"world_size": f.world_size},
       "/is_paused": lambda f: {"is_paused": f.paused}}


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):  # quiet
        pass

    def _send(self, code: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        fake = self.server.fake  # type: ignore[attr-defined]
        u = urlparse(self.path)
        fake.calls.append((u.path, {}))
        route = GET.get(u.path)
        return self._send(200, route(fake)) if route else self._send(404, {"detail": "Not Found"})

    def do_POST(self):
        fake = self.server.fake  # type: ignore[attr-defined]
        u = urlparse(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"null") or {}
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        fake.calls.append((u.path, {**body, **q}))
        time.sleep(fake.stall.get(u.path, 0.0))
        route = POST.get(u.path)
        return self._send(*route(fake, body, q)) if route else self._send(404, {"detail": "Not Found"})


class FakeVLLM:
    def __init__(self, port: int = 0, world_size: int = 1):
        self.calls: list[tuple[str, dict]] = []
        self.paused = self.updating = self.crashed = False
        self.version: str | None = None
        self.world_size = world_size
        self.stall: dict[str, float] = {}
        self.stale_version = False
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self.httpd.fake = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def paths(self, skip=("/v1/models",)) -> list[str]:
        return [p for p, _ in self.calls if p not in skip]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
