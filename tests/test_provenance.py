"""arpo/provenance.py: the commit (and dirty or not) of the checkout that tracks a file, and package
versions; run dirs record it at every start and resume (training/rundir.py)."""

from __future__ import annotations

import subprocess

import arpo
from arpo.provenance import ISA_ENV, cpu_state, git_state, package_versions, provenance


def _git(d, *args):
    return subprocess.run(["git", "-C", str(d), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_git_state_of_a_checkout_clean_dirty_and_untracked(tmp_path):
    _git(tmp_path, "init", "-q")
    f = tmp_path / "mod.py"
    f.write_text("x = 1\n")
    _git(tmp_path, "add", "mod.py")
    _git(tmp_path, "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert git_state(f) == {"commit": head, "dirty": False, "changed": 0}
    f.write_text("x = 2\n")
    (tmp_path / "new.py").write_text("")
    assert git_state(f) == {"commit": head, "dirty": True, "changed": 2}
    # a file the checkout does not track (an installed copy next to it, say): no claim about it
    assert git_state(tmp_path / "new.py") == {"commit": None, "dirty": None, "changed": None}
    assert git_state(tmp_path.parent / "elsewhere.py")["commit"] is None


def test_package_versions_and_provenance():
    import numpy
    import torch

    v = package_versions(("torch", "numpy", "no-such-distribution-xyz"))
    assert v["torch"] == torch.__version__.split("+")[0] or v["torch"] == torch.__version__
    assert v["numpy"] == numpy.__version__ and v["no-such-distribution-xyz"] is None
    p = provenance()
    assert set(p) >= {"commit", "dirty", "python", "platform", "packages"} and p["packages"]["torch"]
    assert p["commit"] == git_state(arpo.__file__)["commit"]


def test_cpu_state_names_the_kernel_instructions_and_the_variables_that_choose_them(monkeypatch):
    import torch

    for k in ISA_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    c = cpu_state()
    assert c == {"capability": torch.backends.cpu.get_cpu_capability(), "isa_env": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
    assert c["capability"]  # e.g. 'AVX2' or 'AVX512' on x86, 'DEFAULT' where there is no vector ISA
    assert provenance()["cpu"] == c
