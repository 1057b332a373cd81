"""The `<python>` tool: runs model-written code in an isolated, short-lived process (spec §1).

Model-written code is hostile input, and during RL it is written by a policy that is being
*rewarded* for whatever works, so the sandbox must hold against code that forks, allocates,
loops, floods stdout, writes files, opens sockets or signals its parent — while costing only
milliseconds per call, because rollouts make thousands of calls.

This module is the tool: its options, one call (send the code, read the output under the
deadline and the byte cap, say how it ended) and a benchmark. The sandbox itself is the
`arpo.tools.sandbox` package (its docstring: who runs where; docs/sandbox.md: the threat model).
"""

from __future__ import annotations

import logging
import statistics
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import Any

from arpo.tools.base import Tool, ToolResult
from arpo.tools.sandbox.capture import UNWATCH, run_with_limits
from arpo.tools.sandbox.limits import SandboxLimits
from arpo.tools.sandbox.linux import write_all
from arpo.tools.sandbox.pool import PoolState, Worker
from arpo.tools.sandbox.protocol import (
    CTL,
    DEADLINE,
    ENDED,
    FAILED,
    CallEnd,
    ProtocolError,
    call_end,
    encode_arm,
    encode_code,
)
from arpo.tools.sandbox.result import call_result, fmt_seconds
from arpo.tools.sandbox.zygote import SANDBOX_UID_SPAN

log = logging.getLogger(__name__)


class PythonTool(Tool):
    """`<python>` tool: run code in a pre-forked, namespace-isolated, one-shot interpreter.

    Thread-safe: `__call__` may run from many threads at once; each call takes its own worker.
    `timeout_s` is a call's wall time, `max_output_chars` what the model sees of its output,
    `pool_size` how many workers are kept ready, `max_read_bytes` where a flood of output is
    stopped (the program is killed; the model sees the head and a marker), `start_timeout_s` how
    long a call waits for a worker (and for a slot). Every other keyword (`memory_mb`, `disk_mb`,
    `max_processes`, `uid`, `seccomp`, ...; the tool-wide caps `max_calls`, `cpus`,
    `cpus_per_call`, `tool_memory_mb`, `tool_pids`) is a field of `SandboxLimits`
    (tools/sandbox/limits.py), where each is documented with its default; docs/sandbox.md says
    what enforces it. At most `max_calls` calls run at once: more wait up to `start_timeout_s`
    for a slot, then come back as an error result.
    """

    name = "python"
    description = "Runs Python code in a sandbox and returns what it prints (a final bare expression is printed too)."
    schema: dict[str, Any] = {"type": "function", "function": {
        "name": "python", "description": description,
        "parameters": {"type": "object",
                       "properties": {"code": {"type": "string", "description": "the Python program"}},
                       "required": ["code"]}}}

    def __init__(
        self,
        timeout_s: float = 5.0,
        max_output_chars: int = 2000,
        memory_mb: int = SandboxLimits.memory_mb,
        pool_size: int = 4,
        preimport: tuple[str, ...] = SandboxLimits.preimport,
        network: bool = SandboxLimits.network,
        *,
        max_read_bytes: int = 1 << 20,
        start_timeout_s: float = 60.0,
        **limits,
    ):
        if timeout_s <= 0 or max_output_chars <= 0 or memory_mb <= 0:
            raise ValueError("timeout_s, max_output_chars and memory_mb must be positive")
        unknown = sorted(set(limits) - {f.name for f in fields(SandboxLimits)})
        if unknown:
            raise TypeError(f"PythonTool got unknown option(s) {', '.join(unknown)}: the sandbox's options are the "
                            "fields of SandboxLimits (tools/sandbox/limits.py)")
        self.limits = SandboxLimits(memory_mb=memory_mb, preimport=tuple(preimport), network=network, **limits)
        self.timeout_s = float(timeout_s)
        self.max_output_chars = int(max_output_chars)
        self.pool_size = max(1, int(pool_size))
        self.max_read_bytes = max(int(max_read_bytes), 4 * self.max_output_chars)
        self.start_timeout_s = float(start_timeout_s)
        self._cfg = self.limits.zygote_config(self.pool_size)
        self.max_calls = int(self.limits.max_calls)
        self._slots = threading.BoundedSemaphore(self.max_calls)
        self._state = PoolState()
        self._finalizer = weakref.finalize(self, self._state.shutdown)
        self._thread = threading.Thread(target=self._state.refill_loop,
                                        args=(self._cfg, self.pool_size, self.start_timeout_s),
                                        name="arpo-python-pool", daemon=True)
        self._thread.start()

    # -- public API ---------------------------------------------------------------------------
    def __call__(self, input: str) -> ToolResult:
        return self.run(input)

    @property
    def isolation(self) -> str:
        """'namespaces' (full), 'userns' (unprivileged namespaces) or 'none' (rlimits only)."""
        return self._state.wait_info(self.start_timeout_s).get("mode", "unknown")

    @property
    def protections(self) -> dict:
        """What this machine let the sandbox put in place (README: threat model): namespaces, the
        filesystem view, uid switch, memory/pids cgroups (and why not), seccomp and its list, ptys."""
        info = self._state.wait_info(self.start_timeout_s)
        return {"isolation": info.get("mode", "unknown"), **info.get("protections", {}),
                "uid_range": list(self.uid_range), "why_weaker": info.get("why") or None}

    @property
    def sandbox_config(self) -> dict:
        """The zygote's configuration (SandboxLimits.zygote_config), a copy."""
        return dict(self._cfg)

    @property
    def uid_range(self) -> tuple[int, int]:
        """[first, last) sandbox uid of this tool's workers (one per call, none shared with another tool)."""
        if self._cfg["uid"] is not None:
            return int(self._cfg["uid"]), int(self._cfg["uid"]) + 1
        return self._cfg["uid_base"], self._cfg["uid_base"] + SANDBOX_UID_SPAN

    def run(self, code: str, timeout_s: float | None = None) -> ToolResult:
        """Run one program; never raises (errors come back as ok=False results)."""
        t0 = time.monotonic()
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if not self._slots.acquire(timeout=self.start_timeout_s):
            return ToolResult(f"Error: the python tool is busy: {self.max_calls} calls are already running (its "
                              f"max_calls), and none finished within {fmt_seconds(self.start_timeout_s)} s; "
                              "this call did not run", ok=False, elapsed_s=time.monotonic() - t0)
        try:
            try:
                worker = self._state.acquire(t0 + self.start_timeout_s)
            except Exception as e:  # noqa: BLE001
                return ToolResult(f"Error: the python sandbox is unavailable: {e}", ok=False,
                                  elapsed_s=time.monotonic() - t0)
            try:
                return self._execute(worker, code, timeout, t0)
            except Exception as e:
                log.exception("python tool failed")
                return ToolResult(f"Error: python tool failed: {type(e).__name__}: {e}", ok=False,
                                  elapsed_s=time.monotonic() - t0)
            finally:
                worker.close()
        finally:
            self._slots.release()

    def warm_up(self, timeout_s: float | None = None) -> bool:
        """Block until the pool is full of ready workers (e.g. before a rollout starts or a
        benchmark); True when it is. Calls work without this: they just wait for their worker."""
        return self._state.wait_full(self.pool_size, time.monotonic() + (timeout_s or self.start_timeout_s))

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> PythonTool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


    # -- one call -----------------------------------------------------------------------------
    def _execute(self, w: Worker, code: str, timeout: float, t0: float) -> ToolResult:
        data = code.encode("utf-8", "replace")
        w.ctl.sendall(encode_arm(timeout, len(data)))  # arms init's own deadline
        deadline = time.monotonic() + timeout
        status = None
        out_r, code_w, rep_r = w.runner_pipes()
        try:
            write_all(code_w, encode_code(timeout, data))
        except OSError:
            status = CallEnd("failed", why="the sandbox worker died before it got the code")
        watch = {rep_r: lambda: _runner_hints(w), w.ctl.fileno(): lambda: _init_status(w)}
        got = run_with_limits(out_r, watch, deadline, self.max_read_bytes, status=status, stop=w.kill)
        return self.format_result(got.raw, got.status, timeout, got.timed_out, got.overflow, time.monotonic() - t0,
                                  w.mode)

    def format_result(self, raw: bytes, status: CallEnd | None, timeout: float, timed_out: bool,
                      overflow: bool, elapsed: float, mode: str) -> ToolResult:
        """A call's outcome as the model reads it (`call_result` of tools/sandbox/result.py, with this tool's caps)."""
        return call_result(raw, status, timeout, timed_out, overflow, elapsed, mode,
                           max_output_chars=self.max_output_chars, max_read_bytes=self.max_read_bytes,
                           memory_mb=self._cfg["memory_mb"])


def _runner_hints(w: Worker):
    """The runner closes its report pipe before the code runs: nothing on it comes from the code."""
    return UNWATCH if "EOF" in w.read_rep() else None


def _init_status(w: Worker) -> CallEnd | None:
    """How init's line says the call ended: the runner's exit status (ENDED), the deadline (DEADLINE)
    or a failure (FAILED); "gone" when init is gone (EOF). Another message is not one that ends a call;
    one that is no CTL message is refused (logged), never the tool's crash."""
    for line in w.read_ctl():
        if line == "EOF":
            return CallEnd("gone")
        try:
            msg, fields = CTL.decode(line)
        except ProtocolError as e:
            log.warning("python sandbox: %s", e)
            continue
        if msg is ENDED:
            return call_end(fields["how"])
        if msg is DEADLINE:
            return CallEnd("deadline")
        if msg is FAILED:
            return CallEnd("failed", why=fields["why"])
    return None


# =============================================================================================
# Benchmark
# =============================================================================================


def benchmark(n: int = 50, code: str = "print(1+1)") -> dict:
    """p50/p95 latency of pool calls vs a cold `subprocess.run([python, -c, code])`, and calls/s
    with 4 concurrent callers.

    Pool calls start from a full, ready pool (the latency a rollout sees when its calls are
    spaced by generation); the concurrent run measures sustained throughput, where every call
    also pays for forking its replacement.
    """
    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    with PythonTool(pool_size=4) as tool:
        tool.run("1")  # wait for the zygote
        pool = []
        for _ in range(n):
            tool.warm_up(5.0)
            time.sleep(0.02)  # let the previous call's namespaces finish tearing down
            t = time.perf_counter()
            result = tool.run(code)
            pool.append(time.perf_counter() - t)
            assert result.ok, result.output
        cold = []
        for _ in range(n):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], capture_output=True)
            cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        with ThreadPoolExecutor(4) as ex:
            list(ex.map(lambda _: tool.run(code), range(n)))
        conc = n / (time.perf_counter() - t)
        mode = tool.isolation
    res = {
        "isolation": mode,
        "pool_p50_ms": 1000 * statistics.median(pool), "pool_p95_ms": 1000 * pct(pool, 0.95),
        "cold_p50_ms": 1000 * statistics.median(cold), "cold_p95_ms": 1000 * pct(cold, 0.95),
        "concurrent4_calls_per_s": conc,
    }
    res["ratio_p50"] = res["pool_p50_ms"] / res["cold_p50_ms"]
    return res
