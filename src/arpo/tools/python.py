"""The `<python>` tool: runs model-written code in an isolated, short-lived process (spec §1).

Model-written code is hostile input, and during RL it is written by a policy that is being
*rewarded* for whatever works, so the sandbox must hold against code that forks, allocates,
loops, floods stdout, writes files, opens sockets or signals its parent — while costing only
milliseconds per call, because rollouts make thousands of calls.

Design (who runs where)::

    trainer process                         (PythonTool; never runs model code, never forks itself)
      └─ zygote      python -I, minimal env, math/numpy/sympy pre-imported, root, host namespaces
           └─ c1        unshare(pid, mount, net, ipc, uts); forks init; passes init's pidfd up; exits
                └─ init   pid 1 of the new namespaces: private read-only mounts, tmpfs /tmp;
                    │      relays the code, enforces the deadline, reports the exit status
                    └─ runner  rlimits, scrubbed env, own uid, no_new_privs, cwd=/tmp;
                               waits for code on a pipe, runs ONE call, then everything dies

* **Fast.** Forking a zygote that already imported numpy/sympy costs a few ms, against
  ~25 ms for a cold `python -c` (and ~1 s to import sympy). A pool of `pool_size` runners is
  kept ready, so a call only ships code over a pipe and reads the output. Each runner serves
  exactly one call and is then killed; a background thread forks replacements.
* **Nothing outlives a call.** The runner lives in its own PID namespace whose init is a root
  process it cannot signal. When init exits (call done, deadline, parent gone) or is SIGKILLed
  by the trainer through a pidfd (race-free: the pidfd is opened by init's parent), the kernel
  kills every process in the namespace — `setsid`, double forks and fork bombs included.
* **Nothing persists, little is visible.** init builds a minimal root for its mount namespace
  (`_minimal_root`): /usr, a few /etc files, the interpreter's own directories (read-only), a
  private /proc, a tiny /dev with a private pty instance, and fresh size-capped tmpfs mounts for
  /tmp (the working directory) and /dev/shm that vanish with the namespace; the host's project
  tree, datasets, home directories and sockets are not in it. The code runs as a uid of its own
  (a block per tool from a persistent counter, one uid per worker) with `no_new_privs`.
* **Bounded memory**: a memory cgroup per call (`memory_mb` + MEMCG_MARGIN_MB) charges heap,
  memfd, shared memory, tmpfs and children alike; a pids cgroup caps processes.
* **A small kernel surface**: a seccomp filter denies keyrings, other processes' memory,
  namespaces and mounts, bpf/perf/io_uring/userfaultfd and the like (SECCOMP_DENY).
* **An unforgeable result**: the runner closes its report pipe before the code runs and reports
  its outcome through its exit status, which init reads with waitpid.
* **No network**: a fresh network namespace with only loopback.
* **Bounded**: RLIMIT_AS / CPU / NPROC / FSIZE / NOFILE / CORE, a wall-clock deadline enforced
  both by the trainer and by init, and output read with a byte cap (a flood is stopped, not
  buffered).

Where the machine does not allow namespaces (not root and no unprivileged user namespaces)
the tool degrades to rlimits + process group + temporary directory and warns loudly once;
see `isolation`. Run as root (e.g. in a container with CAP_SYS_ADMIN) or enable
`kernel.unprivileged_userns_clone` / `user.max_user_namespaces` to get full isolation.

Known limits (README, threat model): the kernel is the boundary; without root there are no
cgroups (RLIMIT_AS plus seccomp-denied memfd/shm instead); the hash seed is shared by all workers
of one zygote. `PythonTool.protections` says what this machine allowed.

This file is also loaded *by path* inside the zygote (without the `arpo` package, so that no
package import can bloat or break it): keep its top-level imports to the standard library.
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import json
import linecache
import logging
import os
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import traceback
import types
import warnings
import weakref
from collections import deque

try:
    from .base import ToolResult
except ImportError:  # loaded by path inside the zygote: the sandbox side never builds results
    ToolResult = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Linux constants (not all are exposed by the os module of every supported Python)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 0x20, 0x400, 0x800, 0x1000
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 0x4000, 0x40000, 0x200000, 0x1000000
PR_SET_NAME, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 15, 24, 36, 38
_MOUNT_OPTION_FLAGS = {
    "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME,
}

USER_FILENAME = "<string>"  # what tracebacks of the model's code show, as for `python -c`
TRACEBACK_FRAMES = 5  # frames of the model's own code kept in a traceback (the last ones)
SANDBOX_UID_SPAN = 100_000  # per-worker uids of one tool cycle through [uid_base, uid_base + span)
SANDBOX_UID_FIRST, SANDBOX_UID_LAST = 100_000_000, 4_000_000_000  # blocks of SPAN uids are handed out in here
_CODE_HEADER = struct.Struct("!dQ")  # (timeout_s, len(code)) in front of the code bytes

# Why a fresh process gets these variables and nothing else: the trainer's environment holds
# tokens and paths that model-written code must not read; thread counts of 1 keep numeric
# libraries from spawning thread pools (fork-unsafe in the zygote, and RLIMIT_NPROC counts them).
_SANDBOX_ENV = {
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


# =============================================================================================
# Sandbox side: everything below until "Trainer side" runs in the zygote or its children.
# =============================================================================================


def _libc():
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    lib.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    lib.unshare.argtypes = [ctypes.c_int]
    lib.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.syscall.restype = ctypes.c_long
    return lib


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(lib, src, target, fstype, flags, data=None) -> None:
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    _check(lib.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _mountinfo() -> list[tuple[str, int]]:
    """(mount point, flags that must be kept on a remount) for every mount we can see."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 etc. are octal escapes
            flags = 0
            for opt in fields[5].split(","):
                flags |= _MOUNT_OPTION_FLAGS.get(opt, 0)
            out.append((point, flags))
    return out


def _interpreter_paths() -> list[str]:
    """Directories the sandboxed interpreter must be able to read: its prefixes, stdlib,
    site-packages and binaries (symlinked and resolved), whatever their path (a venv under /tmp
    or a home directory included). Not arbitrary sys.path entries: an editable install puts the
    project's source tree there, and the project (with its datasets and their answers) must stay
    out of view. Outermost first, nested ones dropped (binding the outer one covers them)."""
    import site
    import sysconfig

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))}
    paths |= {v for k, v in sysconfig.get_paths().items() if k != "data"}
    try:
        paths |= set(site.getsitepackages())
    except AttributeError:  # very old virtualenvs
        pass
    real = sorted({q for p in paths if p and os.path.isdir(p) for q in (os.path.abspath(p), os.path.realpath(p))})
    out: list[str] = []
    for p in real:
        if p != "/" and not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def _blocking_ancestor(path: str) -> str | None:
    """The outermost directory on the way to `path` that a foreign uid cannot traverse."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        d = "/" + "/".join(parts[:i])
        if not os.stat(d).st_mode & 0o001:
            return d
    return None


def _expose_interpreter(lib) -> None:
    """(host-readonly view) Make the interpreter reachable for the sandbox uid without exposing its
    neighbours: a tmpfs is laid over a private ancestor (pyenv in /root, mode 700) and only the
    interpreter's own directories are bind-mounted back into it."""
    masks: dict[str, list[tuple[str, int]]] = {}
    for p in _interpreter_paths():
        top = _blocking_ancestor(p)
        if top is not None:  # keep a handle on p before the mask hides it
            masks.setdefault(top, []).append((p, os.open(p, os.O_PATH | os.O_DIRECTORY)))
    for top, items in masks.items():
        _mount(lib, "tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        for p, fd in items:
            os.makedirs(p, mode=0o755, exist_ok=True)
            _mount(lib, f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
            os.close(fd)


_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # symlinks on merged-/usr systems
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/nsswitch.conf", "/etc/mime.types")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}


def _bind_ro(lib, fd: int, target: str) -> None:
    _mount(lib, f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    _mount(lib, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _minimal_root(lib, cfg: dict) -> None:
    """Replace this mount namespace's view of the host with a new root that holds only: the
    system's /usr (and its /bin, /lib... links), a few /etc files the dynamic loader reads, the
    interpreter's own directories (read-only, at their real paths), a private /proc, a /dev of
    null/zero/full/random/urandom plus a private pty instance capped at `max_ptys`, a capped
    /dev/shm, and a fresh size-capped /tmp (the working directory). Nothing else of the host: no
    project tree, no datasets, no home directory, no host sockets (/run, /var, /tmp are not there).

    Runs in init (root of its new mount and pid namespaces); every source is opened first, since
    the staging tmpfs is mounted over the host's /tmp (where a venv may live)."""
    import platform

    dirs, links, files = [], [], []
    for p in _SYSTEM_DIRS:
        if os.path.islink(p):
            links.append((p, os.readlink(p)))
        elif os.path.isdir(p):
            dirs.append(p)
    dirs += [p for p in _interpreter_paths() if not any(p == d or p.startswith(d + "/") for d in dirs)]
    files = [f for f in _ETC_FILES if os.path.isfile(f)]
    fds = {p: os.open(p, os.O_PATH | (os.O_DIRECTORY if p in dirs else 0)) for p in dirs + files}
    devs = {d: os.open(f"/dev/{d}", os.O_PATH) for d in _DEVICES if os.path.exists(f"/dev/{d}")}
    stage = "/tmp"
    _mount(lib, "tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=755")
    for d in ("tmp", "proc", "dev", "etc", ".old"):
        os.mkdir(f"{stage}/{d}", 0o755)
    disk = f"size={int(cfg['disk_mb'])}m,nr_inodes=16384,mode=1777"
    _mount(lib, "tmpfs", f"{stage}/tmp", "tmpfs", MS_NOSUID | MS_NODEV, disk)  # before binds under it
    for p in sorted(dirs, key=lambda x: x.count("/")):
        os.makedirs(stage + p, 0o755, exist_ok=True)
        _bind_ro(lib, fds[p], stage + p)
    for f in files:
        os.makedirs(os.path.dirname(stage + f), 0o755, exist_ok=True)
        open(stage + f, "w").close()
        _bind_ro(lib, fds[f], stage + f)
    for p, dest in links:
        os.symlink(dest, stage + p)
    _mount(lib, "tmpfs", f"{stage}/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=755")
    for d, fd in devs.items():
        open(f"{stage}/dev/{d}", "w").close()
        _mount(lib, f"/proc/self/fd/{fd}", f"{stage}/dev/{d}", None, MS_BIND)
    os.mkdir(f"{stage}/dev/pts", 0o755)
    try:  # a private pty instance: ptys come from it, never from the host's pool
        _mount(lib, "devpts", f"{stage}/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
               f"newinstance,ptmxmode=0666,mode=620,max={int(cfg.get('max_ptys', 8))}")
        os.symlink("pts/ptmx", f"{stage}/dev/ptmx")
    except OSError as e:
        log.debug("sandbox: no private devpts: %s", e)  # then there are no ptys at all
    os.mkdir(f"{stage}/dev/shm", 0o1777)
    _mount(lib, "tmpfs", f"{stage}/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16m,mode=1777")
    for name, dest in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                       ("stderr", "/proc/self/fd/2")):
        os.symlink(dest, f"{stage}/dev/{name}")
    _mount(lib, "proc", f"{stage}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for fd in [*fds.values(), *devs.values()]:
        os.close(fd)
    nr = _PIVOT_ROOT.get(platform.machine())
    os.chdir(stage)
    pivoted = nr is not None and lib.syscall(nr, b".", b".old") == 0
    os.chroot(".")  # after pivot_root: enter it; without: chroot (the runner has no capability to leave it)
    os.chdir("/")
    # from here on the new root is in place: what follows only tidies up, it must not fail the call
    if pivoted and lib.umount2(b"/.old", 2) == 0:  # MNT_DETACH: the host tree is gone from this namespace
        os.rmdir("/.old")
    try:
        _mount(lib, None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    except OSError as e:
        log.debug("sandbox: root stays writable for root only: %s", e)


def _limit_ipc(cfg: dict) -> None:
    """SysV shared memory of this (private) IPC namespace: at most `memory_mb`, 16 segments."""
    pages = max(1, int(cfg["memory_mb"]) * 256)  # 4 KiB pages
    for name, value in (("shmmax", int(cfg["memory_mb"]) << 20), ("shmall", pages), ("shmmni", 16),
                        ("msgmnb", 65536), ("msgmni", 16)):
        try:
            with open(f"/proc/sys/kernel/{name}", "w") as f:
                f.write(str(value))
        except OSError as e:
            log.debug("sandbox: kernel.%s: %s", name, e)


def _setup_namespaces_fs(lib, cfg: dict, foreign_uid: bool) -> str:
    """This (new) mount namespace's view: the minimal root (see `_minimal_root`), or, where the
    kernel refuses one of its mounts, the host read-only with a private /tmp ("host-readonly").
    Returns which. Making `/` recursively private first keeps every mount from reaching the host."""
    _mount(lib, "none", "/", None, MS_REC | MS_PRIVATE)
    _limit_ipc(cfg)
    if cfg.get("fs_view", "minimal") == "minimal":
        try:  # fails (if at all) before it switches the root: the fallback below starts from the host view
            _minimal_root(lib, cfg)
            return "minimal"
        except OSError as e:
            log.debug("sandbox: minimal root failed, falling back to the host read-only: %s", e)
    try:  # a proc for the new pid namespace: the code sees only its own processes
        _mount(lib, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as e:  # e.g. a container that masks parts of /proc; the host /proc stays
        log.debug("sandbox: no private /proc: %s", e)
    if foreign_uid:
        _expose_interpreter(lib)
    for point, keep in _mountinfo():
        try:
            _mount(lib, None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError:
            pass  # hidden (over-mounted) or vanished mount points cannot be reached anyway
    disk = f"size={int(cfg['disk_mb'])}m,nr_inodes=16384,mode=1777"
    _mount(lib, "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, disk)
    if os.path.isdir("/dev/shm"):
        _mount(lib, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16m,mode=1777")
    return "host-readonly"


# ---- seccomp: kernel surfaces model code has no use for ------------------------------------------
# keyrings (state and secrets that outlive a call: keys belong to a uid, not to a namespace),
# other processes' memory, kernel attack surface (bpf, perf, io_uring, userfaultfd), the
# syscalls that make or enter namespaces or mounts (the runner has no capabilities, but an
# unprivileged user namespace would give it some), machine-wide pools outside any cgroup (the
# AIO context pool: one io_setup(65536) took all of fs.aio-max-nr from the host), and what reaches
# host files through the read-only binds (flock on the venv's files blocked host processes and let
# calls signal each other; inotify/fanotify watches on the shared venv showed what others open).
SECCOMP_DENY = (
    "add_key", "request_key", "keyctl",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "io_setup", "io_submit", "io_getevents", "io_pgetevents", "io_cancel", "io_destroy",
    "flock", "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsmount", "fsconfig", "fspick", "mount_setattr",
    "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "quotactl", "quotactl_fd",
    "acct", "syslog", "vhangup", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "reboot", "swapon", "swapoff", "personality",
)
SECCOMP_DENY_NO_MEMCG = ("memfd_create", "memfd_secret", "shmget")  # unbounded memory without a cgroup
_CLONE_NS_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
# socket()/socketpair() families a call may use: local pipes (AF_UNIX: asyncio, multiprocessing) and
# loopback IP in its own network namespace. Every other family fails with EAFNOSUPPORT: netlink
# (unread messages queued 0.5 GB of kernel memory outside the call's cgroup), vsock (the VM's
# host-facing ports are not per network namespace), packet, bluetooth, alg, xdp...
SOCKET_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)


class _ScmpArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


_SECCOMP_LIB: list = []


def _seccomp_lib():
    """libseccomp, loaded once (in the zygote, so workers inherit it and need no file access)."""
    if not _SECCOMP_LIB:
        try:
            _SECCOMP_LIB.append(ctypes.CDLL("libseccomp.so.2"))
        except OSError:
            _SECCOMP_LIB.append(None)
    return _SECCOMP_LIB[0]


def _load_seccomp(deny: tuple[str, ...]) -> bool:
    """Install a filter: `deny` fail with EPERM, clone3 with ENOSYS (libc falls back to clone,
    whose flags a filter can see), clone with namespace flags with EPERM, socket families outside
    SOCKET_FAMILIES with EAFNOSUPPORT. Needs no_new_privs.
    False where libseccomp is missing (then nothing is filtered)."""
    import errno

    sc = _seccomp_lib()
    if sc is None:
        return False
    sc.seccomp_init.restype = ctypes.c_void_p
    sc.seccomp_init.argtypes = [ctypes.c_uint32]
    sc.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    sc.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                          ctypes.POINTER(_ScmpArgCmp)]
    sc.seccomp_load.argtypes = [ctypes.c_void_p]
    sc.seccomp_release.argtypes = [ctypes.c_void_p]
    allow, err = 0x7FFF0000, lambda e: 0x00050000 | (e & 0xFFFF)
    ctx = sc.seccomp_init(allow)
    if not ctx:
        return False
    sc.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    # SCMP_FLTATR_CTL_SSB: by default a seccomp filter also turns on the speculative-store-bypass
    # mitigation for the task, which slows every instruction of the call; it guards a process
    # against code *inside* it, which has nothing here to steal that it could not read anyway
    sc.seccomp_attr_set(ctx, 7, 1)
    sc.seccomp_attr_set(ctx, 8, 2)  # SCMP_FLTATR_CTL_OPTIMIZE: a binary tree instead of a linear scan
    try:
        rules = [(name, err(errno.EPERM), []) for name in deny] + [("clone3", err(errno.ENOSYS), [])]
        # SCMP_CMP_MASKED_EQ compares (arg & mask) == datum: one rule per namespace flag
        rules += [("clone", err(errno.EPERM), [_ScmpArgCmp(0, 7, 1 << b, 1 << b)])
                  for b in range(32) if _CLONE_NS_FLAGS & (1 << b)]
        # families outside SOCKET_FAMILIES (compared as 64 bits: stray high bits are denied too)
        top = max(SOCKET_FAMILIES)
        for name in ("socket", "socketpair"):
            rules.append((name, err(errno.EAFNOSUPPORT), [_ScmpArgCmp(0, 6, top, 0)]))  # SCMP_CMP_GT
            rules += [(name, err(errno.EAFNOSUPPORT), [_ScmpArgCmp(0, 4, f, 0)])  # SCMP_CMP_EQ
                      for f in range(top) if f not in SOCKET_FAMILIES]
        for name, action, cmps in rules:
            nr = sc.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                continue  # not a syscall on this architecture / kernel headers
            arr = (_ScmpArgCmp * len(cmps))(*cmps) if cmps else None
            if sc.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr) != 0:
                return False
        return sc.seccomp_load(ctx) == 0
    finally:
        sc.seccomp_release(ctx)


# ---- cgroups: a memory (and pids) bound per call -------------------------------------------------
MEMCG_MARGIN_MB = 64  # on top of memory_mb: the interpreter's copy-on-write pages, kernel objects
# Socket buffers (loopback TCP/UDP queues) are charged to a cgroup v2 memory cgroup with
# everything else; cgroup v1 keeps them outside memory.limit_in_bytes and charges them only once
# memory.kmem.tcp.limit_in_bytes is set (then for TCP and UDP alike): a v1 call gets this much.
SOCKET_MEM_MB = 64
CGROUP_TEARDOWN_S = 60.0  # closing a tool waits this long at most for its calls' processes to be gone
# per-socket caps inside the call's network namespace (bytes: min, default, max), so one socket
# cannot take the whole budget: net.ipv4.tcp_rmem / tcp_wmem are per namespace (rmem_max is not)
_NETNS_SYSCTLS = (("ipv4/tcp_rmem", "4096 131072 1048576"), ("ipv4/tcp_wmem", "4096 16384 1048576"),
                  ("core/somaxconn", "128"))


_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000  # the cgroup cpu quota's period: a call over its quota waits at most this long


def _cgroup_dirs() -> dict[str, str]:
    """{'memory'|'pids'|'cpu': this process's cgroup directory} where that controller is mounted
    (v1 hierarchies, or v2's unified one when it offers the controller)."""
    mounts: dict[str, str] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _src, opts = (right.split() + ["", "", ""])[:3]
            point = left.split()[4].encode().decode("unicode_escape")
            if fstype == "cgroup":
                for c in _CONTROLLERS:
                    if c in opts.split(","):
                        mounts.setdefault(c, point)
            elif fstype == "cgroup2":
                mounts.setdefault("unified", point)
    out: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _hid, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in _CONTROLLERS:
                if c in ctrls.split(",") and c in mounts:
                    out[c] = mounts[c] + path
            if ctrls == "" and "unified" in mounts:
                d = mounts["unified"] + path
                try:
                    with open(os.path.join(d, "cgroup.subtree_control")) as sf:
                        enabled = sf.read().split()
                except OSError:
                    enabled = []
                for c in _CONTROLLERS:
                    if c in enabled:
                        out.setdefault(c, d)
    return out


def _write(d: str, name: str, value, required: bool = False) -> bool:
    try:
        with open(os.path.join(d, name), "w") as f:
            f.write(str(value))
        return True
    except OSError as e:
        if required:
            raise
        log.debug("sandbox: %s/%s: %s", d, name, e)
        return False


class _CallCgroups:
    """The zygote's cgroups: one parent per zygote (the tool) under this process's memory, pids and
    cpu cgroups, one child per worker (the call). Parent: the tool-wide caps (cfg tool_memory_mb,
    tool_pids, cpus), sized by the trainer to the tool's concurrency. Child: the call's own limits
    (memory_mb + margin, max_processes, cpus_per_call) and an equal cpu weight, so the calls of one
    tool share its CPU quota fairly. Empty children are removed as the zygote goes."""

    def __init__(self, cfg: dict):
        self.cfg, self.parents, self.live, self.why, self.v1 = cfg, {}, [], "", False
        self.cpu_why = ""
        dirs = _cgroup_dirs()
        if "memory" not in dirs:
            self.why = "no memory cgroup controller mounted"
            return
        for c, d in dirs.items():
            self._sweep_dead(d)
            parent = os.path.join(d, f"arpo-sandbox-{os.getpid()}")
            try:
                os.makedirs(parent, exist_ok=True)
                self.parents[c] = parent
            except OSError as e:
                if c == "memory":
                    self.why = f"cannot create a memory cgroup under {d} ({e.strerror})"
        if "memory" not in self.parents:
            self.parents = {}
            return
        self.v1 = os.path.exists(os.path.join(self.parents["memory"], "memory.limit_in_bytes"))
        if not self.v1:  # v2: the calls' cgroups (children of the parent) get the controllers, one by one
            for c in [c for c, p in self.parents.items() if p == self.parents["memory"]]:
                if not _write(self.parents[c], "cgroup.subtree_control", f"+{c}"):
                    if c == "memory":
                        self.why = f"cannot delegate the memory controller under {self.parents[c]}"
                        self.parents = {}
                        return
                    del self.parents[c]
        try:
            self._limit(self.parents, int(cfg["tool_memory_mb"]), int(cfg["max_calls"]) * SOCKET_MEM_MB,
                        int(cfg["tool_pids"]), float(cfg["cpus"]), max(1, min(10_000, int(100 * float(cfg["cpus"])))))
        except OSError as e:
            self.why = f"cannot set the tool-wide memory limit under {self.parents['memory']} ({e.strerror})"
            self.parents = {}

    @property
    def memory(self) -> bool:
        return "memory" in self.parents

    @property
    def cpu(self) -> bool:
        return "cpu" in self.parents and not self.cpu_why

    def bound_mb(self) -> int:
        """The most memory one call can hold: its cgroup's limit, plus v1's separate socket counter."""
        return int(self.cfg["memory_mb"]) + MEMCG_MARGIN_MB + (SOCKET_MEM_MB if self.v1 else 0)

    @staticmethod
    def _sweep_dead(d: str) -> None:
        """Parents left by zygotes that died (their pid is gone): remove them."""
        try:
            names = os.listdir(d)
        except OSError:
            return
        for n in names:
            if n.startswith("arpo-sandbox-") and n[13:].isdigit() and not os.path.exists(f"/proc/{n[13:]}"):
                root = os.path.join(d, n)
                for child in os.listdir(root):
                    if os.path.isdir(os.path.join(root, child)):
                        try:
                            os.rmdir(os.path.join(root, child))
                        except OSError:
                            pass
                try:
                    os.rmdir(root)
                except OSError:
                    pass

    def _limit(self, dirs: dict[str, str], mb: int, socket_mb: int, pids: int, cpus: float, weight: int) -> None:
        """Write limits into `dirs` ({controller: directory}); only the memory limit must succeed.
        `weight` (v2 cpu.weight, 100 = one nice-0 task; v1 cpu.shares scaled): the calls of a tool
        share it equally (100 each); the tool competes with the host as `cpus` busy tasks would,
        not as one (a cgroup is one entity to the scheduler, however many processes it holds)."""
        if "memory" in dirs:
            d = dirs["memory"]
            if self.v1:
                _write(d, "memory.limit_in_bytes", mb << 20, required=True)
                _write(d, "memory.memsw.limit_in_bytes", mb << 20)
                _write(d, "memory.swappiness", 0)
                _write(d, "memory.kmem.tcp.limit_in_bytes", socket_mb << 20)
            else:
                _write(d, "memory.max", mb << 20, required=True)
                _write(d, "memory.swap.max", 0)
        if "pids" in dirs:
            _write(dirs["pids"], "pids.max", pids)
        if "cpu" in dirs and cpus > 0:
            d, quota = dirs["cpu"], max(1000, int(cpus * CPU_PERIOD_US))
            if os.path.exists(os.path.join(d, "cpu.cfs_quota_us")):  # v1 (the cpu hierarchy may differ from memory's)
                ok = _write(d, "cpu.cfs_period_us", CPU_PERIOD_US) and _write(d, "cpu.cfs_quota_us", quota)
                _write(d, "cpu.shares", max(2, weight * 1024 // 100))
            else:
                ok = _write(d, "cpu.max", f"{quota} {CPU_PERIOD_US}")
                _write(d, "cpu.weight", weight)
            if not ok:
                self.cpu_why = f"cannot set a cpu quota under {d}"

    def create(self, n: int) -> list[str]:
        """Directories of worker n's cgroups, limits written (the worker joins them itself)."""
        dirs: dict[str, str] = {}
        made: list[str] = []
        try:
            for c, parent in self.parents.items():
                d = os.path.join(parent, f"w{n}")
                if d not in made:  # v2: one directory holds every controller
                    try:
                        os.mkdir(d)
                        made.append(d)
                    except OSError as e:
                        log.debug("sandbox: cgroup %s: %s", d, e)
                        if c == "memory":
                            raise
                        continue
                dirs[c] = d
            self._limit(dirs, int(self.cfg["memory_mb"]) + MEMCG_MARGIN_MB, SOCKET_MEM_MB,
                        int(self.cfg["max_processes"]) + 4, float(self.cfg["cpus_per_call"]), 100)
        finally:
            self.live.append((time.monotonic(), made))
        return made

    def sweep(self, min_age_s: float = 5.0, everything: bool = False) -> None:
        keep, now = [], time.monotonic()
        for born, dirs in self.live:
            if not everything and now - born < min_age_s:
                keep.append((born, dirs))
                continue
            left = []
            for d in dirs:
                try:
                    os.rmdir(d)  # only succeeds once no process is left in it
                except OSError:
                    left.append(d)
            if left:
                keep.append((born, left))
        self.live = keep

    def close(self, timeout_s: float = CGROUP_TEARDOWN_S) -> None:
        """Remove every call's cgroup, then the parents. A killed call's last process can take
        seconds to exit (the kernel frees what it made: 400k files took longer than the half
        second teardown used to allow, and left the directories behind), so this retries, killing
        whatever is still in them and reaping, until they are empty or `timeout_s` has passed."""
        end, delay = time.monotonic() + timeout_s, 0.005
        while True:
            self.sweep(everything=True)
            if not self.live:
                break
            if time.monotonic() >= end:
                log.warning("sandbox: cgroups still busy after %.0f s, left behind: %s", timeout_s,
                            [d for _, dirs in self.live for d in dirs])
                break
            for _, dirs in self.live:
                for d in dirs:
                    _kill_cgroup_members(d)
            _reap(None)
            time.sleep(delay)
            delay = min(0.1, delay * 2)
        for p in set(self.parents.values()):  # v2: one directory for every controller
            try:
                os.rmdir(p)
            except OSError as e:
                log.warning("sandbox: could not remove %s: %s", p, e)


def _kill_cgroup_members(d: str) -> None:
    try:
        with open(os.path.join(d, "cgroup.procs")) as f:
            pids = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _join_cgroups(dirs: list[str]) -> int | None:
    """Move this process into `dirs`; returns an fd on the memory cgroup's OOM report (or None)."""
    fd = None
    for d in dict.fromkeys(dirs):
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        for name in ("memory.oom_control", "memory.events"):
            if fd is None and os.path.exists(os.path.join(d, name)):
                fd = os.open(os.path.join(d, name), os.O_RDONLY)
    return fd


def _oom_killed(fd: int | None) -> bool:
    if fd is None:
        return False
    try:
        text = os.pread(fd, 4096, 0).decode()
    except OSError:
        return False
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == "oom_kill" and v.strip().isdigit() and int(v) > 0:
            return True
    return False


def _loopback_up() -> None:
    """A fresh network namespace has `lo` down; up, it lets code use localhost inside itself."""
    import fcntl

    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | IFF_UP))


def _limit_netns() -> None:
    """Per-socket buffer caps of this (private) network namespace (see _NETNS_SYSCTLS)."""
    for name, value in _NETNS_SYSCTLS:
        try:
            with open(f"/proc/sys/net/{name}", "w") as f:
                f.write(value)
        except OSError as e:
            log.debug("sandbox: net.%s: %s", name.replace("/", "."), e)


def _drop_capabilities(lib) -> None:
    """In user-namespace mode the runner is 'root' of its namespace: take every capability away."""
    for cap in range(64):
        lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    _check(lib.capset(header, data), "capset")


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
        except Exception:
            pass


def _run_user_code(src: str, mod: types.ModuleType | None = None) -> str:
    """Run `src` as `__main__` with REPL semantics; return 'ok', 'exc' or 'exit N'.

    The last statement, if a bare expression, is evaluated and its repr printed (not when
    None), because models write `x` at the end expecting to see it. Tracebacks start at the
    model's own code and keep its last frames only: harness frames would be noise.
    """
    if mod is None:  # a one-shot call: a fresh namespace (a session passes its own, kept across calls)
        mod = types.ModuleType("__main__")
        mod.__builtins__ = builtins
    sys.modules["__main__"] = mod
    linecache.cache[USER_FILENAME] = (len(src), None, src.splitlines(True), USER_FILENAME)
    try:
        tree = ast.parse(src, USER_FILENAME, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
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
        except Exception:
            pass
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != USER_FILENAME:
            tb = tb.tb_next
        sys.stderr.write("".join(traceback.format_exception(type(e), e, tb, limit=-TRACEBACK_FRAMES)))
        return "exc"


def _set_limits(cfg: dict) -> None:
    """Resource limits for the runner. Address space is counted on top of what the pre-imported
    interpreter already maps, so `memory_mb` means memory the code itself may use."""
    import resource

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
        **({resource.RLIMIT_NPROC: int(cfg["max_processes"])} if cfg.get("_own_uid") else {}),
        resource.RLIMIT_MSGQUEUE: 0,
        resource.RLIMIT_MEMLOCK: 0,
    }
    for which, value in limits.items():
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError) as e:
            log.debug("sandbox: setrlimit(%s) failed: %s", which, e)


def _lock_down(lib, cfg: dict, mode: str, uid: int | None, workdir: str, out_w: int, keep: set[int]) -> None:
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
    os.environ.update(_SANDBOX_ENV)
    if uid is not None:  # root: a uid of our own makes the host's files and processes foreign
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _check(lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if mode == "userns":
        _drop_capabilities(lib)
    os.chdir(workdir)
    sys.stdin = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    sys.argv = [""]
    import faulthandler
    import random

    faulthandler.enable(sys.stderr)  # a segfault still tells the model where it happened
    random.seed()  # forked workers would otherwise all draw the same "random" numbers
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    deny = SECCOMP_DENY + (() if cfg.get("_memcg") else SECCOMP_DENY_NO_MEMCG)
    if cfg.get("seccomp", True) and not _load_seccomp(deny) and cfg.get("_seccomp_required"):
        raise OSError("the seccomp filter could not be installed")


def _runner_main(lib, cfg: dict, mode: str, uid: int | None, workdir: str,
                 code_r: int, rep_w: int, out_w: int) -> None:
    """Become the locked-down process that runs one call; never returns."""
    status = "crash"
    try:
        _lock_down(lib, cfg, mode, uid, workdir, out_w, {code_r, rep_w})
        if mode != "none":
            _hold_address_space(lib)
        os.write(rep_w, b"R\n")
        os.close(rep_w)  # the model's code gets no channel to the trainer: its status is our exit status
        status = _receive_and_run(code_r)
    except BaseException:  # noqa: BLE001
        _print_exc()
    _flush_std()
    os._exit(_exit_code(status))


def _receive_and_run(code_r: int, mod: types.ModuleType | None = None) -> str:
    """Read one call (timeout, code) from the code pipe, cap its CPU time, run it; its status."""
    import resource

    timeout_s, n = _CODE_HEADER.unpack(_read_exact(code_r, _CODE_HEADER.size))
    src = _read_exact(code_r, n).decode("utf-8", "replace")
    cpu = int(timeout_s) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    return _run_user_code(src, mod)


def _print_exc() -> None:
    try:
        traceback.print_exc()
    except Exception:
        pass


def _flush_std() -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
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
EXIT_EXC, EXIT_HARNESS = 1, 125  # an uncaught exception (as python does); the harness itself failed


def _exit_code(status: str) -> int:
    """The runner reports how the code ended through its exit status, which init reads with
    waitpid (the code cannot forge it: it can only end the process, as any program can)."""
    if status == "ok":
        return 0
    if status == "exc":
        return EXIT_EXC
    if status.startswith("exit "):
        return int(status[5:]) & 0xFF
    return EXIT_HARNESS


def _kill_descendants() -> None:
    """Without a pid namespace: kill everything reparented to us (we are a subreaper)."""
    for _ in range(50):
        kids = set()
        try:
            for tid in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{tid}/children") as f:
                    kids.update(int(p) for p in f.read().split())
        except OSError:
            return
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap(None)
        time.sleep(0.01)


def _reap(watch: int | None) -> int | None:
    """Reap every zombie; return the wait status of `watch` if it was among them."""
    found = None
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == watch:
            found = st


def _init_main(lib, cfg: dict, mode: str, uid: int | None, ctl: socket.socket, pipes: tuple[int, int, int],
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
                _limit_netns()
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


# ---- stateful sessions (PythonSessionTool, tools/python_session.py) --------------------------------
# A session family is one sandbox (namespaces, cgroup, uid) whose init manages *state processes*:
# python processes holding a session's variables (a persistent __main__) and its working directory
# (/tmp/s<pid>). A call runs in a fork of the session's current state (the process it was forked
# from stays as the snapshot "after the previous call", from which a branch of the rollout tree forks
# its own state: copy-on-write memory, a copied directory); when the code is done, the call's process
# forks the new state and exits. Its status is that exit status, read by init (the call's process is
# double-forked, so init adopts it) and written by init to the call's report pipe, which the code
# never holds — as in the one-shot tool, the code can only end its process, as any program can.
# Threads a program started do not survive into the next call (fork copies one thread).

def _session_state_loop(chan: socket.socket, workdir: str, mod: types.ModuleType) -> None:
    """A state process: wait for init's commands on `chan`; never returns.
    b"X" + fds [code_r, out_w, new_chan]: run one call in a process init adopts; it forks the new
    state and reports by exiting; b"F" + fds [new_chan]: a child that becomes a branch's state; EOF:
    end (the snapshot is dropped)."""
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
        if msg[:1] == b"X":  # the call's process is orphaned: init adopts it and reads how it ends
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # (one that ends before we do stays a zombie for init)
            if os.fork() != 0:
                os._exit(0)
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        newdir = f"/tmp/s{os.getpid()}"
        try:
            shutil.copytree(workdir, newdir, symlinks=True)
        except OSError:
            os.makedirs(newdir, exist_ok=True)
        workdir = newdir
        os.chdir(workdir)
        if msg[:1] != b"X":
            chan.sendall(f"P {os.getpid()}\n".encode())
            continue
        chan.sendall(b"C\n")  # init learns this process's pid from the kernel (SO_PASSCRED)
        status = _session_call(fds[0], fds[1], mod)
        try:
            if os.fork() != 0:  # the report is our exit; "S" first: the state lives on in our child
                chan.sendall(b"S\n")
                os._exit(_exit_code(status))
        except OSError:
            os._exit(EXIT_HARNESS)
        chan.sendall(f"P {os.getpid()}\n".encode())


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


def _sender_pid(sock: socket.socket) -> tuple[bytes, int | None]:
    """(data, the sending process's pid as the kernel reports it) from a socket with SO_PASSCRED."""
    data, anc, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(12))
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(raw) >= 12:
            return data, struct.unpack("3i", raw[:12])[0]
    return data, None


def _session_chan() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    return a, b


def _wait_report(st: int, state: bool) -> str:
    """A call process's wait status as the "D <how> <state 0|1>" line its report pipe gets; `state`:
    the call's process forked the new state (the session goes on from it)."""
    how = f"signal {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else f"wexit {os.waitstatus_to_exitcode(st)}"
    return f"D {how} {int(state)}\n"


def _session_init(lib, cfg: dict, mode: str, uid: int | None, ctl: socket.socket, pipes: tuple[int, int, int]) -> None:
    """init of a session family: start the root state, then relay the trainer's commands to states.
    Trainer -> init (ctl): "X src dst" + fds [code_r, out_w, rep_w]; "F src dst"; "Q id" (drop a state);
    "K id" (kill a state's or a running call's process). init -> trainer: "R" (ready), "X dead id" (a
    state vanished); on a call's rep_w (kept by init, never passed on): "D wexit N" / "D signal N"."""
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
            mod.__builtins__ = builtins
            b.sendall(f"P {os.getpid()}\n".encode())
            _session_state_loop(b, "/tmp/s0", mod)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    b.close()
    chans: dict[str, socket.socket] = {"0": a}
    pids: dict[str, int] = {}
    calls: dict[str, dict] = {}  # dst -> {"rep": rep_w, "pid": the call's process once it said "C"}
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
                data, sender = _sender_pid(chans[k])
            except OSError:
                data, sender = b"", None
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
                elif line == b"S" and call is not None and sender == call["pid"]:
                    call["state"] = True
                elif line.startswith(b"P ") and sender:
                    pids[k] = sender
                    if k == "0" and not ready_sent:
                        ready_sent = True
                        ctl.sendall(b"R\n")
        for k, call in list(calls.items()):
            if call["pid"] in exited:
                if k in chans and not call.get("state"):  # its "S" was sent before it exited: read it first
                    chans[k].setblocking(False)
                    try:
                        while True:
                            data, sender = _sender_pid(chans[k])
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
    call = calls.pop(k)
    try:
        os.write(call["rep"], line.encode())
    except OSError:
        pass
    os.close(call["rep"])


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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _spawn_worker(lib, cfg: dict, mode: str, uid: int | None, ctl: socket.socket, pipes: tuple[int, int, int],
                  cgroups: list[str] = ()) -> None:
    """In the zygote's child (c1): join the call's cgroups, enter new namespaces, fork init, hand
    init's pidfd upward."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if not cfg["network"]:
        flags |= CLONE_NEWNET
    try:
        oom_fd = _join_cgroups(list(cgroups)) if cgroups else None
        if mode == "userns":
            real_uid, real_gid = os.getuid(), os.getgid()
            _check(lib.unshare(flags | CLONE_NEWUSER), "unshare")
            for path, text in (("setgroups", "deny"), ("uid_map", f"0 {real_uid} 1"), ("gid_map", f"0 {real_gid} 1")):
                with open(f"/proc/self/{path}", "w") as f:
                    f.write(text)
        elif mode == "namespaces":
            _check(lib.unshare(flags), "unshare")
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


def _probe_mode(lib, cfg: dict) -> tuple[str, str]:
    """Find the strongest isolation this machine allows by trying it once in a throwaway child."""
    candidates = ["namespaces", "userns"] if os.geteuid() == 0 else ["userns"]
    errors = []
    for mode in candidates:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET
                if mode == "userns":
                    uid, gid = os.getuid(), os.getgid()
                    _check(lib.unshare(flags | CLONE_NEWUSER), "unshare")
                    for path, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
                        with open(f"/proc/self/{path}", "w") as f:
                            f.write(text)
                else:
                    _check(lib.unshare(flags), "unshare")
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


def _probe_seccomp(deny: tuple[str, ...]) -> bool:
    """Whether the filter installs here (tried in a throwaway child)."""
    pid = os.fork()
    if pid == 0:
        try:
            lib = _libc()
            _check(lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
            os._exit(0 if _load_seccomp(deny) else 1)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, st = os.waitpid(pid, 0)
    return st == 0


def _zygote_main(cfg: dict, sock: socket.socket) -> None:
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
        SECCOMP_DENY + (() if cfg["_memcg"] else SECCOMP_DENY_NO_MEMCG))
    cfg["_seccomp_required"] = seccomp  # it worked in the probe: a worker without it is a failure
    lib.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphaned inits come back to us to be reaped
    signal.signal(signal.SIGCHLD, lambda *_: _reap(None))
    switch_uid = os.geteuid() == 0 and mode != "userns"
    memcg_why = ("" if cfg["_memcg"] else (cgs.why if cgs else "needs root and namespaces" if mode != "none" or
                                           os.geteuid() != 0 else "disabled"))
    protections = {
        "namespaces": mode != "none", "fs_view": cfg.get("_fs_view", "unknown"), "uid_switch": switch_uid,
        "memory_cgroup": cfg["_memcg"], "memory_cgroup_why": memcg_why,
        "memory_bound_mb": cgs.bound_mb() if cfg["_memcg"] else None,
        "socket_memory": ("not bounded" if not cfg["_memcg"] else f"own limit of {SOCKET_MEM_MB} MB (cgroup v1)"
                          if cgs.v1 else "in the memory limit (cgroup v2)"),
        "pids_cgroup": bool(cgs and "pids" in cgs.parents), "seccomp": seccomp,
        "cpu_cgroup": bool(cgs and cgs.cpu), "cpu_cgroup_why": (cgs.cpu_why or "no cpu cgroup controller mounted"
                                                               if cgs and not cgs.cpu else ""),
        "cpus": float(cfg["cpus"]) if cgs and cgs.cpu else None,
        "cpus_per_call": float(cfg["cpus_per_call"]) if cgs and cgs.cpu else None,
        "max_calls": int(cfg["max_calls"]), "tool_memory_mb": int(cfg["tool_memory_mb"]) if cfg["_memcg"] else None,
        "tool_pids": int(cfg["tool_pids"]) if cgs and "pids" in cgs.parents else None,
        "seccomp_denied": list(SECCOMP_DENY + (() if cfg["_memcg"] else SECCOMP_DENY_NO_MEMCG)) if seccomp else [],
        "max_ptys": int(cfg.get("max_ptys", 8)) if mode != "none" else None, "network": bool(cfg["network"]),
    }
    sock.sendall(json.dumps({"mode": mode, "why": why, "preloaded": preloaded, "uid_switch": switch_uid,
                             "protections": protections}).encode())
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


# =============================================================================================
# Trainer side
# =============================================================================================

_warned_modes: set[str] = set()
SANDBOX_SOURCE_NAME = "<arpo-sandbox>"  # this file's name in the zygote's code objects (tracebacks, faults)
# The zygote's command line is what every call sees as /proc/1/cmdline (init is a fork of the
# zygote): it carries no configuration and no host path. Both arrive as the first message on the
# socket; the source is compiled under SANDBOX_SOURCE_NAME, so frames do not show its host path.
_ZYGOTE_BOOT = (
    "import json, socket, sys, types\n"
    "sock = socket.socket(fileno=int(sys.argv[1]))\n"
    "setup = json.loads(sock.recv(1 << 20))\n"
    "mod = types.ModuleType('_arpo_python_sandbox')\n"
    "sys.modules[mod.__name__] = mod\n"
    "with open(setup['path'], encoding='utf-8') as f:\n"
    "    exec(compile(f.read(), setup['name'], 'exec'), mod.__dict__)\n"
    "mod._zygote_main(setup['cfg'], sock)\n"
)


class SandboxUnavailable(RuntimeError):
    """The zygote could not be started or produced no worker in time."""


class _Zygote:
    """The trainer's handle on the zygote process: start it, ask it for workers."""

    def __init__(self, cfg: dict, start_timeout_s: float):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-c", _ZYGOTE_BOOT, str(child.fileno())],
                pass_fds=(child.fileno(),), env=dict(_SANDBOX_ENV), cwd="/",
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            )
        finally:
            child.close()
        parent.sendall(json.dumps({"cfg": cfg, "path": os.path.abspath(__file__), "name": SANDBOX_SOURCE_NAME}).encode())
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

    def spawn(self) -> "_Worker":
        """Ask the zygote for one worker; it arrives asynchronously (see `_Worker.wait_ready`)."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        code_r, code_w = os.pipe2(os.O_CLOEXEC)
        rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
        try:
            with self.lock:
                socket.send_fds(self.sock, [b"spawn"], [child.fileno(), out_w, code_r, rep_w])
        except OSError:
            parent.close()
            for fd in (out_r, code_w, rep_r):
                os.close(fd)
            raise
        finally:
            child.close()
            for fd in (out_w, code_r, rep_w):
                os.close(fd)
        return _Worker(parent, out_r, code_w, rep_r, self.info["mode"], session=bool(self.cfg.get("session")))

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


class _Worker:
    """One pre-started sandbox, good for exactly one call.

    Channels: `ctl` talks to init (its pidfd arrives on it; crash and deadline reports come
    back on it); `code_w` / `rep_r` go straight to the runner (code in; "R" ready and
    "D <status>" done out); `out_r` carries the program's stdout and stderr.
    """

    def __init__(self, ctl: socket.socket, out_r: int, code_w: int, rep_r: int, mode: str, session: bool = False):
        self.ctl, self.out_r, self.code_w, self.rep_r, self.mode = ctl, out_r, code_w, rep_r, mode
        self.session = session  # a session family: "R" comes from init, the runner pipes are unused
        self.ctl.setblocking(False)
        self.pidfd: int | None = None
        self.pid: int | None = None
        self.ctl_buf = self.rep_buf = b""
        self.ready = False
        self.lock = threading.Lock()  # warm_up() may wait on a worker that a call then takes

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
            data = os.read(self.rep_r, 4096)
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
        poller.register(self.rep_r, select.POLLIN)
        while not (self.ready and self.pidfd is not None):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxUnavailable("a python sandbox worker did not become ready in time")
            for fd, _ in poller.poll(max(1, int(remaining * 1000))):
                lines = self.read_ctl() if fd == self.ctl.fileno() else self.read_rep()
                if self.session and fd == self.rep_r and lines == ["EOF"]:
                    poller.unregister(self.rep_r)  # init closed the unused runner pipes
                    continue
                for line in lines:
                    if line.startswith("P "):
                        self.pid = int(line[2:])
                    elif line == "R":
                        self.ready = True
                    elif line.startswith(("E ", "X ")) or line == "EOF":
                        raise SandboxUnavailable(line[2:] if line.startswith("E ") else "a sandbox worker died at start")

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


def _fmt_seconds(t: float) -> str:
    return f"{t:.1f}" if abs(t * 10 - round(t * 10)) < 1e-9 else f"{t:g}"


def _signal_text(sig: int) -> str:
    if sig == signal.SIGXCPU:
        return "Error: CPU time limit exceeded"
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    desc = signal.strsignal(sig) or name
    return f"Error: the process was killed by {name} ({desc})"


def _clean_fault_report(text: str) -> str:
    """Drop the harness frames and module list from a faulthandler report (segfault etc.): the
    model's own frames come first ("most recent call first"), ours follow them."""
    if "Fatal Python error" not in text:
        return text
    out, skipping = [], False
    for line in text.split("\n"):
        if line.startswith('  File "') and (skipping or f'File "{SANDBOX_SOURCE_NAME}"' in line):
            skipping = True
            continue
        skipping = False
        if not line.startswith("Extension modules:"):
            out.append(line)
    return "\n".join(out)


def _truncate(text: str, limit: int, keep_tail: bool) -> tuple[str, bool]:
    """Cut to `limit` characters with a visible marker; errors keep their tail (the traceback)."""
    if len(text) <= limit:
        return text, False
    if keep_tail:
        head = limit * 3 // 5
        tail = limit - head
        dropped = len(text) - head - tail
        return f"{text[:head]}\n... [output truncated: {dropped} more characters] ...\n{text[len(text) - tail:]}", True
    return f"{text[:limit]}\n... [output truncated: {len(text) - limit} more characters]", True


def default_tool_cpus() -> float:
    """CPUs all calls of one tool may use together by default: the machine's. The tool's cgroup
    weighs as many busy tasks (see _CallCgroups._limit), so under contention the trainer's own
    threads keep their share; each call is capped by `cpus_per_call`. (Leaving a CPU out of the
    quota cost a 2-core machine 15-20 % of its call throughput under load: measured in BENCHMARKS.md.)"""
    return float(os.cpu_count() or 1)


def allocate_uid_block() -> int:
    """The first uid of a block of SANDBOX_UID_SPAN uids that no other PythonTool got: a counter in
    $ARPO_CACHE_DIR/sandbox_uid_blocks, advanced under a lock, so tools of other processes and of
    earlier runs never share a uid (state tied to a uid, e.g. RLIMIT_NPROC, never crosses calls)."""
    import fcntl
    from pathlib import Path

    root = Path(os.environ.get("ARPO_CACHE_DIR") or Path.home() / ".cache" / "arpo")
    n_blocks = (SANDBOX_UID_LAST - SANDBOX_UID_FIRST) // SANDBOX_UID_SPAN
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / "sandbox_uid_blocks", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            text = f.read().strip()
            block = (int(text) + 1 if text.isdigit() else int.from_bytes(os.urandom(4), "big")) % n_blocks
            f.seek(0)
            f.truncate()
            f.write(str(block))
    except OSError:  # a read-only home: a random block (collisions are then unlikely, not impossible)
        block = int.from_bytes(os.urandom(4), "big") % n_blocks
    return SANDBOX_UID_FIRST + block * SANDBOX_UID_SPAN


class PythonTool:
    """`<python>` tool: run code in a pre-forked, namespace-isolated, one-shot interpreter.

    Thread-safe: `__call__` may run from many threads at once; each call takes its own worker.
    Keyword arguments beyond the first six tune the sandbox: `disk_mb` bounds the private
    tmpfs (and file sizes), `max_processes` is RLIMIT_NPROC for the call's own uid, `nice`
    lowers the code's CPU priority below the trainer's, `uid` forces one sandbox uid (default:
    a fresh uid per worker from `uid_base`), `max_read_bytes` is where a flood of output is
    stopped (the program is killed; the model sees the head and a marker).

    Tool-wide caps (cgroups; docs/sandbox.md): at most `max_calls` calls run at once (more wait
    up to `start_timeout_s` for a slot, then come back as an error result); all calls together
    use at most `cpus` CPUs (default: the machine's; the tool weighs as that many tasks) and each at most
    `cpus_per_call`, sharing the tool's quota with equal weights; the tool's calls and ready
    workers together hold at most `tool_memory_mb` (default: `max_calls` calls at their bound)
    and `tool_pids` processes (default: `max_calls + pool_size` calls at `max_processes`).
    """

    name = "python"
    description = "Runs Python code in a sandbox and returns what it prints (a final bare expression is printed too)."
    schema = {"type": "function", "function": {
        "name": "python", "description": description,
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "the Python program"}},
                       "required": ["code"]}}}

    def __init__(
        self,
        timeout_s: float = 5.0,
        max_output_chars: int = 2000,
        memory_mb: int = 1024,
        pool_size: int = 4,
        preimport: tuple[str, ...] = ("math", "numpy", "sympy"),
        network: bool = False,
        *,
        disk_mb: int = 64,
        max_processes: int = 64,
        max_open_files: int = 256,
        nice: int = 5,
        uid: int | None = None,
        uid_base: int | None = None,
        max_read_bytes: int = 1 << 20,
        start_timeout_s: float = 60.0,
        max_ptys: int = 8,
        memory_cgroup: bool = True,
        seccomp: bool = True,
        fs_view: str = "minimal",
        max_calls: int = 16,
        cpus: float | None = None,
        cpus_per_call: float = 1.0,
        tool_memory_mb: int | None = None,
        tool_pids: int | None = None,
    ):
        if timeout_s <= 0 or max_output_chars <= 0 or memory_mb <= 0:
            raise ValueError("timeout_s, max_output_chars and memory_mb must be positive")
        if max_calls < 1 or cpus_per_call <= 0 or (cpus is not None and cpus <= 0):
            raise ValueError("max_calls must be >= 1, cpus and cpus_per_call positive")
        self.timeout_s = float(timeout_s)
        self.max_output_chars = int(max_output_chars)
        self.pool_size = max(1, int(pool_size))
        self.max_read_bytes = max(int(max_read_bytes), 4 * self.max_output_chars)
        self.start_timeout_s = float(start_timeout_s)
        if fs_view not in ("minimal", "host-readonly"):
            raise ValueError("fs_view must be minimal or host-readonly")
        self._cfg = {
            "preimport": list(preimport), "network": bool(network), "memory_mb": int(memory_mb),
            "disk_mb": int(disk_mb), "max_processes": int(max_processes),
            "max_open_files": int(max_open_files), "nice": int(nice), "uid": uid,
            "uid_base": int(uid_base) if uid_base is not None else allocate_uid_block(),
            "max_ptys": int(max_ptys), "memory_cgroup": bool(memory_cgroup), "seccomp": bool(seccomp),
            "fs_view": fs_view, "max_calls": int(max_calls),
            "cpus": float(cpus) if cpus is not None else default_tool_cpus(), "cpus_per_call": float(cpus_per_call),
            "tool_memory_mb": int(tool_memory_mb) if tool_memory_mb is not None else
            int(max_calls) * (int(memory_mb) + MEMCG_MARGIN_MB) + self.pool_size * MEMCG_MARGIN_MB,
            "tool_pids": int(tool_pids) if tool_pids is not None else
            (int(max_calls) + self.pool_size) * (int(max_processes) + 4),
        }
        self.max_calls = int(max_calls)
        self._slots = threading.BoundedSemaphore(self.max_calls)
        self._state = _PoolState()
        self._finalizer = weakref.finalize(self, self._state.shutdown)
        self._thread = threading.Thread(target=self._state.refill_loop, args=(self._cfg, self.pool_size, self.start_timeout_s),
                                        name="arpo-python-pool", daemon=True)
        self._thread.start()

    # -- public API ---------------------------------------------------------------------------
    def __call__(self, input: str) -> ToolResult:
        return self.run(input)

    @property
    def isolation(self) -> str:
        """'namespaces' (full), 'userns' (unprivileged namespaces) or 'none' (rlimits only)."""
        return self._state.wait_info(self.start_timeout_s).get("mode", "unknown")

    @property
    def protections(self) -> dict:
        """What this machine let the sandbox put in place (README: threat model): namespaces, the
        filesystem view, uid switch, memory/pids cgroups (and why not), seccomp and its list, ptys."""
        info = self._state.wait_info(self.start_timeout_s)
        return {"isolation": info.get("mode", "unknown"), **info.get("protections", {}),
                "uid_range": list(self.uid_range), "why_weaker": info.get("why") or None}

    @property
    def uid_range(self) -> tuple[int, int]:
        """[first, last) sandbox uid of this tool's workers (one per call, none shared with another tool)."""
        if self._cfg["uid"] is not None:
            return int(self._cfg["uid"]), int(self._cfg["uid"]) + 1
        return self._cfg["uid_base"], self._cfg["uid_base"] + SANDBOX_UID_SPAN

    def run(self, code: str, timeout_s: float | None = None) -> ToolResult:
        """Run one program; never raises (errors come back as ok=False results)."""
        t0 = time.monotonic()
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if not self._slots.acquire(timeout=self.start_timeout_s):
            return ToolResult(f"Error: the python tool is busy: {self.max_calls} calls are already running (its "
                              f"max_calls), and none finished within {_fmt_seconds(self.start_timeout_s)} s; "
                              "this call did not run", ok=False, elapsed_s=time.monotonic() - t0)
        try:
            try:
                worker = self._state.acquire(t0 + self.start_timeout_s)
            except Exception as e:  # noqa: BLE001
                return ToolResult(f"Error: the python sandbox is unavailable: {e}", ok=False,
                                  elapsed_s=time.monotonic() - t0)
            try:
                return self._execute(worker, code, timeout, t0)
            except Exception as e:  # noqa: BLE001 - a tool must never raise into the rollout
                log.exception("python tool failed")
                return ToolResult(f"Error: python tool failed: {type(e).__name__}: {e}", ok=False,
                                  elapsed_s=time.monotonic() - t0)
            finally:
                worker.close()
        finally:
            self._slots.release()

    def warm_up(self, timeout_s: float | None = None) -> bool:
        """Block until the pool is full of ready workers (e.g. before a rollout starts or a
        benchmark); True when it is. Calls work without this: they just wait for their worker."""
        return self._state.wait_full(self.pool_size, time.monotonic() + (timeout_s or self.start_timeout_s))

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> "PythonTool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one call -----------------------------------------------------------------------------
    def _execute(self, w: _Worker, code: str, timeout: float, t0: float) -> ToolResult:
        data = code.encode("utf-8", "replace")
        header = _CODE_HEADER.pack(timeout, len(data))
        w.ctl.sendall(b"C" + header)  # arms init's own deadline
        deadline = time.monotonic() + timeout
        out, total, status = bytearray(), 0, None
        timed_out = overflow = False
        try:
            _write_all(w.code_w, header + data)
        except OSError:
            status = "E the sandbox worker died before it got the code"
        poller = select.poll()
        for fd in (w.out_r, w.rep_r, w.ctl.fileno()):
            poller.register(fd, select.POLLIN)
        out_open = True
        while status is None and not overflow:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for fd, _ in poller.poll(max(1, int(remaining * 1000 + 0.999))):
                if fd == w.out_r:
                    chunk = os.read(w.out_r, 1 << 16)
                    if not chunk:
                        poller.unregister(w.out_r)
                        out_open = False
                    total += len(chunk)
                    out += chunk[: max(0, self.max_read_bytes - len(out))]
                    overflow = total > self.max_read_bytes
                    continue
                if fd == w.rep_r:  # the runner closed it before the code ran: nothing comes from the code
                    if "EOF" in w.read_rep():
                        poller.unregister(w.rep_r)
                    continue
                for line in w.read_ctl():  # init: the runner's exit status, the deadline, or a failure
                    if status is None and (line.startswith(("X ", "E ")) or line in ("T", "EOF")):
                        status = line
        w.kill()
        if out_open and not overflow:  # what the runner wrote before it reported is in the pipe
            os.set_blocking(w.out_r, False)
            try:
                while len(out) < self.max_read_bytes:
                    chunk = os.read(w.out_r, 1 << 16)
                    if not chunk:
                        break
                    out += chunk
            except BlockingIOError:
                pass
        return self._result(bytes(out), status, timeout, timed_out, overflow, time.monotonic() - t0, w.mode)

    def _result(self, raw: bytes, status: str | None, timeout: float, timed_out: bool,
                overflow: bool, elapsed: float, mode: str) -> ToolResult:
        text = _clean_fault_report(raw.decode("utf-8", "replace").replace("\x00", ""))
        ok, error = True, None
        if timed_out or status == "T":
            ok, error = False, f"Error: execution timed out after {_fmt_seconds(timeout)} s"
        elif overflow:
            ok, error = False, f"Error: output limit exceeded; the program was stopped after {self.max_read_bytes} bytes"
        elif status == "X oom":
            ok, error = False, (f"Error: memory limit exceeded ({self._cfg['memory_mb']} MB); the program was "
                                "killed")
        elif status and status.startswith("X signal ") and status[9:].isdigit():
            ok, error = False, _signal_text(int(status[9:]))
        elif status and status.startswith("X wexit ") and status[8:].lstrip("-").isdigit():
            code = int(status[8:])  # the runner's exit status: 0 ok, 1 an exception (traceback above)
            ok = code == 0
            if code == EXIT_HARNESS:
                error = "Error: the sandbox failed to run the program"
            elif code not in (0, EXIT_EXC):
                error = f"Error: the program exited with status {code}"
        else:
            ok, error = False, f"Error: the sandbox failed ({status or 'no status'})"
        text, truncated = _truncate(text, self.max_output_chars, keep_tail=not ok)
        if overflow:
            truncated = True
        if error:
            text = f"{text.rstrip()}\n{error}" if text.strip() else error
        elif not text.strip():
            text = "(no output)"
        meta = {"isolation": mode, "status": status, "timed_out": timed_out, "output_bytes": len(raw)}
        return ToolResult(text.rstrip("\n"), ok=ok, elapsed_s=elapsed, truncated=truncated, meta=meta)


class _PoolState:
    """The zygote and the queue of ready workers, shared by the tool and its refill thread.

    Kept apart from `PythonTool` so that a garbage-collected tool can still be shut down by
    its finalizer (the thread holds this, not the tool)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.pool: deque[_Worker] = deque()
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

    def acquire(self, deadline: float) -> _Worker:
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
            if not self.cond.wait_for(lambda: self.closed or len(self.pool) >= size, max(0, deadline - time.monotonic())):
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


# =============================================================================================
# Benchmark
# =============================================================================================


def benchmark(n: int = 50, code: str = "print(1+1)") -> dict:
    """p50/p95 latency of pool calls vs a cold `subprocess.run([python, -c, code])`, and calls/s
    with 4 concurrent callers.

    Pool calls start from a full, ready pool (the latency a rollout sees when its calls are
    spaced by generation); the concurrent run measures sustained throughput, where every call
    also pays for forking its replacement.
    """
    from concurrent.futures import ThreadPoolExecutor

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    with PythonTool(pool_size=4) as tool:
        tool.run("1")  # wait for the zygote
        pool = []
        for _ in range(n):
            tool.warm_up(5.0)
            time.sleep(0.02)  # let the previous call's namespaces finish tearing down
            t = time.perf_counter()
            res = tool.run(code)
            pool.append(time.perf_counter() - t)
            assert res.ok, res.output
        cold = []
        for _ in range(n):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], capture_output=True)
            cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        with ThreadPoolExecutor(4) as ex:
            list(ex.map(lambda _: tool.run(code), range(n)))
        conc = n / (time.perf_counter() - t)
        mode = tool.isolation
    res = {
        "isolation": mode,
        "pool_p50_ms": 1000 * statistics.median(pool), "pool_p95_ms": 1000 * pct(pool, 0.95),
        "cold_p50_ms": 1000 * statistics.median(cold), "cold_p95_ms": 1000 * pct(cold, 0.95),
        "concurrent4_calls_per_s": conc,
    }
    res["ratio_p50"] = res["pool_p50_ms"] / res["cold_p50_ms"]
    return res
