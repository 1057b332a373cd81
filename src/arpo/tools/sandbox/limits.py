"""The sandbox's knobs, documented once: `SandboxLimits` (its fields are `PythonTool`'s sandbox
keywords; docs/sandbox.md lists each with what enforces it) and how a tool's defaults follow from
the machine (`default_tool_cpus`) or from other tools (`allocate_uid_block`). The fixed bounds live
with what enforces them (cgroups.py: MEMCG_MARGIN_MB, SOCKET_MEM_MB, CPU_PERIOD_US...; runner.py:
the environment; zygote.py: SANDBOX_UID_SPAN).

Trainer side: never loaded inside the zygote."""

from __future__ import annotations

import fcntl
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .cgroups import MEMCG_MARGIN_MB
from .zygote import SANDBOX_UID_SPAN

SANDBOX_UID_FIRST, SANDBOX_UID_LAST = 100_000_000, 4_000_000_000  # blocks of SPAN uids are handed out in here


def default_tool_cpus() -> float:
    """CPUs all calls of one tool may use together by default: the machine's. The tool's cgroup
    weighs as many busy tasks (see CallCgroups._limit), so under contention the trainer's own
    threads keep their share; each call is capped by `cpus_per_call`. (Leaving a CPU out of the
    quota cost a 2-core machine 15-20 % of its call throughput under load: measured in BENCHMARKS.md.)"""
    return float(os.cpu_count() or 1)


def allocate_uid_block() -> int:
    """The first uid of a block of SANDBOX_UID_SPAN uids that no other PythonTool got: a counter in
    $ARPO_CACHE_DIR/sandbox_uid_blocks, advanced under a lock, so tools of other processes and of
    earlier runs never share a uid (state tied to a uid, e.g. RLIMIT_NPROC, never crosses calls)."""
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


@dataclass(frozen=True)
class SandboxLimits:
    """What one python tool's sandbox allows, per call and for the whole tool (docs/sandbox.md).
    Fields are `PythonTool`'s sandbox keywords; `zygote_config` resolves the defaults that depend
    on the machine or on the tool (None below) into the configuration the zygote receives."""

    memory_mb: int = 1024  # per call, everything it allocates (memory cgroup: + MEMCG_MARGIN_MB); RLIMIT_AS
    preimport: tuple[str, ...] = ("math", "numpy", "sympy")  # imported once in the zygote, shared by every call
    network: bool = False  # False: a network namespace of the call's own, loopback only
    # TCP/MPTCP sockets on that loopback: off by default, because data in connections nobody accept()s is
    # charged to no memory cgroup (docs/sandbox.md); UDP and AF_UNIX sockets are always there
    loopback_tcp: bool = False
    disk_mb: int = 64  # the call's private /tmp (a tmpfs) and RLIMIT_FSIZE
    max_processes: int = 64  # RLIMIT_NPROC of the call's own uid; its pids cgroup allows 4 more
    # snapshots one session family keeps (tools/python_session.py: the states a branch can start from; the
    # oldest are dropped beyond it); each has process slots of its own, outside max_processes
    session_snapshots: int = 32
    max_open_files: int = 256  # RLIMIT_NOFILE per process
    nice: int = 5  # the code's CPU priority below the trainer's
    uid: int | None = None  # one sandbox uid for every call (default: a fresh uid per worker from uid_base)
    uid_base: int | None = None  # first uid of this tool's block of SANDBOX_UID_SPAN (default: allocate_uid_block)
    max_ptys: int = 8  # ptys of the call's private devpts instance
    memory_cgroup: bool = True  # a memory (and pids, cpu) cgroup per call, where the machine allows one
    seccomp: bool = True  # the seccomp filter (seccomp.SECCOMP_DENY)
    fs_view: str = "minimal"  # "minimal" root, or "host-readonly" (the host read-only, a private /tmp)
    max_calls: int = 16  # calls running at once; more wait for a slot (tool-wide)
    cpus: float | None = None  # CPUs all calls together (tool-wide cgroup quota; default: default_tool_cpus)
    cpus_per_call: float = 1.0  # CPUs one call, whatever it forks (its cgroup's quota)
    tool_memory_mb: int | None = None  # all calls and ready workers (default: max_calls calls at their bound)
    tool_pids: int | None = None  # all calls' processes (default: max_calls + pool_size calls at max_processes + 4)

    def __post_init__(self):
        if self.memory_mb <= 0:
            raise ValueError("memory_mb must be positive")
        if self.max_calls < 1 or self.cpus_per_call <= 0 or (self.cpus is not None and self.cpus <= 0):
            raise ValueError("max_calls must be >= 1, cpus and cpus_per_call positive")
        if self.session_snapshots < 1:
            raise ValueError("session_snapshots must be >= 1")
        if self.fs_view not in ("minimal", "host-readonly"):
            raise ValueError("fs_view must be minimal or host-readonly")

    def zygote_config(self, pool_size: int) -> dict:
        """The zygote's configuration (plain JSON): these limits, the defaults resolved (a uid block
        is allocated here when `uid_base` is None) for a tool keeping `pool_size` workers ready."""
        cfg = asdict(self)
        cfg.update({
            "preimport": list(self.preimport), "network": bool(self.network),
            "loopback_tcp": bool(self.loopback_tcp), "memory_mb": int(self.memory_mb),
            "disk_mb": int(self.disk_mb), "max_processes": int(self.max_processes),
            "session_snapshots": int(self.session_snapshots),
            "max_open_files": int(self.max_open_files), "nice": int(self.nice),
            "uid_base": int(self.uid_base) if self.uid_base is not None else allocate_uid_block(),
            "max_ptys": int(self.max_ptys), "memory_cgroup": bool(self.memory_cgroup), "seccomp": bool(self.seccomp),
            "max_calls": int(self.max_calls),
            "cpus": float(self.cpus) if self.cpus is not None else default_tool_cpus(),
            "cpus_per_call": float(self.cpus_per_call),
            "tool_memory_mb": int(self.tool_memory_mb) if self.tool_memory_mb is not None else
            int(self.max_calls) * (int(self.memory_mb) + MEMCG_MARGIN_MB) + pool_size * MEMCG_MARGIN_MB,
            "tool_pids": int(self.tool_pids) if self.tool_pids is not None else
            (int(self.max_calls) + pool_size) * (int(self.max_processes) + 4),
        })
        return cfg
