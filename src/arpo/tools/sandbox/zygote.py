"""The zygote and what it forks: probe what the machine allows, then per worker join its cgroups,
enter new namespaces (c1), and run init, pid 1 of the call's namespaces, which forks the runner.

This is the entry point of the zygote process (`_zygote_main`, started by pool.py's bootstrap).
Loaded inside the zygote (see the package docstring): standard library only."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time

from .cgroups import SOCKET_MEM_MB, _CallCgroups, _join_cgroups, _oom_killed
from .fsview import _setup_namespaces_fs
from .linux import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    PR_SET_CHILD_SUBREAPER,
    _check,
    _kill_descendants,
    _libc,
    _reap,
)
from .netns import _limit_netns, _loopback_up
from .runner import _CODE_HEADER, _denies_ip_streams, _runner_main
from .seccomp import SECCOMP_DENY, SECCOMP_DENY_NO_MEMCG, _probe_seccomp
from .session import _session_init

SANDBOX_UID_SPAN = 100_000  # per-worker uids of one tool cycle through [uid_base, uid_base + span)


def _init_main(lib, cfg: dict, mode: str, uid: int | None, ctl: socket.socket, pipes: tuple[int, int, int],  # noqa: C901 - sandbox boot code (pid 1 of a call, no arpo imports); to be split per message (issue 42 item 3)
               oom_fd: int | None = None) -> None:
    """Pid 1 of the sandbox: set it up, fork the runner, watch the deadline, report crashes.

    The code and the runner's own report travel on pipes between the trainer and the runner
    directly (one scheduler wake-up less each way); init only hears "C <timeout>" when a call
    starts. It enforces that deadline itself (timeout + grace), so a runner dies even when the
    trainer hangs or leaked a copy of our socket into a forked child; when init exits, the
    kernel kills the whole pid namespace.
    """
    out_w, code_r, rep_w = pipes
    workdir = "/tmp"
    tmpdir = None
    try:
        if mode != "none":
            _setup_namespaces_fs(lib, cfg, foreign_uid=uid is not None)
            if not cfg["network"]:
                _limit_netns(bool(cfg.get("loopback_tcp")))
                try:
                    _loopback_up()
                except OSError:
                    pass
            lib.sethostname(b"sandbox", 7)
        else:
            import tempfile

            lib.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            tmpdir = workdir = tempfile.mkdtemp(prefix="arpo_py_")
            if uid is not None:
                os.chown(tmpdir, uid, uid)
        if cfg.get("session"):
            if mode == "none":
                raise OSError("python sessions need namespace isolation")
            _session_init(lib, cfg, mode, uid, ctl, pipes)
            os._exit(0)
        runner = os.fork()
        if runner == 0:
            ctl.close()
            _runner_main(lib, cfg, mode, uid, workdir, code_r, rep_w, out_w)
        for fd in pipes:
            os.close(fd)
    except BaseException as e:  # noqa: BLE001
        try:
            ctl.sendall(f"E sandbox setup failed: {type(e).__name__}: {e}\n".encode())
        finally:
            os._exit(1)

    def finish(*_):
        if mode == "none":
            _kill_descendants()
            if tmpdir:
                import shutil

                shutil.rmtree(tmpdir, ignore_errors=True)
        os._exit(0)

    def send(line: str) -> None:
        try:
            ctl.sendall(line.encode() + b"\n")
        except OSError:
            finish()

    signal.signal(signal.SIGTERM, finish)
    pidfd = os.pidfd_open(runner)
    poller = select.poll()
    poller.register(ctl.fileno(), select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    inbox, deadline = b"", None
    while True:
        wait_ms = 1000 if deadline is None else max(0, (deadline - time.monotonic()) * 1000)
        events = poller.poll(wait_ms)
        runner_status = _reap(runner)
        if any(fd == ctl.fileno() for fd, _ in events):
            chunk = ctl.recv(4096)
            if not chunk:
                finish()  # the trainer is gone or gave up on us
            inbox += chunk
            if deadline is None and len(inbox) >= 1 + _CODE_HEADER.size:
                timeout_s, _n = _CODE_HEADER.unpack(inbox[1 : 1 + _CODE_HEADER.size])
                deadline = time.monotonic() + timeout_s + 1.0
        if runner_status is None and any(fd == pidfd for fd, _ in events):
            runner_status = _reap(runner)
        if runner_status is not None:
            if os.WIFSIGNALED(runner_status) and os.WTERMSIG(runner_status) == signal.SIGKILL and _oom_killed(oom_fd):
                send("X oom")
            elif os.WIFSIGNALED(runner_status):
                send(f"X signal {os.WTERMSIG(runner_status)}")
            else:
                send(f"X wexit {os.waitstatus_to_exitcode(runner_status)}")
            finish()
        if deadline is not None and time.monotonic() >= deadline:
            send("T")
            finish()


def _spawn_worker(lib, cfg: dict, mode: str, uid: int | None, ctl: socket.socket, pipes: tuple[int, int, int],
                  cgroups: list[str] | tuple[str, ...] = ()) -> None:
    """In the zygote's child (c1): join the call's cgroups, enter new namespaces, fork init, hand
    init's pidfd upward."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if not cfg["network"]:
        flags |= CLONE_NEWNET
    try:
        oom_fd = _join_cgroups(list(cgroups)) if cgroups else None
        _unshare(lib, flags, mode)
        init = os.fork()
        if init == 0:
            _init_main(lib, cfg, mode, uid, ctl, pipes, oom_fd)
            os._exit(0)
        pidfd = os.pidfd_open(init)  # race-free: init is our own child and not yet reaped
        socket.send_fds(ctl, [f"P {init}\n".encode()], [pidfd])
    except BaseException as e:  # noqa: BLE001
        why = f"{type(e).__name__}: {e}"
        if isinstance(e, BlockingIOError):  # fork: EAGAIN is the pids cgroup saying no
            why += f" (the tool-wide process limit, tool_pids={cfg.get('tool_pids')}, is reached)"
        try:
            ctl.sendall(f"E sandbox spawn failed: {why}\n".encode())
        except OSError:
            pass
    os._exit(0)


def _unshare(lib, flags: int, mode: str) -> None:
    """Enter the new namespaces `flags` (CLONE_NEW*) in isolation `mode`: "namespaces" (root) as they
    are; "userns" inside a new user namespace too, where the caller's uid and gid map to 0 (setgroups
    denied); "none": nothing."""
    if mode == "userns":
        uid, gid = os.getuid(), os.getgid()
        _check(lib.unshare(flags | CLONE_NEWUSER), "unshare")
        for path, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{path}", "w") as f:
                f.write(text)
    elif mode == "namespaces":
        _check(lib.unshare(flags), "unshare")


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
                        view = _setup_namespaces_fs(lib, cfg, foreign_uid=mode == "namespaces")
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


def _zygote_main(cfg: dict, sock: socket.socket) -> None:  # noqa: C901 - sandbox boot code (the zygote, no arpo imports); to be split per message (issue 42 item 3)
    """Entry point of the zygote process (see the module docstring and _ZYGOTE_BOOT)."""
    preloaded = []
    for name in cfg["preimport"]:
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
    lib = _libc()
    mode, why = _probe_mode(lib, cfg)  # before the SIGCHLD handler, which would reap the probe
    cgs = _CallCgroups(cfg) if cfg.get("memory_cgroup", True) and mode != "none" and os.geteuid() == 0 else None
    cfg["_memcg"] = bool(cgs and cgs.memory)
    seccomp = cfg.get("seccomp", True) and mode != "none" and _probe_seccomp(
        SECCOMP_DENY + (() if cfg["_memcg"] else SECCOMP_DENY_NO_MEMCG), _denies_ip_streams(cfg))
    cfg["_seccomp_required"] = seccomp  # it worked in the probe: a worker without it is a failure
    lib.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphaned inits come back to us to be reaped
    signal.signal(signal.SIGCHLD, lambda *_: _reap(None))
    switch_uid = os.geteuid() == 0 and mode != "userns"
    memcg_why = ("" if cfg["_memcg"] else (cgs.why if cgs else "needs root and namespaces" if mode != "none" or
                                           os.geteuid() != 0 else "disabled"))
    protections = {
        "namespaces": mode != "none", "fs_view": cfg.get("_fs_view", "unknown"), "uid_switch": switch_uid,
        "memory_cgroup": cfg["_memcg"], "memory_cgroup_why": memcg_why,
        "memory_bound_mb": cgs.bound_mb() if cgs and cfg["_memcg"] else None,
        "socket_memory": ("not bounded" if not cfg["_memcg"] else f"own limit of {SOCKET_MEM_MB} MB (cgroup v1)"
                          if cgs and cgs.v1 else "in the memory limit (cgroup v2)"),
        "pids_cgroup": bool(cgs and "pids" in cgs.parents), "seccomp": seccomp,
        "cpu_cgroup": bool(cgs and cgs.cpu), "cpu_cgroup_why": (cgs.cpu_why or "no cpu cgroup controller mounted"
                                                               if cgs and not cgs.cpu else ""),
        "cpus": float(cfg["cpus"]) if cgs and cgs.cpu else None,
        "cpus_per_call": float(cfg["cpus_per_call"]) if cgs and cgs.cpu else None,
        "max_calls": int(cfg["max_calls"]), "tool_memory_mb": int(cfg["tool_memory_mb"]) if cfg["_memcg"] else None,
        "tool_pids": int(cfg["tool_pids"]) if cgs and "pids" in cgs.parents else None,
        "seccomp_denied": list(SECCOMP_DENY + (() if cfg["_memcg"] else SECCOMP_DENY_NO_MEMCG)) if seccomp else [],
        "max_ptys": int(cfg.get("max_ptys", 8)) if mode != "none" else None, "network": bool(cfg["network"]),
        "ip_stream_sockets": ("denied" if seccomp and _denies_ip_streams(cfg) else "host network" if cfg["network"]
                              else "allowed, unaccepted connections not bounded" if cfg.get("loopback_tcp")
                              else "allowed (no seccomp)"),
    }
    try:
        sock.sendall(json.dumps({"mode": mode, "why": why, "preloaded": preloaded, "uid_switch": switch_uid,
                                 "protections": protections}).encode())
    except OSError:  # the tool was closed while we started (a command that failed early): leave quietly
        return
    count = 0
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 4)
        except OSError:
            break
        if not msg:
            break  # the trainer closed the tool or died
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        if cfg["uid"] is not None:
            uid = int(cfg["uid"]) if switch_uid else None
        else:
            uid = int(cfg["uid_base"]) + count % SANDBOX_UID_SPAN if switch_uid else None
        count += 1
        dirs: list[str] = []
        if cgs is not None and cgs.memory:
            cgs.sweep()
            try:
                dirs = cgs.create(count)
            except OSError as e:  # no worker without its memory bound: the trainer retries
                try:
                    os.write(fds[0], f"E no memory cgroup for the worker: {e}\n".encode())
                except OSError:
                    pass
                for fd in fds:
                    os.close(fd)
                continue
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            sock.close()
            ctl = socket.socket(fileno=fds[0])
            _spawn_worker(lib, cfg, mode, uid, ctl, (fds[1], fds[2], fds[3]), dirs)
            os._exit(0)
        for fd in fds:
            os.close(fd)
    # Shutting down: kill every sandbox that is still ours, reap, remove their cgroups, leave.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _kill_descendants()
    if cgs is not None:
        cgs.close()  # waits until the kernel has emptied them (bounded by CGROUP_TEARDOWN_S)
    os._exit(0)
