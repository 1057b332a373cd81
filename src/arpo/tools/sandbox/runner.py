"""The runner: the locked-down process that runs one call's code (the child side of a call).

It closes every other descriptor, takes its rlimits, a scrubbed environment, its own uid,
no_new_privs and the seccomp filter, reads the code from its pipe, runs it with REPL semantics,
and reports how the code ended through its exit status (which the code cannot forge).

Loaded inside the zygote (see the package docstring): standard library only."""

from __future__ import annotations

import ast
import builtins
import ctypes
import faulthandler
import linecache
import logging
import os
import random
import resource
import sys
import threading
import traceback
import types

from .cgroups import process_slots
from .linux import PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, check_ret
from .protocol import CODE_HEADER, RUNNER_READY
from .seccomp import SECCOMP_DENY, SECCOMP_DENY_NO_MEMCG, load_seccomp

log = logging.getLogger(__name__)

# Why a fresh process gets these variables and nothing else: the trainer's environment holds
# tokens and paths that model-written code must not read; thread counts of 1 keep numeric
# libraries from spawning thread pools (fork-unsafe in the zygote, and RLIMIT_NPROC counts them).
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "USER": "sandbox",
    "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "MALLOC_ARENA_MAX": "2",  # glibc reserves 64 MB of address space per arena: RLIMIT_AS
    "MPLBACKEND": "Agg",
}


USER_FILENAME = "<string>"  # what tracebacks of the model's code show, as for `python -c`
TRACEBACK_FRAMES = 5  # frames of the model's own code kept in a traceback (the last ones)
EXIT_EXC, EXIT_HARNESS = 1, 125  # an uncaught exception (as python does); the harness itself failed


def _drop_capabilities(lib) -> None:
    """In user-namespace mode the runner is 'root' of its namespace: take every capability away."""
    for cap in range(64):
        lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    check_ret(lib.capset(header, data), "capset")


def _close_fds_except(keep: set[int]) -> None:
    last = 2
    for fd in sorted(keep):
        if fd > last + 1:
            os.closerange(last + 1, fd)
        last = max(last, fd)
    os.closerange(last + 1, 1 << 20)


def _read_exact(fd: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the code pipe closed early")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _join_threads() -> None:
    """Wait for non-daemon threads as a normal interpreter exit would (bounded by the deadline)."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception:  # noqa: BLE001 - the user's threads may fail anything here; the exit is reported anyway
            pass


def _run_user_code(src: str, mod: types.ModuleType | None = None) -> str:
    """Run `src` as `__main__` with REPL semantics; return 'ok', 'exc' or 'exit N'.

    The last statement, if a bare expression, is evaluated and its repr printed (not when
    None), because models write `x` at the end expecting to see it. Tracebacks start at the
    model's own code and keep its last frames only: harness frames would be noise.
    """
    if mod is None:  # a one-shot call: a fresh namespace (a session passes its own, kept across calls)
        mod = types.ModuleType("__main__")
        mod.__dict__["__builtins__"] = builtins  # (typeshed's ModuleType has no __builtins__ attribute)
    sys.modules["__main__"] = mod
    linecache.cache[USER_FILENAME] = (len(src), None, src.splitlines(True), USER_FILENAME)
    try:
        tree = ast.parse(src, USER_FILENAME, "exec")
        last = None
        tail = tree.body[-1] if tree.body else None
        if isinstance(tail, ast.Expr):
            tree.body.pop()
            last = ast.Expression(tail.value)
        exec(compile(tree, USER_FILENAME, "exec"), mod.__dict__)
        if last is not None:
            value = eval(compile(last, USER_FILENAME, "eval"), mod.__dict__)
            if value is not None:
                print(repr(value))
        _join_threads()
        return "ok"
    except SystemExit as e:
        code = e.code
        if code is None or code == 0:
            return "ok"
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        return f"exit {code}"
    except BaseException as e:  # noqa: BLE001 - the model's code may raise anything
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - the user's code may have replaced or broken sys.stdout
            pass
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != USER_FILENAME:
            tb = tb.tb_next
        sys.stderr.write("".join(traceback.format_exception(type(e), e, tb, limit=-TRACEBACK_FRAMES)))
        return "exc"


def _set_limits(cfg: dict) -> None:
    """Resource limits for the runner. Address space is counted on top of what the pre-imported
    interpreter already maps, so `memory_mb` means memory the code itself may use."""
    base = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                base = int(line.split()[1]) * 1024
    mb = 1 << 20
    limits = {
        resource.RLIMIT_AS: base + int(cfg["memory_mb"]) * mb,
        resource.RLIMIT_CPU: 3600,  # lowered to the call's timeout once the code arrives
        resource.RLIMIT_FSIZE: int(cfg["disk_mb"]) * mb,
        resource.RLIMIT_NOFILE: int(cfg["max_open_files"]),
        resource.RLIMIT_CORE: 0,
        # Counted per uid: meaningful with our own uid or user namespace, harmful without.
        **({resource.RLIMIT_NPROC: process_slots(cfg)} if cfg.get("_own_uid") else {}),
        resource.RLIMIT_MSGQUEUE: 0,
        resource.RLIMIT_MEMLOCK: 0,
    }
    for which, value in limits.items():
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError) as e:
            log.debug("sandbox: setrlimit(%s) failed: %s", which, e)


def lock_down(lib, cfg: dict, mode: str, uid: int | None, workdir: str, out_w: int, keep: set[int]) -> None:
    """Turn this process into the locked-down one that runs model code: only `keep` (and stdio on
    out_w) open, its own session, rlimits, a scrubbed environment, the sandbox uid, no_new_privs,
    no capabilities, the working directory, fresh randomness, the seccomp filter."""
    _close_fds_except(keep | {out_w})
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    for fd in {devnull, out_w} - {0, 1, 2}:
        os.close(fd)
    os.setsid()
    if cfg["nice"]:
        os.nice(int(cfg["nice"]))
    _set_limits(dict(cfg, _own_uid=uid is not None or mode == "userns"))
    os.environ.clear()
    os.environ.update(SANDBOX_ENV)
    if uid is not None:  # root: a uid of our own makes the host's files and processes foreign
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    check_ret(lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if mode == "userns":
        _drop_capabilities(lib)
    os.chdir(workdir)
    # the sandbox's std streams for the rest of the process (closefd=False: its exit closes fds 0-2)
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115 - see above
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", buffering=1,  # noqa: SIM115 - see above
                      closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1,  # noqa: SIM115 - see above
                      closefd=False)
    # typeshed declares sys.__std*__ Final; the sandbox points them at its own streams on purpose
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
    sys.argv = [""]

    faulthandler.enable(sys.stderr)  # a segfault still tells the model where it happened
    random.seed()  # forked workers would otherwise all draw the same "random" numbers
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    deny = SECCOMP_DENY + (() if cfg.get("_memcg") else SECCOMP_DENY_NO_MEMCG)
    if cfg.get("seccomp", True) and not load_seccomp(deny, denies_ip_streams(cfg)) and cfg.get("_seccomp_required"):
        raise OSError("the seccomp filter could not be installed")


def denies_ip_streams(cfg: dict) -> bool:
    """Whether a call's IP stream sockets are denied (seccomp.IP_STREAM_TYPES): in its own network
    namespace, unless the tool asked for loopback TCP."""
    return not cfg["network"] and not cfg.get("loopback_tcp")


def runner_main(lib, cfg: dict, mode: str, uid: int | None, workdir: str,
                 code_r: int, rep_w: int, out_w: int) -> None:
    """Become the locked-down process that runs one call; never returns."""
    status = "crash"
    try:
        lock_down(lib, cfg, mode, uid, workdir, out_w, {code_r, rep_w})
        if mode != "none":
            _hold_address_space(lib)
        os.write(rep_w, RUNNER_READY.encode())
        os.close(rep_w)  # the model's code gets no channel to the trainer: its status is our exit status
        status = receive_and_run(code_r)
    except BaseException:  # noqa: BLE001
        print_exc()
    flush_std()
    os._exit(exit_code(status))


def receive_and_run(code_r: int, mod: types.ModuleType | None = None) -> str:
    """Read one call (timeout, code) from the code pipe, cap its CPU time, run it; its status."""
    timeout_s, n = CODE_HEADER.unpack(_read_exact(code_r, CODE_HEADER.size))
    src = _read_exact(code_r, n).decode("utf-8", "replace")
    cpu = int(timeout_s) + 2
    # a session's runner inherits its state's limit, which no unprivileged process can raise: there the
    # hard limit stays (the deadline kills a call anyway) so that a later call may have a longer timeout
    hard = cpu + 1 if mod is None else resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, hard), hard))
    return _run_user_code(src, mod)


def print_exc() -> None:
    try:
        traceback.print_exc()
    except Exception:  # noqa: BLE001 - reporting the user's exception must not fail the run's report
        pass


def flush_std() -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - the user's code may have replaced or broken the std streams
        pass


def _hold_address_space(lib) -> None:
    """Start a helper process that shares the runner's memory (CLONE_VM) and only sleeps.

    The runner reports its result by exiting (its exit status cannot be forged by the code it
    ran), and the kernel tears the address space down *before* it reports an exit: 2-3 ms for a
    process with numpy and sympy mapped, on every call's critical path. While the helper holds a
    reference, the runner's exit only drops it; the teardown happens when init exits and the
    kernel kills the pid namespace, after the trainer has the result. (Namespace modes only: the
    namespace is what ends the helper.)"""
    CLONE_VM, SIGCHLD = 0x100, 17
    stack = ctypes.create_string_buffer(1 << 16)
    _HELD.append(stack)  # the helper's stack lives in the shared memory: keep it alive
    top = (ctypes.addressof(stack) + len(stack) - 64) & ~0xF
    lib.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    if lib.clone(ctypes.cast(lib.pause, ctypes.c_void_p), ctypes.c_void_p(top), CLONE_VM | SIGCHLD, None) < 0:
        log.debug("sandbox: no address-space holder (clone failed)")


_HELD: list = []


def exit_code(status: str) -> int:
    """The runner reports how the code ended through its exit status, which init reads with
    waitpid (the code cannot forge it: it can only end the process, as any program can)."""
    if status == "ok":
        return 0
    if status == "exc":
        return EXIT_EXC
    if status.startswith("exit "):
        return int(status[5:]) & 0xFF
    return EXIT_HARNESS
