"""CI lints every Python file the repository ships (issue 64: scripts/ was left out of `.ci/run`'s
ruff line and held 6 errors): the ruff line's paths cover every tracked `.py` file, and ruff run on
them, as CI runs it, passes. And CI's log records the main suite's wall time."""

from __future__ import annotations

import re
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


def test_ci_logs_the_main_suites_wall_time(tmp_path):
    """`.ci/run` prints the main suite's wall time, whether it passed or failed (issue 64): its lines
    from `suite_start=` to the exit, run by bash with pytest replaced by a command that fails."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("suite_start="))
    block = "\n".join(lines[start:start + 4]).replace(".venv/bin/python -m pytest", "false")
    r = subprocess.run(["bash", "-c", f"set -euo pipefail\n{block}"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and re.search(r"CI: main suite wall time \d+ s \(exit 1;", r.stdout), (r.stdout, r.stderr)
