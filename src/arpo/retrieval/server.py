"""A retrieval server: the local index over HTTP, so many trainers / rollout workers share one.

    arpo serve retriever --search-index ~/.cache/arpo/indexes/hotpotqa --port 8001
    POST /search {"queries": [...], "top_k": 10, "mode": "bm25"} -> {"results": [[{id,title,text,score}]]}
    GET  /health -> {"status": "ok", "n_docs": ..., "dense": ...}      GET /docs: OpenAPI UI

Invalid requests get HTTP 422 with FastAPI's `detail` list plus a one-line `message`; a mode the
index cannot serve (dense/hybrid without embeddings) gets HTTP 400 with the reason. The handlers are
plain functions, so FastAPI runs them in its thread pool; `Index.search` is thread-safe.

With a key (ARPO_RETRIEVER_KEY; the search tool sends the same variable's value), POST /search needs
`Authorization: Bearer KEY` (HTTP 401 otherwise). Bodies over MAX_BODY_BYTES get HTTP 413, and a
loopback-bound server answers only loopback Host names (arpo/http_guard.py; docs/web_tools.md).
"""

# No `from __future__ import annotations` here: FastAPI must see the request model class itself in
# the handler's signature (a string annotation of a function-local class would not resolve and the
# body would be taken for a query parameter).
import hmac
import os
from dataclasses import asdict

import arpo.ports
from arpo.errors import ArpoError
from arpo.retrieval import load_index

KEY_ENV = "ARPO_RETRIEVER_KEY"  # the server's key; the search tool (tools/search.py) sends the same variable's value
MAX_QUERIES = 1024
MAX_TOP_K = 100
MAX_BODY_BYTES = 2 * 2**20  # 1024 queries of ~2 KB; larger bodies get HTTP 413 (16 MB took 38 s to search)


def create_app(index, *, api_key: str | None = None, bind_host: str = "127.0.0.1",
               max_body_bytes: int = MAX_BODY_BYTES):
    """The FastAPI app over `index`; `api_key`: required as a Bearer token on /search when set;
    `bind_host`: the address it listens on (the Host check); `max_body_bytes`: larger bodies get 413."""
    from fastapi import FastAPI, Request
    from fastapi.encoders import jsonable_encoder
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field

    from arpo.http_guard import RequestGuard, allowed_hosts  # noqa: PLC0415 - loads starlette; kept out of this light module's import
    from arpo.retrieval.index import MODES  # noqa: PLC0415 - loads numpy; kept out of this light module's import

    class SearchRequest(BaseModel):
        queries: list[str] = Field(..., min_length=1, max_length=MAX_QUERIES,
                                   description="queries, searched as one batch")
        top_k: int = Field(10, ge=1, le=MAX_TOP_K, description="hits per query")
        mode: str = Field("bm25", pattern=f"^({'|'.join(MODES)})$", description="bm25 | dense | hybrid")

    app = FastAPI(title="arpo retriever", version="1",
                  description=f"BM25 / dense / hybrid search over a local corpus ({len(index)} documents)")
    app.add_middleware(RequestGuard, allowed=allowed_hosts(bind_host), max_body_bytes=max_body_bytes)
    expected = f"Bearer {api_key}".encode() if api_key else None

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        msg = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}"
                        for e in errs)
        return JSONResponse(status_code=422,
                            content={"detail": jsonable_encoder(errs), "message": f"invalid request: {msg}"})

    @app.get("/health")
    def health():
        return {"status": "ok", "n_docs": len(index), "dense": index.dense is not None}

    @app.post("/search")
    def search(req: SearchRequest, request: Request):
        if expected is not None and not hmac.compare_digest(request.headers.get("authorization", "").encode(),
                                                            expected):
            msg = f"invalid or missing key (Authorization: Bearer ...; the client reads {KEY_ENV})"
            return JSONResponse(status_code=401, content={"detail": msg, "message": msg})
        try:
            hits = index.search(req.queries, k=req.top_k, mode=req.mode)
        except ArpoError as e:
            return JSONResponse(status_code=400, content={"detail": str(e), "message": str(e)})
        return {"results": [[asdict(h) for h in row] for row in hits]}

    return app


def serve(index_dir: str | None, host: str = "127.0.0.1", port: int = 8001, log_level: str = "info",
          api_key: str | None = None) -> None:
    """Load the index at `index_dir` (None: the default index, built on first use) and serve it until
    interrupted (ArpoError if it cannot load). `api_key` (default: $ARPO_RETRIEVER_KEY): required on /search."""
    import uvicorn

    from arpo.http_guard import warn_bind  # noqa: PLC0415 - loads starlette; kept out of this light module's import

    index = load_index(index_dir)
    if index.has_dense:  # load the query encoder now, not inside the first request (clients time out)
        index.encoder()
    api_key = api_key or os.environ.get(KEY_ENV) or None
    arpo.ports.require_port_free(host, port)
    print(f"arpo retriever: {len(index)} documents (dense: {index.dense is not None}) from {index.path} "
          f"on http://{host}:{port}  (POST /search, GET /health, GET /docs)"
          f"{'; /search needs the key of ' + KEY_ENV if api_key else ''}", flush=True)
    warn_bind("arpo serve retriever", host, port, bool(api_key))
    # lifespan off: no startup/shutdown handlers; see web/server.py
    uvicorn.run(create_app(index, api_key=api_key, bind_host=host), host=host, port=port, log_level=log_level,
                lifespan="off")
