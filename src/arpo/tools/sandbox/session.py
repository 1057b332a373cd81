"""The sandbox side of `python` sessions (trainer side: tools/python_session.py): a session
family's init and its state processes.

Loaded inside the zygote (see the package docstring): standard library only."""

from __future__ import annotations

import builtins
import os
import select
import signal
import socket
import struct
import sys
import time
import types

from .runner import EXIT_HARNESS, _exit_code, _flush_std, _lock_down, _print_exc, _receive_and_run

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
    import shutil

    newdir = f"/tmp/s{os.getpid()}"
    try:
        shutil.copytree(workdir, newdir, symlinks=True)
    except OSError:
        os.makedirs(newdir, exist_ok=True)
    os.chdir(newdir)
    return newdir


def _be_state(chan: socket.socket, workdir: str, ready: socket.socket | None) -> tuple:  # noqa: C901 - sandbox boot code (runs in the forked interpreter, no arpo imports); to be split per message (issue 42 item 3)
    """A state process: say so to init, have a runner for the next call (`ready`: the socket of
    one forked with us; else fork one), then wait for init's commands on `chan`: b"X" + fds
    [code_r, out_w, new_chan]: the runner runs a call; b"F" + fds [new_chan]: a child becomes a
    branch's state; EOF: end (the snapshot is dropped). Returns only in a forked child:
    (role, chan, workdir, socket) for _session_process."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # states never wait for their children: auto-reaped
    chan.sendall(f"P {os.getpid()}\n".encode())  # init learns this process's pid from the kernel (SO_PASSCRED)
    if ready is None:
        ready, child = _fork_runner(chan)
        if child is not None:
            return "runner", None, workdir, child
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(chan, 64, 4)
        except OSError:
            os._exit(0)
        if not msg or not fds:
            os._exit(0)
        if msg[:1] == b"X":  # to the waiting runner (a second call from this snapshot: a new one)
            for _ in range(2):  # a runner that died meanwhile is replaced once; else init reports a crash
                if ready is None:
                    ready, child = _fork_runner(chan)
                    if child is not None:
                        for fd in fds:
                            os.close(fd)
                        return "runner", None, workdir, child
                    if ready is None:
                        break
                try:
                    socket.send_fds(ready, [b"X"], fds)
                    sent = True
                except OSError:
                    sent = False
                ready.close()
                ready = None
                if sent:
                    break
            for fd in fds:
                os.close(fd)
            continue
        try:
            pid = os.fork()
        except OSError:
            pid = -1
        if pid != 0:
            for fd in fds:
                os.close(fd)
            continue
        chan.close()
        if ready is not None:
            ready.close()
        return "state", socket.socket(fileno=fds[-1]), _own_workdir(workdir), None


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
    if msg[:1] != b"X" or len(fds) != 3:
        os._exit(0)  # the state was dropped
    code_r, out_w = fds[0], fds[1]
    chan = socket.socket(fileno=fds[2])
    workdir = _own_workdir(workdir)
    holder = _hold_memory()
    try:  # init learns our pid from the kernel (SO_PASSCRED), and gets the holder's pidfd
        socket.send_fds(chan, [b"C\n"], [holder] if holder is not None else [])
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
            chan.sendall(b"S\n")
        except OSError:
            pass
        os._exit(_exit_code(status))
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
    import ctypes

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
        status = _receive_and_run(code_r, mod)
    except BaseException:  # noqa: BLE001
        _print_exc()
    _flush_std()
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


def _wait_report(st: int, state: bool) -> str:
    """A call process's wait status as the "D <how> <state 0|1>" line its report pipe gets; `state`:
    the call's process forked the new state (the session goes on from it)."""
    how = f"signal {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else f"wexit {os.waitstatus_to_exitcode(st)}"
    return f"D {how} {int(state)}\n"


def _session_init(lib, cfg: dict, mode: str, uid: int | None, ctl: socket.socket, pipes: tuple[int, int, int]) -> None:  # noqa: C901 - sandbox boot code (runs in the forked interpreter, no arpo imports); to be split per message (issue 42 item 3)
    """init of a session family: start the root state, then relay the trainer's commands to states.
    Trainer -> init (ctl): "X src dst" + fds [code_r, out_w, rep_w]; "F src dst"; "Q id" (drop a state);
    "K id" (kill a state's or a running call's process). init -> trainer: "R" (ready), "X dead id" (a
    state vanished); on a call's rep_w (kept by init, never passed on): "D wexit N" / "D signal N".
    On a state's channel (senders' pids from the kernel): "P" (a state), "C" + its holder's pidfd (a
    runner starts a call: its exit is the report), "S" (that runner's child carries the state on)."""
    for fd in pipes:
        os.close(fd)
    a, b = _session_chan()
    root = os.fork()
    if root == 0:
        ctl.close()
        a.close()
        try:
            os.makedirs("/tmp/s0", exist_ok=True)
            if uid is not None:
                os.chown("/tmp/s0", uid, uid)
            null = os.open("/dev/null", os.O_WRONLY)
            _lock_down(lib, cfg, mode, uid, "/tmp/s0", null, {b.fileno()})
            mod = types.ModuleType("__main__")
            mod.__dict__["__builtins__"] = builtins  # (typeshed's ModuleType has no __builtins__ attribute)
            _session_process(b, "/tmp/s0", mod)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    b.close()
    chans: dict[str, socket.socket] = {"0": a}
    pids: dict[str, int] = {}
    calls: dict[str, dict] = {}  # dst -> {"rep": rep_w, "pid": the call's runner once it said "C", "holder"}
    exited: dict[int, tuple] = {}  # pid -> (wait status, when) of the processes init reaped
    bufs: dict[str, bytes] = {}
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)  # a SIGCHLD wakes the poll below

    def collect(*_):
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            exited[pid] = (st, time.monotonic())

    signal.signal(signal.SIGCHLD, collect)
    inbox, ready_sent, fd_groups = b"", False, []
    while True:
        poller = select.poll()
        poller.register(ctl.fileno(), select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        by_fd = {c.fileno(): k for k, c in chans.items()}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        try:
            events = poller.poll(1000)
        except InterruptedError:
            continue
        for fd, _ in events:
            if fd == wake_r:
                try:
                    os.read(wake_r, 4096)
                except OSError:
                    pass
                continue
            if fd == ctl.fileno():
                try:
                    msg, fds, _, _ = socket.recv_fds(ctl, 4096, 4)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    msg, fds = b"", []
                if not msg:
                    os._exit(0)  # the trainer is gone: the namespace dies with us
                # a stream socket may deliver several commands at once: one per line; each X command's
                # three descriptors arrive with it, in order
                fd_groups += [fds[i:i + 3] for i in range(0, len(fds), 3)]
                inbox += msg
                while b"\n" in inbox:
                    line, inbox = inbox.split(b"\n", 1)
                    cmd = line.decode(errors="replace").strip()
                    group = fd_groups.pop(0) if cmd.startswith("X ") and fd_groups else []
                    _session_command(cmd, group, chans, pids, calls)
                continue
            k = by_fd[fd]
            try:
                data, sender, fds = _sender_pid(chans[k])
            except OSError:
                data, sender, fds = b"", None, []
            if not data:
                chans.pop(k).close()
                call = calls.get(k)
                if call is not None and call["pid"] is None:  # the call's process died before it started
                    _report(calls, k, "D signal 9 0\n")
                if k in pids:
                    pids.pop(k)
                    try:
                        ctl.sendall(f"X dead {k}\n".encode())
                    except OSError:
                        os._exit(0)
                continue
            lines = (bufs.get(k, b"") + data).split(b"\n")
            bufs[k] = lines.pop()[-4096:]
            for line in lines:
                call = calls.get(k)
                if line == b"C" and call is not None and call["pid"] is None and sender:
                    call["pid"] = pids[k] = sender  # the process that runs the call: its exit is the report
                    if fds and _pidfd_pid(fds[0]) != os.getpid():  # its memory holder (sent before the
                        call["holder"] = fds.pop(0)  # code ran): killed after the report
                elif line == b"S" and call is not None and sender == call["pid"]:
                    call["state"] = True
                elif line.startswith(b"P ") and sender:
                    pids[k] = sender
                    if k == "0" and not ready_sent:
                        ready_sent = True
                        ctl.sendall(b"R\n")
            for fd in fds:  # anything else a call's code sent us
                os.close(fd)
        for k, call in list(calls.items()):
            if call["pid"] in exited:
                if k in chans and not call.get("state"):  # its "S" was sent before it exited: read it first
                    chans[k].setblocking(False)
                    try:
                        while True:
                            data, sender, fds = _sender_pid(chans[k])
                            for fd in fds:
                                os.close(fd)
                            if not data:
                                break
                            lines = (bufs.get(k, b"") + data).split(b"\n")
                            bufs[k] = lines.pop()[-4096:]
                            call["state"] = call.get("state") or (sender == call["pid"] and b"S" in lines)
                            if sender and sender != call["pid"] and any(ln.startswith(b"P ") for ln in lines):
                                pids[k] = sender
                    except (BlockingIOError, OSError):
                        pass
                    chans[k].setblocking(True)
                _report(calls, k, _wait_report(exited.pop(call["pid"])[0], bool(call.get("state"))))
        now = time.monotonic()
        for pid, (_, at) in list(exited.items()):  # (a copy: SIGCHLD may add to it meanwhile)
            if now - at > 30:  # no call claimed it
                exited.pop(pid, None)


def _report(calls: dict, k: str, line: str) -> None:
    """Write a call's report; then kill its memory holder (its memory is freed off the call's path)."""
    call = calls.pop(k)
    try:
        os.write(call["rep"], line.encode())
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


def _session_command(cmd: str, fds: list[int], chans: dict, pids: dict, calls: dict) -> None:
    parts = cmd.split()
    op = parts[0] if parts else ""
    keep = None
    try:
        if op in ("X", "F") and len(parts) == 3 and parts[1] in chans:
            a, b = _session_chan()
            socket.send_fds(chans[parts[1]], [op.encode()], [*(fds[:2] if op == "X" else []), b.fileno()])
            b.close()
            chans[parts[2]] = a
            if op == "X" and len(fds) == 3:
                keep = fds[2]  # the report pipe stays here: init writes the call's status to it
                calls[parts[2]] = {"rep": keep, "pid": None}
        elif op == "Q" and len(parts) == 2 and parts[1] in chans:
            pids.pop(parts[1], None)
            chans.pop(parts[1]).close()
            if parts[1] in calls:
                _report(calls, parts[1], "D dropped 0\n")
        elif op == "K" and len(parts) == 2 and parts[1] in pids:
            os.kill(pids[parts[1]], signal.SIGKILL)
    except OSError:
        pass
    finally:
        for fd in fds:
            if fd != keep:
                os.close(fd)
