"""commands/experiment.py's STUDIES, the name -> study registry of `arpo experiment`: the help lists every
study from it, an unknown name is refused with the list, and each study's config is built from its
config class (--quick: its quick()) with the command's flags."""

import dataclasses
import importlib
import re

import pytest

from arpo.cli import main
from arpo.commands.experiment import STUDIES

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
    from arpo.experiments.arpo_vs_grpo import ExperimentConfig
    from arpo.experiments.branch_rules_study import BranchRulesConfig

    assert from_dict(BranchRulesConfig, {"methods": ["arpo@zscore", "grpo"]}).methods == ["arpo@zscore", "grpo"]
    with pytest.raises(ArpoError, match=r"methods: 'arpo@nope': unknown branch rule 'nope'"):
        from_dict(BranchRulesConfig, {"methods": ["arpo@nope", "grpo"]})
    with pytest.raises(ArpoError, match=r"methods: unknown algo preset 'nope'"):
        from_dict(BranchRulesConfig, {"methods": ["nope@zscore", "grpo"]})
    with pytest.raises(ArpoError, match=r"methods: unknown algo preset 'arpo@zscore'"):
        from_dict(ExperimentConfig, {"methods": ["arpo@zscore", "grpo"]})


# study modules that still share a name with a module of the library (to rename: issue 64 item 6)
SHARED_NAMES = {"hop2.py": "data/hop2.py", "protocol.py": "tools/sandbox/protocol.py"}


def test_study_modules_are_named_apart_from_the_librarys():
    """experiments/branch_rules.py shared its name with rollout/branch_rules.py (issue 64): a study's
    module is named apart from every module of the library it studies."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "arpo"
    library = {p.name for p in src.rglob("*.py") if p.parts[len(src.parts)] != "experiments"}
    clash = sorted(p.name for p in (src / "experiments").glob("*.py")
                   if p.name != "__init__.py" and p.name in library and p.name not in SHARED_NAMES)
    assert not clash, f"experiments/ modules named like library modules: {clash}"
