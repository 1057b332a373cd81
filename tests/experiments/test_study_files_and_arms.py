"""`arpo experiment` studies from any directory (their configs/... were read from the current one only,
"cannot read config" after 15 s), and `methods=[arpo@,arpo]` is one arm given twice (it trained it twice)."""

from pathlib import Path

import pytest

from arpo.errors import ArpoError
from experiments.common import check_methods
from experiments.hop2_study import Hop2ExperimentConfig
from experiments.svamp import SvampExperimentConfig


@pytest.mark.parametrize("cls", [Hop2ExperimentConfig, SvampExperimentConfig])
def test_a_study_finds_its_configs_from_any_directory(cls, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = cls()
    cfg.validate()
    assert Path(cfg.sft_config).is_file() and Path(cfg.train_config).is_file(), (cfg.sft_config, cfg.train_config)
    bad = cls(sft_config="configs/nope.yaml")
    with pytest.raises(ArpoError, match=r"sft_config: configs/nope.yaml is not a file, neither from"):
        bad.validate()


def test_an_arm_without_a_rule_is_its_preset():
    with pytest.raises(ArpoError, match=r"methods: arpo given twice"):
        check_methods(["arpo@", "arpo"], arms=True)
    check_methods(["arpo", "arpo@reference"], arms=True)  # another rule: another arm
