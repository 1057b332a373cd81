"""Continuous batching of agent conversations: one thread owns the engine and runs the agent loop for
every conversation the server has in flight.

    sched = AgentScheduler(engine, tools, AgentConfig(max_tool_calls=5))
    cid = sched.submit(prompt_ids, Request(max_tokens=256, seed=0), emit)   # any thread
    ...emit(Tokens([..]))  emit(Step(record))  emit(Done(trajectory))     # on the engine thread
    sched.cancel(cid)                                                       # any thread
    sched.close()

Between two engine steps the thread admits new conversations, releases cancelled ones and hands
finished tool calls back, so concurrent requests share every decode step (engine/hf.py decodes all
running sequences in one batched forward) and a cancelled request frees its sequence (and KV cache)
before the next step. Each conversation is one trajectory of the same agent loop that `arpo chat`,
eval and training run (rollout/agent.py: its pause handling, tool calls and budgets, unchanged);
tool calls run on a thread pool while the other conversations keep decoding. A tool failure is an
error result inside the conversation (tools never raise into the loop); an engine failure fails the
conversations in flight with a `Failed` event and the thread keeps serving.

Per-conversation state lives in `Conversation` (the agent's `TrajState` included); every way a
conversation ends — done, cancelled, failed, shutdown — goes through `_close`, the one place where
per-conversation resources (its engine sequence, its python session) are released.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from arpo.engine.base import SamplingParams
from arpo.rollout.agent import AgentLoop, ToolCallRecord, Trajectory, TrajState
from arpo.settings import AgentConfig
from arpo.tools.registry import ToolRegistry

log = logging.getLogger("arpo.serve")


@dataclass
class Request:
    """Sampling settings of one conversation; None = the server's AgentConfig value."""

    max_tokens: int  # response budget: generated tokens and tool results together (AgentConfig.max_response_tokens)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()  # the conversation ends when the model writes one of these


# ---- events, delivered to the conversation's `emit` on the engine thread ------------------------
@dataclass
class Tokens:
    ids: list[int]  # tokens the model generated in the last step (never tool-result tokens)


@dataclass
class Step:
    # the tool calls of one pause (one in the tag format, one or more in a json turn) whose results
    # were appended to the conversation; the last one holds the result_span of all their results
    calls: list[ToolCallRecord]


@dataclass
class Done:
    trajectory: Trajectory
    stop: str | None = None  # the request's stop string that ended it, if one did


@dataclass
class Failed:
    message: str


@dataclass
class Conversation:
    cid: int
    prompt_ids: list[int]
    req: Request
    emit: Callable[[object], None]
    sid: int | None = None  # engine sequence, once admitted
    state: TrajState | None = None
    cancelled: bool = False
    stop: str | None = None

    def live(self) -> tuple[int, TrajState]:
        """(engine sequence, trajectory state) of an admitted conversation: one in the live set."""
        if self.sid is None or self.state is None:
            raise RuntimeError(f"conversation {self.cid} is not running")
        return self.sid, self.state


class Busy(Exception):
    """The wait queue is full: try again later."""


@dataclass
class _Stats:
    submitted: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    steps: int = 0  # engine steps that produced tokens
    batched_steps: int = 0  # of those, steps whose tokens came from two or more conversations
    max_batch: int = 0  # most conversations that received a token in one step
    tool_calls: int = 0


class AgentScheduler:
    def __init__(self, engine, tools: ToolRegistry, cfg: AgentConfig | None = None, max_batch: int = 64,
                 max_waiting: int = 1024):
        self.engine, self.tools = engine, tools
        self.loop = AgentLoop(engine, tools, cfg)  # `.loop.params` is what arpo.testing.hook_rollout patches
        self.max_batch, self.max_waiting = max_batch, max_waiting
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # ("submit", conv) | ("cancel", cid)
        self._wake = threading.Event()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._queued = 0  # submitted, not yet admitted (guards max_waiting)
        self._waiting: deque[Conversation] = deque()  # admitted to the scheduler, not to the engine
        self._live: dict[int, Conversation] = {}  # sid -> conversation in the engine
        self._pending: dict[Future, int] = {}  # running tool call -> sid
        self._stats = _Stats()
        self._closing = False
        # intra-op threads are per thread: the engine thread uses as many as its creator (vLLM's CPU
        # attention checks that its metadata and its kernel agree on the count)
        self._torch_threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._run, name="arpo-serve-engine", daemon=True)
        self._thread.start()

    # ---- any thread ---------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], req: Request, emit: Callable[[object], None]) -> int:
        """Queue a conversation; returns its id. `emit(event)` is called on the engine thread with
        Tokens / Step events and finally one Done or Failed; it must be quick and must not raise."""
        if self._closing:
            raise RuntimeError("scheduler is closed")
        with self._lock:
            if self._queued >= self.max_waiting:
                raise Busy(f"{self._queued} conversations are waiting")
            self._queued += 1
            self._stats.submitted += 1
            cid = next(self._ids)
        self._inbox.put(("submit", Conversation(cid, list(prompt_ids), req, emit)))
        self._wake.set()
        return cid

    def cancel(self, cid: int) -> None:
        """Stop a conversation (no event follows); its engine sequence is released before the next
        step, or as soon as its running tool call returns."""
        self._inbox.put(("cancel", cid))
        self._wake.set()

    def stats(self) -> dict:
        return dataclasses.asdict(self._stats) | {
            "live": len(self._live), "waiting": self._queued, "engine": dict(self.engine.stats)}

    def close(self, timeout: float = 10.0) -> None:
        """Cancel everything in flight and stop the engine thread."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)

    # ---- the engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_num_threads(self._torch_threads)
        with ThreadPoolExecutor(max_workers=self.loop.cfg.tool_workers, thread_name_prefix="arpo-tool") as pool:
            while True:
                self._wake.clear()  # anything that happens from here on wakes the wait below
                self._drain_inbox()
                if self._closing:
                    break
                try:
                    if not self._iteration(pool):
                        self._wake.wait()
                except Exception as e:  # a broken step fails its conversations, not the server
                    log.exception("engine step failed")
                    for conv in [c for c in self._live.values() if c.sid not in self._pending.values()]:
                        self._fail(conv, f"engine error: {type(e).__name__}: {e}")
            self._drain_inbox()
            with self._lock:
                self._queued -= len(self._waiting)
            for conv in list(self._live.values()) + list(self._waiting):
                self._close(conv)
                conv.emit(Failed("the server is shutting down"))

    def _iteration(self, pool) -> bool:
        """Hand back finished tool calls, admit waiting conversations, run one engine step. False when
        there was nothing to step (every conversation waits for a tool, or none is in flight)."""
        self._deliver_tools()
        self._admit()
        if not any(self.engine.seq(sid).status in ("waiting", "running") for sid in self._live):
            return False
        self._on_step(self.engine.step(), pool)
        return True

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, x = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                self._waiting.append(x)
            else:
                self._cancel(x)

    def _cancel(self, cid: int) -> None:
        for queued in self._waiting:
            if queued.cid == cid:
                self._waiting.remove(queued)
                with self._lock:
                    self._queued -= 1
                self._stats.cancelled += 1
                return self._close(queued)
        conv = next((c for c in self._live.values() if c.cid == cid), None)
        if conv is None or conv.cancelled:
            return  # already finished
        conv.cancelled = True
        self._stats.cancelled += 1
        if conv.sid not in self._pending.values():  # with a tool running, _deliver_tools closes it
            self._close(conv)

    def _admit(self) -> None:
        while self._waiting and len(self._live) < self.max_batch:
            conv = self._waiting.popleft()
            with self._lock:
                self._queued -= 1
            try:
                conv.sid = self.engine.add(conv.prompt_ids, self._params(conv))
            except Exception as e:  # noqa: BLE001 - a bad request fails its conversation, not the server
                self._fail(conv, f"cannot start the conversation: {type(e).__name__}: {e}")
                continue
            conv.state = TrajState(seg_start=len(conv.prompt_ids))
            self._live[conv.sid] = conv

    def _params(self, conv: Conversation) -> SamplingParams:
        r, p = conv.req, self.loop.params(len(conv.prompt_ids), conv.req.seed)
        return dataclasses.replace(
            p, temperature=p.temperature if r.temperature is None else r.temperature,
            top_p=p.top_p if r.top_p is None else r.top_p, top_k=p.top_k if r.top_k is None else r.top_k,
            max_len=len(conv.prompt_ids) + r.max_tokens, stop=tuple(p.stop) + tuple(r.stop),
        )

    def _on_step(self, outs, pool) -> None:
        new: dict[int, list[int]] = {}
        for o in outs:
            if o.sid in self._live:
                new.setdefault(o.sid, []).append(o.token)
        if new:
            self._stats.steps += 1
            self._stats.batched_steps += len(new) > 1
            self._stats.max_batch = max(self._stats.max_batch, len(new))
        for sid, ids in new.items():
            self._live[sid].emit(Tokens(ids))
        for o in outs:
            conv = self._live.get(o.sid)
            if o.finish_reason is None or conv is None:
                continue
            try:
                self._on_pause(conv, pool)
            except Exception as e:
                log.exception("agent loop failed")
                self._fail(conv, f"agent error: {type(e).__name__}: {e}")
        for conv in [c for c in self._live.values() if c.state is not None and c.state.finish_reason is not None]:
            self._finish(conv)

    def _on_pause(self, conv: Conversation, pool) -> None:
        sid, state = conv.live()
        s = self.engine.seq(sid)
        if s.status == "paused" and s.stop_text in conv.req.stop:
            conv.stop = s.stop_text
            self.loop._end(sid, state, "stop")
            return
        f = self.loop._on_stop(sid, state, pool)  # may submit the tool call
        if f is not None:
            self._pending[f] = sid
            self._stats.tool_calls += 1
            f.add_done_callback(lambda _: self._wake.set())

    def _deliver_tools(self) -> None:
        for f in [f for f in self._pending if f.done()]:
            conv = self._live[self._pending.pop(f)]
            if conv.cancelled:
                self._close(conv)
                continue
            sid, state = conv.live()
            try:
                out = f.result()  # (results, the text to append), rollout/agent.py
                self.loop._deliver(sid, state, out)
            except Exception as e:
                log.exception("tool result delivery failed")
                self._fail(conv, f"agent error: {type(e).__name__}: {e}")
                continue
            calls = state.calls[len(state.calls) - len(out[0]):]
            if calls[-1].result_span[1] > calls[-1].result_span[0]:
                conv.emit(Step([dataclasses.replace(c) for c in calls]))
            if state.finish_reason is not None:
                self._finish(conv)

    def _finish(self, conv: Conversation) -> None:
        traj = self.loop.trajectory(*conv.live())
        self._stats.completed += 1
        self._close(conv)
        conv.emit(Done(traj, conv.stop))

    def _fail(self, conv: Conversation, message: str) -> None:
        self._stats.failed += 1
        self._close(conv)
        conv.emit(Failed(message))

    def _close(self, conv: Conversation) -> None:
        """Release everything the conversation holds — its engine sequence and its tool sessions (a
        python session with `tools.python_session`, keyed by the sequence like a rollout's trajectory).
        Called exactly once per conversation."""
        if conv.sid is not None:
            self._live.pop(conv.sid, None)
            try:
                self.tools.end_sessions([conv.sid])
            finally:
                self.engine.release(conv.sid)
            conv.sid = None
