"""The verifiers side of the `vf:` bridge (envs/verifiers.py): run by the python of verifiers' own venv
(`.venv-verifiers`, scripts/install_verifiers.sh), never imported by arpo. It imports only verifiers
(0.4.0, its `verifiers.v1` stack) and the standard library, and speaks JSON lines on stdin/stdout:

    {"op": "load", "taskset": ID, "config": {...}}   -> {"ok": true, "taskset": class name}
    {"op": "tasks", "n": N, "skip": K}               -> {"tasks": [{"idx", "system", "prompt", "data"}, ...]}
    {"op": "tools", "idx": I}                        -> {"tools": [OpenAI function schemas]}
    {"op": "call", "idx": I, "name", "args", "state"} -> {"text", "is_error", "state"}
    {"op": "score", "idx": I, "messages", "state"}   -> {"reward", "rewards": {name: [score, weight]},
                                                         "metrics": {name: value}}

A task is `Taskset.load()`'s idx-th (`vf.load_taskset`-style: the taskset id is an importable module
exporting its Taskset subclass in `__all__`). Tools are the task's and the taskset's `vf.Toolset`s,
registered on an in-process MCP server exactly as verifiers serves them (names `<server>_<tool>`,
arguments validated by MCP); the rollout's `State` (what verifiers syncs between its tool servers and
the trace) travels in each request and reply, so a fork continues from any call's state. Scoring is
the task's own `Task.score(trace)`: its `@vf.reward`s (weighted), `@vf.metric`s and plugged judges, on
a `vf.Trace` holding the conversation. Any failure answers {"error": one line}.
"""

# ruff: noqa: PLC0415
# (verifiers and mcp are imported where they run: this file also loads, for lint and types, where they are absent)
import asyncio
import contextlib
import json
import os
import sys
import traceback
from typing import Any

# Python puts this script's folder (arpo/envs, which holds arpo's verifiers.py) first on the path: `import
# verifiers` must find the package of this venv
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def _fail(e: BaseException) -> dict:
    last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    where = f" (at {os.path.basename(last[0].filename)}:{last[0].lineno})" if last else ""
    return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}{where}"}


class Worker:
    def __init__(self):
        self.taskset: Any = None
        self.tasks: dict = {}  # idx -> Task
        self.servers: dict = {}  # idx -> (toolsets, {tool name: (toolset, MCPServer, raw name)}, schemas)
        self.loop = asyncio.new_event_loop()

    # ---- ops ----------------------------------------------------------------------------------------
    def load(self, taskset: str, config: dict | None = None) -> dict:
        import verifiers.v1 as vf
        from verifiers.v1.utils.loaders import taskset_class

        cls = taskset_class(taskset)
        cfg = vf.taskset_config_type(taskset).model_validate({**(config or {}), "id": taskset})
        self.taskset, self.tasks, self.servers = cls(cfg), {}, {}
        return {"ok": True, "taskset": cls.__name__}

    def _task(self, idx: int):
        if idx not in self.tasks:
            for t in self.taskset.include(idx=[f"{idx}:{idx + 1}"]):
                self.tasks[idx] = t
            if idx not in self.tasks:
                raise KeyError(f"the taskset has no task {idx}")
        return self.tasks[idx]

    def task_list(self, n: int, skip: int = 0) -> dict:
        out = []
        for t in self.taskset.skip(skip).take(n):
            self.tasks[t.data.idx] = t
            prompt = t.data.prompt
            if prompt is None:
                raise ValueError(f"task {t.data.idx} has no prompt (a task the user opens cannot be played)")
            msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else \
                [m.model_dump(mode="json", exclude_none=True) for m in prompt]
            out.append({"idx": t.data.idx, "system": t.data.system_prompt, "prompt": msgs,
                        "data": t.data.model_dump(mode="json", exclude_none=True)})
        return {"tasks": out}

    def _servers(self, idx: int):
        if idx not in self.servers:
            from mcp.server.mcpserver import MCPServer

            task = self._task(idx)
            toolsets = list(type(task).toolsets(task.config)) + list(type(self.taskset).toolsets(self.taskset.config))
            tools, schemas = {}, []
            for ts in toolsets:
                self._run(ts.setup())
                self._run(ts.setup_task(task))
                mcp = MCPServer(ts.server_name or type(ts).__name__)
                ts.register(mcp)
                for tool in self._run(mcp.list_tools()):
                    name = f"{ts.server_name}_{tool.name}" if ts.server_name else tool.name
                    if name in tools:
                        raise ValueError(f"two tools are named {name!r}")
                    tools[name] = (ts, mcp, tool.name)
                    schemas.append({"type": "function", "function": {
                        "name": name, "description": tool.description or "",
                        "parameters": tool.input_schema or {"type": "object", "properties": {}}}})
            self.servers[idx] = (toolsets, tools, schemas)
        return self.servers[idx]

    def tools(self, idx: int) -> dict:
        return {"tools": self._servers(idx)[2]}

    def call(self, idx: int, name: str, args: dict, state: dict | None) -> dict:
        from mcp.server.mcpserver.exceptions import ToolError
        from verifiers.v1.mcp.server import _call_state
        from verifiers.v1.state import state_cls

        _, tools, _ = self._servers(idx)
        if name not in tools:
            return {"text": f"Error: no tool {name!r}; the tools are {', '.join(sorted(tools))}", "is_error": True,
                    "state": state}
        ts, mcp, raw = tools[name]
        task_state_cls = state_cls(type(self._task(idx)))
        shared = task_state_cls.model_validate(state or {})
        box = {"state": shared}

        async def pull():  # verifiers' state channel, in process: the rollout's State before the call
            return ts._state_adapter.validate_json(task_state_cls.model_validate(box["state"]).model_dump_json())

        async def push(before: bytes) -> None:  # ... and after it
            box["state"] = task_state_cls.model_validate_json(ts._state_adapter.dump_json(_call_state.get()))

        ts._pull_state, ts._push_state = pull, push
        try:
            res = self._run(mcp.call_tool(raw, args))
        except ToolError as e:  # bad arguments or the tool raised: the model reads why
            return {"text": f"Error: {e}", "is_error": True, "state": box["state"].model_dump(mode="json")}
        finally:
            del ts._pull_state, ts._push_state
        parts = [getattr(c, "text", None) or f"[{getattr(c, 'type', 'content')}]" for c in res.content or []]
        if not parts and res.structured_content is not None:
            parts = [json.dumps(res.structured_content)]
        return {"text": "\n".join(parts) or "(no output)", "is_error": bool(res.is_error),
                "state": box["state"].model_dump(mode="json")}

    def score(self, idx: int, messages: list, state: dict | None) -> dict:
        import verifiers.v1 as vf
        from pydantic import TypeAdapter
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.state import state_cls

        task = self._task(idx)
        msgs = TypeAdapter(vf.Messages).validate_python(messages)
        nodes = [MessageNode(parent=i - 1 if i else None, message=m,
                             sampled=m.role == "assistant" and bool(messages[i].get("sampled", True)))
                 for i, m in enumerate(msgs)]
        trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                         state=state_cls(type(task)).model_validate(state or {}),
                         agent=vf.AgentInfo(config=vf.AgentConfig(), name="arpo"), nodes=nodes,
                         is_completed=True, ok=True)
        self._run(task.score(trace))
        missing = [k for k, r in trace.rewards.items() if r is None]
        if missing:
            raise ValueError(f"the rubric did not score {', '.join(missing)}")
        return {"reward": trace.reward, "rewards": {k: [r.score, r.weight] for k, r in trace.rewards.items()},
                "metrics": {k: v for k, v in trace.metrics.items() if v is not None}}

    # ---- plumbing -----------------------------------------------------------------------------------
    def _run(self, coro):
        return self.loop.run_until_complete(coro)

    def handle(self, req: dict) -> dict:
        op = req.get("op")
        if op == "load":
            return self.load(req["taskset"], req.get("config"))
        if self.taskset is None:
            raise RuntimeError("load a taskset first")
        if op == "tasks":
            return self.task_list(int(req["n"]), int(req.get("skip", 0)))
        if op == "tools":
            return self.tools(int(req["idx"]))
        if op == "call":
            return self.call(int(req["idx"]), req["name"], req.get("args") or {}, req.get("state"))
        if op == "score":
            return self.score(int(req["idx"]), req["messages"], req.get("state"))
        raise ValueError(f"unknown op {op!r}")


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # an environment's prints must not break the protocol
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    worker = Worker()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            with contextlib.redirect_stdout(sys.stderr):
                reply = worker.handle(json.loads(line))
        except Exception as e:  # noqa: BLE001 - one line back to arpo, the worker goes on
            reply = _fail(e)
        out.write(json.dumps(reply, default=str) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
