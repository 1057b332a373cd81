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
    name: str  # the tag this tool owns, e.g. "python" for <python>...</python>

    def __call__(self, input: str) -> ToolResult: ...


class SessionTool(Tool, Protocol):
    """A tool whose state lives per trajectory (`sessions = True`, e.g. python with session: true):
    each call runs in the session `key`; a branch forks its parent's session, a finished trajectory
    ends its own."""

    sessions: bool

    def run_session(self, key: str, code: str) -> ToolResult: ...

    def fork(self, parent: str, child: str, n_calls: int) -> None: ...

    def end(self, key: str) -> None: ...


def has_sessions(tool: object) -> TypeGuard[SessionTool]:
    """The tool keeps per-trajectory sessions (its `sessions` flag is set)."""
    return bool(getattr(tool, "sessions", False))


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
