"""The sandbox package's shape (tools/sandbox/): the zygote side loads without `arpo`, and the one
output loop both python tools use (`run_with_limits`) keeps its deadline and byte cap."""

from __future__ import annotations

import ast
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from arpo.tools.sandbox import pool
from arpo.tools.sandbox.capture import UNWATCH, run_with_limits
from arpo.tools.sandbox.protocol import CallEnd, call_end

PKG = Path(pool.__file__).parent
TRAINER_SIDE = {"__init__", "limits", "pool", "capture", "result"}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(relative level, module) of every import in the file, those inside functions too."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(0, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or ""))
    return out


def test_every_module_is_on_one_side():
    """A new module must be listed: loaded into the zygote (ZYGOTE_MODULES) or trainer side only."""
    names = {p.stem for p in PKG.glob("*.py")}
    assert names == set(pool.ZYGOTE_MODULES) | TRAINER_SIDE, names ^ (set(pool.ZYGOTE_MODULES) | TRAINER_SIDE)
    assert not set(pool.ZYGOTE_MODULES) & TRAINER_SIDE


def test_zygote_side_imports_only_the_standard_library_and_earlier_modules():
    """The bootstrap execs ZYGOTE_MODULES in order into a package of their own, without `arpo`: an
    import of arpo (or of a later module) would fail in the zygote or, inside a function, in a call
    whose filesystem view no longer holds the project tree."""
    for i, name in enumerate(pool.ZYGOTE_MODULES):
        for level, mod in _imports(PKG / f"{name}.py"):
            if level:
                assert level == 1 and mod in pool.ZYGOTE_MODULES[:i], f"{name}.py imports .{mod}"
            else:
                top = mod.split(".")[0]
                optional = name == "zygote" and top == "sympy"  # the pre-import of an optional library, guarded
                assert top in sys.stdlib_module_names or top == "__future__" or optional, f"{name}.py imports {mod}"


def test_calls_run_in_the_packaged_zygote_without_arpo():
    from arpo.tools.python import PythonTool

    with PythonTool(pool_size=1, preimport=()) as tool:
        res = tool.run("import sys\nprint(sorted(m for m in sys.modules if 'arpo' in m))")
    assert res.ok, res.output
    loaded = set(ast.literal_eval(res.output))
    assert loaded == {pool.ZYGOTE_PACKAGE} | {f"{pool.ZYGOTE_PACKAGE}.{m}" for m in pool.ZYGOTE_MODULES}


def _writer(fd: int, data: bytes, delay_s: float = 0.0, close: bool = True) -> threading.Thread:
    def run():
        time.sleep(delay_s)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view[: 1 << 16]):]
        except BrokenPipeError:
            pass
        if close:
            os.close(fd)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_run_with_limits_stops_a_flood_at_the_cap_and_not_before():
    for size, cap, flooded in ((1000, 1000, False), (1001, 1000, True), (300_000, 100_000, True)):
        r, w = os.pipe()
        _writer(w, b"x" * size)
        got = run_with_limits(r, {}, time.monotonic() + 1.0, cap)  # no status comes: the deadline ends the rest
        os.close(r)
        assert (got.overflow, got.timed_out, got.status) == (flooded, not flooded, None), (size, cap)
        assert got.raw == b"x" * min(size, cap)


def test_run_with_limits_ends_at_a_status_and_drains_what_was_written():
    r, w = os.pipe()
    sr, sw = os.pipe()
    os.write(w, b"before the status\n")
    _writer(sw, b"X wexit 0\n", delay_s=0.05, close=False)
    stopped = []

    def status():
        line = os.read(sr, 64).decode()
        return call_end(line.strip().removeprefix("X ")) if line else UNWATCH

    got = run_with_limits(r, {sr: status}, time.monotonic() + 10, 1 << 20, stop=lambda: stopped.append(1))
    assert (got.status, got.timed_out, got.overflow, stopped) == (CallEnd("exit", 0), False, False, [1])
    assert got.raw == b"before the status\n"
    for fd in (r, w, sr, sw):
        os.close(fd)


@pytest.mark.parametrize("known", [None, CallEnd("failed", why="the code could not be sent")])
def test_run_with_limits_deadline_and_a_status_known_before(known):
    r, w = os.pipe()
    os.write(w, b"partial")
    t0 = time.monotonic()
    got = run_with_limits(r, {}, t0 + 0.3, 1 << 20, status=known)
    elapsed = time.monotonic() - t0
    assert got.raw == b"partial" and got.status == known and got.timed_out == (known is None)
    assert (0.3 <= elapsed < 2.0) if known is None else elapsed < 0.2
    os.close(r)
    os.close(w)
