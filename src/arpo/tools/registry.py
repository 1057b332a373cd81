"""The tool registry: maps tags to tools, gives the agent its stop strings and parses the model's
last call (the protocol's types are in tools/base.py; plain functions and classes become tools
through tools/plugins/function.py).

A name belongs to one tool: registering a second tool under a name already taken (a built-in, your
own function or class, an MCP server's tool, or two MCP servers offering one name) is an ArpoError
that names both sources. An MCP tool called `python` used to replace the sandboxed python tool
silently while the prompt still described the built-in (issue 37)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from arpo.errors import ArpoError
from arpo.tools.base import ANSWER_TAG, NON_CALL_TAGS, Tool, ToolCall, ToolResult, has_sessions
from arpo.tools.plugins.function import as_tool


class ToolRegistry:
    """Maps tags to tools; provides the stop strings and parses the model's last call."""

    def __init__(self, tools: Iterable[Tool] = ()):
        self._tools: dict[str, Tool] = {}
        self._sources: dict[str, str] = {}  # tool name -> where it came from (for the duplicate error)
        for t in tools:
            self.register(t)

    def register(self, tool, source: str | None = None) -> None:
        """Add a tool: a Tool, or any function / class (tools/plugins/function.py builds its schema).
        `source`: where it comes from, in words (default: made from the tool, source_of)."""
        tool = as_tool(tool)
        self._add(tool, source or source_of(tool))

    def _add(self, tool: Tool, source: str) -> None:
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", tool.name):
            raise ValueError(f"tool tag {tool.name!r} must be lowercase [a-z0-9_]")
        if tool.name in (ANSWER_TAG, "result", "think"):
            raise ValueError(f"tag <{tool.name}> is reserved by the protocol")
        if tool.name in self._tools:
            raise ArpoError(f"two tools are named {tool.name!r}: {self._sources[tool.name]} and {source}; a name "
                            "belongs to one tool (the agent would call one while its prompt describes the other): "
                            "remove one of them, or rename your tool")
        self._tools[tool.name] = tool
        self._sources[tool.name] = source

    def source(self, tag: str) -> str:
        """Where tool `tag` came from, in words."""
        return self._sources[tag]

    def __contains__(self, tag: str) -> bool:
        return tag in self._tools

    def __getitem__(self, tag: str) -> Tool:
        return self._tools[tag]

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def stop_strings(self) -> list[str]:
        """Generation pauses at any tool's closing tag and ends at `</answer>`."""
        return [f"</{t}>" for t in self._tools] + [f"</{ANSWER_TAG}>"]

    def parse_last_call(self, segment: str) -> ToolCall | None:
        """Parse the tool call that ends `segment` (the text generated since the last result).

        Returns None when the segment ends with `</answer>` or no closing tag at all (a plain finish).
        Unknown tags, unclosed tags and empty bodies become a ToolCall with `error` set: the agent
        receives the error as its result and the trajectory goes on (issue #2, item 3).
        """
        m = re.search(r"</([A-Za-z_][A-Za-z0-9_]*)>\s*$", segment.rstrip()) or re.search(
            r"</([A-Za-z_][A-Za-z0-9_]*)>", segment[-40:]
        )
        if m is None:
            return None
        tag = m.group(1)
        if tag in NON_CALL_TAGS:
            return None
        close_at = segment.rfind(f"</{tag}>")
        head = segment[:close_at]
        open_at = head.rfind(f"<{tag}>")
        if tag not in self._tools:
            known = ", ".join(f"<{t}>" for t in self._tools) or "none"
            return ToolCall(tag, "", error=f"Error: unknown tool <{tag}>. Available tools: {known}.")
        if open_at < 0:
            return ToolCall(tag, "", error=f"Error: found </{tag}> without an opening <{tag}> tag.")
        body = head[open_at + len(tag) + 2 :].strip()
        if not body:
            return ToolCall(tag, "", error=f"Error: empty <{tag}> call; put the input between the tags.")
        return ToolCall(tag, body)

    # -- tools with per-trajectory sessions (tools/python_session.py) --------------------------------
    def fork_sessions(self, parent, child, calls) -> None:
        """The rollout forked trajectory `parent` into `child`, which inherits `calls` (the parent's call
        records up to the branch point): each session tool forks its state as of its last such call."""
        for name, tool in self._tools.items():
            if has_sessions(tool):
                tool.fork(str(parent), str(child), sum(1 for c in calls if c.tool == name))

    def bind_sessions(self, examples) -> None:
        """Trajectories start: `examples` maps each one's key (its sequence id) to its example; session
        tools that play a task per trajectory (an environment, tools/plugins/env.py) learn theirs."""
        for tool in self._tools.values():
            bind = getattr(tool, "bind", None)
            if bind is not None and has_sessions(tool):
                for k, ex in examples.items():
                    bind(str(k), ex)

    def end_sessions(self, keys) -> None:
        for tool in self._tools.values():
            if has_sessions(tool):
                for k in keys:
                    tool.end(str(k))

    def close(self) -> None:
        """Release tool resources (worker pools, connections) of tools that hold any."""
        for t in self._tools.values():
            t.close()

    def run(self, call: ToolCall) -> ToolResult:
        """Run a parsed call; errors (malformed call or a tool that raised) become error results."""
        if call.error is not None:
            tool = self._tools.get(call.tag)
            if tool is not None and call.session is not None and hasattr(tool, "refused"):
                tool.refused(call.session)  # an environment counts its trajectory's calls (plugins/env.py)
            return ToolResult(call.error, ok=False)
        try:
            tool = self._tools[call.tag]
            if has_sessions(tool) and call.session is not None:  # state per trajectory
                if call.arguments is not None and hasattr(tool, "run_session_args"):  # json format, several args
                    return tool.run_session_args(call.session, call.arguments)  # (plugins/verifiers.py)
                text = call.input if call.arguments is None else str(next(iter(call.arguments.values()), ""))
                return tool.run_session(call.session, text)
            if call.arguments is not None:  # json format (a tool without its own `call`: one string argument)
                return tool.call(call.arguments)
            return tool(call.input)
        except Exception as e:  # noqa: BLE001 - a tool must never crash the rollout
            return ToolResult(f"Error: tool <{call.tag}> failed: {type(e).__name__}: {e}", ok=False)


def source_of(tool) -> str:
    """Where a tool comes from, in words: an MCP server's tool names its server, your function or
    class its module path, a built-in its class."""
    inner = getattr(tool, "tool", tool)  # a CachedTool wraps the real one
    server = getattr(inner, "server", None)
    if server is not None and hasattr(server, "label"):
        return f"the tool {inner.name!r} of MCP server {server.label}"
    owner, fn = getattr(inner, "owner", None), getattr(inner, "fn", None)
    obj = type(owner) if owner is not None else fn
    if obj is not None:
        return f"your tool {getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"
    return f"the built-in tool {inner.name!r} ({type(inner).__module__}.{type(inner).__qualname__})"
