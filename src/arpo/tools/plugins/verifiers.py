"""A verifiers environment's tools (`tools.enabled: ["vf:TASKSET"]`, envs/verifiers.py): each tool of the
task's `vf.Toolset`s under verifiers' own name (`<server>_<tool>`) and MCP schema, run by the worker in
verifiers' venv. The tools of one taskset share each trajectory's rollout `vf.State` (as verifiers' tool
servers share the trace's): a call sends the state after the trajectory's last call and keeps the one it
returns; the call record carries it (`meta.vf_state`, with `meta.vf_args`) for the reward. A fork
continues from the state after its last inherited call, whichever tool made it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from arpo.envs.verifiers import parse, worker
from arpo.errors import ArpoError
from arpo.tools.base import ToolResult
from arpo.tools.plugins.function import SchemaArgs


# ---- tools --------------------------------------------------------------------------------------------
@dataclass
class _Trajectory:
    idx: int
    states: list[Any] = field(default_factory=list)  # the rollout State after each call (all tools)
    calls: dict[str, list[int]] = field(default_factory=dict)  # tool -> len(states) after each of its calls

    def state(self) -> Any:
        return self.states[-1] if self.states else None


class _Sessions:
    """The trajectories of one taskset's tools: they share the rollout state, as verifiers' tool servers do."""

    def __init__(self, taskset: str):
        self.taskset = taskset
        self.by_key: dict[str, _Trajectory] = {}
        self.lock = threading.Lock()

    def bind(self, key: str, example: dict) -> None:
        vf = example.get("vf")
        if isinstance(vf, dict) and vf.get("taskset") == self.taskset:
            with self.lock:
                self.by_key.setdefault(key, _Trajectory(int(vf["idx"])))

    def fork(self, tool: str, parent: str, child: str, n: int) -> None:
        with self.lock:
            p = self.by_key.get(parent)
            if p is None:
                return
            c = self.by_key.setdefault(child, _Trajectory(p.idx))
            c.calls[tool] = p.calls.get(tool, [])[:n]
            upto = max([len(c.states)] + [v[-1] for v in c.calls.values() if v])
            c.states = p.states[:upto]


def vf_tools(spec: str) -> list[VfTool]:
    """The arpo tools of a `vf:TASKSET` tools spec: the first task's toolsets' tools."""
    taskset, _, _, config = parse(spec)
    w = worker(taskset, config)
    first = w.request("tasks", n=1, skip=0)["tasks"]
    if not first:
        raise ArpoError(f"{spec}: the taskset has no tasks")
    schemas = w.request("tools", idx=first[0]["idx"])["tools"]
    if not schemas:
        raise ArpoError(f"{spec}: the taskset's tasks have no tools (a single-turn environment: leave it out of "
                        "tools.enabled)")
    sessions = _Sessions(taskset)
    return [VfTool(taskset, config, sessions, s) for s in schemas]


class VfTool(SchemaArgs):
    """One tool of a verifiers environment; its calls run in the worker with the trajectory's state."""

    sessions = True
    cacheable = False

    def __init__(self, taskset: str, config: dict, sessions: _Sessions, schema: dict):
        self.taskset, self.config, self._sessions, self.schema = taskset, config, sessions, schema
        self.name = schema["function"]["name"]
        self.description = schema["function"].get("description", "")

    def call(self, args: dict) -> ToolResult:  # no trajectory: no task to act in
        return ToolResult(f"Error: <{self.name}> plays a verifiers task; it needs the agent loop's sessions", ok=False)

    def bind(self, key: str, example: dict) -> None:
        self._sessions.bind(str(key), example)

    def fork(self, parent: str, child: str, n_calls: int) -> None:
        self._sessions.fork(self.name, str(parent), str(child), n_calls)

    def end(self, key: str) -> None:
        with self._sessions.lock:
            self._sessions.by_key.pop(str(key), None)

    def refused(self, key: str) -> None:
        t = self._sessions.by_key.get(str(key))
        if t is not None:
            t.calls.setdefault(self.name, []).append(len(t.states))

    def run_session(self, key: str, text: str) -> ToolResult:
        """The tag format: the call's text is its JSON arguments (or the one string argument)."""
        args, err = self.parse_text(text)
        return self.run_session_args(key, args, err)

    def run_session_args(self, key: str, args: Any, err: str | None = None) -> ToolResult:
        """One call with its arguments (the json format gives them parsed) in trajectory `key`'s task."""
        t = self._sessions.by_key.get(str(key))
        if t is None:
            return ToolResult(f"Error: <{self.name}>: this trajectory plays no task of {self._sessions.taskset} (train "
                              "on the rows of its vf: data spec)", ok=False)
        err = err or self.validate(args)
        if err:
            t.calls.setdefault(self.name, []).append(len(t.states))
            return ToolResult(f"Error: tool {self.name}: {err}", ok=False)
        try:
            r = worker(self.taskset, self.config).request("call", idx=t.idx, name=self.name, args=args, state=t.state())
        except ArpoError as e:
            t.calls.setdefault(self.name, []).append(len(t.states))
            return ToolResult(f"Error: {e}", ok=False, meta={"vf_error": str(e)})
        t.states.append(r["state"])
        t.calls.setdefault(self.name, []).append(len(t.states))
        return ToolResult(r["text"], ok=not r["is_error"], meta={"vf_args": args, "vf_state": r["state"]})
