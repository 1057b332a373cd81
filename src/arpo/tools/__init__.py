"""Tools the agent can call. Each owns a tag (`<python>`, `<search>`); see tools/base.py."""

from __future__ import annotations

from arpo.errors import ArpoError
from arpo.tools.base import Tool, ToolRegistry, ToolResult  # noqa: F401

KNOWN_TOOLS = ("python", "search")


SEARCH_TOP_K = 3  # passages per search: the one default of `arpo eval/chat/tool/sft-data` and tools.search_top_k
SEARCH_MAX_CHARS = 300  # characters per passage (the reference's 10 x 1000 is set in configs/gpu/)


def build_tools(names: list[str], *, python_timeout_s: float = 5.0, max_output_chars: int = 2000,
                search_index: str | None = None, search_url: str | None = None, search_top_k: int = SEARCH_TOP_K,
                search_max_chars: int = SEARCH_MAX_CHARS, cache=None) -> ToolRegistry:
    """A registry with the named tools, configured from plain options (CLI flags / config keys).
    `cache`: a tools.cache.ToolCache shared by the tools (identical calls answered once), or None."""
    reg = _Registry(cache)
    for n in names:
        if n == "python":
            from arpo.tools.python import PythonTool

            reg.register(PythonTool(timeout_s=python_timeout_s, max_output_chars=max_output_chars))
        elif n == "search":
            from arpo.tools.search import SearchTool

            if search_url:
                reg.register(SearchTool(url=search_url, top_k=search_top_k, max_chars=search_max_chars))
            else:
                index = load_index(search_index)
                reg.register(SearchTool(index=index, top_k=search_top_k, max_chars=search_max_chars))
        else:
            raise ArpoError(f"unknown tool {n!r}; available: {', '.join(KNOWN_TOOLS)}")
    return reg


class _Registry(ToolRegistry):
    """A ToolRegistry whose tools are wrapped in a shared cache when one is given."""

    def __init__(self, cache=None):
        super().__init__()
        self.cache = cache

    def register(self, tool: Tool) -> None:
        if self.cache is not None:
            from arpo.tools.cache import CachedTool

            tool = CachedTool(tool, self.cache)
        super().register(tool)

    def close(self) -> None:
        super().close()
        if self.cache is not None and self.cache.path is not None:
            self.cache.save()


def default_index_dir():
    from arpo.tools.index import default_index_dir

    return default_index_dir()


def load_index(path: str | None = None):
    """The index at `path`, or the default one (built on first use from the built-in HotpotQA)."""
    from arpo.tools.index import Index, default_index

    if path is None:
        return default_index()
    try:
        return Index.load(path)
    except Exception as e:
        raise ArpoError(f"search index {path!r} cannot be loaded ({e}); build one with "
                        f"`arpo index build FILES --out {path}`, leave the index unset for the default "
                        "(built-in HotpotQA) or pass --search-url") from e
