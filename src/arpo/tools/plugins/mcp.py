"""MCP servers as tool sources (the official `mcp` SDK, extra `mcp`).

    tools:
      mcp:
        - {command: python, args: [my_server.py]}          # a stdio server, started by arpo
        - {url: http://localhost:8000/mcp}                 # a Streamable HTTP server

arpo connects once per run, lists the server's tools and exposes each as a tool with the server's
own name, description and input schema (so both call formats work). The SDK is async: one event
loop thread per server owns the connection; tool calls from the rollout's worker threads are
submitted to it. A call's error (the server reports `isError`, the server died, a timeout) is an
error result; the trajectory goes on.

A stdio server's stderr goes to a temporary file, not the terminal: a server that fails to start
(an import error, a crash) is one error line naming the server and the last line it printed, not
the SDK's "ExceptionGroup: unhandled errors in a TaskGroup" after the server's traceback. A server
written for mcp 1.x (`from mcp.server.fastmcp import FastMCP`) cannot import under mcp 2 (FastMCP
is `mcp.server.mcpserver.MCPServer` there): run it with a python of an environment that has mcp<2
(`{command: /path/to/venv1/bin/python, args: [server.py]}`; the protocol is the same).
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import json
import logging
import sys
import tempfile
import threading
import time

from arpo.errors import ArpoError
from arpo.tools.base import ToolResult
from arpo.tools.plugins.function import SchemaArgs


class MCPServerTools:
    """One MCP server connection and its tools."""

    def __init__(self, spec: dict, timeout_s: float = 30.0, start_timeout_s: float = 60.0):
        try:
            import mcp
        except ImportError as e:
            raise ArpoError("tools.mcp needs the MCP SDK: pip install 'arpo[mcp]'") from e
        self.spec, self.timeout_s = dict(spec), float(spec.get("timeout_s", timeout_s))
        self._errlog = None
        if "url" in spec:
            target = spec["url"]
        elif "command" in spec:
            from mcp.client.stdio import stdio_client

            params = mcp.StdioServerParameters(command=str(spec["command"]),
                                               args=[str(a) for a in spec.get("args", [])],
                                               env=spec.get("env"), cwd=spec.get("cwd"))
            # closed in close(); the server process writes to it for the connection's whole life
            self._errlog = tempfile.TemporaryFile(  # noqa: SIM115
                "w+", encoding="utf-8", errors="replace", prefix="arpo-mcp-")
            target = stdio_client(params, errlog=self._errlog)
        else:
            raise ArpoError(f"tools.mcp entry {spec!r}: needs a command (stdio) or a url (HTTP)")
        self.label = spec.get("url") or " ".join([spec["command"], *map(str, spec.get("args", []))])
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="arpo-mcp", daemon=True)
        self._thread.start()
        self.bad_stdout: str | None = None  # the first stdout line that was not JSON-RPC
        _quiet_parse_errors()
        self._client = mcp.Client(target, read_timeout_seconds=self.timeout_s, message_handler=self._on_message)
        try:
            self._run(self._client.__aenter__(), start_timeout_s, starting=True)
            listed = self._run(self._client.list_tools(), start_timeout_s, starting=True)
        except Exception as e:
            cause = self._cause(e, start_timeout_s)
            self.close()
            raise ArpoError(f"MCP server {self.label}: cannot connect or list its tools: {cause}"
                            + _hint(cause)) from e
        self._tools = [MCPTool(self, t.name, t.description or "", _field(t, "input_schema", "inputSchema")
                               or {"type": "object", "properties": {}}) for t in listed.tools]

    async def _on_message(self, message) -> None:
        """The SDK hands over what the server wrote to stdout that is not JSON-RPC as an exception
        (it logged a traceback, skipped the line and, if the line held a reply, waited for it until
        the timeout): kept, and the connection's start fails on it (_run)."""
        if isinstance(message, ValueError) and self.bad_stdout is None:  # pydantic's ValidationError
            errors = getattr(message, "errors", None)
            line = errors()[0].get("input") if callable(errors) and errors() else message
            self.bad_stdout = f"{line!r:.200}" if not isinstance(line, str) else repr(line[:200])
            if getattr(self, "_tools", None) is not None:  # after the start: the call goes on, said once
                print(f"arpo: MCP server {self.label} wrote a line that is not JSON-RPC to its stdout "
                      f"({self.bad_stdout}, skipped); a stdio server must print to stderr", file=sys.stderr)

    def _run(self, coro, timeout: float, starting: bool = False):
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        if not starting:
            return fut.result(timeout)
        deadline = time.monotonic() + timeout
        while True:  # the start fails at once on a stdout line that is not JSON-RPC
            try:
                return fut.result(min(0.1, max(0.0, deadline - time.monotonic())))
            except concurrent.futures.TimeoutError:
                if self.bad_stdout is not None:
                    fut.cancel()
                    raise ArpoError(f"it wrote a line that is not JSON-RPC to its stdout ({self.bad_stdout}); a stdio "
                                    "server's stdout carries only the protocol: print to stderr "
                                    "(print(..., file=sys.stderr)) or log") from None
                if time.monotonic() >= deadline:
                    raise

    def _cause(self, e: BaseException, timeout: float) -> str:
        """One line on why a request failed: the last line the server printed to stderr (a stdio
        server that crashed says why there), else the innermost SDK exception (an ExceptionGroup of
        the SDK's task group is unwrapped)."""
        if isinstance(e, ArpoError):
            return str(e)
        last = self.stderr_tail()
        if last:
            return f"the server printed: {last}"
        e = _innermost(e)
        if isinstance(e, (TimeoutError, concurrent.futures.TimeoutError)):
            return f"no answer within {timeout:g} s"
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__

    def stderr_tail(self) -> str:
        """The last non-empty line of a stdio server's stderr ('' for none or an HTTP server)."""
        if self._errlog is None or self._errlog.closed:
            return ""
        try:
            self._errlog.flush()
            self._errlog.seek(0)
            lines = [x.strip() for x in self._errlog.read()[-20000:].splitlines() if x.strip()]
        except (OSError, ValueError):
            return ""
        return lines[-1][:500] if lines else ""

    def tools(self) -> list[MCPTool]:
        return list(self._tools)

    def call(self, name: str, args: dict) -> ToolResult:
        try:
            res = self._run(self._client.call_tool(name, args), self.timeout_s + 5)
        except Exception as e:  # noqa: BLE001 - a dead server or a timeout: an error result
            return ToolResult(f"Error: MCP tool {name} failed: {self._cause(e, self.timeout_s + 5)}", ok=False)
        parts = []
        for c in getattr(res, "content", []) or []:
            text = getattr(c, "text", None)
            parts.append(text if text is not None else f"[{getattr(c, 'type', 'content')}]")
        structured = _field(res, "structured_content", "structuredContent")
        if not parts and structured is not None:
            parts.append(json.dumps(structured, ensure_ascii=False))
        return ToolResult("\n".join(parts) or "(no output)", ok=not _field(res, "is_error", "isError"))

    def close(self) -> None:
        if getattr(self, "_client", None) is not None and self._loop.is_running():
            try:
                self._run(self._client.__aexit__(None, None, None), 10)
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if self._errlog is not None:
            self._errlog.close()


def _quiet_parse_errors() -> None:
    """The SDK logs a traceback for each stdout line that is not JSON-RPC; MCPServerTools reports the
    line itself (one line), so the SDK's record is dropped."""
    log = logging.getLogger("mcp.client.stdio")
    if not any(isinstance(f, _DropParseErrors) for f in log.filters):
        log.addFilter(_DropParseErrors())


class _DropParseErrors:
    def filter(self, record) -> bool:
        return not str(record.msg).startswith("Failed to parse JSONRPC message")


def _innermost(e: BaseException) -> BaseException:
    """The first leaf of nested exception groups (anyio's task groups wrap the real error)."""
    groups = getattr(builtins, "BaseExceptionGroup", ())  # Python 3.11+ (anyio's backport before)
    while isinstance(e, groups) and getattr(e, "exceptions", None):
        e = e.exceptions[0]
    return e


def _hint(cause: str) -> str:
    """What to do about a server written for mcp 1.x (FastMCP) under arpo's mcp 2."""
    if "mcp.server.fastmcp" not in cause:
        return ""
    return "; to run it as it is, give tools.mcp the python of an environment with mcp<2 as its command"


def _field(obj, *names):
    """A field of an SDK object under its mcp 2 (snake_case) or mcp 1 (camelCase) name."""
    for n in names:
        v = getattr(obj, n, None)
        if v is not None:
            return v
    return None


class MCPTool(SchemaArgs):
    """One tool of an MCP server, in arpo's tool protocol (the tag format's text and argument
    checks of SchemaArgs, as for your own tools)."""

    cacheable = False  # a server may hold state

    def __init__(self, server: MCPServerTools, name: str, description: str, input_schema: dict):
        self.server, self.name, self.description = server, name, description
        self.schema = {"type": "function", "function": {"name": name, "description": description,
                                                        "parameters": input_schema}}

    def call(self, args: dict) -> ToolResult:
        err = self.validate(args)  # the same checks as for your own tools
        if err:
            return ToolResult(f"Error: tool {self.name}: {err}", ok=False)
        return self.server.call(self.name, args)

