"""The shared tool cache: identical calls answered once, only successes kept, thread-safe, persistent."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from arpo.errors import ArpoError
from arpo.tools.base import ToolResult
from arpo.tools.cache import CachedTool, ToolCache


class SlowTool:
    name = "search"

    def __init__(self, fail=False):
        self.calls = 0
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, q):
        with self.lock:
            self.calls += 1
        time.sleep(0.05)
        return ToolResult("Error: down" if self.fail else f"Page 1: {q.strip().lower()}", ok=not self.fail)


def test_hits_are_normalized_and_marked_cached():
    t = CachedTool(SlowTool(), ToolCache())
    a = t("Ed  Wood ")
    b = t("ed wood")
    assert t.tool.calls == 1
    assert not a.cached and b.cached and a.output == b.output
    assert t.cache.stats()["hits"] == 1


def test_python_keys_keep_case_and_inner_whitespace():
    c = ToolCache()
    c.put("python", "print('A')", ToolResult("A"))
    assert c.get("python", "print('a')") is None
    assert c.get("python", "  print('A')\n").output == "A"


def test_failures_are_not_cached():
    t = CachedTool(SlowTool(fail=True), ToolCache())
    assert not t("x").ok and not t("x").ok
    assert t.tool.calls == 2 and len(t.cache) == 0


def test_concurrent_identical_calls_run_once():
    t = CachedTool(SlowTool(), ToolCache())
    with ThreadPoolExecutor(8) as ex:
        outs = list(ex.map(t, ["same query"] * 8))
    assert t.tool.calls == 1
    assert len({o.output for o in outs}) == 1


def test_lru_eviction_and_atomic_persistence(tmp_path):
    c = ToolCache(max_entries=2, path=tmp_path / "cache.json")
    for q in ("a", "b", "c"):
        c.put("search", q, ToolResult(q.upper()))
    assert c.get("search", "a") is None and c.get("search", "c").output == "C"
    c.save()
    # no temporary file left (the lock file that serializes processes' saves stays, empty)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".cache.json.lock", "cache.json"]
    d = ToolCache(path=tmp_path / "cache.json")
    assert len(d) == 2 and d.get("search", "b").output == "B"


def test_save_without_a_path_says_so(tmp_path):
    c = ToolCache()  # in memory only
    c.put("search", "a", ToolResult("A"))
    with pytest.raises(ArpoError, match="no path given"):
        c.save()
    assert c.save(tmp_path / "c.json") == tmp_path / "c.json" and len(ToolCache(path=tmp_path / "c.json")) == 1


def test_build_tools_wraps_with_shared_cache():
    from arpo.tools import build_tools

    cache = ToolCache()
    reg = build_tools(["python"], cache=cache)
    try:
        r1 = reg["python"]("print(6*7)")
        r2 = reg["python"]("print(6*7)")
    finally:
        reg.close()
    assert r1.output.strip() == "42" and r2.cached and cache.hits == 1
