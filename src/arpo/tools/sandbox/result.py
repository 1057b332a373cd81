"""A call's outcome as the model reads it: its output, capped, and one error line saying how it
ended (timeout, output flood, memory, signal, exit status).

Trainer side: never loaded inside the zygote."""

from __future__ import annotations

import signal

from arpo.tools.base import ToolResult

from .pool import SANDBOX_SOURCE_NAME
from .protocol import CallEnd
from .runner import EXIT_EXC, EXIT_HARNESS


def fmt_seconds(t: float) -> str:
    return f"{t:.1f}" if abs(t * 10 - round(t * 10)) < 1e-9 else f"{t:g}"


def _signal_text(sig: int) -> str:
    if sig == signal.SIGXCPU:
        return "Error: CPU time limit exceeded"
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    desc = signal.strsignal(sig) or name
    return f"Error: the process was killed by {name} ({desc})"


def _clean_fault_report(text: str) -> str:
    """Drop the harness frames and module list from a faulthandler report (segfault etc.): the
    model's own frames come first ("most recent call first"), ours follow them."""
    if "Fatal Python error" not in text:
        return text
    out, skipping = [], False
    for line in text.split("\n"):
        if line.startswith('  File "') and (skipping or f'File "{SANDBOX_SOURCE_NAME}"' in line):
            skipping = True
            continue
        skipping = False
        if not line.startswith("Extension modules:"):
            out.append(line)
    return "\n".join(out)


def _truncate(text: str, limit: int, keep_tail: bool) -> tuple[str, bool]:
    """Cut to `limit` characters with a visible marker; errors keep their tail (the traceback)."""
    if len(text) <= limit:
        return text, False
    if keep_tail:
        head = limit * 3 // 5
        tail = limit - head
        dropped = len(text) - head - tail
        return f"{text[:head]}\n... [output truncated: {dropped} more characters] ...\n{text[len(text) - tail:]}", True
    return f"{text[:limit]}\n... [output truncated: {len(text) - limit} more characters]", True


def call_result(raw: bytes, status: CallEnd | None, timeout: float, timed_out: bool, overflow: bool,
                elapsed: float, mode: str, *, max_output_chars: int, max_read_bytes: int, memory_mb: int) -> ToolResult:
    """The ToolResult of one call: its output (NULs dropped, harness frames cut from a fault report,
    cut to `max_output_chars`, a failure keeping its tail) and, unless it ended well, one error
    line from how it ended (`status`) and the limit that ended it."""
    text = _clean_fault_report(raw.decode("utf-8", "replace").replace("\x00", ""))
    ok, error = True, None
    kind = status.kind if status is not None else None
    if timed_out or kind == "deadline":
        ok, error = False, f"Error: execution timed out after {fmt_seconds(timeout)} s"
    elif overflow:
        ok, error = False, f"Error: output limit exceeded; the program was stopped after {max_read_bytes} bytes"
    elif kind == "oom":
        ok, error = False, f"Error: memory limit exceeded ({memory_mb} MB); the program was killed"
    elif status is not None and kind == "signal":
        ok, error = False, _signal_text(status.code)
    elif status is not None and kind == "exit":
        code = status.code  # the runner's exit status: 0 ok, 1 an exception (traceback above)
        ok = code == 0
        if code == EXIT_HARNESS:
            error = "Error: the sandbox failed to run the program"
        elif code not in (0, EXIT_EXC):
            error = f"Error: the program exited with status {code}"
    else:
        ok, error = False, f"Error: the sandbox failed ({status or 'no status'})"
    text, truncated = _truncate(text, max_output_chars, keep_tail=not ok)
    if overflow:
        truncated = True
    if error:
        text = f"{text.rstrip()}\n{error}" if text.strip() else error
    elif not text.strip():
        text = "(no output)"
    meta = {"isolation": mode, "status": None if status is None else str(status), "timed_out": timed_out,
            "output_bytes": len(raw)}
    return ToolResult(text.rstrip("\n"), ok=ok, elapsed_s=elapsed, truncated=truncated, meta=meta)
