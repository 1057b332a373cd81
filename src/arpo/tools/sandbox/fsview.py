"""The filesystem a call sees: a private mount namespace holding a minimal root (the system's /usr,
the interpreter's directories read-only, private /proc, /dev, /tmp), or the host read-only.

Runs in the sandbox's init (root of its new mount namespace). Loaded inside the zygote (see the
package docstring): standard library only."""

from __future__ import annotations

import logging
import os
import platform
import site
import sys
import sysconfig

from .linux import (
    MOUNT_OPTION_FLAGS,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    mount_fs,
)

log = logging.getLogger(__name__)


def _mountinfo() -> list[tuple[str, int]]:
    """(mount point, flags that must be kept on a remount) for every mount we can see."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 etc. are octal escapes
            flags = 0
            for opt in fields[5].split(","):
                flags |= MOUNT_OPTION_FLAGS.get(opt, 0)
            out.append((point, flags))
    return out


def _interpreter_paths() -> list[str]:
    """Directories the sandboxed interpreter must be able to read: its prefixes, stdlib,
    site-packages and binaries (symlinked and resolved), whatever their path (a venv under /tmp
    or a home directory included). Not arbitrary sys.path entries: an editable install puts the
    project's source tree there, and the project (with its datasets and their answers) must stay
    out of view. Outermost first, nested ones dropped (binding the outer one covers them)."""
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
        mount_fs(lib, "tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        for p, fd in items:
            os.makedirs(p, mode=0o755, exist_ok=True)
            mount_fs(lib, f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
            os.close(fd)


_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # symlinks on merged-/usr systems
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/nsswitch.conf", "/etc/mime.types")
_DEVICES = ("null", "zero", "full", "random", "urandom")
# /proc files that show the host, not the call, to any uid: the kernel's command line, the keyring
# users of every host uid (key-users) and their keys, the loaded modules and kernel symbols, the
# kernel's build configuration, the host's interrupt counts per device and CPU, and its memory zones
# (issue 61). Each is covered by /dev/null (reads are empty), as container runtimes do.
_PROC_MASKED = ("cmdline", "key-users", "keys", "modules", "kallsyms", "config.gz", "interrupts", "zoneinfo")
# /proc directories of the host's devices (PCI, input): covered by an empty read-only directory
_PROC_MASKED_DIRS = ("bus",)
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}


def _bind_ro(lib, fd: int, target: str) -> None:
    mount_fs(lib, f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    mount_fs(lib, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _overlay_ro(lib, fd: int, target: str, empty: str) -> None:
    """A read-only overlay of the directory `fd` at `target` (`empty`: an empty directory, the second
    lower layer an overlay without an upper one needs), else a read-only bind. An overlay has inodes
    of its own, so the record locks a call takes on the host's files are its alone: two calls that
    lock and query byte ranges of one stdlib file (fcntl F_SETLK/F_GETLK) could talk through them
    (issue 37). Reads and mmaps go to the host's files (their page cache stays shared)."""
    try:
        mount_fs(lib, "overlay", target, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV,
               f"lowerdir=/proc/self/fd/{fd}:{empty}")
    except OSError as e:
        log.debug("sandbox: no overlay at %s, a bind: %s", target, e)
        _bind_ro(lib, fd, target)


def _minimal_root(lib, cfg: dict) -> None:
    """Replace this mount namespace's view of the host with a new root that holds only: the
    system's /usr (and its /bin, /lib... links), a few /etc files the dynamic loader reads, the
    interpreter's own directories (read-only, at their real paths), a private /proc, a /dev of
    null/zero/full/random/urandom plus a private pty instance capped at `max_ptys`, a capped
    /dev/shm, and a fresh size-capped /tmp (the working directory). Nothing else of the host: no
    project tree, no datasets, no home directory, no host sockets (/run, /var, /tmp are not there).

    Runs in init (root of its new mount and pid namespaces); every source is opened first, since
    the staging tmpfs is mounted over the host's /tmp (where a venv may live)."""
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
    mount_fs(lib, "tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=755")
    for d in ("tmp", "proc", "dev", "etc", ".old", ".empty"):
        os.mkdir(f"{stage}/{d}", 0o755)
    disk = f"size={int(cfg['disk_mb'])}m,nr_inodes=16384,mode=1777"
    mount_fs(lib, "tmpfs", f"{stage}/tmp", "tmpfs", MS_NOSUID | MS_NODEV, disk)  # before binds under it
    for p in sorted(dirs, key=lambda x: x.count("/")):
        os.makedirs(stage + p, 0o755, exist_ok=True)
        _overlay_ro(lib, fds[p], stage + p, f"{stage}/.empty")
    for f in files:
        os.makedirs(os.path.dirname(stage + f), 0o755, exist_ok=True)
        open(stage + f, "w").close()
        _bind_ro(lib, fds[f], stage + f)
    for p, dest in links:
        os.symlink(dest, stage + p)
    mount_fs(lib, "tmpfs", f"{stage}/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=755")
    for d, fd in devs.items():
        open(f"{stage}/dev/{d}", "w").close()
        mount_fs(lib, f"/proc/self/fd/{fd}", f"{stage}/dev/{d}", None, MS_BIND)
    os.mkdir(f"{stage}/dev/pts", 0o755)
    try:  # a private pty instance: ptys come from it, never from the host's pool
        mount_fs(lib, "devpts", f"{stage}/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
               f"newinstance,ptmxmode=0666,mode=620,max={int(cfg.get('max_ptys', 8))}")
        os.symlink("pts/ptmx", f"{stage}/dev/ptmx")
    except OSError as e:
        log.debug("sandbox: no private devpts: %s", e)  # then there are no ptys at all
    os.mkdir(f"{stage}/dev/shm", 0o1777)
    mount_fs(lib, "tmpfs", f"{stage}/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16m,mode=1777")
    for name, dest in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                       ("stderr", "/proc/self/fd/2")):
        os.symlink(dest, f"{stage}/dev/{name}")
    mount_fs(lib, "proc", f"{stage}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mask_proc(lib, f"{stage}/proc", devs.get("null"), f"{stage}/.empty")
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
        mount_fs(lib, None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    except OSError as e:
        log.debug("sandbox: root stays writable for root only: %s", e)


def _mask_proc(lib, proc: str, null_fd: int | None, empty_dir: str | None = None) -> None:
    """Cover the host-wide files of `_PROC_MASKED` under the mounted proc `proc` with /dev/null (an
    O_PATH descriptor of it, or None: opened here), and the directories of `_PROC_MASKED_DIRS` with
    `empty_dir` (read-only) when one is given."""
    fd = os.open("/dev/null", os.O_PATH) if null_fd is None else null_fd
    try:
        for name in _PROC_MASKED:
            if os.path.exists(f"{proc}/{name}"):
                mount_fs(lib, f"/proc/self/fd/{fd}", f"{proc}/{name}", None, MS_BIND)
        for name in _PROC_MASKED_DIRS if empty_dir else ():
            if os.path.isdir(f"{proc}/{name}"):
                mount_fs(lib, empty_dir, f"{proc}/{name}", None, MS_BIND)
                mount_fs(lib, None, f"{proc}/{name}", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    finally:
        if null_fd is None:
            os.close(fd)


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


def setup_namespaces_fs(lib, cfg: dict, foreign_uid: bool) -> str:
    """This (new) mount namespace's view: the minimal root (see `_minimal_root`), or, where the
    kernel refuses one of its mounts, the host read-only with a private /tmp ("host-readonly").
    Returns which. Making `/` recursively private first keeps every mount from reaching the host."""
    mount_fs(lib, "none", "/", None, MS_REC | MS_PRIVATE)
    _limit_ipc(cfg)
    if cfg.get("fs_view", "minimal") == "minimal":
        try:  # fails (if at all) before it switches the root: the fallback below starts from the host view
            _minimal_root(lib, cfg)
            return "minimal"
        except OSError as e:
            log.debug("sandbox: minimal root failed, falling back to the host read-only: %s", e)
    try:  # a proc for the new pid namespace: the code sees only its own processes
        mount_fs(lib, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as e:  # e.g. a container that masks parts of /proc; the host /proc stays
        log.debug("sandbox: no private /proc: %s", e)
    try:
        _mask_proc(lib, "/proc", None)
    except OSError as e:
        log.debug("sandbox: /proc files not masked: %s", e)
    if foreign_uid:
        _expose_interpreter(lib)
    for point, keep in _mountinfo():
        try:
            mount_fs(lib, None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError:
            pass  # hidden (over-mounted) or vanished mount points cannot be reached anyway
    disk = f"size={int(cfg['disk_mb'])}m,nr_inodes=16384,mode=1777"
    mount_fs(lib, "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, disk)
    if os.path.isdir("/dev/shm"):
        mount_fs(lib, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16m,mode=1777")
    return "host-readonly"
