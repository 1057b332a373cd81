"""The `arpo view` web server: the page (static/) and its JSON data (data.Catalog) under /api/.

    GET /                                   the page (hand-written JS + inline SVG, no CDN)
    GET /api/runs                           the runs given on the command line
    GET /api/runs/R/metrics                 metrics.jsonl rows (+ branch_rate)
    GET /api/runs/R/steps                   steps whose trees were saved
    GET /api/runs/R/steps/S/page/P          tree summaries of step S, data.PAGE per page
    GET /api/runs/R/steps/S/trees/T         one tree, every token
    GET /api/runs/R/entropy                 entropy after tool results over the run (paper Fig. 1)
    GET /api/runs/R/steps/S/entropy         the same for one step

Like arpo's other servers (http_guard.py), it answers only requests whose Host header names the address
it is bound to or loopback (when bound to loopback): a web page that rebinds its DNS name to 127.0.0.1
gets HTTP 400, not the runs (issue 61). Requests carry no body; one over MAX_BODY_BYTES gets HTTP 413.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from arpo.errors import ArpoError
from arpo.view.data import Catalog, NotFound

STATIC = Path(__file__).parent / "static"
MAX_BODY_BYTES = 64 * 1024


def create_app(catalog: Catalog, bind_host: str = "127.0.0.1"):
    from fastapi import FastAPI
    from fastapi.responses import FileResponse, JSONResponse, Response
    from fastapi.staticfiles import StaticFiles

    from arpo.http_guard import RequestGuard, allowed_hosts  # noqa: PLC0415 - loads starlette; kept out of this light module's import

    app = FastAPI(title="arpo view", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/api/{path:path}")
    def api(path: str):
        try:
            data = catalog.get(path)
        except NotFound as e:
            return JSONResponse({"detail": str(e)}, status_code=404)
        # serialized here, not by FastAPI's encoder: a tree has tens of thousands of numbers
        return Response(json.dumps(data, ensure_ascii=False), media_type="application/json")

    @app.get("/")
    def index():
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @app.middleware("http")
    async def revalidate(request, call_next):  # a new arpo's page is never hidden behind a cached one
        response = await call_next(request)
        response.headers.setdefault("Cache-Control", "no-cache")
        return response

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(RequestGuard, allowed=allowed_hosts(bind_host), max_body_bytes=MAX_BODY_BYTES)
    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or one clear error if the port is taken (port 0: any free port)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ArpoError(f"--port {port}: cannot listen on {host}:{port} ({e.strerror}); choose another port "
                        "or --port 0 for any free one") from e
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(catalog: Catalog, host: str = "127.0.0.1", port: int = 8765, log_level: str = "warning",
          on_ready=None) -> None:
    import uvicorn

    sock = bind(host, port)
    url = f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}/"
    if on_ready is not None:
        on_ready(url)
    server = uvicorn.Server(uvicorn.Config(create_app(catalog, bind_host=host), log_level=log_level))
    server.run(sockets=[sock])
