"""The agent server's routes (serve/app.py builds the app around them): module-level FastAPI route
functions on one APIRouter. Each reads the agent it serves from the app's state through the `served`
dependency; the routes behind the API key declare the `require_key` dependency.

    GET  /health                liveness and batching statistics (no key)
    GET  /v1/models             the one model served (with its tools)
    GET  /v1/models/{name}      that model's card
    POST /v1/chat/completions   the agent loop with its tools, server-side (stream=true: SSE chunks)

A request whose client goes away — a closed stream or a dropped connection — is cancelled, and its
engine sequence released, within a fraction of a second (`_Run`, `_stream`).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations as classes.
import asyncio
import functools
import hmac
import json
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from arpo.rollout.agent import Trajectory
from arpo.serve import openai_format as fmt
from arpo.serve.scheduler import AgentScheduler, Busy, Done, Failed, Step, Tokens
from arpo.serve.scheduler import Request as AgentRequest

DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there


@dataclass
class Served:
    """What the routes serve (the app's `state.served`): the running scheduler, whose agent's tools and
    tool format render the prompts; `system` the agent's system prompt; `context_len` the model's
    context in tokens; `max_response_tokens` the budget of a request without max_tokens; `card` the
    model's /v1/models entry; `api_key` the key requests need (None: none)."""

    scheduler: AgentScheduler
    tokenizer: Any
    model_name: str
    system: str
    context_len: int
    max_response_tokens: int
    card: dict
    api_key: str | None = None
    # prompts are tokenized here, one at a time, off the event loop (a 10 MB body held it for 11.6 s)
    tokenize: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="arpo-serve-tokenize"))


async def served(request: Request) -> Served:
    return request.app.state.served


async def require_key(request: Request) -> None:
    """The API key, when the server has one (`Authorization: Bearer <key>`); compared in constant time:
    the time taken tells nothing about the key."""
    key = request.app.state.served.api_key
    if key is not None and not hmac.compare_digest(request.headers.get("authorization", "").encode(),
                                                   f"Bearer {key}".encode()):
        raise fmt.ApiError(401, "invalid or missing API key (Authorization: Bearer ...)", code="invalid_api_key")


ServedDep = Annotated[Served, Depends(served)]
router = APIRouter()
KEYED = [Depends(require_key)]


@router.get("/health")
def health(s: ServedDep):
    return {"status": "ok", "model": s.model_name, **s.scheduler.stats()}


@router.get("/v1/models", dependencies=KEYED)
def models(s: ServedDep):
    return {"object": "list", "data": [s.card]}


@router.get("/v1/models/{name:path}", dependencies=KEYED)
def model(name: str, s: ServedDep):
    _check_model(name, s)
    return s.card


@router.post("/v1/chat/completions", dependencies=KEYED)
async def chat(body: fmt.ChatRequest, request: Request, s: ServedDep):
    fmt.check_request(body)
    _check_model(body.model, s)
    fmt.check_prompt_chars(body, s.context_len)
    prompt = await asyncio.get_running_loop().run_in_executor(
        s.tokenize, functools.partial(fmt.render_messages, s.tokenizer, body.messages, s.system, s.scheduler.tools,
                                      s.scheduler.loop.cfg.tool_format))
    budget = fmt.response_budget(body, len(prompt), s.context_len, s.max_response_tokens)
    stops = fmt.stop_strings(body)
    top_k = None if body.top_k is None else max(0, body.top_k)
    seeds = [None if body.seed is None else body.seed + i for i in range(body.n)]
    run = _Run(s.scheduler, f"chatcmpl-{uuid.uuid4().hex}", asyncio.get_running_loop())
    try:
        for seed in seeds:
            run.submit(prompt, AgentRequest(budget, body.temperature, body.top_p, top_k, seed, stops))
    except Busy as e:
        run.cancel()
        raise fmt.ApiError(503, f"the server is busy ({e}); retry later", type="server_error",
                           code="server_busy") from e
    if body.stream:
        gen = _stream(run, s.tokenizer, body, s.model_name, len(prompt), stops)
        return StreamingResponse(gen, media_type="text/event-stream", background=BackgroundTask(run.cancel))
    try:
        done = await run.wait_all(request)
    finally:
        run.cancel()
    if done is None:  # the client went away; nobody reads this
        return Response(status_code=499)
    choices = []
    for i, ev in enumerate(done):
        msgs, content = fmt.split_trajectory(s.tokenizer, ev.trajectory, run.id, i, ev.stop)
        choices.append(fmt.choice(i, content, msgs, ev.trajectory.finish_reason))
    return fmt.completion(run.id, s.model_name, run.created, choices,
                          fmt.usage(len(prompt), [ev.trajectory for ev in done]))


def _check_model(name: str, s: Served) -> None:
    if name != s.model_name:
        raise fmt.ApiError(404, f"The model `{name}` does not exist; this server serves `{s.model_name}`",
                           param="model", code="model_not_found")


class _Run:
    """One request's conversations (one per choice) and the queue their events arrive on."""

    def __init__(self, scheduler: AgentScheduler, completion_id: str, loop):
        self.sched, self.id, self.loop = scheduler, completion_id, loop
        self.created = fmt.now()
        self.events: asyncio.Queue = asyncio.Queue()
        self.cids: list[int] = []
        self.finished: set[int] = set()

    def submit(self, prompt: list[int], req: AgentRequest) -> None:
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


def validation_error(errors: Sequence[Any]) -> fmt.ApiError:
    """A request FastAPI could not validate, as OpenAI's error body."""
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    if e.get("type") == "extra_forbidden":
        return fmt.ApiError(400, f"Unrecognized request argument supplied: {param}", param=param,
                            code="unrecognized_argument")
    if e.get("type") in ("json_invalid", "model_attributes_type") or not loc:
        return fmt.ApiError(400, f"the body must be a JSON object: {e.get('msg')}", code="invalid_json")
    return fmt.ApiError(400, f"{param}: {e.get('msg')}", param=param, code="invalid_value")
