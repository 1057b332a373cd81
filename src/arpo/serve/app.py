"""`arpo serve agent`: a trained agent behind an OpenAI-compatible HTTP API.

    POST /v1/chat/completions   the agent loop with its tools, server-side (stream=true: SSE chunks)
    GET  /v1/models             the one model served (with its tools)
    GET  /health                liveness and batching statistics

The format (final answer in `content`, executed tool calls in `agent_messages`, errors as
`{"error": {...}}`) is described in serve/openai_format.py; batching and cancellation in
serve/scheduler.py. A request whose client goes away — a closed stream or a dropped connection —
is cancelled, and its engine sequence released, within a fraction of a second. The routes are
serve/routes.py's (module-level functions on one APIRouter, the API key a dependency); this module
builds the app around them and runs the server.

Before a handler runs, arpo/http_guard.py checks the Host header (a loopback-bound server answers
only loopback names: DNS-rebinding pages are refused) and the body size (HTTP 413 over
max_request_bytes); the prompt is tokenized off the event loop, so /health and the streams stay
responsive while a large request is read. docs/web_tools.md has the threat model.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import arpo.models
from arpo.chat_templates import guard_tokenizer
from arpo.data.prompts import default_template, system_prompt
from arpo.engine import make_engine
from arpo.errors import ArpoError
from arpo.http_guard import RequestGuard, allowed_hosts, warn_bind
from arpo.ports import require_port_free
from arpo.serve import openai_format as fmt
from arpo.serve.scheduler import AgentScheduler
from arpo.settings import MAX_REQUEST_BYTES, ServeConfig
from arpo.tools import check_web, tools_from_config


def create_app(scheduler: AgentScheduler, tokenizer, *, model_name: str, system: str, context_len: int,
               max_response_tokens: int, api_key: str | None = None, info: dict | None = None,
               bind_host: str = "127.0.0.1", max_request_bytes: int = MAX_REQUEST_BYTES):
    """The FastAPI app over a running scheduler (whose agent's tools and tool format render the
    prompts): serve/routes.py's routes over this agent, behind the Host and body-size guard, with
    every error as OpenAI's error body. `system`: the agent's system prompt; `context_len`: the
    model's context in tokens; `max_response_tokens`: the budget of a request without max_tokens;
    `info`: extra fields for /v1/models (tools, engine, ...); `bind_host`: the address it listens on
    (the Host check); `max_request_bytes`: larger bodies get HTTP 413."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    from arpo.serve.routes import Served, router  # noqa: PLC0415 - loads fastapi; agent_server names the extra when it is missing

    app = FastAPI(title="arpo agent", version="1", description=f"The arpo agent `{model_name}` with its tools, "
                  "behind an OpenAI-compatible Chat Completions API")
    app.add_middleware(RequestGuard, allowed=allowed_hosts(bind_host), max_body_bytes=max_request_bytes,
                       error=lambda status, msg: fmt.error_body(msg, code="request_too_large" if status == 413
                                                                else "invalid_request"))
    card = {"id": model_name, "object": "model", "created": fmt.now(), "owned_by": "arpo", **(info or {})}
    app.state.served = Served(scheduler, tokenizer, model_name, system, context_len, max_response_tokens, card,
                              api_key)
    app.state.model_name = model_name
    app.add_exception_handler(fmt.ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http)
    app.include_router(router)
    return app


def _error(e: fmt.ApiError):
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=e.status, content=e.body())


async def _api_error(request, exc):
    return _error(exc)


async def _invalid(request, exc):
    from arpo.serve.routes import validation_error  # noqa: PLC0415 - loads fastapi; agent_server names the extra when it is missing

    return _error(validation_error(exc.errors()))


async def _http(request, exc):
    return _error(fmt.ApiError(exc.status_code, str(exc.detail), code=None))


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
