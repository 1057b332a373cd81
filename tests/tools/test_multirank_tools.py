"""What the web tools and the tool cache do when several processes of one node (torchrun's ranks)
run them at once: one web rate for the node, and one cache file that holds every process's entries."""

import subprocess
import sys
import time
from pathlib import Path

from web_servers import scripted_server

SRC = str(Path(__file__).resolve().parents[2] / "src")

SEARCHER = """
import sys, time
from pathlib import Path
import httpx  # imported before the burst, so the first request is not late by an import
from arpo.settings.web import web_config
from arpo.tools.web.web_search import WebSearchTool
tool = WebSearchTool(web_config({"provider": "searxng", "url": sys.argv[1], "rate_limit": float(sys.argv[2])}))
print("ready", flush=True)
while not Path(sys.argv[3]).exists():  # both processes start their burst together
    time.sleep(0.01)
for j in range(int(sys.argv[4])):
    assert tool(f"{sys.argv[5]} query {j}").ok
"""


def _env(tmp_path):
    import os

    return dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1", ARPO_RATE_LIMIT_DIR=str(tmp_path / "rates"))


def test_two_processes_share_one_web_rate(tmp_path):
    """Two processes each send a burst of 8 searches at rate_limit 5/s to one local server: the
    server sees 16 requests over ~3 s (5.1/s measured) and never more than 5 (+ jitter) in a
    second. Before: each process had its own limiter, the node sent 16 in 1.87 s (8.0/s), 10 in
    one second."""
    ok = (200, {}, {"results": [{"title": "T", "url": "https://e.org/t", "content": "c"}]})
    go, rate, n = tmp_path / "go", 5.0, 8
    with scripted_server(lambda req: ok) as srv:
        procs = [subprocess.Popen([sys.executable, "-c", SEARCHER, srv.url, str(rate), str(go), str(n), f"p{i}"],
                                  env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(2)]
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()[-3000:]
        go.write_text("")
        for p in procs:
            assert p.wait(timeout=120) == 0, p.stderr.read()[-3000:]
        times = sorted(r.t for r in srv.requests)
    assert len(times) == 2 * n
    # the limiter spaces the sends; arrivals jitter by the client's latency on a busy machine (a late
    # first request and an on-time second one arrive together), hence the +3 on one-second windows
    per_second = max(sum(1 for u in times if t <= u < t + 1.0) for t in times)
    assert per_second <= rate + 3, [round(t - times[0], 3) for t in times]
    assert (len(times) - 1) / (times[-1] - times[0]) <= rate * 1.1, [round(t - times[0], 3) for t in times]


def test_two_processes_share_a_limiter_file(tmp_path):
    """The limiter's slot lives in a file: a second limiter on that file (another process's) waits
    for the slots the first one booked."""
    from arpo.tools.web.webhttp import RateLimiter

    a, b = RateLimiter(10.0, tmp_path / "slot"), RateLimiter(10.0, tmp_path / "slot")
    t0 = time.monotonic()
    for lim in (a, b, a, b):
        lim.acquire()
    assert time.monotonic() - t0 >= 0.27  # 4 slots 0.1 s apart: 0.3 s (0.27: the sleep's granularity)


CACHER = """
import sys, time
from pathlib import Path
from arpo.tools.base import ToolResult
from arpo.tools.cache import ToolCache
cache = ToolCache(path=sys.argv[1])  # both load the (empty) file first, like the ranks at the start of a run
print("ready", flush=True)
while not Path(sys.argv[2]).exists():
    time.sleep(0.01)
for j in range(50):
    cache.put("search", f"{sys.argv[3]} {j}", ToolResult(f"out {sys.argv[3]} {j}"))
    if j % 10 == 9:
        cache.save()
"""


def test_two_processes_saving_one_cache_file_keep_both_keys(tmp_path):
    """Before: save() wrote this process's entries over the file (the last writer won)."""
    from arpo.tools.cache import ToolCache

    path, go = tmp_path / "cache.json", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", CACHER, str(path), str(go), f"rank{i}"], env=_env(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()[-3000:]
    go.write_text("")
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()[-3000:]
    merged = ToolCache(path=path)
    assert len(merged) == 100
    for i in range(2):
        hit = merged.get("search", f"rank{i} 49")
        assert hit is not None and hit.output == f"out rank{i} 49"


def test_save_merges_with_what_another_process_saved(tmp_path):
    from arpo.tools.base import ToolResult
    from arpo.tools.cache import ToolCache

    path = tmp_path / "c.json"
    a, b = ToolCache(path=path), ToolCache(path=path)  # both loaded before either saved
    a.put("search", "alpha", ToolResult("A"))
    b.put("search", "beta", ToolResult("B"))
    b.put("search", "alpha", ToolResult("A from b"))
    a.save()
    b.save()  # merges: keeps a's keys; on a key both have, the saving process's value wins
    c = ToolCache(path=path)
    assert len(c) == 2 and c.get("search", "beta").output == "B" and c.get("search", "alpha").output == "A from b"
