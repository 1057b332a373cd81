"""commands/experiment.py's STUDIES, the name -> study registry of `arpo experiment`: the help lists every
study from it, an unknown name is refused with the list, and each study's config is built from its
config class (--quick: its quick()) with the command's flags."""

import dataclasses
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from arpo.cli import main
from arpo.commands.experiment import STUDIES

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = [n for n, st in STUDIES.items() if st.command is None]


def test_the_help_lists_every_study_with_its_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["experiment", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for name, st in STUDIES.items():
        assert re.search(rf"^\s+{re.escape(name)}\s+{re.escape(st.help)}$", out, re.M), name


def test_an_unknown_study_is_refused_with_the_list(capsys):
    with pytest.raises(SystemExit) as e:
        main(["experiment", "svamp"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "invalid choice: 'svamp'" in err
    assert all(f"'{name}'" in err for name in STUDIES)


@pytest.mark.parametrize("name", RUNNABLE)
def test_the_command_builds_each_study_config(name, tmp_path, monkeypatch, capsys):
    """The study's own run() gets its config class's defaults (its quick() with --quick), with the flags
    it takes; a study without quick() refuses --quick by name."""
    st = STUDIES[name]
    seen = {}
    monkeypatch.setattr(importlib.import_module(st.module), "run", lambda cfg: seen.setdefault("cfg", cfg))
    monkeypatch.setitem(STUDIES, name, dataclasses.replace(st, printed=lambda res, cfg: {"ran": True}))
    quick = st.quick()
    out = str(tmp_path / "o")
    assert main(["experiment", name, "--out", out, "--threads", "1", *(["--quick"] if quick else [])]) == 0
    assert capsys.readouterr().out.strip() == '{\n "ran": true\n}'
    base = quick if quick is not None else st.config_class()()
    assert type(seen["cfg"]) is st.config_class() and seen["cfg"] == dataclasses.replace(base, out=out, threads=1)
    if quick is None:
        assert main(["experiment", name, "--quick", "--out", out]) == 2
        assert f"--quick: {name} has no smoke-test config" in capsys.readouterr().err


def test_the_rl_studies_take_arms_and_check_their_rule(capsys):
    """branch-rules' arms `preset@rule` were refused as unknown algo presets by the methods check (its
    --quick config failed before the fix); an unknown rule is refused by name, and arpo-vs-grpo, whose
    runs take a bare preset, still refuses an arm."""
    from arpo.config import from_dict
    from arpo.errors import ArpoError
    from experiments.arpo_vs_grpo import ExperimentConfig
    from experiments.branch_rules_study import BranchRulesConfig

    assert from_dict(BranchRulesConfig, {"methods": ["arpo@zscore", "grpo"]}).methods == ["arpo@zscore", "grpo"]
    with pytest.raises(ArpoError, match=r"methods: 'arpo@nope': unknown branch rule 'nope'"):
        from_dict(BranchRulesConfig, {"methods": ["arpo@nope", "grpo"]})
    with pytest.raises(ArpoError, match=r"methods: unknown algo preset 'nope'"):
        from_dict(BranchRulesConfig, {"methods": ["nope@zscore", "grpo"]})
    with pytest.raises(ArpoError, match=r"methods: unknown algo preset 'arpo@zscore'"):
        from_dict(ExperimentConfig, {"methods": ["arpo@zscore", "grpo"]})


def test_study_modules_are_named_apart_from_the_librarys():
    """experiments/branch_rules.py shared its name with rollout/branch_rules.py, hop2.py with data/hop2.py
    and protocol.py with tools/sandbox/protocol.py (issue 64 item 6): a study's module is named apart from
    every module of the library it studies."""
    library = {p.name for p in (ROOT / "src" / "arpo").rglob("*.py")}
    studies = {p.name for p in (ROOT / "experiments").glob("*.py")} - {"__init__.py"}
    assert {"hop2_study.py", "blind_protocol.py", "branch_rules_study.py"} <= studies
    clash = sorted(studies & library)
    assert not clash, f"experiments/ modules named like library modules: {clash}"


def _arpo(args: list[str], pythonpath: str, cwd) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "arpo", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def test_the_studies_are_found_in_the_clone_arpo_is_imported_from(tmp_path):
    """The studies are the repository's experiments/, not the installed package's (issue 64 item 6): with
    arpo imported from a clone's src/, `arpo experiment` finds them from any directory (here the study's
    own command answers: hop2-stats refuses a missing --results itself)."""
    out = _arpo(["experiment", "hop2-stats"], str(ROOT / "src"), tmp_path)
    assert out.returncode == 2 and "hop2-stats needs --results PATH" in out.stderr, out.stderr[-2000:]


def test_without_a_clone_the_command_says_in_one_line_that_the_studies_need_one(tmp_path):
    """arpo installed without the repository around it (its package alone, here linked into an empty
    site folder): the command's one line says the studies need a clone, not a ModuleNotFoundError."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "arpo").symlink_to(ROOT / "src" / "arpo", target_is_directory=True)
    for args in (["experiment", "hop2-stats", "--results", "x.json"], ["experiment", "branching", "--out", "o"]):
        out = _arpo(args, str(site), tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
        assert "not part of the installed arpo package" in lines[0] and "from a clone of the repository" in lines[0]
