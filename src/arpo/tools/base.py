"""The tool protocol (spec §1): each tool owns a tag; the agent writes `<tag> input </tag>` and the
environment answers `<result>\\n{output}\\n</result>`.

A tool is any object with a `name` (its tag) and `__call__(input: str) -> ToolResult`; plain
Python functions and classes become tools through `ToolRegistry.register` (tools/plugins/function.py), and
tools with a JSON `schema` also take `call(arguments: dict)` (the function-calling format,
rollout/tool_formats.py). Tools never raise into the rollout: failures come back as
`ToolResult(ok=False, output=<error text>)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TypeGuard, runtime_checkable

RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
ANSWER_TAG = "answer"
NON_CALL_TAGS = ("answer", "think", "result")  # closing these is not a tool call
# Any closing tag except </think> and </result> pauses generation, so that unknown tools are caught too.
STOP_REGEX = r"</(?!think>|result>)[A-Za-z_][A-Za-z0-9_]*>"


@dataclass
class ToolResult:
    output: str  # exactly the text placed between <result> and </result>
    ok: bool = True
    elapsed_s: float = 0.0
    truncated: bool = False
    cached: bool = False
    meta: dict = field(default_factory=dict)


@runtime_checkable
class Tool(Protocol):
    """A tool: its `name` (the tag) and `__call__(input)`. The optional members have their defaults
    here: a tool class that subclasses Tool inherits them (the built-in tools do), and
    ToolRegistry.register gives a tool that only has `name` and `__call__` the same (`as_tool`), so
    the rest of arpo reads them as attributes, never probes for them."""

    name: str  # the tag this tool owns, e.g. "python" for <python>...</python>
    description: str = ""  # what it does, in a line (the prompt's tool list when it has no schema)
    # the function-calling schema {"type": "function", "function": {name, description, parameters}};
    # None: one string argument, `input` (data/prompts.py tool_schema)
    schema: dict | None = None
    cacheable: bool = True  # identical calls may be answered from tools.cache
    sessions: bool = False  # its state lives per trajectory (SessionTool)

    def __call__(self, input: str) -> ToolResult: ...

    @property
    def single_string_arg(self) -> str | None:
        """The argument a tag-format call's text fills as is (None: the schema says how)."""
        return None

    def call(self, arguments: dict) -> ToolResult:
        """The function-calling form: by default one string argument, passed to `__call__`."""
        (value,) = arguments.values() if len(arguments) == 1 else (None,)
        if not isinstance(value, str):
            return ToolResult(f"Error: tool {self.name} takes one string argument", ok=False)
        return self(value)

    def close(self) -> None:
        """Release what the tool holds (worker pools, connections); by default nothing."""
        return None


class _DuckTool(Tool):
    """A tool that has `name` and `__call__` but does not subclass Tool, with Tool's defaults for the
    members it lacks (the one place that looks at which it has); its other attributes pass through."""

    def __init__(self, tool) -> None:
        self.tool, self.name = tool, tool.name
        for member in ("description", "schema", "cacheable", "sessions"):
            if hasattr(tool, member):
                setattr(self, member, getattr(tool, member))

    def __call__(self, input: str) -> ToolResult:
        return self.tool(input)

    @property
    def single_string_arg(self) -> str | None:
        return getattr(self.tool, "single_string_arg", None)

    def call(self, arguments: dict) -> ToolResult:
        return self.tool.call(arguments) if hasattr(self.tool, "call") else super().call(arguments)

    def close(self) -> None:
        if hasattr(self.tool, "close"):
            self.tool.close()

    def __getattr__(self, name: str):  # its own attributes (counters, run_session, ...)
        tool = self.__dict__.get("tool")
        if tool is None:  # during copy / unpickling
            raise AttributeError(name)
        return getattr(tool, name)


def as_protocol_tool(tool) -> Tool:
    """`tool` itself when it subclasses Tool, else `tool` with Tool's defaults for what it lacks."""
    return tool if Tool in type(tool).__mro__ else _DuckTool(tool)


class SessionTool(Tool, Protocol):
    """A tool whose state lives per trajectory (`sessions = True`, e.g. python with session: true):
    each call runs in the session `key`; a branch forks its parent's session, a finished trajectory
    ends its own."""

    sessions: bool

    def run_session(self, key: str, code: str) -> ToolResult: ...

    def fork(self, parent: str, child: str, n_calls: int) -> None: ...

    def end(self, key: str) -> None: ...


def has_sessions(tool: Tool) -> TypeGuard[SessionTool]:
    """The tool keeps per-trajectory sessions (its `sessions` flag is set)."""
    return tool.sessions


def format_result(output: str) -> str:
    """The text the environment appends after a tool call (spec §1)."""
    return f"\n{RESULT_OPEN}\n{output}\n{RESULT_CLOSE}\n"


@dataclass
class ToolCall:
    tag: str  # the tool the model named (its tag; may be unknown)
    input: str  # body between the tags, stripped (json format: the arguments as JSON text)
    error: str | None = None  # set when the call is malformed; then the error is the result
    arguments: dict | None = None  # json format: the parsed arguments
    session: str | None = None  # the trajectory's key, for tools with sessions (python with session: true)
