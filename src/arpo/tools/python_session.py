"""`python` with `session: true`: a stateful interpreter per trajectory that forks with the rollout
tree (issue 19).

* one sandboxed interpreter per trajectory, created on its first call, with the one-shot tool's
  isolation and limits (namespaces, minimal filesystem, memory cgroup, seccomp, own uid, rlimits,
  wall-clock kill) — the sandbox package (tools/sandbox/) in its session mode;
* variables, imports and files of its working directory persist across that trajectory's calls;
* when the rollout forks a trajectory after tool result t, the session forks with it: the branch
  starts from a copy-on-write fork of the interpreter *as it was after that call* (every call runs
  in a fork of the previous state, so each earlier state is kept as a snapshot) and a copy of its
  working directory; what one branch does later is invisible to its siblings;
* sessions end with their trajectory (`end`), and closing the tool kills every sandbox; the number
  of live sessions is bounded (`max_sessions`: a new one waits for a free slot, then gives an error
  result); a session that crashes or times out is reported in that call's result and the next call
  starts a fresh one, saying so;
* the tool is never cached (a result depends on the trajectory's state).

A branch lives in the sandbox of the global sample it came from (one pid namespace, memory cgroup
and uid per family of sessions), separated from its siblings by process and working directory.
Limits: each call's process has the one-shot tool's rlimits; the memory cgroup bounds the family.
A call's status is unforgeable as in the one-shot tool: it is how the call's process ended (its exit
status, read by the sandbox's init and written to the call's report pipe, which the code never
holds); before it exits, the process hands the session's state to a fork of itself. The call's
process is forked before the call comes (docs/sandbox.md, "Sessions"). A program that ends its
process itself (`os._exit`) ends the session too (the next call starts a fresh one, saying so).
Not defended: a process a call leaves running shares the session's uid and namespaces, so it can
interfere with that session's later calls (it is code of the same trajectory).
"""

from __future__ import annotations

import itertools
import os
import select
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

from arpo.tools.base import Tool, ToolResult
from arpo.tools.python import PythonTool
from arpo.tools.sandbox.capture import run_with_limits
from arpo.tools.sandbox.cgroups import process_slots
from arpo.tools.sandbox.linux import write_all
from arpo.tools.sandbox.pool import PoolState, Worker
from arpo.tools.sandbox.protocol import (
    CTL,
    DROP,
    FAILED,
    FAMILY_READY,
    FORK,
    KILL,
    REPORT,
    RUN,
    CallEnd,
    ProtocolError,
    call_end,
    encode_code,
)


@dataclass
class _Family:
    worker: Worker | None  # its ctl talks to the family's init; None: a restarted session's dead placeholder
    lock: threading.Lock = field(default_factory=threading.Lock)
    live: set = field(default_factory=set)  # state ids alive in it
    dead: bool = False

    def ctl(self) -> socket.socket:
        if self.worker is None:  # a dead placeholder is never sent to (its callers check `dead` first)
            raise OSError("this python session family has no sandbox")
        return self.worker.ctl

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()  # kills init: the kernel kills every process of the family


@dataclass
class _Session:
    family: _Family
    states: dict  # number of calls done -> state id (the snapshot after that many calls)
    calls: int = 0  # calls run in this session (including those inherited at a fork)
    note: str = ""  # told to the model with the next result (e.g. "a fresh session started")


class PythonSessionTool(Tool):
    """The `python` tool with sessions: `run_session(key, code)`, `fork(parent, child, n)`, `end(key)`.
    Keys are the rollout's sequence ids (rollout/agent.py passes them)."""

    name = "python"
    sessions = True
    cacheable = False
    description = PythonTool.description + " Variables, imports and files persist across this trajectory's calls."
    schema = {"type": "function", "function": {**PythonTool.schema["function"], "description": description}}

    def __init__(self, timeout_s: float = 5.0, max_output_chars: int = 2000, memory_mb: int = 1024,
                 max_sessions: int = 64, pool_size: int = 2, start_timeout_s: float = 60.0,
                 queue_timeout_s: float = 30.0, **sandbox):
        self._inner = PythonTool(timeout_s=timeout_s, max_output_chars=max_output_chars, memory_mb=memory_mb,
                                 pool_size=1, start_timeout_s=start_timeout_s,
                                 **{"max_calls": max_sessions, **sandbox})  # tool-wide caps: one family per session
        self._inner.close()  # only its configuration and result formatting are used
        self.timeout_s, self.max_output_chars, self.max_sessions = timeout_s, max_output_chars, max_sessions
        self._cfg = dict(self._inner.sandbox_config, session=True)
        if sandbox.get("tool_pids") is None:  # a family's process slots include its snapshots' (process_slots)
            self._cfg["tool_pids"] = (max_sessions + pool_size) * (process_slots(self._cfg) + 4)
        self.session_snapshots = int(self._cfg["session_snapshots"])
        self._pool = PoolState()
        self._thread = threading.Thread(target=self._pool.refill_loop, args=(self._cfg, pool_size, start_timeout_s),
                                        name="arpo-python-session-pool", daemon=True)
        self._thread.start()
        self.start_timeout_s, self.queue_timeout_s = start_timeout_s, queue_timeout_s
        self._sessions: dict[str, _Session] = {}
        self._families: list[_Family] = []
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self.stats = {"sessions_started": 0, "forks": 0, "calls": 0}

    # -- the tool protocol ------------------------------------------------------------------------
    def __call__(self, input: str) -> ToolResult:
        return self.run_session("default", input)

    def call(self, args: dict) -> ToolResult:
        return self(args.get("code", ""))

    @property
    def isolation(self) -> str:
        return self._pool.wait_info(self.start_timeout_s).get("mode", "unknown")

    @property
    def protections(self) -> dict:
        info = self._pool.wait_info(self.start_timeout_s)
        return {"isolation": info.get("mode", "unknown"), **info.get("protections", {}), "session": True,
                "uid_range": list(self._inner.uid_range)}

    # -- sessions -----------------------------------------------------------------------------------
    def run_session(self, key: str, code: str, timeout_s: float | None = None) -> ToolResult:
        """Run `code` in session `key` (created on its first call); never raises."""
        t0 = time.monotonic()
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        try:
            sess = self._get_or_start(str(key), t0)
        except Exception as e:  # noqa: BLE001
            return ToolResult(f"Error: no python session available: {e}", ok=False, elapsed_s=time.monotonic() - t0)
        note, sess.note = sess.note, ""
        res = self._execute(sess, code, timeout, t0)
        self.stats["calls"] += 1
        if note:
            res.output = f"{note}\n{res.output}"
        return res

    def fork(self, parent: str, child: str, n_calls: int) -> None:
        """The rollout forked `parent` into `child` right after the parent's call number `n_calls`:
        the child's session starts from the parent's state after that call."""
        with self._cond:
            src = self._sessions.get(str(parent))
            if src is not None and n_calls > 0 and not src.family.dead and n_calls not in src.states \
                    and n_calls <= src.calls:  # a snapshot dropped beyond session_snapshots: say so
                self._sessions[str(child)] = _Session(_Family(None, dead=True), {}, calls=-1, note=(
                    f"[note: the python session's state after call {n_calls} was dropped (a session family keeps "
                    f"its last {self.session_snapshots} snapshots: session_snapshots); this call started a fresh "
                    "session — earlier variables and files are gone]"))
                return
            if src is None or n_calls == 0 or src.family.dead or n_calls not in src.states:
                return  # nothing to inherit: the child starts fresh on its first call
            fam, dst = src.family, str(next(self._ids))
            with fam.lock:
                try:
                    fam.ctl().sendall(FORK.encode(src.states[n_calls], dst))
                except OSError:
                    return
                fam.live.add(dst)
            self._sessions[str(child)] = _Session(fam, {n_calls: dst}, calls=n_calls)
            self.stats["forks"] += 1
            self._trim(fam)

    def end(self, key: str) -> None:
        """The trajectory ended: drop its session's states (a family's sandbox ends with its last)."""
        with self._cond:
            sess = self._sessions.pop(str(key), None)
            if sess is None:
                return
            self._drop(sess.family, list(sess.states.values()))
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            fams, self._families, self._sessions = self._families, [], {}
        for fam in fams:
            fam.close()  # kills init: the kernel kills every process of the family
        self._pool.shutdown()
        self._inner.close()

    @property
    def live_sessions(self) -> int:
        return len(self._sessions)

    # -- internals ----------------------------------------------------------------------------------
    def _drop(self, fam: _Family, states: list[str]) -> None:
        with fam.lock:
            for sid in states:
                if sid in fam.live:
                    fam.live.discard(sid)
                    try:
                        fam.ctl().sendall(DROP.encode(sid))
                    except OSError:
                        pass
            if not fam.live and fam in self._families:
                self._families.remove(fam)
                fam.close()

    def _trim(self, fam: _Family) -> None:
        """Keep at most `session_snapshots` states in a family: drop the oldest snapshots that are no
        session's current state (each is a process; the family's process slots count them, and so
        does its memory). A session's current state is never dropped, so its calls go on for ever."""
        with self._cond:
            over = len(fam.live) - self.session_snapshots
            if over <= 0:
                return
            sessions = [s for s in self._sessions.values() if s.family is fam]
            current = {s.states.get(s.calls) for s in sessions}
            old = sorted((int(sid), n, s) for s in sessions for n, sid in s.states.items() if sid not in current)
            for sid, n, s in old[:over]:
                del s.states[n]
                self._drop(fam, [str(sid)])

    def _get_or_start(self, key: str, t0: float) -> _Session:
        with self._cond:
            sess = self._sessions.get(key)
            if sess is not None and not sess.family.dead:
                return sess
            if sess is not None:  # its sandbox died: start over
                self._sessions.pop(key)
            deadline = t0 + self.queue_timeout_s
            while len(self._sessions) >= self.max_sessions:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())) and time.monotonic() >= deadline:
                    raise RuntimeError(f"{self.max_sessions} python sessions are live (max_sessions); none ended in "
                                       f"{self.queue_timeout_s:g} s")
        w = self._pool.acquire(t0 + self.start_timeout_s)
        for fd in w.runner_pipes():  # session workers use per-call pipes
            try:
                os.close(fd)
            except OSError:
                pass
        w.out_r = w.code_w = w.rep_r = None
        if not w.ready:
            self._wait_ready(w, t0 + self.start_timeout_s)
        fam = _Family(w, live={"0"})
        with self._cond:
            self._families.append(fam)
            sess = self._sessions[key] = _Session(fam, {0: "0"}, note=(sess.note if sess else ""))
            self.stats["sessions_started"] += 1
        return sess

    @staticmethod
    def _wait_ready(w, deadline: float) -> None:
        poller = select.poll()
        poller.register(w.ctl.fileno(), select.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError("a python session did not start in time")
            poller.poll(max(1, int(remaining * 1000)))
            for line in w.read_ctl():
                if line == "EOF":
                    raise RuntimeError("the session sandbox died at start")
                try:
                    msg, fields = CTL.decode(line)
                except ProtocolError as e:
                    raise RuntimeError(f"the session sandbox sent a malformed message at start: {e}") from None
                if msg is FAMILY_READY:
                    return
                if msg is FAILED:
                    raise RuntimeError(fields["why"])

    def _execute(self, sess: _Session, code: str, timeout: float, t0: float) -> ToolResult:
        fam = sess.family
        src, dst = sess.states[sess.calls], str(next(self._ids))
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        code_r, code_w = os.pipe2(os.O_CLOEXEC)
        rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
        try:
            with fam.lock:
                socket.send_fds(fam.ctl(), [RUN.encode(src, dst)], [code_r, out_w, rep_w])
                fam.live.add(dst)
        except OSError as e:
            for fd in (out_r, out_w, code_r, code_w, rep_r, rep_w):
                os.close(fd)
            fam.dead = True
            return ToolResult(f"Error: the python session is gone ({e})", ok=False)
        for fd in (code_r, out_w, rep_w):
            os.close(fd)
        data = code.encode("utf-8", "replace")
        status = None
        try:
            write_all(code_w, encode_code(timeout, data))
        except OSError:
            status = CallEnd("failed", why="the session died before it got the code")
        finally:
            os.close(code_w)
        deadline = time.monotonic() + timeout
        rep_buf, state = bytearray(), {"alive": False}

        def report():  # init's report: how the call's process ended and whether the state lives on
            chunk = os.read(rep_r, 1 << 16)
            if not chunk:
                return CallEnd("gone")  # the call's process died without reporting
            rep_buf.extend(chunk)
            if b"\n" not in rep_buf:
                return None
            status, state["alive"] = _report_status(bytes(rep_buf.split(b"\n", 1)[0]))
            return status

        got = run_with_limits(out_r, {rep_r: report}, deadline, self._inner.max_read_bytes, status=status)
        out, status, timed_out, overflow = got.raw, got.status, got.timed_out, got.overflow
        state_alive = state["alive"]
        os.close(out_r)
        os.close(rep_r)
        # the state lives on when the call's process forked it before exiting (init says so); a
        # signal, or a program that ended its own process, leaves none: the next call starts fresh
        ended = timed_out or overflow or not state_alive
        if ended:  # the call's process is killed; the next call starts a fresh session, saying so
            with fam.lock:
                try:
                    fam.ctl().sendall(KILL.encode(dst) + DROP.encode(dst))
                except OSError:
                    pass
                fam.live.discard(dst)
            crashed = status is None or status.kind == "gone"
            self._restart(sess, "timed out" if timed_out else "crashed" if crashed else "stopped")
            if crashed:  # no report: the call's process was killed (as by SIGKILL) before it could say how
                status = CallEnd("signal", int(signal.SIGKILL))
        else:
            sess.calls += 1
            sess.states[sess.calls] = dst
            self._trim(fam)
        return self._inner.format_result(bytes(out), status, timeout, timed_out, overflow, time.monotonic() - t0,
                                   "namespaces")

    def _restart(self, sess: _Session, why: str) -> None:
        """Drop a session whose call ended badly; its next call starts a fresh one and says so."""
        with self._cond:
            for key, s in list(self._sessions.items()):
                if s is sess:
                    self._sessions.pop(key)
                    self._drop(sess.family, list(sess.states.values()))
                    self._sessions[key] = _Session(sess.family, {}, calls=-1, note=(
                        f"[note: the python session {why}; this call started a fresh session — earlier variables "
                        "and files are gone]"))
                    self._sessions[key].family = _Family(None, dead=True)
            self._cond.notify_all()


def _report_status(line: bytes) -> tuple[CallEnd, bool]:
    """init's DONE line on a call's report pipe as (how the call ended, and whether the session's
    state lives on); a malformed one is a failed end (and no state), never a crash."""
    try:
        _, done = REPORT.decode(line)
    except ProtocolError as e:
        return CallEnd("failed", why=f"the python session's report was malformed ({e})"), False
    return call_end(done["how"]), done["state"] == "1"
