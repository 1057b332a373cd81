"""What produced a result: the commit of arpo's source (and whether the tree had uncommitted changes),
the Python and the package versions. Run dirs (training/rundir.py: RUN_DIR/provenance.json) and the
experiments' results.json record it, so a number can be traced to the code that made it."""

from __future__ import annotations

import os
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


# Variables that choose which vector instructions torch's CPU kernels use: ATen's own kernels, oneDNN's
# and MKL's (MKL_CBWR: MKL's reproducible code path). The same weights and data give other floats on a CPU
# with other instructions (AVX-512 against AVX2); with all four set to AVX2 an AVX-512 machine reproduced
# an AVX2 machine's SFT weights bit for bit (docs/branch_rules.md, "A study longer than a machine").
ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS")
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2",
            "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def cpu_state() -> dict:
    """{capability, isa_env}: the vector instructions torch's CPU kernels use here (torch's
    get_cpu_capability(), e.g. 'AVX2' or 'AVX512'; None when torch is not loaded, so that this light
    module never imports it) and which of ISA_ENV are set, with their values."""
    torch = sys.modules.get("torch")
    try:
        cap = torch.backends.cpu.get_cpu_capability() if torch is not None else None
    except (AttributeError, RuntimeError):
        cap = None
    return {"capability": cap, "isa_env": {k: os.environ[k] for k in ISA_ENV if k in os.environ}}


def provenance() -> dict:
    """{commit, dirty, changed, python, platform, cpu, packages, time}: arpo's source commit (git_state
    of the imported arpo package), the interpreter, the CPU's kernel instructions (cpu_state) and the
    package versions, now."""
    return {**git_state(arpo.__file__), "python": sys.version.split()[0], "platform": platform.platform(),
            "cpu": cpu_state(), "packages": package_versions(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
