"""Linux constants, libc calls and process helpers the sandbox's other modules share.

Loaded inside the zygote (see the package docstring): standard library only."""

from __future__ import annotations

import ctypes
import os
import signal
import time

# ---------------------------------------------------------------------------------------------
# Linux constants (not all are exposed by the os module of every supported Python)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_NEWCGROUP = 0x02000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 0x20, 0x400, 0x800, 0x1000
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 0x4000, 0x40000, 0x200000, 0x1000000
PR_SET_NAME, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 15, 24, 36, 38
MOUNT_OPTION_FLAGS = {
    "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME,
}


def load_libc():
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    lib.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    lib.unshare.argtypes = [ctypes.c_int]
    lib.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.syscall.restype = ctypes.c_long
    return lib


def check_ret(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount_fs(lib, src, target, fstype, flags, data=None) -> None:
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    check_ret(lib.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def kill_descendants() -> None:
    """Without a pid namespace: kill everything reparented to us (we are a subreaper)."""
    for _ in range(50):
        kids: set[int] = set()
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
        reap(None)
        time.sleep(0.01)


def reap(watch: int | None) -> int | None:
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


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
