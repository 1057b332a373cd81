"""Tools the agent can call; `build_tools` makes a registry of them from names, `tools_from_config` from
a config's `tools:` section (settings.ToolsConfig, whose defaults and names this package reads).

    base.py          the Tool protocol, ToolResult, ToolCall and the tags (every tool imports it)
    registry.py      ToolRegistry: name -> tool, the stop strings, the tag format's parse, run
    python.py        the sandboxed `python` tool; python_session.py: with state per trajectory
    sandbox/         where model-written code runs (docs/sandbox.md)
    search.py        the `search` tool over a local index or a retriever (arpo/retrieval/)
    web/             `web_search` and `browse`, their settings in settings/web.py, and HTTP plumbing
    plugins/         your own functions and classes (`module.path:name`, plugins/function.py),
                     MCP servers' tools (plugins/mcp.py) and environments (`env:`/`openenv:`, plugins/env.py;
                     `vf:`, plugins/verifiers.py)
    cache.py         one result for identical calls

How a call is written and its result appended (tags or json) is rollout/tool_formats.py, beside the
agent loop. base.py and registry.py stay here: every tool returns a ToolResult and build_tools fills
a ToolRegistry, and the rollout imports this package, not the other way round."""

from __future__ import annotations

from collections.abc import Mapping

from arpo.errors import ArpoError
from arpo.retrieval import load_index
from arpo.settings.agent import (
    KNOWN_TOOLS,
    MAX_OUTPUT_CHARS,
    PYTHON_TIMEOUT_S,
    SEARCH_MAX_CHARS,
    SEARCH_TOP_K,
    ToolOptions,
    ToolsConfig,
    tool_options,
)
from arpo.settings.web import WebConfig, web_config
from arpo.tools.base import Tool, ToolResult  # noqa: F401
from arpo.tools.cache import CachedTool, ToolCache
from arpo.tools.plugins.env import env_tool
from arpo.tools.plugins.function import as_tool, load_tool, snake_case
from arpo.tools.plugins.mcp import MCPServerTools
from arpo.tools.python import PythonTool
from arpo.tools.python_session import PythonSessionTool
from arpo.tools.registry import ToolRegistry, source_of
from arpo.tools.search import SearchTool
from arpo.tools.web.browse import BrowseTool
from arpo.tools.web.web_search import WebSearchTool


def check_web(cfg: ToolsConfig) -> None:
    """With web_search on the local web (provider local, the default): the local web must answer, or
    one ArpoError line says where and how to start it. Without this check `arpo eval / train / chat /
    serve agent` ran to the end with rc 0, every search an error result. Those commands call it
    before their model loads (a library caller's registry is not checked: one more request)."""
    from arpo.tools.web.web_search import require_local_web  # noqa: PLC0415 - loads httpx; only with web_search

    if "web_search" in cfg.enabled:
        require_local_web(cfg.web)


def tools_from_config(cfg: ToolsConfig) -> ToolRegistry:
    """The registry a `tools:` section asks for (settings.ToolsConfig): its web key checked first, its
    cache shared by the cacheable tools."""
    cfg.check_keys()
    cache = ToolCache(path=cfg.cache_path) if cfg.cache else None
    return build_tools(cfg.enabled, python_timeout_s=cfg.python_timeout_s, max_output_chars=cfg.max_output_chars,
                       search_index=cfg.search_index, search_url=cfg.search_url, search_top_k=cfg.search_top_k,
                       search_max_chars=cfg.search_max_chars, cache=cache, options=cfg.options, mcp=cfg.mcp,
                       python_session=cfg.python_session, web=cfg.web)


def _register_env(reg: ToolRegistry, spec: str) -> None:
    """An environment's tools: `env:`/`openenv:` one tool with sessions (plugins/env.py), `vf:` a verifiers
    task's tools (plugins/verifiers.py)."""
    if spec.startswith("vf:"):
        from arpo.tools.plugins.verifiers import vf_tools  # noqa: PLC0415 - only for vf: specs (a worker in its own venv)

        tools: list = list(vf_tools(spec))
    else:
        tools = [env_tool(spec)]
    for t in tools:
        reg.register(t, f"the environment {spec!r} (tools.enabled)")


def build_tools(names: list[str], *, python_timeout_s: float = PYTHON_TIMEOUT_S,
                max_output_chars: int = MAX_OUTPUT_CHARS, search_index: str | None = None,
                search_url: str | None = None, search_top_k: int = SEARCH_TOP_K,
                search_max_chars: int = SEARCH_MAX_CHARS, cache=None,
                options: Mapping[str, ToolOptions | dict] | None = None, mcp: list | None = None,
                python_session: bool = False, web: WebConfig | dict | None = None) -> ToolRegistry:
    """A registry with the named tools, configured from plain options (CLI flags / config keys).
    `names`: built-in tools (python, search) and your own as `module.path:function_or_class`;
    `options`: {tool name: ToolOptions or a dict of its keys (timeout_s, max_concurrency, max_output_chars,
    cache)} for your tools;
    `mcp`: MCP servers whose tools join the registry ({command, args, env} or {url}, tools/plugins/mcp.py);
    `cache`: a tools.cache.ToolCache shared by the cacheable tools (identical calls answered once);
    `python_session`: python keeps its state per trajectory and forks with the tree (tools/python_session.py);
    `web`: the web tools' settings, a settings.web.WebConfig or a dict of its keys (None: defaults,
    the local web of `arpo web serve`). A dict is parsed here, once (settings.web.web_config); both
    web tools get the one WebConfig."""
    own_options = {k: v if isinstance(v, ToolOptions) else tool_options(v, f"tools.options.{k}")
                   for k, v in (options or {}).items()}
    web = web if isinstance(web, WebConfig) else web_config(web)

    def keys(spec: str) -> list[str]:  # a tool's options may be keyed by its attribute or its tool name
        attr = spec.rsplit(":", 1)[1].rsplit(".", 1)[-1]
        return list(dict.fromkeys([attr, snake_case(attr)]))

    own = [k for n in names if ":" in n for k in keys(n)]
    stray = [k for k in own_options if k not in own]
    if stray:  # a misspelt name used to be ignored, and the tool ran with the defaults
        raise ArpoError(f"tools.options: {', '.join(map(repr, stray))} is none of your enabled tools "
                        f"({', '.join(own) or 'none: tools.options applies to module.path:function tools'})")
    reg = _Registry(cache)
    try:
        for n in names:
            builtin = f"the built-in tool {n!r} (tools.enabled)"
            if n == "python" and python_session:
                reg.register(PythonSessionTool(timeout_s=python_timeout_s, max_output_chars=max_output_chars), builtin)
            elif n == "python":
                reg.register(PythonTool(timeout_s=python_timeout_s, max_output_chars=max_output_chars), builtin)
            elif n == "search":
                if search_url:
                    reg.register(SearchTool(url=search_url, top_k=search_top_k, max_chars=search_max_chars), builtin)
                else:
                    index = load_index(search_index)
                    reg.register(SearchTool(index=index, top_k=search_top_k, max_chars=search_max_chars), builtin)
            elif n in ("web_search", "browse"):
                reg.register((WebSearchTool if n == "web_search" else BrowseTool)(web), builtin)
            elif n.startswith(("env:", "openenv:", "vf:")):  # an environment's tools
                _register_env(reg, n)
            elif ":" in n:
                # `Sql` or `sql`: it used to miss the second
                name = next((k for k in keys(n) if k in own_options), keys(n)[0])
                topts = own_options.get(name) or ToolOptions()
                topts.validate(f"tools.options.{name}")
                tool = load_tool(n, topts)
                tool.cacheable = topts.cache
                reg.register(tool, f"your tool {n!r} (tools.enabled)")
            else:
                raise ArpoError(f"unknown tool {n!r}; available: {', '.join(KNOWN_TOOLS)} or your own as "
                                "module.path:function (e.g. mypkg.tools:lookup_order)")
        for i, server in enumerate(mcp or []):
            src = MCPServerTools(server)
            reg.sources.append(src)
            for tool in src.tools():
                reg.register(tool, f"the tool {tool.name!r} of MCP server {src.label} (tools.mcp[{i}])")
    except BaseException:
        reg.close()
        raise
    return reg


class _Registry(ToolRegistry):
    """A ToolRegistry whose tools are wrapped in a shared cache when one is given."""

    def __init__(self, cache=None):
        super().__init__()
        self.cache = cache
        self.sources: list = []  # MCP server connections (closed with the registry)

    def register(self, tool, source: str | None = None) -> None:
        tool = as_tool(tool)
        source = source or source_of(tool)
        if self.cache is not None and tool.cacheable:  # your tools: only when options say so
            tool = CachedTool(tool, self.cache)
        try:
            super().register(tool, source)
        except Exception:
            tool.close()  # a tool refused (its name is taken) keeps no workers
            raise

    def close(self) -> None:
        super().close()
        for src in self.sources:
            src.close()
        self.sources.clear()
        if self.cache is not None and self.cache.path is not None:
            self.cache.save()
