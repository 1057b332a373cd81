"""The trainer's side of the sandbox: start the zygote (a bootstrap that loads this package's
sandbox-side modules by path), ask it for workers, and keep a pool of ready ones.

Trainer side: never loaded inside the zygote."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from .cgroups import CGROUP_TEARDOWN_S
from .protocol import (
    CTL,
    ENDED,
    FAILED,
    FAMILY_READY,
    INIT_PID,
    RUNNER,
    RUNNER_READY,
    SPAWN,
    Channel,
    Message,
    ProtocolError,
)
from .runner import SANDBOX_ENV

log = logging.getLogger(__name__)


_warned_modes: set[str | None] = set()
# the sandbox modules' file name in the zygote's code objects (tracebacks, faults)
SANDBOX_SOURCE_NAME = "<arpo-sandbox>"
# The sandbox side, in dependency order: each imports only the standard library and the ones before it.
ZYGOTE_MODULES = ("protocol", "linux", "fsview", "netns", "seccomp", "cgroups", "runner", "session", "zygote")
ZYGOTE_PACKAGE = "_arpo_sandbox"  # their package's name inside the zygote (not `arpo`: nothing of it is imported)
# The zygote's command line is what every call sees as /proc/1/cmdline (init is a fork of the
# zygote): it carries no configuration and no host path. Both arrive as the first message on the
# socket. The bootstrap compiles ZYGOTE_MODULES from their source text (sent, not their paths) into a
# package of their own (their relative imports find each other in sys.modules), without the `arpo`
# package, so no package import can bloat or break the zygote; each is compiled under
# SANDBOX_SOURCE_NAME, so frames do not show a host path. What the zygote's forks run later is all
# loaded here: nothing is imported from the host tree inside a call's filesystem view.
# No host path of the project enters the zygote's memory (issue 37: a call could read it from its own
# sys.path): `-S` skips `site`, whose .pth files (an editable install's) put the project's source tree
# on sys.path; the bootstrap sets sys.prefix and sys.path to the interpreter's own directories
# (`_zygote_path`) and then does what `site` does that code relies on (exit(), quit(), help()).
# SIGINT is ignored first thing, and so by every worker forked from the zygote: Ctrl-C in a terminal
# signals the whole foreground process group, and the trainer, not the sandbox, decides when to stop
# (train finishes its step after Ctrl-C, with working tools, then closes the sandbox).
_ZYGOTE_BOOT = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "import json, socket, sys, types\n"
    "sock = socket.socket(fileno=int(sys.argv[1]))\n"
    "setup = json.loads(sock.recv(1 << 21))\n"
    "sys.prefix, sys.exec_prefix = setup['prefix']\n"
    "sys.path[:] = setup['path']\n"
    "import site\n"
    "site.PREFIXES[:] = [sys.prefix, sys.exec_prefix]\n"
    "site.setquit(); site.setcopyright(); site.sethelper()\n"
    "pkg = types.ModuleType(setup['package'])\n"
    "pkg.__path__ = []\n"
    "sys.modules[pkg.__name__] = pkg\n"
    "for name, source in setup['modules']:\n"
    "    mod = types.ModuleType(f'{pkg.__name__}.{name}')\n"
    "    mod.__package__ = pkg.__name__\n"
    "    sys.modules[mod.__name__] = mod\n"
    "    setattr(pkg, name, mod)\n"
    "    exec(compile(source, setup['name'], 'exec'), mod.__dict__)\n"
    "del setup['modules'], name, source\n"
    "mod.zygote_main(setup['cfg'], sock)\n"
)


def _zygote_path() -> list[str]:
    """The zygote's sys.path: this interpreter's entries that lie inside its own prefixes (stdlib,
    lib-dynload, site-packages), in order; never the current directory, PYTHONPATH or a .pth file's
    directory outside them (an editable install's source tree)."""
    roots = {os.path.realpath(p).rstrip("/") + "/" for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                             sys.base_exec_prefix)}
    out = []
    for p in sys.path:
        if p and os.path.isabs(p) and any((os.path.realpath(p) + "/").startswith(r) for r in roots) and p not in out:
            out.append(p)
    return out


def _zygote_setup(cfg: dict) -> bytes:
    """The zygote's first message: its configuration, sys.prefix and sys.path, and the sandbox
    modules' source text, in order."""
    here = os.path.dirname(os.path.abspath(__file__))
    modules = []
    for name in ZYGOTE_MODULES:
        with open(os.path.join(here, f"{name}.py"), encoding="utf-8") as f:
            modules.append([name, f.read()])
    return json.dumps({"cfg": cfg, "package": ZYGOTE_PACKAGE, "modules": modules, "name": SANDBOX_SOURCE_NAME,
                       "prefix": [sys.prefix, sys.exec_prefix], "path": _zygote_path()}).encode()


class SandboxUnavailable(RuntimeError):
    """The zygote could not be started or produced no worker in time."""


class _Zygote:
    """The trainer's handle on the zygote process: start it, ask it for workers."""

    def __init__(self, cfg: dict, start_timeout_s: float):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-c", _ZYGOTE_BOOT, str(child.fileno())],
                pass_fds=(child.fileno(),), env=dict(SANDBOX_ENV), cwd="/",
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            )
        finally:
            child.close()
        parent.sendall(_zygote_setup(cfg))
        self.sock = parent
        self.cfg = cfg
        self.lock = threading.Lock()
        parent.settimeout(start_timeout_s)
        try:
            hello = parent.recv(65536)
        except OSError as e:
            self.close()
            raise SandboxUnavailable(f"the python sandbox did not start: {e}") from e
        if not hello:
            self.close()
            raise SandboxUnavailable("the python sandbox exited during start-up")
        parent.settimeout(None)
        self.info = json.loads(hello)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self) -> Worker:
        """Ask the zygote for one worker; it arrives asynchronously (see `Worker.wait_ready`)."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        code_r, code_w = os.pipe2(os.O_CLOEXEC)
        rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
        try:
            with self.lock:
                socket.send_fds(self.sock, [SPAWN.encode()], [child.fileno(), out_w, code_r, rep_w])
        except OSError:
            parent.close()
            for fd in (out_r, code_w, rep_r):
                os.close(fd)
            raise
        finally:
            child.close()
            for fd in (out_w, code_r, rep_w):
                os.close(fd)
        return Worker(parent, out_r, code_w, rep_r, self.info["mode"], session=bool(self.cfg.get("session")))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        try:  # the zygote kills its calls and removes their cgroups (CGROUP_TEARDOWN_S), then exits
            self.proc.wait(timeout=CGROUP_TEARDOWN_S + 5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Worker:
    """One pre-started sandbox, good for exactly one call.

    Channels: `ctl` talks to init (its pidfd arrives on it; crash and deadline reports come
    back on it); `code_w` / `rep_r` go straight to the runner (code in; "R" ready and
    "D <status>" done out); `out_r` carries the program's stdout and stderr.
    """

    def __init__(self, ctl: socket.socket, out_r: int, code_w: int, rep_r: int, mode: str, session: bool = False):
        self.ctl, self.mode = ctl, mode
        # the runner pipes; None once a session family closed them (python_session.py: per-call pipes)
        self.out_r: int | None = out_r
        self.code_w: int | None = code_w
        self.rep_r: int | None = rep_r
        self.session = session  # a session family: "R" comes from init, the runner pipes are unused
        self.ctl.setblocking(False)
        self.pidfd: int | None = None
        self.pid: int | None = None
        self.ctl_buf = self.rep_buf = b""
        self.ready = False
        self.lock = threading.Lock()  # warm_up() may wait on a worker that a call then takes

    def runner_pipes(self) -> tuple[int, int, int]:
        """(out_r, code_w, rep_r), which every worker has until a session family closes them."""
        if self.out_r is None or self.code_w is None or self.rep_r is None:
            raise SandboxUnavailable("this python sandbox worker's runner pipes are closed (a session family's)")
        return self.out_r, self.code_w, self.rep_r

    def read_ctl(self) -> list[str]:
        """Status lines from init (and init's pidfd, attached to the first one); 'EOF' at the end."""
        try:
            data, fds, _, _ = socket.recv_fds(self.ctl, 65536, 4)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            data, fds = b"", []
        for fd in fds:
            if self.pidfd is None:
                self.pidfd = fd
            else:
                os.close(fd)
        if not data:
            return ["EOF"]
        lines = (self.ctl_buf + data).split(b"\n")
        self.ctl_buf = lines.pop()[-4096:]
        return [ln.decode("utf-8", "replace") for ln in lines]

    def read_rep(self) -> list[str]:
        """Lines from the runner; the model's code can write here too, so they are only hints."""
        try:
            data = os.read(self.runner_pipes()[2], 4096)
        except BlockingIOError:
            return []
        if not data:
            return ["EOF"]
        lines = (self.rep_buf + data).split(b"\n")
        self.rep_buf = lines.pop()[-4096:]
        return [ln.decode("utf-8", "replace")[:64] for ln in lines]

    def wait_ready(self, deadline: float) -> None:
        with self.lock:
            self._wait_ready(deadline)

    def _wait_ready(self, deadline: float) -> None:
        poller = select.poll()
        poller.register(self.ctl.fileno(), select.POLLIN)
        poller.register(self.runner_pipes()[2], select.POLLIN)
        while not (self.ready and self.pidfd is not None):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxUnavailable("a python sandbox worker did not become ready in time")
            for fd, _ in poller.poll(max(1, int(remaining * 1000))):
                from_ctl = fd == self.ctl.fileno()
                lines = self.read_ctl() if from_ctl else self.read_rep()
                if self.session and fd == self.rep_r and lines == ["EOF"]:
                    poller.unregister(self.rep_r)  # init closed the unused runner pipes
                    continue
                for line in lines:
                    self._starting(line, CTL if from_ctl else RUNNER)

    def _starting(self, line: str, channel: Channel) -> None:
        """One message from c1 or init (CTL) or the runner (RUNNER) while the worker starts, by its
        handler (_on_start); one that does not belong here fails the worker, saying what came."""
        if line == "EOF":
            raise SandboxUnavailable("a sandbox worker died at start")
        try:
            channel.dispatch(line, self._on_start, self)
        except ProtocolError as e:
            raise SandboxUnavailable(f"a python sandbox worker sent what it should not at start: {e}") from None

    def _on_pid(self, pid: str) -> None:
        """INIT_PID: init's pid (its pidfd came with it: read_ctl)."""
        if not pid.isdigit():
            raise ProtocolError(f"{INIT_PID!r}: the pid must be a number, got {pid!r}")
        self.pid = int(pid)

    def _on_ready(self) -> None:
        """RUNNER_READY (a one-shot runner, on its report pipe) or FAMILY_READY (a session family's init)."""
        self.ready = True

    def _on_failed(self, why: str) -> None:
        raise SandboxUnavailable(why)

    def _on_ended(self, how: str) -> None:
        raise SandboxUnavailable("a sandbox worker died at start")

    _on_start: Mapping[Message, Callable[..., Any]] = {
        INIT_PID: _on_pid, RUNNER_READY: _on_ready, FAMILY_READY: _on_ready, FAILED: _on_failed, ENDED: _on_ended}

    def kill(self) -> None:
        """Kill init: in namespace mode the kernel then kills everything the call started."""
        sig = signal.SIGKILL if self.mode != "none" else signal.SIGTERM
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
        except OSError:
            pass

    def close(self) -> None:
        self.kill()
        for fd in (self.out_r, self.code_w, self.rep_r, self.pidfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.ctl.close()


class PoolState:
    """The zygote and the queue of ready workers, shared by the tool and its refill thread.

    Kept apart from `PythonTool` so that a garbage-collected tool can still be shut down by
    its finalizer (the thread holds this, not the tool)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.pool: deque[Worker] = deque()
        self.closed = False
        self.zygote: _Zygote | None = None
        self.info: dict = {}
        self.error: str | None = None

    def wait_info(self, timeout_s: float) -> dict:
        end = time.monotonic() + timeout_s
        with self.cond:
            while not self.info and not self.error and not self.closed and time.monotonic() < end:
                self.cond.wait(0.1)
            return dict(self.info)

    def refill_loop(self, cfg: dict, size: int, start_timeout_s: float) -> None:
        backoff = 0.1
        while True:
            with self.cond:
                while not self.closed and len(self.pool) >= size:
                    self.cond.wait()
                if self.closed:
                    return
            try:
                if self.zygote is None or not self.zygote.alive():
                    if self.zygote is not None:
                        self.zygote.close()
                    self.zygote = _Zygote(cfg, start_timeout_s)
                    self._announce(self.zygote.info, cfg)
                worker = self.zygote.spawn()
                backoff = 0.1
            except Exception as e:  # noqa: BLE001
                log.warning("python sandbox: could not start a worker: %s", e)
                with self.cond:
                    self.error = str(e)
                    self.cond.notify_all()
                if self.zygote is not None and not self.zygote.alive():
                    self.zygote = None
                time.sleep(backoff)
                backoff = min(5.0, backoff * 2)
                continue
            with self.cond:
                if self.closed:
                    worker.close()
                    return
                self.pool.append(worker)
                self.cond.notify_all()

    def _announce(self, info: dict, cfg: dict) -> None:
        with self.cond:
            self.info, self.error = info, None
            self.cond.notify_all()
        mode = info.get("mode")
        if mode != "namespaces" and mode not in _warned_modes:
            _warned_modes.add(mode)
            msg = (
                f"arpo PythonTool: running model code with WEAK isolation (mode={mode!r}): "
                + ("no pid/mount/network namespaces — code can see the network and the host "
                   "filesystem, and detached processes may survive a call. " if mode == "none" else
                   "no uid switch — code runs as your own user inside user namespaces. ")
                + f"Run as root (or in a container with CAP_SYS_ADMIN) or enable unprivileged user "
                  f"namespaces (sysctl user.max_user_namespaces>0, kernel.unprivileged_userns_clone=1). "
                  f"Probe errors: {info.get('why') or 'none'}"
            )
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            log.warning(msg)

    def acquire(self, deadline: float) -> Worker:
        for _attempt in range(3):
            with self.cond:
                while not self.pool:
                    if self.closed:
                        raise SandboxUnavailable("the tool is closed")
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise SandboxUnavailable(self.error or "timed out waiting for a worker")
                    self.cond.wait(min(remaining, 0.5))
                worker = self.pool.popleft()
                self.cond.notify_all()
            try:
                worker.wait_ready(deadline)
                return worker
            except SandboxUnavailable as e:
                worker.close()
                with self.cond:
                    self.error = str(e)
        raise SandboxUnavailable(self.error or "no worker")

    def wait_full(self, size: int, deadline: float) -> bool:
        with self.cond:
            if not self.cond.wait_for(lambda: self.closed or len(self.pool) >= size,
                                      max(0, deadline - time.monotonic())):
                return False
            workers = list(self.pool)
        try:
            for w in workers:
                w.wait_ready(deadline)
        except (SandboxUnavailable, OSError):
            return False
        return not self.closed

    def shutdown(self) -> None:
        with self.cond:
            self.closed = True
            workers = list(self.pool)
            self.pool.clear()
            self.cond.notify_all()
        for w in workers:
            w.close()
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
