"""The python sandbox's hold on the host's kernel pools, CPU and memory (issue 27, items 5-12).

Each attack here got past the sandbox of the commit before (numbers in the docstrings were measured
on that commit); each test fails there and passes now. Run as root (as CI does): without namespaces
and cgroups the tests skip.
"""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest

from arpo.tools.python import PythonTool
from arpo.tools.sandbox.cgroups import cgroup_dirs

MEMORY_MB = 256


@pytest.fixture(scope="module")
def tool():
    with PythonTool(timeout_s=20, memory_mb=MEMORY_MB, pool_size=1) as t:
        if t.isolation != "namespaces":
            pytest.skip(f"full isolation needs root and namespaces here (got {t.isolation!r})")
        if not t.protections.get("memory_cgroup"):
            pytest.skip(f"no memory cgroup here: {t.protections.get('memory_cgroup_why')}")
        yield t


def last_line(res) -> str:
    lines = res.output.strip().splitlines()
    return lines[-1] if lines else ""


# ---- item 5: kernel memory outside the call's limit ---------------------------------------------
_QUEUED = (  # bytes queued on the call's sockets, as its own network namespace reports them
    "def queued():\n"
    "    tot = 0\n"
    "    for f in ('/proc/net/udp', '/proc/net/tcp', '/proc/net/udp6', '/proc/net/tcp6'):\n"
    "        try:\n"
    "            rows = open(f).read().splitlines()[1:]\n"
    "        except OSError:\n"
    "            continue\n"
    "        for row in rows:\n"
    "            tx, rx = row.split()[4].split(':')\n"
    "            tot += int(tx, 16) + int(rx, 16)\n"
    "    return tot\n"
)
SOCKET_FLOODS = {
    # 120 unread UDP receivers with 4 MB buffers: 953 MB queued while the call's cgroup said 9 MB
    "udp": _QUEUED + "import socket\nkeep = []\nfor i in range(120):\n"
           "    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); r.bind(('127.0.0.1', 0))\n"
           "    try:\n        r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)\n"
           "    except OSError:\n        pass\n"
           "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setblocking(False)\n"
           "    for _ in range(150):\n        try:\n            s.sendto(b'x' * 60000, r.getsockname())\n"
           "        except OSError:\n            break\n"
           "    keep.append((r, s))\nprint(queued())\n",
    # 120 loopback connections written until they block: 450 MB outside the cgroup
    "tcp": _QUEUED + "import socket\nl = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(128)\nkeep = []\n"
           "for i in range(120):\n    c = socket.create_connection(l.getsockname()); s, _ = l.accept()\n"
           "    c.setblocking(False)\n    try:\n        while True:\n            c.send(b'x' * 65536)\n"
           "    except OSError:\n        pass\n    keep.append((c, s))\nprint(queued())\n",
}


@pytest.fixture(scope="module")
def tcp_tool():
    """A tool that asked for loopback TCP (`loopback_tcp=True`)."""
    with PythonTool(timeout_s=20, memory_mb=MEMORY_MB, pool_size=1, loopback_tcp=True) as t:
        if t.isolation != "namespaces" or not t.protections.get("memory_cgroup"):
            pytest.skip("full isolation needs root, namespaces and a memory cgroup")
        yield t


@pytest.mark.parametrize("name", sorted(SOCKET_FLOODS))
def test_socket_buffers_count_against_the_limit(tool, tcp_tool, name):
    """What a call queues on loopback sockets stays within its memory bound (sockets included)."""
    if name == "tcp":  # accepted connections: charged to the call, where a tool allows TCP at all
        tool = tcp_tool
    bound = tool.protections["memory_bound_mb"]
    res = tool.run(SOCKET_FLOODS[name])
    queued_mb = int(last_line(res)) / 2**20 if last_line(res).isdigit() else 0.0
    assert last_line(res).isdigit(), res.output[-500:]
    assert queued_mb <= bound, (name, queued_mb, bound)
    assert tool("print(1+1)").output == "2"


# ---- issue 37, crossing 4: connections nobody accept()s ----------------------------------------
# Three listeners with 8 MB receive buffers, 80 connections each written until they block, never
# accepted. The kernel makes such a connection's socket itself (no process's context), so its queue
# is charged to no memory cgroup, only to the host's TCP pool (`mem` in /proc/net/sockstat, global:
# the namespace's file shows it too). On main at 90394d7: TCP +545 MB, MPTCP +717 MB in one call
# whose bound was 384 MB; UDP's queues belong to the socket that queued them (charged, as above).
_UNACCEPTED = (
    "import os, socket, time\nfd = os.open('/proc/net/sockstat', os.O_RDONLY)\n"
    "def pool():  # bytes in the host's {row} pool\n"
    "    for line in os.pread(fd, 4096, 0).decode().splitlines():\n"
    "        if line.startswith('{row}:'):\n"
    "            f = line.split(); return int(f[f.index('mem') + 1]) * 4096\n"
    "m0 = pool(); keep = []; err = None; t0 = time.time()\n"
    "try:\n"
    "    for k in range(3):\n"
    "        l = socket.socket(socket.AF_INET, {kind}, {proto})\n"
    "        l.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)\n"
    "        l.bind(('127.0.0.1', 0)); keep.append(l)\n"
    "        if {kind} == socket.SOCK_STREAM:\n"
    "            l.listen(4096)\n"
    "        for i in range(80):\n"
    "            c = socket.socket(socket.AF_INET, {kind}, {proto}); c.setblocking(False)\n"
    "            try:\n                c.connect(l.getsockname())\n"
    "            except BlockingIOError:\n                pass\n"
    "            time.sleep(0.001)\n"
    "            try:  # until it blocks (UDP: the receiver drops what it cannot queue)\n"
    "                for _ in range(200):\n                    c.send(b'x' * 65000)\n"
    "            except OSError:\n                pass\n"
    "            keep.append(c)\n"
    "            if time.time() - t0 > 5:\n                break\n"
    "except OSError as e:\n    err = e.errno\n"
    "print(err, (pool() - m0) >> 20)\n"
)
UNACCEPTED = {"tcp": ("TCP", "socket.SOCK_STREAM", 0), "mptcp": ("TCP", "socket.SOCK_STREAM", 262),
              "udp": ("UDP", "socket.SOCK_DGRAM", 0)}


@pytest.mark.parametrize("name", sorted(UNACCEPTED))
def test_connections_nobody_accepts_add_little_to_the_hosts_socket_memory(tool, name):
    """The host's TCP (or UDP) memory grows by less than the call's memory bound during the call,
    and by under 32 MB for TCP/MPTCP (others' traffic on this shared machine is the slack): the
    call's IP stream sockets are denied (EACCES) where the tool did not ask for loopback TCP."""
    row, kind, proto = UNACCEPTED[name]
    res = tool.run(_UNACCEPTED.format(row=row, kind=kind, proto=proto))
    err, grew_mb = last_line(res).split()
    assert int(grew_mb) < (32 if row == "TCP" else tool.protections["memory_bound_mb"]), (name, res.output[-300:])
    if row == "TCP":
        assert err == str(errno.EACCES), res.output[-300:]
        assert tool.protections["ip_stream_sockets"] == "denied"


SOCKET_FAMILY_PROGRAM = ("import socket\ntry:\n    socket.socket({family}, {kind}, 0)\n    print('open')\n"
                         "except OSError as e:\n    print(e.errno)\n")
DENIED_FAMILIES = {"netlink": (16, 3), "packet": (17, 3), "vsock": (40, 1), "alg": (38, 5), "bluetooth": (31, 3),
                   "xdp": (44, 3), "high_bits": ((1 << 32) | 16, 3)}


@pytest.mark.parametrize("name", sorted(DENIED_FAMILIES))
def test_socket_families_outside_unix_and_ip_are_denied(tool, name):
    """netlink (unread messages: 0.5 GB of host kernel memory, cgroup at 8 MB), vsock (the VM's own
    ports: a call listening there kept a host process from binding), packet, alg... all opened."""
    family, kind = DENIED_FAMILIES[name]
    if name == "high_bits":  # the kernel reads an int: high bits must not smuggle AF_NETLINK past the filter
        code = ("import ctypes\nl = ctypes.CDLL(None, use_errno=True)\nl.syscall.restype = ctypes.c_long\n"
                f"r = l.syscall(41, ctypes.c_long({family}), 3, 0)\nprint('open' if r >= 0 else ctypes.get_errno())")
    else:
        code = SOCKET_FAMILY_PROGRAM.format(family=family, kind=kind)
    res = tool.run(code)
    assert last_line(res) == str(errno.EAFNOSUPPORT), (name, res.output[-300:])


def test_vsock_listen_is_denied(tool):
    """Item 6: a call bound the VM's vsock port 9999 (VMADDR_CID_ANY) and the host could not."""
    res = tool.run("import socket\ntry:\n    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n"
                   "    s.bind((socket.VMADDR_CID_ANY, 9999)); s.listen(); print('listening')\n"
                   "except OSError as e:\n    print(e.errno)\n")
    assert last_line(res) == str(errno.EAFNOSUPPORT), res.output[-300:]


LOCAL_SERVER = ("import asyncio, socket\n"
                "async def main():\n"
                "    async def echo(r, w):\n        w.write(await r.read(5)); await w.drain(); w.close()\n"
                "    srv = await asyncio.start_server(echo, '127.0.0.1', 0)\n"
                "    r, w = await asyncio.open_connection(*srv.sockets[0].getsockname()[:2])\n"
                "    w.write(b'hello'); await w.drain(); data = await r.read(5); srv.close(); return data\n"
                "print(asyncio.run(main()))")


def test_loopback_tcp_is_there_when_a_tool_asks_for_it(tcp_tool):
    res = tcp_tool.run(LOCAL_SERVER)
    assert res.ok and last_line(res) == "b'hello'", res.output[-500:]
    assert tcp_tool.protections["ip_stream_sockets"].startswith("allowed")


def test_unix_and_loopback_sockets_still_work(tool):
    """What calls need stays: asyncio's self-pipe and servers (AF_UNIX), loopback UDP in the call's netns."""
    res = tool.run("import asyncio, socket\n"
                   "async def main():\n"
                   "    async def echo(r, w):\n        w.write(await r.read(5)); await w.drain(); w.close()\n"
                   "    srv = await asyncio.start_unix_server(echo, 'echo.sock')\n"
                   "    r, w = await asyncio.open_unix_connection('echo.sock')\n"
                   "    w.write(b'hello'); await w.drain(); data = await r.read(5); srv.close(); return data\n"
                   "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(('127.0.0.1', 0))\n"
                   "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'dgram', u.getsockname())\n"
                   "a, b = socket.socketpair(); a.send(b'pair')\n"
                   "print(asyncio.run(main()), u.recv(10), b.recv(10))")
    assert res.ok and last_line(res) == "b'hello' b'dgram' b'pair'", res.output[-500:]


KERNEL_QUEUES = {
    # each held before too (listed so that a regression shows): pipe pages are charged to the
    # call's cgroup; POSIX message queues get RLIMIT_MSGQUEUE 0; SysV queues are capped per IPC
    # namespace; AF_UNIX queues are charged to the cgroup
    "pipes": "import os, fcntl\nkeep = []\nfor i in range(120):\n    r, w = os.pipe(); os.set_blocking(w, False)\n"
             "    try:\n        fcntl.fcntl(w, 1031, 1 << 20)\n    except OSError:\n        pass\n"
             "    try:\n        while True:\n            os.write(w, b'x' * 65536)\n    except OSError:\n        pass\n"
             "    keep.append((r, w))\nprint('held')\n",
    "unix": "import socket, os, time\nfor k in range(4):\n    if os.fork() == 0:\n        keep = []\n"
            "        for i in range(120):\n            a, b = socket.socketpair(); a.setblocking(False)\n"
            "            try:\n                while True:\n                    a.send(b'x' * 65536)\n"
            "            except OSError:\n                pass\n            keep.append((a, b))\n"
            "        time.sleep(2); os._exit(0)\ntime.sleep(2.5)\nprint('held')\n",
    "posix_mqueue": "import ctypes\nl = ctypes.CDLL(None, use_errno=True)\n"
                    "r = l.mq_open(b'/q', 0o100 | 2, 0o600, None)\nprint(r, ctypes.get_errno())\n",
    "sysv_msg": "import ctypes\nl = ctypes.CDLL(None, use_errno=True)\nids = [l.msgget(0, 0o1600) for _ in range(64)]\n"
                "buf = ctypes.create_string_buffer(8 + 8192); ctypes.memmove(buf, (1).to_bytes(8, 'little'), 8)\n"
                "n = 0\n"
                "for i in ids:\n    while i >= 0 and l.msgsnd(i, buf, 8192, 0o4000) == 0:\n        n += 8192\n"
                "print(n)\n",
}


def _call_peak_mb(tool) -> float:
    """The largest peak of the tool's per-call memory cgroups that are still there, sockets included."""
    root = Path(cgroup_dirs()["memory"]) / f"arpo-sandbox-{tool._state.zygote.proc.pid}"
    peaks = []
    for d in root.glob("w*"):
        total = 0
        for name in ("memory.max_usage_in_bytes", "memory.peak", "memory.kmem.tcp.max_usage_in_bytes"):
            if (d / name).exists():
                total += int((d / name).read_text())
        peaks.append(total / 2**20)
    assert peaks, f"no call cgroups under {root}"
    return max(peaks)


@pytest.mark.parametrize("name", sorted(KERNEL_QUEUES))
def test_other_kernel_queues_stay_within_the_limit(tool, name):
    res = tool.run(KERNEL_QUEUES[name])
    assert _call_peak_mb(tool) <= tool.protections["memory_bound_mb"] + 1, (name, res.output[-300:])
    if name == "posix_mqueue":
        assert last_line(res).startswith("-1 "), res.output
    if name == "sysv_msg":
        assert int(last_line(res)) <= 16 * 65536, res.output  # msgmni x msgmnb of the call's IPC namespace


# ---- item 7: the machine-wide AIO pool, io_uring --------------------------------------------------
@pytest.mark.parametrize("call", ["io_setup(65536)", "io_uring_setup"])
def test_aio_and_io_uring_are_denied(tool, call):
    """One io_setup(65536) took the whole fs.aio-max-nr pool: the host's io_setup(128) then failed."""
    nr, args = {"io_setup(65536)": (206, "65536, ctypes.byref(ctx)"), "io_uring_setup": (425, "4, p")}[call]
    res = tool.run("import ctypes\nl = ctypes.CDLL(None, use_errno=True)\nctx = ctypes.c_ulong(0)\n"
                   f"p = ctypes.create_string_buffer(120)\nr = l.syscall({nr}, {args})\nprint(r, ctypes.get_errno())")
    assert last_line(res) == f"-1 {errno.EPERM}", res.output[-300:]


# ---- item 10: locks and watches on host files through the read-only binds -------------------------
def test_flock_on_host_files_is_denied(tool):
    """A call took LOCK_EX on the venv's pyvenv.cfg (read-only bind): host processes could not lock it."""
    res = tool.run("import fcntl, os, sys\n"
                   "path = next(p for p in (sys.prefix + '/pyvenv.cfg', sys.executable) if os.path.exists(p))\n"
                   "try:\n    fcntl.flock(open(path, 'rb'), fcntl.LOCK_EX | fcntl.LOCK_NB); print('locked', path)\n"
                   "except OSError as e:\n    print(e.errno)\n")
    assert last_line(res) == str(errno.EPERM), res.output[-300:]


@pytest.mark.parametrize("call", ["inotify_init1", "fanotify_init"])
def test_watches_on_the_shared_venv_are_denied(tool, call):
    """inotify watches on the venv showed which files the host and other calls opened."""
    res = tool.run("import ctypes, sys\nl = ctypes.CDLL(None, use_errno=True)\n"
                   f"fd = l.{call}(0, 0) if {call!r} == 'fanotify_init' else l.{call}(0)\n"
                   "w = l.inotify_add_watch(fd, sys.prefix.encode(), 0xfff) if fd >= 0 else -1\n"
                   "print(fd, ctypes.get_errno())")
    assert last_line(res) == f"-1 {errno.EPERM}", res.output[-300:]


# ---- item 11: what a call sees of the tool's own processes ----------------------------------------
def test_proc_1_shows_no_config_or_host_paths(tool):
    """/proc/1/cmdline (the call's init, a fork of the zygote) carried the tool's whole JSON config
    and the host path of the sandbox's source."""
    import arpo

    res = tool.run("import os\n"
                   "for p in ('/proc/1/cmdline', '/proc/self/cmdline', '/proc/self/environ', '/proc/1/environ'):\n"
                   "    try:\n        print(p, open(p, 'rb').read())\n"
                   "    except OSError as e:\n        print(p, e.errno)\n")
    assert res.ok, res.output
    project = str(Path(arpo.__file__).resolve().parents[1])
    for needle in ('"memory_mb"', "uid_base", "preimport", project, "python.py"):
        assert needle not in res.output, (needle, res.output)


# ---- issue 37: host information a call could read ---------------------------------------------
def test_host_wide_proc_files_read_empty(tool):
    """/proc/cmdline (the host kernel's command line) and /proc/key-users (every host uid's keyrings)
    were readable from a call; they read empty now."""
    res = tool.run("for f in ('cmdline', 'key-users', 'keys', 'kallsyms'):\n"
                   "    print(f, len(open('/proc/' + f, 'rb').read()))\n")
    assert res.output.split("\n") == ["cmdline 0", "key-users 0", "keys 0", "kallsyms 0"], res.output


def _project_paths() -> list[str]:
    """Host paths of the project: arpo's source tree, and directories a .pth file of the interpreter's
    site-packages adds outside the interpreter (an editable install's source tree)."""
    import site
    import sys

    import arpo

    out = {str(Path(arpo.__file__).resolve().parents[1])}
    prefixes = [str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix)]
    for sp in site.getsitepackages():
        for pth in Path(sp).glob("*.pth"):
            for line in pth.read_text(errors="replace").splitlines():
                if line.startswith("/") and Path(line).is_dir() and \
                        not any(str(Path(line).resolve()).startswith(p) for p in prefixes):
                    out.add(line.rstrip("/"))
    return sorted(out)


# Scans every readable mapping of the call's own memory (ctypes: /proc/self/mem is root's) for each path, held as two
# halves that never stand next to each other in the program, so only a real copy matches.
_MEMORY_SCAN = (
    "import sys\nhalves = {halves!r}\nfound = set()\n"
    "for h1, h2 in halves:\n"
    "    if any((h1 + h2).decode() in p for p in sys.path):\n        found.add('sys.path')\n"
    "import ctypes\n"
    "for line in open('/proc/self/maps').read().splitlines():\n"
    "    f = line.split()\n"
    "    if f[1][0] != 'r' or (len(f) > 5 and f[5] in ('[vvar]', '[vsyscall]', '[vvar_vclock]')):\n        continue\n"
    "    lo, hi = (int(x, 16) for x in f[0].split('-'))\n"
    "    pos = lo\n"
    "    while pos < hi:\n"
    "        n = min(hi - pos, 8 << 20)\n"
    "        chunk = ctypes.string_at(pos, min(n + 256, hi - pos))\n"
    "        for h1, h2 in halves:\n"
    "            i = chunk.find(h1)\n"
    "            while i >= 0:\n"
    "                if chunk[i + len(h1):i + len(h1) + len(h2)] == h2:\n"
    "                    found.add(f[5] if len(f) > 5 else 'anonymous')\n"
    "                i = chunk.find(h1, i + 1)\n"
    "        pos += n\n"
    "print(sorted(found) or 'clean')\n"
)


def test_the_project_path_is_not_in_the_calls_memory(tool):
    """A call read the project's source path from its own interpreter: sys.path (an editable
    install's .pth), and the zygote's memory (the sandbox modules' paths it was sent). Now no copy
    of it is anywhere in the call's address space."""
    paths = _project_paths()
    halves = [(p[: len(p) // 2].encode(), p[len(p) // 2:].encode()) for p in paths]
    with PythonTool(timeout_s=60, memory_mb=MEMORY_MB, pool_size=1) as t:
        res = t.run(_MEMORY_SCAN.format(halves=halves))
    assert last_line(res) == "clean", (paths, res.output[-500:])


def test_record_locks_on_host_files_are_no_channel_between_calls(tool):
    """Two concurrent calls talked through POSIX record locks on a shared read-only host file (one
    read-locks a byte of the stdlib's os.py, the other asks F_GETLK whether a write lock would
    conflict): each call's interpreter directories are an overlay of their own now, with inodes
    (and locks) of its own. sqlite's locks (WAL included) still work."""
    import threading

    sender = ("import fcntl, os, struct, time\nfd = os.open(os.__file__, os.O_RDONLY)\n"
              "fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack('hhqqi', fcntl.F_RDLCK, 0, 4242, 1, 0))\n"
              "print('locked', flush=True)\ntime.sleep(4)\n")
    receiver = ("import fcntl, os, struct, time\ntime.sleep(1.5)\nfd = os.open(os.__file__, os.O_RDONLY)\n"
                "r = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 4242, 1, 0))\n"
                "print('seen' if struct.unpack('hhqqi', r)[0] != fcntl.F_UNLCK else 'nothing')\n")
    with PythonTool(timeout_s=15, memory_mb=MEMORY_MB, pool_size=2) as t:
        out: dict = {}
        th = threading.Thread(target=lambda: out.setdefault("sender", t.run(sender)))
        th.start()
        got = t.run(receiver)
        th.join()
        assert out["sender"].output.startswith("locked"), out["sender"].output
        assert got.output == "nothing", got.output
        res = t.run("import sqlite3\nfor mode in ('delete', 'wal'):\n"
                    "    a = sqlite3.connect(f'{mode}.db'); a.execute(f'pragma journal_mode={mode}')\n"
                    "    a.execute('create table t(x)'); a.execute('insert into t values (1)'); a.commit()\n"
                    "    b = sqlite3.connect(f'{mode}.db'); b.execute('insert into t values (2)'); b.commit()\n"
                    "    print(mode, a.execute('select sum(x) from t').fetchone()[0])\n")
        assert res.output == "delete 3\nwal 3", res.output


# ---- item 12: teardown after a call that leaves the kernel much to free ---------------------------
def test_close_removes_the_cgroups_after_a_call_with_many_files():
    """After a call that created 400k files, closing the tool left its cgroup directories behind
    (2 of 2 runs): the last process of the call takes seconds to exit while the kernel frees the
    files' inodes, and teardown gave up after half a second. Here 250k empty files in /dev/shm
    (made with mknod: ~6 s on a loaded 2-core machine) are enough for that."""
    t = PythonTool(timeout_s=30, memory_mb=1024, pool_size=1)
    try:
        if t.isolation != "namespaces" or not t.protections.get("memory_cgroup"):
            pytest.skip("needs namespaces and a memory cgroup")
        res = t.run("import os\nfor i in range(250_000):\n    os.mknod(f'/dev/shm/{i}')\n"
                    "print(len(os.listdir('/dev/shm')))")
        assert last_line(res) == "250000", res.output[-300:]
        zygote = t._state.zygote.proc.pid
        parents = [Path(d) / f"arpo-sandbox-{zygote}" for d in cgroup_dirs().values()]
        assert any(p.exists() for p in parents)
    finally:
        t0 = time.monotonic()
        t.close()
        took = time.monotonic() - t0
    left = [str(c) for p in parents if p.exists() for c in [p, *p.glob("w*")]]
    assert not left, (left, took)


# ---- item 8: a CPU quota per call, shared fairly within the tool ---------------------------------
BUSY = ("import os, time, resource\nkids = []\nfor _ in range({n}):\n    pid = os.fork()\n    if pid == 0:\n"
        "        os.setsid(); end = time.time() + {secs}\n        while time.time() < end:\n            pass\n"
        "        os._exit(0)\n    kids.append(pid)\nt0 = time.time()\nfor p in kids:\n    os.waitpid(p, 0)\n"
        "wall = time.time() - t0\nru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(round(ru.ru_utime + ru.ru_stime, 3), round(wall, 3))")


PIN = "import os\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"  # children inherit it


def test_a_busy_call_stays_within_its_cpu_quota():
    """4 busy processes (each in its own session) of one call took every core of the machine: 63
    of them raised other calls' p50 from 39 ms to 692 ms and slowed a host loop 5-14x. A call
    now gets `cpus_per_call` CPUs (default 1) whatever it forks; here 0.5."""
    with PythonTool(timeout_s=10, memory_mb=256, pool_size=1, cpus_per_call=0.5) as t:
        if not t.protections.get("cpu_cgroup"):
            pytest.skip(f"no cpu cgroup here: {t.protections.get('cpu_cgroup_why')}")
        res = t.run(BUSY.format(n=4, secs=2.0))
        cpu, wall = map(float, last_line(res).split())
        assert cpu <= 0.5 * wall * 1.15 + 0.1, (cpu, wall)


def test_calls_of_one_tool_share_its_cpu_quota_fairly():
    """Two calls of a tool with 1 CPU in all: the one with 4 busy processes does not starve the one
    with 1 (equal weights per call, not per process). Both calls pin themselves to one core, so that
    the weights alone decide: per call about 1 : 1, per process 1 : 4. (Unpinned on 2 cores, the hog
    also runs alone on the other core until the quota is spent, and the lone call got 0.40-0.91 of
    the hog's time, so a threshold could not tell the two apart reliably.)"""
    from concurrent.futures import ThreadPoolExecutor

    with PythonTool(timeout_s=10, memory_mb=256, pool_size=2, cpus=1.0, cpus_per_call=1.0) as t:
        if not t.protections.get("cpu_cgroup"):
            pytest.skip(f"no cpu cgroup here: {t.protections.get('cpu_cgroup_why')}")
        t.warm_up(60)
        with ThreadPoolExecutor(2) as ex:
            hog, one = ex.map(lambda n: t.run(PIN + BUSY.format(n=n, secs=2.0)), (4, 1))
        (hog_cpu, _), (one_cpu, one_wall) = (map(float, last_line(r).split()) for r in (hog, one))
        assert hog_cpu + one_cpu <= 1.0 * 2.0 * 1.2 + 0.2, (hog_cpu, one_cpu)
        # equal weights per call: about half each; per process (as before) the lone one got 1/4 of the hog
        assert one_cpu >= 0.6 * hog_cpu, (hog_cpu, one_cpu, one_wall)


# ---- item 9: tool-wide caps ------------------------------------------------------------------------
def _tool_cgroup(t: PythonTool, controller: str) -> Path:
    return Path(cgroup_dirs()[controller]) / f"arpo-sandbox-{t._state.zygote.proc.pid}"


def _read_first(d: Path, *names: str) -> str:
    for n in names:
        if (d / n).exists():
            return (d / n).read_text().strip()
    raise FileNotFoundError(f"none of {names} in {d}")


def test_tool_wide_caps_are_set_and_sized_to_the_concurrency(tool):
    """A tool had no cap of its own: 3 concurrent calls held 2.75 GB, and the default concurrency
    (8-40 calls) could take 9-43 GB. Now the tool's parent cgroups carry max_calls-sized limits."""
    p = tool.protections
    assert p["max_calls"] == 16 and p["tool_memory_mb"] == 16 * (MEMORY_MB + 64) + 64
    limit = int(_read_first(_tool_cgroup(tool, "memory"), "memory.max", "memory.limit_in_bytes"))
    assert limit == p["tool_memory_mb"] << 20
    if p["pids_cgroup"]:
        assert int(_read_first(_tool_cgroup(tool, "pids"), "pids.max")) == p["tool_pids"] == (16 + 1) * (64 + 4)
    if p["cpu_cgroup"]:
        d = _tool_cgroup(tool, "cpu")
        quota = ((d / "cpu.max").read_text().split()[0] if (d / "cpu.max").exists()
                 else (d / "cpu.cfs_quota_us").read_text())
        assert int(quota) == int(p["cpus"] * 100_000)


def test_the_tool_wide_memory_cap_holds_across_calls():
    """Three calls that each stay inside their own limit cannot together pass the tool's."""
    from concurrent.futures import ThreadPoolExecutor

    with PythonTool(timeout_s=10, memory_mb=256, pool_size=3, max_calls=3, tool_memory_mb=450) as t:
        if not t.protections.get("memory_cgroup"):
            pytest.skip("no memory cgroup here")
        t.warm_up(60)
        with ThreadPoolExecutor(3) as ex:
            results = list(ex.map(lambda _: t.run("b = bytearray(200 << 20)\nimport time; time.sleep(2)\n"
                                                  "print('held')"),
                                  range(3)))
        d = _tool_cgroup(t, "memory")
        peak = int(_read_first(d, "memory.peak", "memory.max_usage_in_bytes")) / 2**20
        assert peak <= 450 + 1, peak
        assert sum(r.ok for r in results) <= 2, [r.output[-200:] for r in results]


def test_the_tool_wide_process_cap_holds_across_calls():
    """Two calls that each fork 50 sleepers (under their own max_processes of 64) share tool_pids=80."""
    from concurrent.futures import ThreadPoolExecutor

    code = ("import os, time\nn = 0\nfor _ in range(50):\n    try:\n        pid = os.fork()\n    except OSError:\n"
            "        break\n    if pid == 0:\n        time.sleep(60); os._exit(0)\n    n += 1\n"
            "time.sleep(3)\nprint(n)")  # the sleepers live until the call ends, 3 s after the last fork
    with PythonTool(timeout_s=10, memory_mb=256, pool_size=2, max_calls=2, tool_pids=80) as t:
        if not t.protections.get("pids_cgroup"):
            pytest.skip("no pids cgroup here")
        t.warm_up(60)
        with ThreadPoolExecutor(2) as ex:
            results = list(ex.map(lambda _: t.run(code), range(2)))
        forked = [int(last_line(r)) for r in results if last_line(r).isdigit()]
        assert len(forked) == 2 and sum(forked) <= 80 - 2 * 2, [r.output[-200:] for r in results]


def test_a_call_beyond_max_calls_gets_a_clear_error():
    import threading

    with PythonTool(timeout_s=10, memory_mb=256, pool_size=1, max_calls=1, start_timeout_s=60) as t:
        t.warm_up(60)
        t.start_timeout_s = 1.5  # how long a call waits for a slot (and a worker) from here on
        first = threading.Thread(target=t.run, args=("import time; time.sleep(5)",))
        first.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        res = t.run("print(1)")
        waited = time.monotonic() - t0
        first.join()
        assert not res.ok and "max_calls" in res.output and "did not run" in res.output, res.output
        assert waited < 4, waited
        assert t.run("print(2)").output == "2"
