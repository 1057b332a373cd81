"""results.json records a study's `out` relative to the working directory (issue 64): the committed
results named the folders of the machine that ran them (/work/study41/...)."""

import os
from pathlib import Path

from experiments.common import RLStudyConfig, recorded_settings


def test_an_absolute_out_is_recorded_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study").mkdir()
    got = recorded_settings(RLStudyConfig(out=str(tmp_path / "runs" / "x"), seeds=2))
    assert got["out"] == os.path.join("runs", "x") and got["seeds"] == 2
    monkeypatch.chdir(tmp_path / "study")
    outside = recorded_settings(RLStudyConfig(out=str(tmp_path / "elsewhere")))["out"]
    assert not Path(outside).is_absolute() and (tmp_path / "study" / outside).resolve() == tmp_path / "elsewhere"
    assert recorded_settings(RLStudyConfig(out="runs/y"))["out"] == "runs/y"  # as given
