"""A retrieval server: the local index over HTTP, so many trainers / rollout workers share one.

    arpo serve retriever --index ~/.cache/arpo/indexes/hotpotqa --port 8001
    POST /search {"queries": [...], "top_k": 10, "mode": "bm25"} -> {"results": [[{id,title,text,score}]]}
    GET  /health -> {"status": "ok", "n_docs": ..., "dense": ...}      GET /docs: OpenAPI UI
"""


from dataclasses import asdict


def create_app(index):
    from fastapi import FastAPI, HTTPException
    from pydantic import BaseModel, Field

    from arpo.errors import ArpoError

    class SearchRequest(BaseModel):
        queries: list[str] = Field(..., min_length=1, max_length=1024, description="queries, searched as one batch")
        top_k: int = Field(10, ge=1, le=100)
        mode: str = Field("bm25", pattern="^(bm25|dense|hybrid)$")

    app = FastAPI(title="arpo retriever", description="BM25 / dense search over a local corpus")

    @app.get("/health")
    def health():
        return {"status": "ok", "n_docs": len(index), "dense": index.dense is not None}

    @app.post("/search")
    def search(req: SearchRequest):
        try:
            hits = index.search(req.queries, k=req.top_k, mode=req.mode)
        except ArpoError as e:
            raise HTTPException(status_code=400, detail=str(e)) from e
        return {"results": [[asdict(h) for h in row] for row in hits]}

    return app


def serve(index_dir: str, host: str = "127.0.0.1", port: int = 8001) -> None:
    import uvicorn

    from arpo.tools.index import Index

    uvicorn.run(create_app(Index.load(index_dir)), host=host, port=port, log_level="info")
