"""The sandbox side of `python` sessions (trainer side: tools/python_session.py): a session
family's init and its state processes.

Loaded inside the zygote (see the package docstring): standard library only."""

from __future__ import annotations

import builtins
import os
import select
import signal
import socket
import sys
import types

from .linux import _reap
from .runner import _flush_std, _lock_down, _print_exc, _receive_and_run

# ---- stateful sessions (PythonSessionTool, tools/python_session.py) --------------------------------
# A session family is one sandbox (namespaces, cgroup, uid) whose init manages *state processes*:
# python processes holding a session's variables (a persistent __main__) and its working directory
# (/tmp/s<pid>). A call runs in a fork of the session's current state, which then *is* the new
# state; the process it was forked from stays as the snapshot "after the previous call", from which a
# branch of the rollout tree forks its own state (copy-on-write memory, a copied directory). Threads a
# program started do not survive into the next call (fork copies one thread).

def _session_state_loop(chan: socket.socket, workdir: str, mod: types.ModuleType) -> None:
    """A state process: wait for init's commands on `chan`; never returns.
    b"X" + fds [code_r, out_w, rep_w, new_chan]: run one call in a child that becomes the new state;
    b"F" + fds [new_chan]: a child that becomes a branch's state; EOF: end (the snapshot is dropped)."""
    import shutil

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # states never wait for their children: auto-reaped
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(chan, 64, 4)
        except OSError:
            os._exit(0)
        if not msg or not fds:
            os._exit(0)
        pid = os.fork()
        if pid != 0:
            for fd in fds:
                os.close(fd)
            continue
        chan.close()
        chan = socket.socket(fileno=fds[-1])
        newdir = f"/tmp/s{os.getpid()}"
        try:
            shutil.copytree(workdir, newdir, symlinks=True)
        except OSError:
            os.makedirs(newdir, exist_ok=True)
        workdir = newdir
        os.chdir(workdir)
        if msg[:1] == b"X":
            _session_call(*fds[:3], mod)
        chan.sendall(f"P {os.getpid()}\n".encode())


def _session_call(code_r: int, out_w: int, rep_w: int, mod: types.ModuleType) -> None:
    """One call in a session: stdout/stderr to out_w, "D <status>" on rep_w, then both closed."""
    status = "crash"
    try:
        sys.stdout.flush()
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        status = _receive_and_run(code_r, mod)
    except BaseException:  # noqa: BLE001
        _print_exc()
    _flush_std()
    try:
        os.write(rep_w, f"D {status}\n".encode())
    except OSError:
        pass
    devnull = os.open("/dev/null", os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    for fd in (devnull, code_r, out_w, rep_w):
        try:
            os.close(fd)
        except OSError:
            pass


def _session_init(lib, cfg: dict, mode: str, uid: int | None, ctl: socket.socket, pipes: tuple[int, int, int]) -> None:
    """init of a session family: start the root state, then relay the trainer's commands to states.
    Trainer -> init (ctl): "X src dst" + fds [code_r, out_w, rep_w]; "F src dst"; "Q id" (drop a state);
    "K id" (kill a state's process). init -> trainer: "R" (ready), "X dead id" (a state vanished)."""
    for fd in pipes:
        os.close(fd)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
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
            mod.__builtins__ = builtins
            b.sendall(f"P {os.getpid()}\n".encode())
            _session_state_loop(b, "/tmp/s0", mod)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    b.close()
    chans: dict[str, socket.socket] = {"0": a}
    pids: dict[str, int] = {}
    bufs: dict[str, bytes] = {}
    signal.signal(signal.SIGCHLD, lambda *_: _reap(None))
    inbox, ready_sent, fd_groups = b"", False, []
    while True:
        poller = select.poll()
        poller.register(ctl.fileno(), select.POLLIN)
        by_fd = {c.fileno(): k for k, c in chans.items()}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        try:
            events = poller.poll(1000)
        except InterruptedError:
            continue
        for fd, _ in events:
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
                    _session_command(cmd, group, chans, pids)
                continue
            k = by_fd[fd]
            try:
                data = chans[k].recv(4096)
            except OSError:
                data = b""
            if not data:
                chans.pop(k).close()
                if k in pids:
                    pids.pop(k)
                    try:
                        ctl.sendall(f"X dead {k}\n".encode())
                    except OSError:
                        os._exit(0)
                continue
            lines = (bufs.get(k, b"") + data).split(b"\n")
            bufs[k] = lines.pop()
            for line in lines:
                if line.startswith(b"P "):
                    pids[k] = int(line[2:])
                    if k == "0" and not ready_sent:
                        ready_sent = True
                        ctl.sendall(b"R\n")


def _session_command(cmd: str, fds: list[int], chans: dict, pids: dict) -> None:
    parts = cmd.split()
    op = parts[0] if parts else ""
    try:
        if op in ("X", "F") and len(parts) == 3 and parts[1] in chans:
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            socket.send_fds(chans[parts[1]], [op.encode()], [*(fds if op == "X" else []), b.fileno()])
            b.close()
            chans[parts[2]] = a
        elif op == "Q" and len(parts) == 2 and parts[1] in chans:
            pids.pop(parts[1], None)
            chans.pop(parts[1]).close()
        elif op == "K" and len(parts) == 2 and parts[1] in pids:
            os.kill(pids[parts[1]], signal.SIGKILL)
    except OSError:
        pass
    finally:
        for fd in fds:
            os.close(fd)
