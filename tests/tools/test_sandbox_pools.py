"""Host pools and host facts a call reached in the red team of issue 61 (each failed before): IPv6
multicast and anycast joins (host slab, uncharged), flow-label leases (one machine-wide pool),
memfd_create(MFD_HUGETLB) (the host's huge pages), and /proc files of the host's kernel build,
interrupts, memory zones and PCI devices. Run as root (as CI does): without namespaces the tests skip."""

from __future__ import annotations

import errno

import pytest

from arpo.tools.python import PythonTool


@pytest.fixture(scope="module")
def tool():
    with PythonTool(timeout_s=20, memory_mb=256, pool_size=1) as t:
        if t.isolation != "namespaces":
            pytest.skip(f"full isolation needs root and namespaces here (got {t.isolation!r})")
        yield t


def last_line(res) -> str:
    lines = res.output.strip().splitlines()
    return lines[-1] if lines else ""


TRY = "import socket, struct, os\ntry:\n{body}\n    print('ok')\nexcept OSError as e:\n    print(e.errno)\n"
GROUP = "socket.inet_pton(socket.AF_INET6, 'ff02::1:3')"
OPTIONS = {
    "ipv6_add_membership": "    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
                           f"    s.setsockopt(socket.IPPROTO_IPV6, 20, {GROUP} + struct.pack('@I', 1))",
    "mcast_join_group": "    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
                        "    sa = struct.pack('=HHI', socket.AF_INET6, 0, 0) + "
                        f"{GROUP} + struct.pack('=I', 0) + bytes(128 - 28)\n"
                        "    s.setsockopt(socket.IPPROTO_IPV6, 42, struct.pack('=I', 1) + bytes(4) + sa)",
    "ipv6_join_anycast": "    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
                         "    s.setsockopt(socket.IPPROTO_IPV6, 27, socket.inet_pton(socket.AF_INET6, '2001:db8::1')"
                         " + struct.pack('@I', 1))",
    # struct in6_flowlabel_req: dst, label (be32), action GET, share EXCL, flags CREATE, expires, linger, pad
    "flowlabel_mgr": "    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
                     "    req = socket.inet_pton(socket.AF_INET6, '::1') + struct.pack('!I', 0x12345) + "
                     "struct.pack('=BBHHHI', 0, 1, 1, 0, 0, 0)\n"
                     "    s.setsockopt(socket.IPPROTO_IPV6, 32, req)",
    "memfd_hugetlb": "    os.memfd_create('huge', os.MFD_HUGETLB)",
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_uncharged_pools_are_denied(tool, name):
    res = tool.run(TRY.format(body=OPTIONS[name]))
    assert last_line(res) == str(errno.EPERM), (name, res.output[-300:])


def test_what_calls_use_stays(tool):
    """Ordinary IPv6 options, IPv4 joins (capped per socket by the kernel) and plain memfds still work."""
    body = ("    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
            "    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)\n"
            "    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 5)\n"
            "    s.bind(('::1', 0))\n"
            "    os.close(os.memfd_create('plain')) if hasattr(os, 'memfd_create') else None")
    res = tool.run(TRY.format(body=body))
    assert last_line(res) == "ok", res.output[-300:]


def test_host_kernel_build_interrupts_zones_and_devices_are_not_shown(tool):
    res = tool.run("import os\nfor f in ('config.gz', 'interrupts', 'zoneinfo'):\n"
                   "    try:\n        print(f, len(open('/proc/' + f, 'rb').read()))\n"
                   "    except FileNotFoundError:\n        print(f, 0)\n"
                   "print('bus', os.listdir('/proc/bus') if os.path.isdir('/proc/bus') else [])\n")
    assert res.output.split("\n") == ["config.gz 0", "interrupts 0", "zoneinfo 0", "bus []"], res.output


def test_the_host_cgroup_path_is_not_shown(tool):
    """/proc/self/cgroup showed the host's cgroup path of the call (the container's id and arpo's tree)."""
    res = tool.run("print(sorted({line.split(':', 2)[2] for line in open('/proc/self/cgroup').read().split()}))")
    assert last_line(res) == "['/']", res.output
