"""A shared tool-result cache: the same call is answered once per run (or across runs).

ARPO trees make many identical calls: branches re-issue their parent's queries, and groups of M
samples of one prompt often write the same search or the same small program. Both tools are pure
functions of their input here (the search corpus is fixed; python runs in a fresh sandbox with no
state), so a result can be reused. Only successful results are cached (a timeout or a server error
is retried next time). The web tools are cached the same way: within a run a page or a query is read
once, so branches see the same web. Keys are normalized: surrounding whitespace, and for search also case and
inner whitespace.

Thread-safe; concurrent identical calls are deduplicated (one runs, the others wait for it).
`save()` writes the cache atomically as JSON; `ToolCache(path=...)` loads it. Several processes may
save to one file (torchrun's ranks share tools.cache_path): under a file lock, save() reads what is
there and writes the union, this process's entries winning on a key both have — no rank's entries
are lost to another's save.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

from arpo.errors import ArpoError
from arpo.tools.base import Tool, ToolResult, as_protocol_tool


def normalize(tool: str, text: str) -> str:
    text = text.strip()
    if tool in ("search", "web_search"):
        text = " ".join(text.lower().split())
    return text


class ToolCache:
    def __init__(self, max_entries: int = 100_000, path: str | Path | None = None):
        self.max_entries = max_entries
        self.path = Path(path) if path else None
        self._d: OrderedDict[tuple[str, str], dict] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        if self.path and self.path.is_file():
            for row in _read_rows(self.path):
                self._d[(row["tool"], row["key"])] = {"output": row["output"], "truncated": row.get("truncated", False)}

    def get(self, tool: str, text: str) -> ToolResult | None:
        k = (tool, normalize(tool, text))
        with self._lock:
            v = self._d.get(k)
            if v is None:
                self.misses += 1
                return None
            self._d.move_to_end(k)
            self.hits += 1
        return ToolResult(v["output"], ok=True, truncated=v["truncated"], cached=True)

    def put(self, tool: str, text: str, result: ToolResult) -> None:
        if not result.ok:
            return
        k = (tool, normalize(tool, text))
        with self._lock:
            self._d[k] = {"output": result.output, "truncated": result.truncated}
            self._d.move_to_end(k)
            while len(self._d) > self.max_entries:
                self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def stats(self) -> dict:
        return {"entries": len(self), "hits": self.hits, "misses": self.misses, "hit_rate": round(self.hit_rate, 4)}

    def save(self, path: str | Path | None = None) -> Path:
        target = path or self.path
        if target is None:
            raise ArpoError("ToolCache.save: no path given, and the cache was made without one (ToolCache(path=...))")
        from filelock import FileLock

        p = Path(target)
        with self._lock:
            mine = [{"tool": t, "key": k, **v} for (t, k), v in self._d.items()]
        with FileLock(str(p.with_name(f".{p.name}.lock"))):  # read-merge-write, one process at a time
            merged = {(r["tool"], r["key"]): r for r in (_read_rows(p) if p.is_file() else [])}
            for r in mine:  # ours last: newest, and kept when the size cap drops the oldest
                merged.pop((r["tool"], r["key"]), None)
                merged[(r["tool"], r["key"])] = r
            rows = list(merged.values())[-self.max_entries:]
            tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
            tmp.write_text(json.dumps(rows))
            os.replace(tmp, p)
        return p


def _read_rows(path: Path) -> list[dict]:
    """The rows of a saved cache file."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArpoError(f"{path}: not a tool cache saved by arpo (JSON rows): {e}; delete it or fix "
                        "tools.cache_path") from e


class CachedTool(Tool):
    """Wraps a tool with a ToolCache; the tool's `name`, description and schema, `__call__`, `call`, `close`."""

    def __init__(self, tool, cache: ToolCache):
        self.tool, self.cache = as_protocol_tool(tool), cache
        self.name, self.description, self.schema = tool.name, self.tool.description, self.tool.schema
        self.cacheable, self.sessions = self.tool.cacheable, self.tool.sessions
        self._inflight: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def __call__(self, input: str) -> ToolResult:
        hit = self.cache.get(self.name, input)
        if hit is not None:
            return hit
        key = normalize(self.name, input)
        with self._lock:
            ev = self._inflight.get(key)
            owner = ev is None
            if ev is None:
                ev = self._inflight[key] = threading.Event()
        if not owner:  # the same call is running in another thread: wait and reuse its result
            ev.wait()
            hit = self.cache.get(self.name, input)
            if hit is not None:
                return hit
            return self.tool(input)  # it failed there (not cached): run it ourselves
        try:
            r = self.tool(input)
            self.cache.put(self.name, input, r)
            return replace(r, cached=False)
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            ev.set()

    def call(self, args: dict) -> ToolResult:
        """Function-calling form: the canonical JSON of the arguments is the cache key."""
        key = json.dumps(args, sort_keys=True, ensure_ascii=False)
        hit = self.cache.get(self.name, key)
        if hit is not None:
            return hit
        r = self.tool.call(args)
        self.cache.put(self.name, key, r)
        return replace(r, cached=False)

    @property
    def single_string_arg(self) -> str | None:
        return self.tool.single_string_arg

    def close(self) -> None:
        self.tool.close()

    def __getattr__(self, name):  # expose the wrapped tool's attributes (isolation, counters, ...)
        return getattr(self.tool, name)
