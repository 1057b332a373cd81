"""The zygote and what it forks: probe what the machine allows, then per worker join its cgroups,
enter new namespaces (c1), and run init, pid 1 of the call's namespaces, which forks the runner.

This is the entry point of the zygote process (`zygote_main`, started by pool.py's bootstrap); the
messages it and init send and read are protocol.py's (ZYGOTE, CTL).
Loaded inside the zygote (see the package docstring): standard library only."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import tempfile
import time

from .cgroups import SOCKET_MEM_MB, CallCgroups, join_cgroups, oom_killed
from .fsview import setup_namespaces_fs
from .linux import (
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    PR_SET_CHILD_SUBREAPER,
    check_ret,
    kill_descendants,
    load_libc,
    reap,
)
from .netns import limit_netns, loopback_up
from .protocol import DEADLINE, ENDED, FAILED, INIT_PID, SPAWN, ProtocolError, decode_arm
from .runner import denies_ip_streams, runner_main
from .seccomp import SECCOMP_DENY, SECCOMP_DENY_NO_MEMCG, probe_seccomp
from .session import session_init

SANDBOX_UID_SPAN = 100_000  # per-worker uids of one tool cycle through [uid_base, uid_base + span)


def _init_main(lib, cfg: dict, mode: str, uid: int | None, ctl: socket.socket, pipes: tuple[int, int, int],
               oom_fd: int | None = None) -> None:
    """Pid 1 of the sandbox: set it up, fork the runner (or, for a session family, become its
    init: session.py), watch the deadline, report how the runner ended. Never returns.

    The code and the runner's own report travel on pipes between the trainer and the runner
    directly (one scheduler wake-up less each way); init only hears ARM ("C" + the code header)
    when a call starts. It enforces that deadline itself (timeout + grace), so a runner dies even
    when the trainer hangs or leaked a copy of our socket into a forked child; when init exits,
    the kernel kills the whole pid namespace.
    """
    try:
        workdir, tmpdir = _enter_call_view(lib, cfg, mode, uid)
        if cfg.get("session"):
            if mode == "none":
                raise OSError("python sessions need namespace isolation")
            session_init(lib, cfg, mode, uid, ctl, pipes)
            os._exit(0)
        runner = _start_runner(lib, cfg, mode, uid, workdir, ctl, pipes)
    except BaseException as e:  # noqa: BLE001
        try:
            ctl.sendall(FAILED.encode(_one_line(f"sandbox setup failed: {type(e).__name__}: {e}")))
        finally:
            os._exit(1)
    _CallInit(ctl, runner, mode, tmpdir, oom_fd).watch()


def _one_line(text: str) -> str:
    """An error text as one protocol field (a line of its own)."""
    return " ".join(text.splitlines())


def _enter_call_view(lib, cfg: dict, mode: str, uid: int | None) -> tuple[str, str | None]:
    """init's first step: with namespaces, the call's filesystem view, its network namespace (loopback
    only, unless the tool has the network) and host name; without, a temporary working directory
    (owned by the call's uid) and the subreaper bit. Returns (working directory, temporary
    directory to remove at the end or None)."""
    if mode != "none":
        setup_namespaces_fs(lib, cfg, foreign_uid=uid is not None)
        if not cfg["network"]:
            limit_netns(bool(cfg.get("loopback_tcp")))
            try:
                loopback_up()
            except OSError:
                pass
        lib.sethostname(b"sandbox", 7)
        return "/tmp", None

    lib.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    tmpdir = tempfile.mkdtemp(prefix="arpo_py_")
    if uid is not None:
        os.chown(tmpdir, uid, uid)
    return tmpdir, tmpdir


def _start_runner(lib, cfg: dict, mode: str, uid: int | None, workdir: str, ctl: socket.socket,
                  pipes: tuple[int, int, int]) -> int:
    """Fork the runner (runner.py), which keeps the call's pipes; init closes its copies. Its pid."""
    out_w, code_r, rep_w = pipes
    runner = os.fork()
    if runner == 0:
        ctl.close()
        runner_main(lib, cfg, mode, uid, workdir, code_r, rep_w, out_w)
    for fd in pipes:
        os.close(fd)
    return runner


class _CallInit:
    """A one-shot init's watch over its runner: read ARM on `ctl` (it starts the deadline: timeout +
    1 s), and report on `ctl` how the runner ended (ENDED) or that the deadline passed (DEADLINE);
    then end, and with it the pid namespace. The trainer closing `ctl`, or SIGTERM, ends it too."""

    def __init__(self, ctl: socket.socket, runner: int, mode: str, tmpdir: str | None, oom_fd: int | None):
        self.ctl, self.runner, self.mode, self.tmpdir, self.oom_fd = ctl, runner, mode, tmpdir, oom_fd
        self.inbox = b""
        self.deadline: float | None = None

    def finish(self, *_) -> None:
        if self.mode == "none":
            kill_descendants()
            if self.tmpdir:
                shutil.rmtree(self.tmpdir, ignore_errors=True)
        os._exit(0)

    def send(self, line: bytes) -> None:
        try:
            self.ctl.sendall(line)
        except OSError:
            self.finish()

    def watch(self) -> None:
        signal.signal(signal.SIGTERM, self.finish)
        pidfd = os.pidfd_open(self.runner)
        poller = select.poll()
        poller.register(self.ctl.fileno(), select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        while True:
            wait_ms = 1000 if self.deadline is None else max(0, (self.deadline - time.monotonic()) * 1000)
            events = poller.poll(wait_ms)
            runner_status = reap(self.runner)
            if any(fd == self.ctl.fileno() for fd, _ in events):
                self._read_ctl()
            if runner_status is None and any(fd == pidfd for fd, _ in events):
                runner_status = reap(self.runner)
            if runner_status is not None:
                self.send(ENDED.encode(_runner_end(runner_status, self.oom_fd)))
                self.finish()
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.send(DEADLINE.encode())
                self.finish()

    def _read_ctl(self) -> None:
        chunk = self.ctl.recv(4096)
        if not chunk:
            self.finish()  # the trainer is gone or gave up on us
        self.inbox += chunk
        if self.deadline is None:
            try:
                timeout_s = decode_arm(self.inbox)
            except ProtocolError:  # (only the trainer writes here) not a call's start: no deadline from it
                return
            if timeout_s is not None:
                self.deadline = time.monotonic() + timeout_s + 1.0


def _runner_end(status: int, oom_fd: int | None) -> str:
    """How the runner ended, as ENDED's field: "oom" (SIGKILL by the memory cgroup), "signal N", "wexit N"."""
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL and oom_killed(oom_fd):
        return "oom"
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"wexit {os.waitstatus_to_exitcode(status)}"


def _spawn_worker(lib, cfg: dict, mode: str, uid: int | None, ctl: socket.socket, pipes: tuple[int, int, int],
                  cgroups: list[str] | tuple[str, ...] = ()) -> None:
    """In the zygote's child (c1): join the call's cgroups, enter new namespaces, fork init, hand
    init's pidfd upward."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if not cfg["network"]:
        flags |= CLONE_NEWNET
    if os.path.exists("/proc/self/ns/cgroup"):  # after joining them: /proc/self/cgroup shows "/", not the host's path
        flags |= CLONE_NEWCGROUP
    try:
        oom_fd = join_cgroups(list(cgroups)) if cgroups else None
        _unshare(lib, flags, mode)
        init = os.fork()
        if init == 0:
            _init_main(lib, cfg, mode, uid, ctl, pipes, oom_fd)
            os._exit(0)
        pidfd = os.pidfd_open(init)  # race-free: init is our own child and not yet reaped
        socket.send_fds(ctl, [INIT_PID.encode(init)], [pidfd])
    except BaseException as e:  # noqa: BLE001
        why = f"{type(e).__name__}: {e}"
        if isinstance(e, BlockingIOError):  # fork: EAGAIN is the pids cgroup saying no
            why += f" (the tool-wide process limit, tool_pids={cfg.get('tool_pids')}, is reached)"
        try:
            ctl.sendall(FAILED.encode(_one_line(f"sandbox spawn failed: {why}")))
        except OSError:
            pass
    os._exit(0)


def _unshare(lib, flags: int, mode: str) -> None:
    """Enter the new namespaces `flags` (CLONE_NEW*) in isolation `mode`: "namespaces" (root) as they
    are; "userns" inside a new user namespace too, where the caller's uid and gid map to 0 (setgroups
    denied); "none": nothing."""
    if mode == "userns":
        uid, gid = os.getuid(), os.getgid()
        check_ret(lib.unshare(flags | CLONE_NEWUSER), "unshare")
        for path, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{path}", "w") as f:
                f.write(text)
    elif mode == "namespaces":
        check_ret(lib.unshare(flags), "unshare")


def _probe_mode(lib, cfg: dict) -> tuple[str, str]:
    """Find the strongest isolation this machine allows by trying it once in a throwaway child."""
    candidates = ["namespaces", "userns"] if os.geteuid() == 0 else ["userns"]
    errors: list[str] = []
    for mode in candidates:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET
                _unshare(lib, flags, mode)
                child = os.fork()
                if child == 0:
                    try:
                        view = setup_namespaces_fs(lib, cfg, foreign_uid=mode == "namespaces")
                        os.write(w, f"VIEW {view}".encode())
                        os._exit(0)
                    except BaseException as e:  # noqa: BLE001
                        os.write(w, f"{type(e).__name__}: {e}".encode()[:500])
                        os._exit(1)
                _, st = os.waitpid(child, 0)
                os._exit(0 if st == 0 else 1)
            except BaseException as e:  # noqa: BLE001
                os.write(w, f"{type(e).__name__}: {e}".encode()[:500])
                os._exit(1)
        os.close(w)
        _, st = os.waitpid(pid, 0)
        msg = os.read(r, 1000).decode(errors="replace")
        os.close(r)
        if st == 0:
            cfg["_fs_view"] = msg[5:] if msg.startswith("VIEW ") else "unknown"
            return mode, "; ".join(errors)
        errors.append(f"{mode}: {msg or 'failed'}")
    cfg["_fs_view"] = "host (no namespaces)"
    return "none", "; ".join(errors)


def zygote_main(cfg: dict, sock: socket.socket) -> None:
    """Entry point of the zygote process (see the module docstring and pool.py's _ZYGOTE_BOOT):
    pre-import, probe what the machine allows, say so to the trainer, then start a worker for each
    SPAWN until the trainer closes the socket; then tear every sandbox down."""
    preloaded = _preimport(cfg["preimport"])
    lib = load_libc()
    mode, why = _probe_mode(lib, cfg)  # before the SIGCHLD handler, which would reap the probe
    cgs = CallCgroups(cfg) if cfg.get("memory_cgroup", True) and mode != "none" and os.geteuid() == 0 else None
    cfg["_memcg"] = bool(cgs and cgs.memory)
    seccomp = cfg.get("seccomp", True) and mode != "none" and probe_seccomp(
        SECCOMP_DENY + (() if cfg["_memcg"] else SECCOMP_DENY_NO_MEMCG), denies_ip_streams(cfg))
    cfg["_seccomp_required"] = seccomp  # it worked in the probe: a worker without it is a failure
    lib.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphaned inits come back to us to be reaped
    signal.signal(signal.SIGCHLD, lambda *_: reap(None))
    switch_uid = os.geteuid() == 0 and mode != "userns"
    try:
        sock.sendall(json.dumps({"mode": mode, "why": why, "preloaded": preloaded, "uid_switch": switch_uid,
                                 "protections": _protections(cfg, mode, cgs, seccomp, switch_uid)}).encode())
    except OSError:  # the tool was closed while we started (a command that failed early): leave quietly
        return
    _serve_spawns(lib, cfg, sock, mode, cgs, switch_uid)
    # Shutting down: kill every sandbox that is still ours, reap, remove their cgroups, leave.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    kill_descendants()
    if cgs is not None:
        cgs.close()  # waits until the kernel has emptied them (bounded by CGROUP_TEARDOWN_S)
    os._exit(0)


def _preimport(names: list[str]) -> list[str]:
    """Import the libraries calls will use (those installed), so that every fork has them loaded;
    the ones that loaded."""
    preloaded = []
    for name in names:
        try:
            __import__(name)
            preloaded.append(name)
        except Exception:  # noqa: BLE001 - an optional library that is not installed
            pass
    if "numpy" in preloaded:
        for name in ("numpy.random", "numpy.linalg"):  # numpy 2 loads these lazily
            try:
                __import__(name)
            except Exception:  # noqa: BLE001
                pass
    if "sympy" in preloaded:
        try:  # first use pulls in the parser and printer modules: do it once here
            import sympy

            str(sympy.simplify(sympy.sympify("x**2 + 2*x + 1")))
        except Exception:  # noqa: BLE001
            pass
    return preloaded


def _protections(cfg: dict, mode: str, cgs: CallCgroups | None, seccomp: bool, switch_uid: bool) -> dict:
    """What this machine let the sandbox put in place (PythonTool.protections), with the reason
    where something is missing."""
    memcg, cpu = cfg["_memcg"], bool(cgs and cgs.cpu)
    pids = bool(cgs and "pids" in cgs.parents)
    denied = SECCOMP_DENY + (() if memcg else SECCOMP_DENY_NO_MEMCG)
    return {
        "namespaces": mode != "none", "fs_view": cfg.get("_fs_view", "unknown"), "uid_switch": switch_uid,
        "memory_cgroup": memcg, "memory_cgroup_why": _memcg_why(mode, cgs, memcg),
        "memory_bound_mb": cgs.bound_mb() if cgs and memcg else None,
        "socket_memory": _socket_memory(cgs, memcg),
        "pids_cgroup": pids, "seccomp": seccomp,
        "cpu_cgroup": cpu, "cpu_cgroup_why": (cgs.cpu_why or "no cpu cgroup controller mounted"
                                             if cgs and not cgs.cpu else ""),
        "cpus": float(cfg["cpus"]) if cpu else None,
        "cpus_per_call": float(cfg["cpus_per_call"]) if cpu else None,
        "max_calls": int(cfg["max_calls"]), "tool_memory_mb": int(cfg["tool_memory_mb"]) if memcg else None,
        "tool_pids": int(cfg["tool_pids"]) if pids else None,
        "seccomp_denied": list(denied) if seccomp else [],
        "max_ptys": int(cfg.get("max_ptys", 8)) if mode != "none" else None, "network": bool(cfg["network"]),
        "ip_stream_sockets": _ip_stream_sockets(cfg, seccomp),
    }


def _memcg_why(mode: str, cgs: CallCgroups | None, memcg: bool) -> str:
    if memcg:
        return ""
    if cgs:
        return cgs.why
    return "needs root and namespaces" if mode != "none" or os.geteuid() != 0 else "disabled"


def _socket_memory(cgs: CallCgroups | None, memcg: bool) -> str:
    if not memcg:
        return "not bounded"
    return f"own limit of {SOCKET_MEM_MB} MB (cgroup v1)" if cgs and cgs.v1 else "in the memory limit (cgroup v2)"


def _ip_stream_sockets(cfg: dict, seccomp: bool) -> str:
    if seccomp and denies_ip_streams(cfg):
        return "denied"
    if cfg["network"]:
        return "host network"
    return "allowed, unaccepted connections not bounded" if cfg.get("loopback_tcp") else "allowed (no seccomp)"


def _serve_spawns(lib, cfg: dict, sock: socket.socket, mode: str, cgs: CallCgroups | None, switch_uid: bool) -> None:
    """Start a worker for each SPAWN (its four descriptors: ctl, out_w, code_r, rep_w) until the
    trainer closes the socket or dies."""
    count = 0
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 4)
        except OSError:
            return
        if not msg:
            return  # the trainer closed the tool or died
        if len(fds) != len(SPAWN.fds):
            _close_all(fds)
            continue
        count += 1
        _spawn_one(lib, cfg, sock, mode, cgs, _worker_uid(cfg, switch_uid, count - 1), count, fds)


def _worker_uid(cfg: dict, switch_uid: bool, n: int) -> int | None:
    """The uid of the tool's `n`-th worker: the configured one, else the next of the tool's block
    (None: no uid switch)."""
    if not switch_uid:
        return None
    if cfg["uid"] is not None:
        return int(cfg["uid"])
    return int(cfg["uid_base"]) + n % SANDBOX_UID_SPAN


def _spawn_one(lib, cfg: dict, sock: socket.socket, mode: str, cgs: CallCgroups | None, uid: int | None,
               count: int, fds: list[int]) -> None:
    """Give the worker its memory cgroup (none: it fails, and the trainer retries) and fork c1."""
    dirs: list[str] = []
    if cgs is not None and cgs.memory:
        cgs.sweep()
        try:
            dirs = cgs.create(count)
        except OSError as e:  # no worker without its memory bound: the trainer retries
            try:
                os.write(fds[0], FAILED.encode(_one_line(f"no memory cgroup for the worker: {e}")))
            except OSError:
                pass
            _close_all(fds)
            return
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        ctl = socket.socket(fileno=fds[0])
        _spawn_worker(lib, cfg, mode, uid, ctl, (fds[1], fds[2], fds[3]), dirs)
        os._exit(0)
    _close_all(fds)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
