"""The seccomp filter: the kernel surfaces model code has no use for, denied.

Built with libseccomp (loaded once in the zygote), installed by the runner after no_new_privs.
Loaded inside the zygote (see the package docstring): standard library only."""

from __future__ import annotations

import ctypes
import errno
import os
import socket

from .linux import PR_SET_NO_NEW_PRIVS, check_ret, load_libc

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
# IP stream sockets (TCP, MPTCP, SCTP, DCCP) inside the call's own network namespace, unless the tool
# asks for them (`loopback_tcp`): a connection that nobody accept()s is a socket the kernel made
# outside any process, so its queued data is charged to no memory cgroup (on main at 90394d7 one call
# put +545 MB of TCP and +717 MB of MPTCP into the host's tcp_mem with its cgroup bounded at 384 MB;
# three such listeners pass the host's limit and starve every TCP socket on the machine). Without a
# network there is no peer to talk to but the call itself; UDP and AF_UNIX stay (their buffers belong
# to the socket that queued them, which the call made: charged). socket() fails with EACCES.
# Type bits (type & 0xF): SOCK_STREAM 1, SOCK_RAW 3 (needs CAP_NET_RAW anyway), SOCK_SEQPACKET 5 match
# the mask 1; SOCK_DCCP is 6; SOCK_DGRAM (2) stays.
IP_STREAM_TYPES = ((1, 1), (0xF, 6))  # (mask, value) pairs of socket()'s type argument
# setsockopt(IPPROTO_IPV6, ...) options that take from pools outside the call's cgroup (issue 61): IPv6
# multicast and anycast joins (17.9 k groups from one call: +10 MB of host slab, uncharged; IPv6 has no
# per-socket cap like IPv4's igmp_max_memberships) and flow-label leases (IPV6_FLOWLABEL_MGR: one
# machine-wide pool, which a call exhausted for every other process). They fail with EPERM; leaving
# a group, and IPv4's capped joins, stay.
IPV6_DENIED_OPTIONS = {
    20: "IPV6_ADD_MEMBERSHIP", 27: "IPV6_JOIN_ANYCAST", 32: "IPV6_FLOWLABEL_MGR", 33: "IPV6_FLOWINFO_SEND",
    42: "MCAST_JOIN_GROUP", 43: "MCAST_BLOCK_SOURCE", 46: "MCAST_JOIN_SOURCE_GROUP", 48: "MCAST_MSFILTER",
}
MFD_HUGETLB = 0x0004  # memfd_create flag: huge pages come from the host's hugetlb pool, not the memory cgroup


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


def load_seccomp(deny: tuple[str, ...], deny_ip_streams: bool = False) -> bool:
    """Install a filter: `deny` fail with EPERM, clone3 with ENOSYS (libc falls back to clone,
    whose flags a filter can see), clone with namespace flags with EPERM, socket families outside
    SOCKET_FAMILIES with EAFNOSUPPORT, and (`deny_ip_streams`) IP stream sockets (IP_STREAM_TYPES)
    with EACCES, the IPv6 socket options of IPV6_DENIED_OPTIONS and memfd_create(MFD_HUGETLB) with
    EPERM. Needs no_new_privs.
    False where libseccomp is missing (then nothing is filtered)."""
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
        rules: list[tuple[str, int, list[_ScmpArgCmp]]] = [(name, err(errno.EPERM), []) for name in deny]
        rules += [("clone3", err(errno.ENOSYS), [])]
        # SCMP_CMP_MASKED_EQ compares (arg & mask) == datum: one rule per namespace flag
        rules += [("clone", err(errno.EPERM), [_ScmpArgCmp(0, 7, 1 << b, 1 << b)])
                  for b in range(32) if _CLONE_NS_FLAGS & (1 << b)]
        # families outside SOCKET_FAMILIES (compared as 64 bits: stray high bits are denied too)
        top = max(SOCKET_FAMILIES)
        for name in ("socket", "socketpair"):
            rules.append((name, err(errno.EAFNOSUPPORT), [_ScmpArgCmp(0, 6, top, 0)]))  # SCMP_CMP_GT
            rules += [(name, err(errno.EAFNOSUPPORT), [_ScmpArgCmp(0, 4, f, 0)])  # SCMP_CMP_EQ
                      for f in range(top) if f not in SOCKET_FAMILIES]
        rules += [("setsockopt", err(errno.EPERM), [_ScmpArgCmp(1, 4, socket.IPPROTO_IPV6, 0),
                                                     _ScmpArgCmp(2, 4, opt, 0)]) for opt in IPV6_DENIED_OPTIONS]
        if "memfd_create" not in deny:  # (flags & MFD_HUGETLB) == MFD_HUGETLB
            rules.append(("memfd_create", err(errno.EPERM), [_ScmpArgCmp(1, 7, MFD_HUGETLB, MFD_HUGETLB)]))
        if deny_ip_streams:  # family == AF_INET(6) and (type & mask) == value: both must hold
            rules += [("socket", err(errno.EACCES), [_ScmpArgCmp(0, 4, fam, 0), _ScmpArgCmp(1, 7, mask, value)])
                      for fam in (socket.AF_INET, socket.AF_INET6) for mask, value in IP_STREAM_TYPES]
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


def probe_seccomp(deny: tuple[str, ...], deny_ip_streams: bool = False) -> bool:
    """Whether the filter installs here (tried in a throwaway child)."""
    pid = os.fork()
    if pid == 0:
        try:
            lib = load_libc()
            check_ret(lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
            os._exit(0 if load_seccomp(deny, deny_ip_streams) else 1)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, st = os.waitpid(pid, 0)
    return st == 0
