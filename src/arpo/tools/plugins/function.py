"""Your own tools: any Python function or class becomes an agent tool (issue 17).

    def lookup_order(order_id: str, verbose: bool = False) -> str:
        '''Look up an order in the shop database.

        Args:
            order_id: the order number, e.g. "A-1042"
            verbose: include the line items
        '''
    registry.register(lookup_order)                    # or tools.enabled: [python, mypkg.tools:lookup_order]

The name, description and JSON schema of the arguments come from the signature, the type hints and
the docstring (`transformers.utils.get_json_schema`, the same schema a chat template's `tools=`
takes). A function may be sync or `async`. A class is instantiated once per run; its `__call__`
(or `run`) is the tool, its optional `setup()` runs before the first call and `close()` when the
run's tools are closed — that is where per-run state (a database connection, a browser) lives.
Per tool: a timeout, a limit on concurrent calls and an output cap (`ToolOptions`, `tools.options.NAME`,
in settings/agent.py). An exception or a timeout becomes an error result and the trajectory goes on.

A tool is called with a dict of arguments (`call(arguments)`: the JSON function-calling format) or
with the text between its tags (`__call__(text)`: the paper's tag format, rollout/tool_formats.py): a tool
with one string argument takes the text as it is; any other tool takes a JSON object of arguments.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from arpo.errors import ArpoError
from arpo.settings.agent import ToolOptions
from arpo.tools.base import Tool, ToolResult, as_protocol_tool

_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
                                              "array": list, "object": dict}


def snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def json_schema(fn: Callable, name: str | None = None, description: str | None = None) -> dict:
    """The OpenAI/hermes function schema `{type: function, function: {name, description, parameters}}`
    of a callable, from its signature, hints and (Google-style) docstring."""
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as e:  # transformers explains what is missing (a hint, an Args: entry)
        raise ArpoError(f"tool {getattr(fn, '__qualname__', fn)!r}: cannot build its JSON schema: {e}") from e
    if name:
        schema["function"]["name"] = name
    if description:
        schema["function"]["description"] = description
    return schema


class SchemaArgs(Tool):
    """The arguments of a function-calling tool against its JSON schema: validation, and the tag
    format's text as arguments. Shared by FunctionTool and MCP tools; a subclass has `name`,
    `schema` ({type: function, function: {name, description, parameters}}) and `call(dict)`."""

    name: str
    schema: dict

    def call(self, args: dict) -> ToolResult:
        raise NotImplementedError

    # -- the argument schema ------------------------------------------------------------------
    @property
    def parameters(self) -> dict:
        return self.schema["function"].get("parameters", {"type": "object", "properties": {}})

    @property
    def single_string_arg(self) -> str | None:
        """The name of the tool's only argument when that is a string (then tag text passes as is)."""
        props, req = self.parameters.get("properties", {}), self.parameters.get("required", [])
        if len(props) == 1:
            (k, v), = props.items()
            if v.get("type") == "string":
                return k
        if len(req) == 1 and props.get(req[0], {}).get("type") == "string":
            return req[0]
        return None

    def validate(self, args: Any) -> str | None:
        """What is wrong with `args` against the schema (None: fine): names the argument."""
        if not isinstance(args, dict):
            return f"the arguments must be a JSON object, got {type(args).__name__}"
        props, req = self.parameters.get("properties", {}), self.parameters.get("required", [])
        missing = [r for r in req if r not in args]
        if missing:
            return f"missing required argument(s): {', '.join(missing)}"
        extra = [k for k in args if k not in props]
        if extra:
            return f"unknown argument(s) {', '.join(extra)}; valid: {', '.join(props) or 'none'}"
        for k, v in args.items():
            want = props[k].get("type")
            types = _TYPES.get(want) if isinstance(want, str) else None
            is_bool_as_number = want in ("integer", "number") and isinstance(v, bool)
            if types is not None and (not isinstance(v, types) or is_bool_as_number):
                return f"argument {k!r} must be of type {want}, got {type(v).__name__} ({json.dumps(v)[:40]})"
            if "enum" in props[k] and v not in props[k]["enum"]:
                return f"argument {k!r} must be one of {props[k]['enum']}, got {v!r}"
        return None

    def parse_text(self, text: str) -> tuple[Any, str | None]:
        """Tag-format input -> (arguments, error); the arguments are any JSON value (call() validates)."""
        single = self.single_string_arg
        stripped = text.strip()
        if single is not None and not (stripped.startswith("{") and stripped.endswith("}")):
            return {single: text}, None
        try:
            args = json.loads(stripped) if stripped else {}
        except json.JSONDecodeError as e:
            return None, f"the input of <{self.name}> must be a JSON object of arguments ({e.msg} at column {e.colno})"
        if single is not None and not isinstance(args, dict):
            return {single: text}, None
        return args, None

    def __call__(self, input: str) -> ToolResult:
        args, err = self.parse_text(input)
        if err:
            return ToolResult(f"Error: {err}", ok=False)
        return self.call(args)


class FunctionTool(SchemaArgs):
    """A callable as a tool: `call(dict)` for function calling, `__call__(text)` for tags."""

    def __init__(self, fn: Callable, name: str | None = None, description: str | None = None,
                 options: ToolOptions | None = None, schema: dict | None = None, owner: Any = None):
        self.fn = fn
        self.owner = owner  # a class tool's instance (setup/close hooks)
        self.schema = schema or json_schema(fn, name, description)
        self.name = self.schema["function"]["name"]
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", self.name):
            self.name = re.sub(r"[^a-z0-9_]", "_", self.name.lower())
            self.schema["function"]["name"] = self.name
        self.description = self.schema["function"].get("description", "")
        self.options = options or ToolOptions()
        self._sem = threading.BoundedSemaphore(max(1, self.options.max_concurrency))
        self._setup_done = False
        self._setup_lock = threading.Lock()

    def call(self, args: dict) -> ToolResult:
        err = self.validate(args)
        if err:
            return ToolResult(f"Error: tool {self.name}: {err}", ok=False)
        t0 = time.perf_counter()
        with self._sem:  # the concurrency limit: extra calls wait here
            self._ensure_setup()
            fut = _in_daemon_thread(self._invoke, args, name=f"arpo-tool-{self.name}")
            try:
                out = fut.result(timeout=self.options.timeout_s)
            except FutureTimeout:
                return ToolResult(f"Error: tool {self.name} timed out after {self.options.timeout_s:g} s", ok=False,
                                  elapsed_s=time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001 - the tool raised: an error result, the trajectory goes on
                return ToolResult(f"Error: tool {self.name} failed: {type(e).__name__}: {e}", ok=False,
                                  elapsed_s=time.perf_counter() - t0)
        text, ok = self._to_text(out)
        cap, truncated = self.options.max_output_chars, False
        if len(text) > cap:
            text, truncated = text[:cap] + f"\n... [output truncated: {len(text) - cap} more characters]", True
        return ToolResult(text, ok=ok, elapsed_s=time.perf_counter() - t0, truncated=truncated)

    def _invoke(self, args: dict):
        out = self.fn(**args)
        if inspect.isawaitable(out):
            out = asyncio.run(_await(out))
        return out

    @staticmethod
    def _to_text(out) -> tuple[str, bool]:
        if isinstance(out, ToolResult):
            return out.output, out.ok
        if isinstance(out, str):
            return out, True
        if out is None:
            return "(no output)", True
        try:
            return json.dumps(out, ensure_ascii=False, default=str), True
        except (TypeError, ValueError):
            return str(out), True

    def _ensure_setup(self) -> None:
        if self._setup_done:
            return
        with self._setup_lock:
            if not self._setup_done:
                hook = getattr(self.owner, "setup", None)
                if callable(hook):
                    hook()
                self._setup_done = True

    def close(self) -> None:
        hook = getattr(self.owner, "close", None)
        if callable(hook) and self._setup_done:
            hook()


def _in_daemon_thread(fn: Callable, args: dict, name: str) -> Future:
    """fn(**args)'s future, run in a daemon thread of its own. A call that times out is abandoned: a
    daemon thread is not joined at exit, so a tool that blocks forever cannot keep the process alive
    (a ThreadPoolExecutor's workers are joined at exit: arpo printed the timeout and never exited)."""
    fut: Future = Future()

    def run() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn(args))
        except BaseException as e:  # noqa: BLE001 - delivered to the caller through the future
            fut.set_exception(e)

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut


async def _await(x):
    return await x


def as_tool(obj: Any, options: ToolOptions | None = None, name: str | None = None):
    """A Tool from a function, a class (instantiated), an instance with __call__/run, or a Tool."""
    if isinstance(getattr(obj, "name", None), str) and callable(obj) and not inspect.isroutine(obj) \
            and not inspect.isclass(obj) and (hasattr(obj, "schema") or _one_argument(obj)):
        return as_protocol_tool(obj)  # already a tool (name + __call__(input)): PythonTool, an MCP tool...
    if isinstance(obj, type):  # a class (inspect.isclass)
        try:
            inst = obj()
        except Exception as e:  # the user's constructor: one line, not a traceback
            where = f"{obj.__module__}:{obj.__qualname__}"
            raise ArpoError(f"tool class {where}: its constructor raised {type(e).__name__}: {e}") from e
        method = getattr(inst, "run", None) if not _defines_call(obj) else inst.__call__
        if method is None:
            raise ArpoError(f"tool class {obj.__qualname__}: define __call__ or run (the tool's arguments)")
        doc = inspect.getdoc(obj) or ""
        nm = name or getattr(inst, "name", None) or snake_case(obj.__name__)
        summary = " ".join(doc.split("\n\n")[0].split()) or None  # the class docstring's first paragraph
        return FunctionTool(_with_doc(method, doc), nm, summary, options, owner=inst)
    if callable(obj):
        return FunctionTool(obj, name or getattr(obj, "__name__", None), None, options)
    raise ArpoError(f"{obj!r} is not a tool: give a function, a class or a Tool")


def _defines_call(cls) -> bool:
    return any("__call__" in vars(k) for k in cls.__mro__ if k is not object)


def _one_argument(obj) -> bool:
    """__call__ takes exactly one argument: the tag format's text (the Tool protocol)."""
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return False
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) == 1


def _with_doc(method, class_doc: str):
    """get_json_schema reads the method's docstring; fall back to the class's."""
    if inspect.getdoc(method):
        return method

    def call(*a, **k):
        return method(*a, **k)

    call.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]  # read by inspect.signature
    call.__doc__ = class_doc
    call.__name__ = getattr(method, "__name__", "run")
    call.__annotations__ = getattr(method, "__annotations__", {})
    return call


def load_tool(spec: str, options: ToolOptions | None = None):
    """'mypkg.tools:lookup_order' (a function or class) -> a Tool. ArpoError names what is wrong."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ArpoError(f"tool {spec!r}: expected module.path:name (e.g. mypkg.tools:lookup_order) or a built-in "
                        "tool name (python, search)")

    if os.getcwd() not in sys.path:  # like `python -m`: modules of the directory arpo runs in are importable
        sys.path.append(os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ArpoError(f"tool {spec!r}: cannot import {mod_name} ({e})") from e
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ArpoError(f"tool {spec!r}: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return as_tool(obj, options)
