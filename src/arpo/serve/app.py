"""`arpo serve agent`: a trained agent behind an OpenAI-compatible HTTP API.

    POST /v1/chat/completions   the agent loop with its tools, server-side (stream=true: SSE chunks)
    GET  /v1/models             the one model served (with its tools)
    GET  /health                liveness and batching statistics

The format (final answer in `content`, executed tool calls in `agent_messages`, errors as
`{"error": {...}}`) is described in serve/openai_format.py; batching and cancellation in
serve/scheduler.py. A request whose client goes away — a closed stream or a dropped connection —
is cancelled, and its engine sequence released, within a fraction of a second.

Before a handler runs, arpo/http_guard.py checks the Host header (a loopback-bound server answers
only loopback names: DNS-rebinding pages are refused) and the body size (HTTP 413 over
max_request_bytes); the prompt is tokenized off the event loop, so /health and the streams stay
responsive while a large request is read. docs/web_tools.md has the threat model.
"""

# No `from __future__ import annotations`: FastAPI reads the handler's annotations as classes.
import asyncio
import contextlib
import functools
import hmac
import json
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import arpo.models
from arpo.chat_templates import guard_tokenizer
from arpo.data.prompts import default_template, system_prompt
from arpo.engine import make_engine
from arpo.errors import ArpoError
from arpo.http_guard import RequestGuard, allowed_hosts, warn_bind
from arpo.ports import require_port_free
from arpo.rollout.agent import Trajectory
from arpo.serve import openai_format as fmt
from arpo.serve.scheduler import AgentScheduler, Busy, Done, Failed, Request, Step, Tokens
from arpo.settings import MAX_REQUEST_BYTES, ServeConfig
from arpo.tools import check_web, tools_from_config

DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there


def create_app(scheduler: AgentScheduler, tokenizer, *, model_name: str, system: str, context_len: int,  # noqa: C901 - the routes are closures defined here, each counted in this function
               max_response_tokens: int, api_key: str | None = None, info: dict | None = None,
               bind_host: str = "127.0.0.1", max_request_bytes: int = MAX_REQUEST_BYTES):
    """The FastAPI app over a running scheduler (whose agent's tools and tool format render the
    prompts). `system`: the agent's system prompt; `context_len`: the model's context in tokens;
    `max_response_tokens`: the budget of a request without max_tokens; `info`: extra fields for
    /v1/models (tools, engine, ...); `bind_host`: the address it listens on (the Host check);
    `max_request_bytes`: larger bodies get HTTP 413."""
    from fastapi import FastAPI
    from fastapi import Request as HttpRequest
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.background import BackgroundTask
    from starlette.exceptions import HTTPException

    app = FastAPI(title="arpo agent", version="1", description=f"The arpo agent `{model_name}` with its tools, "
                  "behind an OpenAI-compatible Chat Completions API")
    app.add_middleware(RequestGuard, allowed=allowed_hosts(bind_host), max_body_bytes=max_request_bytes,
                       error=lambda status, msg: fmt.error_body(msg, code="request_too_large" if status == 413
                                                                else "invalid_request"))
    # prompts are tokenized here, one at a time, off the event loop (a 10 MB body held it for 11.6 s)
    tokenize = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arpo-serve-tokenize")
    app.state.model_name = model_name
    tool_format = scheduler.loop.cfg.tool_format
    created = fmt.now()
    card = {"id": model_name, "object": "model", "created": created, "owned_by": "arpo", **(info or {})}

    def error(e: fmt.ApiError) -> JSONResponse:
        return JSONResponse(status_code=e.status, content=e.body())

    @app.exception_handler(fmt.ApiError)
    async def _api_error(request, exc: fmt.ApiError):
        return error(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        return error(_validation_error(exc.errors()))

    @app.exception_handler(HTTPException)
    async def _http(request, exc: HTTPException):
        return error(fmt.ApiError(exc.status_code, str(exc.detail), code=None))

    expected = f"Bearer {api_key}".encode() if api_key else None

    def check_key(request) -> None:  # a constant-time comparison: the time taken tells nothing about the key
        if expected is not None and not hmac.compare_digest(request.headers.get("authorization", "").encode(),
                                                            expected):
            raise fmt.ApiError(401, "invalid or missing API key (Authorization: Bearer ...)", code="invalid_api_key")

    @app.get("/health")
    def health():
        return {"status": "ok", "model": model_name, **scheduler.stats()}

    @app.get("/v1/models")
    def models(request: HttpRequest):
        check_key(request)
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{name:path}")
    def model(name: str, request: HttpRequest):
        check_key(request)
        if name != model_name:
            raise fmt.ApiError(404, f"The model `{name}` does not exist; this server serves `{model_name}`",
                               param="model", code="model_not_found")
        return card

    @app.post("/v1/chat/completions")
    async def chat(body: fmt.ChatRequest, request: HttpRequest):
        check_key(request)
        fmt.check_request(body)
        if body.model != model_name:
            raise fmt.ApiError(404, f"The model `{body.model}` does not exist; this server serves `{model_name}`",
                               param="model", code="model_not_found")
        fmt.check_prompt_chars(body, context_len)
        prompt = await asyncio.get_running_loop().run_in_executor(
            tokenize, functools.partial(fmt.render_messages, tokenizer, body.messages, system, scheduler.tools,
                                        tool_format))
        budget = fmt.response_budget(body, len(prompt), context_len, max_response_tokens)
        stops = fmt.stop_strings(body)
        top_k = None if body.top_k is None else max(0, body.top_k)
        seeds = [None if body.seed is None else body.seed + i for i in range(body.n)]
        reqs = [Request(budget, body.temperature, body.top_p, top_k, seed, stops) for seed in seeds]
        run = _Run(scheduler, f"chatcmpl-{uuid.uuid4().hex}", asyncio.get_running_loop())
        try:
            for r in reqs:
                run.submit(prompt, r)
        except Busy as e:
            run.cancel()
            raise fmt.ApiError(503, f"the server is busy ({e}); retry later", type="server_error",
                               code="server_busy") from e
        if body.stream:
            gen = _stream(run, tokenizer, body, model_name, len(prompt), stops)
            return StreamingResponse(gen, media_type="text/event-stream", background=BackgroundTask(run.cancel))
        try:
            done = await run.wait_all(request)
        finally:
            run.cancel()
        if done is None:  # the client went away; nobody reads this
            return Response(status_code=499)
        choices = []
        for i, ev in enumerate(done):
            msgs, content = fmt.split_trajectory(tokenizer, ev.trajectory, run.id, i, ev.stop)
            choices.append(fmt.choice(i, content, msgs, ev.trajectory.finish_reason))
        return fmt.completion(run.id, model_name, run.created, choices,
                              fmt.usage(len(prompt), [ev.trajectory for ev in done]))

    return app


class _Run:
    """One request's conversations (one per choice) and the queue their events arrive on."""

    def __init__(self, scheduler: AgentScheduler, completion_id: str, loop):
        self.sched, self.id, self.loop = scheduler, completion_id, loop
        self.created = fmt.now()
        self.events: asyncio.Queue = asyncio.Queue()
        self.cids: list[int] = []
        self.finished: set[int] = set()

    def submit(self, prompt: list[int], req: Request) -> None:
        i = len(self.cids)

        def emit(ev, i=i):
            try:
                self.loop.call_soon_threadsafe(self.events.put_nowait, (i, ev))
            except RuntimeError:  # the event loop is gone (shutdown)
                pass

        self.cids.append(self.sched.submit(prompt, req, emit))

    def cancel(self) -> None:
        """Cancel every conversation of this request that has not finished (idempotent)."""
        for i, cid in enumerate(self.cids):
            if i not in self.finished:
                self.sched.cancel(cid)
                self.finished.add(i)

    async def next(self):
        i, ev = await self.events.get()
        if isinstance(ev, (Done, Failed)):
            self.finished.add(i)
        return i, ev

    async def wait_all(self, request) -> list[Done] | None:
        """Every choice's Done event in order; None if the client disconnected first."""
        done: dict[int, Done] = {}
        checked = time.monotonic()
        while len(done) < len(self.cids):
            try:
                i, ev = await asyncio.wait_for(self.next(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                i, ev = None, None
            if time.monotonic() - checked >= DISCONNECT_POLL_S:  # events may arrive faster than that
                checked = time.monotonic()
                if await request.is_disconnected():
                    return None
            if isinstance(ev, Failed):
                raise fmt.ApiError(500, ev.message, type="server_error")
            if isinstance(ev, Done):
                done[i] = ev
        return [done[i] for i in range(len(self.cids))]


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _stream(run: _Run, tokenizer, body, model_name: str, prompt_len: int, stops):
    """SSE `chat.completion.chunk`s: the role, then per choice its executed tool calls (delta
    `agent_messages`) and its final text (delta `content`, see FinalTextStream), its finish reason,
    the usage if asked for, and `data: [DONE]`."""
    n = len(run.cids)
    texts = [fmt.FinalTextStream(tokenizer, stops) for _ in range(n)]
    steps = [0] * n
    trajs: dict[int, Trajectory] = {}

    def chunk(*choices, usage=None):
        return _sse(fmt.chunk(run.id, model_name, run.created, list(choices), usage))

    try:
        yield chunk(*[fmt.delta(i, role="assistant", content="") for i in range(n)])
        while len(trajs) < n:
            i, ev = await run.next()
            if isinstance(ev, Tokens):
                text = texts[i].tokens(ev.ids)
                if text:
                    yield chunk(fmt.delta(i, content=text))
            elif isinstance(ev, Step):
                ids = [fmt.call_id(run.id, i, steps[i] + j) for j in range(len(ev.calls))]
                msgs = fmt.tool_messages(ev.calls, fmt.decode(tokenizer, texts[i].ids), ids)
                steps[i] += len(ev.calls)
                texts[i].new_turn()
                yield chunk(fmt.delta(i, agent_messages=msgs))
            elif isinstance(ev, Done):
                tr = trajs[i] = ev.trajectory
                _, content = fmt.split_trajectory(tokenizer, tr, run.id, i, ev.stop)
                rest = texts[i].finish(content)
                if rest:
                    yield chunk(fmt.delta(i, content=rest))
                yield chunk(fmt.delta(i, fmt.FINISH.get(tr.finish_reason, "stop"), tr.finish_reason))
            elif isinstance(ev, Failed):
                yield _sse(fmt.error_body(ev.message, "server_error"))
                return
        if body.stream_options is not None and body.stream_options.include_usage:
            yield chunk(usage=fmt.usage(prompt_len, [trajs[i] for i in range(n)]))
        yield "data: [DONE]\n\n"
    finally:
        run.cancel()  # the client closed the stream (or it ended): free what is still running


def _validation_error(errors: Sequence[Any]) -> fmt.ApiError:
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    if e.get("type") == "extra_forbidden":
        return fmt.ApiError(400, f"Unrecognized request argument supplied: {param}", param=param,
                            code="unrecognized_argument")
    if e.get("type") in ("json_invalid", "model_attributes_type") or not loc:
        return fmt.ApiError(400, f"the body must be a JSON object: {e.get('msg')}", code="invalid_json")
    return fmt.ApiError(400, f"{param}: {e.get('msg')}", param=param, code="invalid_value")


# ---- the command --------------------------------------------------------------------------------------
def serve(cfg: ServeConfig) -> None:
    """Load the model and tools, start the engine thread and serve until interrupted."""
    with agent_server(cfg) as server:
        app = server.config.app
        print(f"arpo serve agent: model {app.state.model_name!r} ({cfg.model}) with tools "
              f"{', '.join(app.state.tools) or 'none'} ({cfg.agent.tool_format}), prompt template "
              f"{cfg.template or 'from the tools'} on http://{cfg.host}:{cfg.port}/v1  "
              "(POST /v1/chat/completions, GET /v1/models, GET /health)", flush=True)
        warn_bind("arpo serve agent", cfg.host, cfg.port, bool(cfg.api_key))
        server.run()


@contextlib.contextmanager
def agent_server(cfg: ServeConfig):
    """A uvicorn.Server for the agent (not yet running: call `.run()`, or run it in a thread and set
    `.should_exit`); the engine thread, tools and engine are shut down when the block ends."""

    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise ArpoError(f"arpo serve agent needs {e.name}: pip install 'arpo[search]'") from e

    agent = cfg.agent
    agent.validate()
    cfg.tools.validate()
    require_port_free(cfg.host, cfg.port)  # before loading anything (uvicorn would only log and exit)
    check_web(cfg.tools)  # the local web down: every search an error result
    tools = tools_from_config(cfg.tools)  # MCP servers and your own tools too
    engine = sched = None
    try:
        system = system_prompt(cfg.template or default_template(tools), tools, tool_format=agent.tool_format)
        engine, tokenizer, context_len = _load_engine(cfg)
        sched = AgentScheduler(engine, tools, agent, max_batch=cfg.max_batch, max_waiting=cfg.max_waiting)
        app = create_app(sched, tokenizer, model_name=cfg.served_model_name or served_name(cfg.model), system=system,
                         context_len=context_len, max_response_tokens=agent.max_response_tokens, api_key=cfg.api_key,
                         bind_host=cfg.host, max_request_bytes=cfg.max_request_bytes,
                         info={"tools": list(tools.names), "tool_format": agent.tool_format, "engine": cfg.engine,
                               "context_length": context_len})
        app.state.tools = list(tools.names)
        yield uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level))
    finally:
        if sched is not None:
            sched.close()
        tools.close()
        if engine is not None:
            engine.close()


def _load_engine(cfg: ServeConfig):
    """(engine, tokenizer, context length in tokens); a run dir's chat template as chat_templates says."""
    if cfg.engine == "vllm_server":  # the servers hold the weights: only the tokenizer is loaded here
        engine = make_engine("vllm_server", None, None, model_dir=cfg.model, servers=cfg.servers)
        guard_tokenizer(engine.tokenizer, cfg.model, cfg.trust_run_config, "serve agent")
        return engine, engine.tokenizer, engine.max_model_len
    if cfg.engine == "vllm":
        from transformers import AutoTokenizer

        model_dir = arpo.models.resolve_model_dir(cfg.model)
        tok = guard_tokenizer(AutoTokenizer.from_pretrained(model_dir), cfg.model, cfg.trust_run_config, "serve agent")
        engine = make_engine("vllm", None, tok, model_dir=str(model_dir))
        return engine, tok, engine.max_model_len
    model, tok = arpo.models.load_model(cfg.model, device=cfg.device)
    guard_tokenizer(tok, cfg.model, cfg.trust_run_config, "serve agent")
    return make_engine(cfg.engine, model, tok), tok, int(model.config.max_position_embeddings)


def served_name(model: str) -> str:
    """The model id clients use: a built-in name as is, a directory by its name (a checkpoint's model/
    dir by its run's name)."""
    p = Path(model).expanduser()
    if not p.exists():
        return model
    p = p.resolve()
    parts = [x for x in p.parts if x not in ("model", "checkpoints") and not x.startswith("step_")]
    return parts[-1] if parts else p.name
