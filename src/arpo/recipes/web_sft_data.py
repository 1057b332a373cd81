"""`arpo web sft-data`: worked deep-search trajectories made through the real web tools (web_search
+ browse), written as SFT JSONL. The trajectories (HotpotQA-style rows by their supporting pages,
webhop questions by their scripted path) are sft/web.py."""

from __future__ import annotations

from arpo.data.sources import iter_rows
from arpo.settings.web import WebConfig, require_web_keys, web_config
from arpo.sft.rows import convert_rows, row_stats, write_rows
from arpo.sft.web import to_deep_search
from arpo.tools import build_tools
from arpo.tools.web.web_search import require_local_web


def build_deep_search_sft(data: str, out_path: str, web: WebConfig | dict | None = None,
                          limit: int | None = None, max_pages: int = 2, progress: bool = True) -> dict:
    """Convert the rows of the data spec `data` (HotpotQA rows, or webhop questions) until `limit`
    rows check out; write JSONL atomically. None checking out is an error and an existing `out_path`
    is kept (a rerun with the web down replaced a good file with an empty one). Returns {written,
    read, dropped{reason: n}, out}. `web`: the web tools' settings, or a dict of their keys (None: the
    local web's defaults)."""
    web = web if isinstance(web, WebConfig) else web_config(web)
    require_web_keys(["web_search"], web)  # a missing key failed every row, silently
    require_local_web(web)  # the local web down: 456 s of silent retries, then nothing written
    tools = build_tools(["web_search", "browse"], web=web)
    try:
        src = [row for _, row in iter_rows(data)]
        rows, reasons = convert_rows(
            src, lambda r: to_deep_search(r, tools["web_search"], tools["browse"], max_pages),
            limit, progress, "deep-search trajectories")
    finally:
        tools.close()
    return row_stats(rows, reasons, write_rows(out_path, rows, reasons))
