"""The sandbox side of `python` sessions (trainer side: tools/python_session.py): a session
family's init and its state processes. What they send each other and the trainer is protocol.py's
(channels SESSION, REPORT, STATE, FAMILY); each receiver has one handler per message.

Loaded inside the zygote (see the package docstring): standard library only."""

from __future__ import annotations

import builtins
import ctypes
import os
import select
import shutil
import signal
import socket
import struct
import sys
import time
import types
from collections.abc import Callable, Mapping
from typing import Any

from .protocol import (
    CALL_STARTED,
    CARRIED,
    DONE,
    DROP,
    ENDED,
    FAMILY,
    FAMILY_READY,
    FORK,
    IS_STATE,
    KILL,
    RUN,
    SESSION,
    STATE,
    STATE_FORK,
    STATE_RUN,
    Message,
    ProtocolError,
)
from .protocol import lines as split_lines
from .runner import EXIT_HARNESS, exit_code, flush_std, lock_down, print_exc, receive_and_run

# ---- stateful sessions (PythonSessionTool, tools/python_session.py) --------------------------------
# A session family is one sandbox (namespaces, cgroup, uid) whose init manages *state processes*:
# python processes holding a session's variables (a persistent __main__) and its working directory
# (/tmp/s<pid>). A call runs in a *runner*, a fork of the session's current state (the state stays
# as the snapshot "after the previous call", from which a branch of the rollout tree forks its own
# state: copy-on-write memory, a copied directory), in a copy of the state's directory. When the
# code is done the runner forks a child that carries the session on, and exits: the call's status
# is that exit status, read by init (a runner is always init's child once its parent has exited)
# and written by init to the call's report pipe, which the code never holds — as in the one-shot
# tool, the code can only end its process, as any program can. Threads a program started do not
# survive into the next call (fork copies one thread).
#
# Speed (issue 27): a call's runner exists before the call comes, so the only fork on a call's path
# is the one that carries the session on. That child forks the new state (the snapshot) and stays
# its runner, waiting for the next call while the model generates. Other states (the root, a
# branch's, a snapshot called twice) double-fork their runner, so that init adopts it. Before the
# code runs, a runner starts a *holder* (CLONE_VM: it shares the runner's memory and only sleeps;
# init's child, its pidfd sent to init): the runner's exit then does not tear its memory down
# (2-5 ms for an interpreter with numpy and sympy), init reads the status at once and kills the
# holder after the report. Nothing waits on a timer: init wakes on SIGCHLD, the trainer on pipes.

def _session_process(chan: socket.socket, workdir: str, mod: types.ModuleType) -> None:
    """A session's processes, all forks of the root state: each is a state or a runner, and a fork
    that changes role goes round this loop again (no recursion: a session may run many calls)."""
    role: str = "state"
    sock: socket.socket | None = None
    while True:
        if role == "state":
            role, chan, workdir, sock = _be_state(chan, workdir, sock)
        else:
            assert sock is not None  # a runner is always handed its socket
            role, chan, workdir, sock = _be_runner(sock, workdir, mod)


def _own_workdir(workdir: str) -> str:
    """Copy the state's working directory to /tmp/s<pid> and enter it; the new directory."""
    newdir = f"/tmp/s{os.getpid()}"
    try:
        shutil.copytree(workdir, newdir, symlinks=True)
    except OSError:
        os.makedirs(newdir, exist_ok=True)
    os.chdir(newdir)
    return newdir


class _StateProcess:
    """A state process's own data: its channel to init, its working directory and the socket of
    its waiting runner (None: none now)."""

    def __init__(self, chan: socket.socket, workdir: str, ready: socket.socket | None):
        self.chan, self.workdir, self.ready = chan, workdir, ready

    def run_call(self, fds: list[int]) -> tuple | None:
        """STATE_RUN: hand the call's descriptors to the waiting runner (a second call from this
        snapshot: a new one). A runner that died meanwhile is replaced once; else init reports a
        crash. Returns the runner's role in a forked runner, else None (the state goes on)."""
        for _ in range(2):
            if self.ready is None:
                self.ready, child = _fork_runner(self.chan)
                if child is not None:
                    _close_all(fds)
                    return "runner", None, self.workdir, child
                if self.ready is None:
                    break
            try:
                socket.send_fds(self.ready, [STATE_RUN.encode()], fds)
                sent = True
            except OSError:
                sent = False
            self.ready.close()
            self.ready = None
            if sent:
                break
        _close_all(fds)
        return None

    def fork_state(self, fds: list[int]) -> tuple | None:
        """STATE_FORK: fork a branch's state, which talks to init on the channel that came (the
        last descriptor). Returns its role in the child, None in this state."""
        try:
            pid = os.fork()
        except OSError:
            pid = -1
        if pid != 0:
            _close_all(fds)
            return None
        self.chan.close()
        if self.ready is not None:
            self.ready.close()
        return "state", socket.socket(fileno=fds[-1]), _own_workdir(self.workdir), None


_STATE_HANDLERS = {STATE_RUN: _StateProcess.run_call, STATE_FORK: _StateProcess.fork_state}


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _be_state(chan: socket.socket, workdir: str, ready: socket.socket | None) -> tuple:
    """A state process: say so to init (IS_STATE), have a runner for the next call (`ready`: the
    socket of one forked with us; else fork one), then serve init's STATE messages on `chan` (one
    handler each, _STATE_HANDLERS); EOF: end (the snapshot is dropped). Returns only in a forked
    child: (role, chan, workdir, socket) for _session_process."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # states never wait for their children: auto-reaped
    chan.sendall(IS_STATE.encode(os.getpid()))  # init learns this process's pid from the kernel (SO_PASSCRED)
    if ready is None:
        ready, child = _fork_runner(chan)
        if child is not None:
            return "runner", None, workdir, child
    state = _StateProcess(chan, workdir, ready)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(chan, 64, 4)
        except OSError:
            os._exit(0)
        if not msg or not fds:
            os._exit(0)
        try:
            role = STATE.dispatch(msg, _STATE_HANDLERS, state, fds)
        except ProtocolError:  # (only init writes here) not ours: dropped
            _close_all(fds)
            continue
        if role is not None:
            return role


def _fork_runner(chan: socket.socket) -> tuple:
    """Fork this state's next runner, double-forked so that init adopts it and reads its exit
    status. Returns (the socket its call comes on, None) in the state, (None, the runner's end) in
    the runner; (None, None) when no process can be forked now (the call is then reported crashed)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = os.fork()
    except OSError:
        a.close()
        b.close()
        return None, None
    if pid != 0:
        b.close()
        return a, None
    a.close()
    chan.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a runner that ends before we do stays a zombie for init
    try:
        if os.fork() != 0:
            os._exit(0)
    except OSError:
        os._exit(EXIT_HARNESS)
    return None, b


def _be_runner(sock: socket.socket, workdir: str, mod: types.ModuleType) -> tuple:
    """A runner: wait for its call's descriptors, run the call in a copy of the state's directory,
    fork the child that carries the session on, and report by exiting. Returns only in that
    child's forks: (role, chan, workdir, socket) of the new state, or of the next call's runner."""
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 64, 4)
    except OSError:
        os._exit(0)
    sock.close()
    if msg != STATE_RUN.encode() or len(fds) != len(STATE_RUN.fds):
        os._exit(0)  # the state was dropped
    code_r, out_w = fds[0], fds[1]
    chan = socket.socket(fileno=fds[2])
    workdir = _own_workdir(workdir)
    holder = _hold_memory()
    try:  # init learns our pid from the kernel (SO_PASSCRED), and gets the holder's pidfd
        socket.send_fds(chan, [CALL_STARTED.encode()], [holder] if holder is not None else [])
    except OSError:
        os._exit(EXIT_HARNESS)
    if holder is not None:
        os.close(holder)
    status = _session_call(code_r, out_w, mod)
    try:  # the report is our exit; first the state lives on in our child ("S" says so)
        pid = os.fork()
    except OSError:
        os._exit(EXIT_HARNESS)
    if pid != 0:
        try:
            chan.sendall(CARRIED.encode())
        except OSError:
            pass
        os._exit(exit_code(status))
    # Our child: init adopts it when we exit. It forks the new state (the snapshot after this call)
    # and stays its runner: the next call's process exists before that call comes, with one fork
    # on this call's path (ours) and none on the next one's.
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = os.fork()
    except OSError:  # no runner now: we are the state, which forks one when its call comes
        a.close()
        b.close()
        return "state", chan, workdir, None
    if pid == 0:
        b.close()
        return "state", chan, workdir, a
    a.close()
    chan.close()
    return "runner", None, workdir, b


_LIBC: list = []
_HOLDER_STACK: list = []


def _hold_memory() -> int | None:
    """Start a process that shares this runner's memory (CLONE_VM) and only sleeps: the runner's
    exit then does not tear its address space down (2-5 ms for an interpreter with numpy and
    sympy, on the call's path before init can read the exit status). It is init's child
    (CLONE_PARENT: a runner's parent is init, or an intermediate that is about to exit), so the
    call's code cannot wait for it, and comes with a pidfd (CLONE_PIDFD), which init gets with "C"
    and uses to kill it after the report. Returns the pidfd, or None (no holder: the call is only
    slower)."""
    CLONE_VM, CLONE_PIDFD, CLONE_PARENT, SIGCHLD = 0x100, 0x1000, 0x8000, 17
    try:
        if not _LIBC:
            lib = ctypes.CDLL(None, use_errno=True)
            _LIBC.append((lib.clone, lib.pause))
            _HOLDER_STACK.append(ctypes.create_string_buffer(1 << 14))  # shared memory: one per process image
        clone, pause = _LIBC[0]
        stack = _HOLDER_STACK[0]
        top = (ctypes.addressof(stack) + len(stack) - 64) & ~0xF
        pidfd = ctypes.c_int(-1)
        pid = clone(ctypes.cast(pause, ctypes.c_void_p), ctypes.c_void_p(top),
                    ctypes.c_int(CLONE_VM | CLONE_PIDFD | CLONE_PARENT | SIGCHLD), None, ctypes.byref(pidfd))
    except Exception:  # noqa: BLE001 - no holder: the call is only slower
        return None
    return pidfd.value if pid > 0 and pidfd.value >= 0 else None


def _session_call(code_r: int, out_w: int, mod: types.ModuleType) -> str:
    """One call in a session: stdout/stderr to out_w (then to /dev/null, both closed); its status."""
    status = "crash"
    try:
        sys.stdout.flush()
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        status = receive_and_run(code_r, mod)
    except BaseException:  # noqa: BLE001
        print_exc()
    flush_std()
    devnull = os.open("/dev/null", os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    for fd in (devnull, code_r, out_w):
        try:
            os.close(fd)
        except OSError:
            pass
    return status


def _sender_pid(sock: socket.socket) -> tuple[bytes, int | None, list[int]]:
    """(data, the sending process's pid as the kernel reports it, descriptors that came with it)
    from a socket with SO_PASSCRED; the caller owns (and closes) the descriptors."""
    data, anc, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(12) + socket.CMSG_SPACE(4 * 4))
    pid: int | None = None
    fds: list[int] = []
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(raw) >= 12:
            pid = struct.unpack("3i", raw[:12])[0]
        elif level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += struct.unpack(f"{len(raw) // 4}i", raw[: len(raw) - len(raw) % 4])
    return data, pid, fds


def _pidfd_pid(fd: int) -> int | None:
    """The pid a pidfd refers to (None: unknown, not a pidfd, or its process is gone)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        pass
    return None


def _session_chan() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    return a, b


def _wait_report(st: int, state: bool) -> bytes:
    """A call process's wait status as the DONE line its report pipe gets ("D wexit N 1", "D signal
    N 0"); `state`: the call's process forked the new state (the session goes on from it)."""
    how = f"signal {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else f"wexit {os.waitstatus_to_exitcode(st)}"
    return DONE.encode(how, int(state))


def session_init(lib, cfg: dict, mode: str, uid: int | None, ctl: socket.socket, pipes: tuple[int, int, int]) -> None:
    """init of a session family: start the root state, then relay the trainer's SESSION commands
    to the states and report each call (protocol.py: SESSION, STATE, FAMILY, REPORT). Never returns."""
    for fd in pipes:
        os.close(fd)
    _FamilyInit(ctl, _start_root_state(lib, cfg, mode, uid, ctl)).serve()


def _start_root_state(lib, cfg: dict, mode: str, uid: int | None, ctl: socket.socket) -> socket.socket:
    """Fork the session's root state (locked down as a one-shot runner is, in /tmp/s0, with a fresh
    __main__); init's end of its channel."""
    a, b = _session_chan()
    if os.fork() == 0:
        ctl.close()
        a.close()
        try:
            os.makedirs("/tmp/s0", exist_ok=True)
            if uid is not None:
                os.chown("/tmp/s0", uid, uid)
            null = os.open("/dev/null", os.O_WRONLY)
            lock_down(lib, cfg, mode, uid, "/tmp/s0", null, {b.fileno()})
            mod = types.ModuleType("__main__")
            mod.__dict__["__builtins__"] = builtins  # (typeshed's ModuleType has no __builtins__ attribute)
            _session_process(b, "/tmp/s0", mod)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    b.close()
    return a


class _FamilyInit:
    """init of a session family: the trainer's commands come on `ctl` (SESSION, one handler each),
    each state's and runner's messages on that state's channel (FAMILY, one handler each, the
    sender's pid from the kernel); SIGCHLD wakes the poll (a wake-up pipe) and the call whose
    runner exited is reported on its report pipe (DONE), which init alone holds."""

    def __init__(self, ctl: socket.socket, root: socket.socket):
        self.ctl = ctl
        self.chans: dict[str, socket.socket] = {"0": root}  # state id -> init's end of its channel
        self.pids: dict[str, int] = {}  # state id -> the pid of its state, or of the call running from it
        self.calls: dict[str, dict] = {}  # dst -> {"rep": rep_w, "pid": its runner once it said C, "holder"}
        self.exited: dict[int, tuple] = {}  # pid -> (wait status, when) of the processes init reaped
        self.bufs: dict[str, bytes] = {}  # state id -> the unfinished line its channel sent
        self.inbox = b""  # the trainer's unfinished command
        self.fd_groups: list[list[int]] = []  # descriptors of RUN commands not read yet, in order
        self.ready_sent = False
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)  # a SIGCHLD wakes the poll
        signal.signal(signal.SIGCHLD, self._collect)

    def _collect(self, *_) -> None:
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.exited[pid] = (st, time.monotonic())

    def serve(self) -> None:
        while True:
            poller = select.poll()
            poller.register(self.ctl.fileno(), select.POLLIN)
            poller.register(self.wake_r, select.POLLIN)
            by_fd = {c.fileno(): k for k, c in self.chans.items()}
            for fd in by_fd:
                poller.register(fd, select.POLLIN)
            try:
                events = poller.poll(1000)
            except InterruptedError:
                continue
            for fd, _ in events:
                if fd == self.wake_r:
                    try:
                        os.read(self.wake_r, 4096)
                    except OSError:
                        pass
                elif fd == self.ctl.fileno():
                    self._read_ctl()
                else:
                    self._read_family(by_fd[fd])
            self._report_exited_calls()
            now = time.monotonic()
            for pid, (_, at) in list(self.exited.items()):  # (a copy: SIGCHLD may add to it meanwhile)
                if now - at > 30:  # no call claimed it
                    self.exited.pop(pid, None)

    # -- the trainer's commands (SESSION) ---------------------------------------------------------
    def _read_ctl(self) -> None:
        try:
            msg, fds, _, _ = socket.recv_fds(self.ctl, 4096, 4)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            msg, fds = b"", []
        if not msg:
            os._exit(0)  # the trainer is gone: the namespace dies with us
        # a stream socket may deliver several commands at once: one per line; each RUN command's
        # descriptors arrive with it, in order
        n = len(RUN.fds)
        self.fd_groups += [fds[i:i + n] for i in range(0, len(fds), n)]
        lines, self.inbox = split_lines(self.inbox, msg, keep=1 << 30)
        for line in lines:
            self._command(line.decode(errors="replace").strip())

    def _command(self, cmd: str) -> None:
        """One command, by its handler (_on_command). A malformed one is dropped and takes no
        descriptors: only a well-formed RUN has them (the trainer's RUN.encode makes no other), so
        garbage cannot take the next call's pipes (tests/tools/test_sandbox_protocol.py)."""
        try:
            msg, fields = SESSION.decode(cmd)
        except ProtocolError:
            return
        group = self.fd_groups.pop(0) if msg is RUN and self.fd_groups else []
        keep = None
        try:
            keep = self._on_command[msg](self, group, **fields)
        except OSError:  # a command that failed is dropped: a call's pipes close, its report is EOF
            pass
        finally:
            for fd in group:
                if fd != keep:
                    os.close(fd)

    def _relay(self, msg: Message, src: str, dst: str, fds: list[int]) -> bool:
        """Send `msg` (STATE_RUN, STATE_FORK) to state `src` with `fds` and a new channel, which
        becomes state `dst`'s; False: no state `src`."""
        if src not in self.chans:
            return False
        a, b = _session_chan()
        socket.send_fds(self.chans[src], [msg.encode()], [*fds, b.fileno()])
        b.close()
        self.chans[dst] = a
        return True

    def _run(self, fds: list[int], src: str, dst: str) -> int | None:
        """RUN: the call goes to state src's runner; init keeps the report pipe (the descriptor it returns)."""
        if self._relay(STATE_RUN, src, dst, fds[:2]) and len(fds) == len(RUN.fds):
            self.calls[dst] = {"rep": fds[2], "pid": None}  # init writes the call's status to it
            return fds[2]
        return None

    def _fork(self, fds: list[int], src: str, dst: str) -> None:
        """FORK: state src forks a branch's state dst."""
        self._relay(STATE_FORK, src, dst, [])

    def _drop(self, fds: list[int], sid: str) -> None:
        """DROP: close the state's channel (it ends); a call still running from it reports "dropped"."""
        if sid in self.chans:
            self.pids.pop(sid, None)
            self.chans.pop(sid).close()
            if sid in self.calls:
                self._report(sid, DONE.encode("dropped", 0))

    def _kill(self, fds: list[int], sid: str) -> None:
        """KILL: SIGKILL the state's process, or its call's."""
        if sid in self.pids:
            os.kill(self.pids[sid], signal.SIGKILL)

    _on_command: Mapping[Message, Callable[..., Any]] = {RUN: _run, FORK: _fork, DROP: _drop, KILL: _kill}

    # -- the states' and runners' messages (FAMILY) --------------------------------------------------
    def _read_family(self, k: str) -> None:
        try:
            data, sender, fds = _sender_pid(self.chans[k])
        except OSError:
            data, sender, fds = b"", None, []
        if not data:
            self._channel_closed(k)
            return
        lines, self.bufs[k] = split_lines(self.bufs.get(k, b""), data)
        for line in lines:
            try:
                FAMILY.dispatch(line, self._on_family, self, k, sender, fds)
            except ProtocolError:  # a call's code may write anything here: not ours, dropped
                pass
        for fd in fds:  # anything else a call's code sent us
            os.close(fd)

    def _channel_closed(self, k: str) -> None:
        """State k's channel closed: a call that had not started is reported killed; a state that
        vanished is told to the trainer ("X dead <id>")."""
        self.chans.pop(k).close()
        call = self.calls.get(k)
        if call is not None and call["pid"] is None:  # the call's process died before it started
            self._report(k, DONE.encode("signal 9", 0))
        if k in self.pids:
            self.pids.pop(k)
            try:
                self.ctl.sendall(ENDED.encode(f"dead {k}"))
            except OSError:
                os._exit(0)

    def _state_up(self, k: str, sender: int | None, fds: list[int], pid: str) -> None:
        """IS_STATE: the state's pid (from the kernel); the root's first one makes the family ready."""
        if sender:
            self.pids[k] = sender
            if k == "0" and not self.ready_sent:
                self.ready_sent = True
                self.ctl.sendall(FAMILY_READY.encode())

    def _call_started(self, k: str, sender: int | None, fds: list[int]) -> None:
        """CALL_STARTED (once, before the code runs): the sender runs the call, its exit is the
        report; the pidfd that came with it (not init's own) is its memory holder."""
        call = self.calls.get(k)
        if call is not None and call["pid"] is None and sender:
            call["pid"] = self.pids[k] = sender
            if fds and _pidfd_pid(fds[0]) != os.getpid():  # its memory holder (sent before the
                call["holder"] = fds.pop(0)  # code ran): killed after the report

    def _carried(self, k: str, sender: int | None, fds: list[int]) -> None:
        """CARRIED, from the call's own process only: its child carries the state on."""
        call = self.calls.get(k)
        if call is not None and sender == call["pid"]:
            call["state"] = True

    _on_family: Mapping[Message, Callable[..., Any]] = {
        IS_STATE: _state_up, CALL_STARTED: _call_started, CARRIED: _carried}

    # -- reports (DONE) ----------------------------------------------------------------------------
    def _report_exited_calls(self) -> None:
        for k, call in list(self.calls.items()):
            if call["pid"] in self.exited:
                if k in self.chans and not call.get("state"):  # its "S" was sent before it exited: read it first
                    self._drain(k, call)
                self._report(k, _wait_report(self.exited.pop(call["pid"])[0], bool(call.get("state"))))

    def _drain(self, k: str, call: dict) -> None:
        """Read what state k's channel holds without waiting: the exited call's CARRIED, and a new
        state's IS_STATE (its pid)."""
        chan = self.chans[k]
        chan.setblocking(False)
        try:
            while True:
                data, sender, fds = _sender_pid(chan)
                for fd in fds:
                    os.close(fd)
                if not data:
                    break
                lines, self.bufs[k] = split_lines(self.bufs.get(k, b""), data)
                said = {_letter(line) for line in lines}
                call["state"] = call.get("state") or (sender == call["pid"] and CARRIED in said)
                if sender and sender != call["pid"] and IS_STATE in said:
                    self.pids[k] = sender
        except (BlockingIOError, OSError):
            pass
        chan.setblocking(True)

    def _report(self, k: str, line: bytes) -> None:
        """Write a call's report; then kill its memory holder (its memory is freed off the call's path)."""
        call = self.calls.pop(k)
        try:
            os.write(call["rep"], line)
        except OSError:
            pass
        os.close(call["rep"])
        holder = call.get("holder")
        if holder is not None:
            try:
                signal.pidfd_send_signal(holder, signal.SIGKILL)
            except OSError:
                pass
            os.close(holder)


def _letter(line: bytes) -> Message | None:
    """The FAMILY message a line is (None: not one)."""
    try:
        return FAMILY.decode(line)[0]
    except ProtocolError:
        return None
