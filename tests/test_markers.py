"""The markers: `timing` (tests that time the machine, listed in conftest.TIMING; CI runs them as a
step of their own) and `slow` (tests that load the real default model)."""

import ast
from pathlib import Path

from conftest import TIMING

ROOT = Path(__file__).resolve().parents[1]


def test_every_timing_test_exists():
    """A renamed test would silently leave the timing step (and run in the default one again)."""
    missing = []
    for nodeid in TIMING:
        path, name = nodeid.split("::")
        tree = ast.parse((ROOT / path).read_text())
        if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in ast.walk(tree)):
            missing.append(nodeid)
    assert not missing, missing
