"""browse never reaches this machine through one of its own global addresses (issue 61, crossing 1).

The test runs a child Python in a fresh network namespace (`unshare -n`, root or user namespaces) whose
loopback carries a public IPv4, a global IPv6 and a local route of public addresses; a server there,
bound to `::` (both families), holds a secret. Before the fix `BrowseTool()` returned the secret for
each address, and also by following a page's 302 to the address the request came from."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("trafilatura")

ROOT = Path(__file__).resolve().parents[2]
V4, V6, ROUTE, IN_ROUTE = "93.184.216.34", "2606:4700::1111", "44.0.0.0/24", "44.0.0.9"

CHILD = r'''
import json, socket, subprocess, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
V4, V6, ROUTE, IN_ROUTE = sys.argv[1:5]
for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", V4 + "/32", "dev", "lo"],
            ["ip", "-6", "addr", "add", V6 + "/128", "dev", "lo", "nodad"],
            ["ip", "route", "add", "local", ROUTE, "dev", "lo"]):
    subprocess.run(cmd, check=True)

class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path == "/start":  # back to the address the request came from
            self.send_response(302)
            peer = self.client_address[0].removeprefix("::ffff:")
            self.send_header("location", f"http://{peer}:{PORT}/secret")
            self.send_header("content-length", "0"); self.end_headers(); return
        body = b"the machine's secret"
        self.send_response(200); self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)

class Dual(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True
    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

httpd = Dual(("::", 0), H)
PORT = httpd.server_address[1]
threading.Thread(target=httpd.serve_forever, daemon=True).start()

real = socket.getaddrinfo
def getaddrinfo(host, port, *a, **k):  # a public name for this machine's public address
    return real(V4 if host == "public.test" else host, port, *a, **k)
socket.getaddrinfo = getaddrinfo

from arpo.settings.web import web_config
from arpo.tools.web.browse import BrowseTool
out = {}
for nonlocal_bind in ("0", "1"):
    for fam in ("ipv4", "ipv6"):
        with open(f"/proc/sys/net/{fam}/ip_nonlocal_bind", "w") as f:
            f.write(nonlocal_bind)
    cfg = {"provider": "ddgs", "browse_timeout_s": 5, "retries": 0}
    for name, url, extra in (("v4", f"http://{V4}:{PORT}/secret", {}),
                             ("v6", f"http://[{V6}]:{PORT}/secret", {}),
                             ("route", f"http://{IN_ROUTE}:{PORT}/secret", {}),
                             ("redirect", f"http://public.test:{PORT}/start",
                              {"allow_hosts": [f"public.test:{PORT}"]})):
        r = BrowseTool(web_config(cfg | extra))(url)
        out[f"{name}/nonlocal={nonlocal_bind}"] = [r.ok, r.output[-300:]]
print(json.dumps(out))
'''


def netns_ok() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not netns_ok(), reason="needs `unshare -n` (root) and iproute2")
def test_browse_refuses_every_address_of_this_machine():
    p = subprocess.run(["unshare", "-n", sys.executable, "-c", CHILD, V4, V6, ROUTE, IN_ROUTE],
                       capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(out) == 8
    for case, (ok, text) in out.items():
        assert not ok and "secret" not in text, (case, text)
        assert "of this machine" in text, (case, text)


def test_site_local_ipv6_is_refused():
    """fec0::/10 is `is_global` in Python 3.11."""
    import ipaddress

    from arpo.tools.web.webnet import refusal

    assert refusal(ipaddress.ip_address("fec0::1")) is not None
    assert refusal(ipaddress.ip_address("feff:ffff::1")) is not None
