"""What produced a result: the commit of arpo's source (and whether the tree had uncommitted changes),
the Python and the package versions. Run dirs (training/rundir.py: RUN_DIR/provenance.json) and the
experiments' results.json record it, so a number can be traced to the code that made it."""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import arpo

PACKAGES = ("arpo", "torch", "transformers", "tokenizers", "safetensors", "numpy", "peft", "vllm", "accelerate")


def git_state(path: str | Path) -> dict:
    """{commit, dirty, changed}: HEAD of the git checkout that tracks `path` (a file), whether the
    checkout differs from it (`git status --porcelain`: modified, staged or untracked files; changed
    = how many) — or all None when `path` is not a tracked file of a git checkout (an installed wheel)
    or git is missing."""
    p = Path(path).resolve()

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(p.parent), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout if r.returncode == 0 else None

    if git("ls-files", "--error-unmatch", p.name) is None:
        return {"commit": None, "dirty": None, "changed": None}
    head, status = git("rev-parse", "HEAD"), git("status", "--porcelain")
    changed = None if status is None else len([ln for ln in status.splitlines() if ln.strip()])
    return {"commit": head.strip() if head else None, "dirty": None if changed is None else changed > 0,
            "changed": changed}


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """{distribution: installed version, or None when it is not installed}."""
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def provenance() -> dict:
    """{commit, dirty, changed, python, platform, packages, time}: arpo's source commit (git_state of
    the imported arpo package), the interpreter and the package versions, now."""
    return {**git_state(arpo.__file__), "python": sys.version.split()[0], "platform": platform.platform(),
            "packages": package_versions(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
