"""The markers: `timing` (tests that time the machine, listed in conftest.TIMING), `pipeline` (whole
pipelines end to end, conftest.PIPELINE; CI runs both as steps of their own) and `slow` (tests that load
the real default model)."""

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _conftest_list(name: str) -> dict[str, str]:
    """A list of tests/conftest.py (TIMING, PIPELINE), loaded by path: `from conftest import`
    gets whichever conftest.py was imported first (tests/training/conftest.py when a session collects
    tests/training first)."""
    spec = importlib.util.spec_from_file_location("_tests_conftest", ROOT / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


TIMING = _conftest_list("TIMING")
PIPELINE = _conftest_list("PIPELINE")


def test_every_timing_and_pipeline_test_exists():
    """A renamed test would silently leave the timing or pipeline step (and run in the default one again)."""
    missing = []
    for nodeid in [*TIMING, *PIPELINE]:
        path, name = nodeid.split("::")
        tree = ast.parse((ROOT / path).read_text())
        if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in ast.walk(tree)):
            missing.append(nodeid)
    assert not missing, missing


# Asserts on a clock that are waits, not bounds on the machine's speed: a loop's own deadline, or a
# guard far beyond any run (pytest's own --timeout=600 is the same guard).
CLOCK_GUARDS = {
    "tests/engine/test_vllm.py::test_serve_scheduler_batches_and_cancels_on_vllm": "polls until a deadline",
    "tests/eval/test_eval_resume.py::test_an_interrupted_eval_resumes_where_it_stopped_and_equals_an_uninterrupted_one":
        "polls the eval's answers until a 300 s deadline",
}
_CLOCKS = {"perf_counter", "monotonic", "time"}


def _clock_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CLOCKS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "time")


def _timed(expr: ast.AST, names: set[str]) -> bool:
    return any(_clock_call(n) or (isinstance(n, ast.Name) and n.id in names) for n in ast.walk(expr))


def _timed_names(fn: ast.AST) -> set[str]:
    """Names that hold a duration: `dt = time.monotonic() - t0`, `waits.append(time.time() - t)`, and
    what is computed from them (`p50 = statistics.median(waits)`)."""
    names: set[str] = set()
    while True:
        found = set(names)
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and ((isinstance(n.value, ast.BinOp) and _timed(n.value, set()))
                                              or _timed(n.value, names) and not _clock_call(n.value)):
                found |= {t.id for t in n.targets if isinstance(t, ast.Name)}
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append"
                  and isinstance(n.func.value, ast.Name) and n.args
                  and ((isinstance(n.args[0], ast.BinOp) and _timed(n.args[0], set())) or _timed(n.args[0], names))):
                found.add(n.func.value.id)
        if found == names:
            return names
        names = found


def clock_bounds(fn: ast.AST) -> list[int]:
    """Lines of the asserts in `fn` that bound a duration from above (`dt < 3`, `3 > dt`)."""
    names = _timed_names(fn)
    lines = []
    for a in (n for n in ast.walk(fn) if isinstance(n, ast.Assert)):
        for c in (n for n in ast.walk(a.test) if isinstance(n, ast.Compare) and len(n.ops) == 1):
            op, left, right = c.ops[0], c.left, c.comparators[0]
            if (isinstance(op, (ast.Lt, ast.LtE)) and _timed(left, names)) or \
                    (isinstance(op, (ast.Gt, ast.GtE)) and _timed(right, names)):
                lines.append(a.lineno)
    return lines


def test_no_default_test_bounds_the_wall_clock():
    """A test that asserts an upper bound on a duration times the machine: it is in TIMING (issue 64:
    ten such tests ran in the default step, where a loaded machine failed them)."""
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name.startswith("test_"):
                nodeid = f"{path.relative_to(ROOT).as_posix()}::{fn.name}"
                if nodeid not in TIMING and nodeid not in CLOCK_GUARDS and clock_bounds(fn):
                    found.append(f"{nodeid} (line {', '.join(map(str, clock_bounds(fn)))})")
    assert not found, "wall-clock bounds outside TIMING (tests/conftest.py):\n" + "\n".join(found)


def test_the_clock_check_sees_a_bound():
    fn = ast.parse("def test_x():\n    t0 = time.monotonic()\n    waits = []\n    waits.append(time.time() - t0)\n"
                   "    p50 = statistics.median(waits)\n    assert p50 < 2.0\n    assert 1 > time.perf_counter() - t0\n"
                   "    assert time.monotonic() - t0 >= 0.2\n")
    assert clock_bounds(fn) == [6, 7]
