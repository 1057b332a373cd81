"""CI lints every Python file the repository ships (issue 64: scripts/ was left out of `.ci/run`'s
ruff line and held 6 errors): the ruff line's paths cover every tracked `.py` file, and ruff run on
them, as CI runs it, passes."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ci_ruff_args() -> list[str]:
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0].endswith("ruff") and words[1:2] == ["check"]:
            return words[2:]
    raise AssertionError(".ci/run has no `ruff check` line")


def _tracked_py() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "*.py"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.decode().split("\0") if p]


def test_ci_lints_every_tracked_python_file():
    paths = [p.rstrip("/") for p in _ci_ruff_args() if not p.startswith("-")]
    uncovered = [f for f in _tracked_py()
                 if not any(p == "." or f == p or f.startswith(p + "/") for p in paths)]
    assert not uncovered, f".ci/run's ruff line ({' '.join(paths)}) leaves out: {uncovered[:10]}"


def test_ruff_passes_on_what_ci_lints():
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed (pip install -e .[test])")
    r = subprocess.run([str(ruff), "check", "--no-cache", *_ci_ruff_args()], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
