"""cgroups: the tool-wide caps (one parent cgroup per zygote) and a memory, pids and cpu bound per
call (one child per worker), cgroup v1 or v2; the OOM report a call's init reads.

Loaded inside the zygote (see the package docstring): standard library only."""

from __future__ import annotations

import logging
import os
import signal
import time

from .linux import reap

log = logging.getLogger(__name__)

MEMCG_MARGIN_MB = 64  # on top of memory_mb: the interpreter's copy-on-write pages, kernel objects
# Socket buffers (loopback TCP/UDP queues) are charged to a cgroup v2 memory cgroup with
# everything else; cgroup v1 keeps them outside memory.limit_in_bytes and charges them only once
# memory.kmem.tcp.limit_in_bytes is set (then for TCP and UDP alike): a v1 call gets this much.
SOCKET_MEM_MB = 64
CGROUP_TEARDOWN_S = 60.0  # closing a tool waits this long at most for its calls' processes to be gone
CPU_PERIOD_US = 100_000  # the cgroup cpu quota's period: a call over its quota waits at most this long


_CONTROLLERS = ("memory", "pids", "cpu")


def process_slots(cfg: dict) -> int:
    """Processes one worker's uid (RLIMIT_NPROC) and pids cgroup (+ 4: init and helpers) may hold:
    `max_processes` for a call's code, and for a session family two more per snapshot it keeps
    (`session_snapshots`: the state and its runner), so that snapshots never take the code's slots
    (issue 37: they did, and a session's 63rd call failed and lost the session)."""
    return int(cfg["max_processes"]) + (2 * int(cfg.get("session_snapshots", 0)) if cfg.get("session") else 0)


def cgroup_dirs() -> dict[str, str]:
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


class CallCgroups:
    """The zygote's cgroups: one parent per zygote (the tool) under this process's memory, pids and
    cpu cgroups, one child per worker (the call). Parent: the tool-wide caps (cfg tool_memory_mb,
    tool_pids, cpus), sized by the trainer to the tool's concurrency. Child: the call's own limits
    (memory_mb + margin, max_processes, cpus_per_call) and an equal cpu weight, so the calls of one
    tool share its CPU quota fairly. Empty children are removed as the zygote goes."""

    def __init__(self, cfg: dict):
        self.cfg, self.parents, self.why, self.v1 = cfg, {}, "", False
        self.live: list[tuple[float, list[str]]] = []  # (made at, the call's cgroup dirs)
        self.cpu_why = ""
        dirs = cgroup_dirs()
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
                        process_slots(self.cfg) + 4, float(self.cfg["cpus_per_call"]), 100)
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
            reap(None)
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


def join_cgroups(dirs: list[str]) -> int | None:
    """Move this process into `dirs`; returns an fd on the memory cgroup's OOM report (or None)."""
    fd = None
    for d in dict.fromkeys(dirs):
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        for name in ("memory.oom_control", "memory.events"):
            if fd is None and os.path.exists(os.path.join(d, name)):
                fd = os.open(os.path.join(d, name), os.O_RDONLY)
    return fd


def oom_killed(fd: int | None) -> bool:
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
