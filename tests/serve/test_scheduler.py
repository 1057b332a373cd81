"""serve/scheduler.py without HTTP: the paths a client cannot easily time — a cancel while the
conversation's tool call is running, the admission limits, shutdown with work in flight."""

import threading
import time

import pytest

from arpo.engine.hf import HFEngine
from arpo.serve.scheduler import AgentScheduler, Busy, Done, Failed, Request, Step, Tokens
from arpo.settings import AgentConfig
from arpo.testing import hook_rollout, scripted_hook
from arpo.tools.base import ToolResult
from arpo.tools.registry import ToolRegistry


class Gate:
    """A python tool that blocks until released."""

    name = "python"

    def __init__(self):
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self, inp):
        self.started.set()
        self.release.wait(10)
        return ToolResult("ok")


@pytest.fixture()
def make(tiny_lm, tiny_tok):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    made = []

    def make(segments, tools=(), **kw):
        s = AgentScheduler(HFEngine(tiny_lm, tiny_tok), ToolRegistry(tools), AgentConfig(max_response_tokens=300), **kw)
        hook_rollout(s, scripted_hook(tiny_tok, segments))
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
    torch.set_num_threads(threads)


class Events:
    def __init__(self):
        self.items, self.done = [], threading.Event()

    def __call__(self, ev):
        self.items.append(ev)
        if isinstance(ev, (Done, Failed)):
            self.done.set()


def _wait(cond, timeout=10.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.005)


PROMPT = [5, 6, 7, 8]


def test_events_of_a_conversation_in_order(make):
    echo = type("E", (), {"name": "python", "__call__": lambda self, i: ToolResult(i)})()
    s = make(["<python> x </python>", " <answer> y </answer>"], tools=[echo])
    ev = Events()
    s.submit(PROMPT, Request(100, seed=0), ev)
    assert ev.done.wait(30)
    kinds = [type(e).__name__ for e in ev.items]
    assert kinds[-1] == "Done" and kinds.count("Step") == 1 and kinds.count("Done") == 1
    assert kinds.index("Step") > 0 and all(k == "Tokens" for k in kinds[: kinds.index("Step")])
    step = next(e for e in ev.items if isinstance(e, Step))
    assert [(c.tool, c.input, c.output) for c in step.calls] == [("python", "x", "x")]
    n_tokens = sum(len(e.ids) for e in ev.items if isinstance(e, Tokens))
    assert n_tokens == ev.items[-1].trajectory.n_generated_tokens  # every generated token, once


def test_cancel_while_the_tool_runs_releases_when_it_returns(make):
    gate = Gate()
    s = make(["<python> x </python>", " <answer> y </answer>"], tools=[gate])
    ev = Events()
    cid = s.submit(PROMPT, Request(100), ev)
    assert gate.started.wait(30)
    s.cancel(cid)
    time.sleep(0.1)
    assert len(s.engine.seqs) == 1  # paused, waiting for its tool: kept until the call returns
    gate.release.set()
    _wait(lambda: not s.engine.seqs)
    time.sleep(0.05)
    assert not any(isinstance(e, (Step, Done)) for e in ev.items)  # nothing after a cancel
    assert s.stats()["cancelled"] == 1 and s.stats()["completed"] == 0 and s.stats()["live"] == 0


def test_max_batch_queues_and_max_waiting_refuses(make):
    gate = Gate()
    s = make(["<python> x </python>", " <answer> y </answer>"], tools=[gate], max_batch=1, max_waiting=2)
    a, b = Events(), Events()
    s.submit(PROMPT, Request(100), a)
    assert gate.started.wait(30)  # a is in the engine, waiting for its tool
    s.submit(PROMPT, Request(100), b)
    s.submit(PROMPT, Request(100), Events())
    with pytest.raises(Busy):
        s.submit(PROMPT, Request(100), Events())
    time.sleep(0.1)
    assert len(s.engine.seqs) == 1 and s.stats()["waiting"] == 2  # b waits for a's place
    gate.release.set()
    assert a.done.wait(30) and b.done.wait(30)
    assert s.stats()["max_batch"] == 1


def test_close_fails_what_is_in_flight_and_frees_the_engine(make):
    gate = Gate()
    s = make(["<python> x </python>", " <answer> y </answer>"], tools=[gate], max_batch=1)
    a, b = Events(), Events()
    s.submit(PROMPT, Request(100), a)
    s.submit(PROMPT, Request(100), b)
    assert gate.started.wait(30)
    gate.release.set()
    s.close()
    assert isinstance(b.items[-1], Failed) and "shutting down" in b.items[-1].message
    assert not s.engine.seqs
    with pytest.raises(RuntimeError):
        s.submit(PROMPT, Request(100), Events())


class SessionTool:
    """A python tool with per-conversation state, like tools.python_session: counts its calls per key."""

    name = "python"
    sessions = True

    def __init__(self):
        self.state, self.ended = {}, []

    def __call__(self, inp):
        raise AssertionError("a session call goes to run_session")

    def run_session(self, key, text):
        self.state[key] = self.state.get(key, 0) + 1
        return ToolResult(str(self.state[key]))

    def end(self, key):
        self.ended.append(key)
        self.state.pop(key, None)


def test_each_conversation_has_its_own_tool_session_ended_with_it(make):
    tool = SessionTool()
    s = make(["<python> a </python>", "<python> b </python>", " <answer> y </answer>"], tools=[tool])
    a, b = Events(), Events()
    s.submit(PROMPT, Request(200), a)
    s.submit(PROMPT, Request(200), b)
    assert a.done.wait(30) and b.done.wait(30)
    for ev in (a, b):  # two calls each, counted in the conversation's own session
        assert [c.output for c in ev.items[-1].trajectory.tool_calls] == ["1", "2"]
    assert sorted(tool.ended) == sorted(str(ev.items[-1].trajectory.sid) for ev in (a, b)) and not tool.state
