"""Every shipped config parses and validates; the tiny config trains end to end on its own."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


def _cls(path: Path):
    from arpo.settings import RolloutJobConfig, SFTConfig, TrainConfig

    name = path.name
    return RolloutJobConfig if name.startswith("rollout") else SFTConfig if name.startswith("sft") else TrainConfig


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(ROOT / "configs")) for p in CONFIGS])
def test_shipped_config_is_valid(path):
    from arpo.config import load_config

    cfg = load_config(_cls(path), str(path))
    if hasattr(cfg, "validate"):
        cfg.validate()


def test_tiny_config_trains_standalone(tmp_path, monkeypatch):
    from arpo.cli import main

    monkeypatch.setenv("ARPO_CACHE_DIR", str(tmp_path / "cache"))  # tiny-random is built there, once
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    assert main(["train", "--config", "configs/train_tiny.yaml", f"run.dir={run}", "--quiet"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["trajectories"] == 8 for r in rows)
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert (tmp_path / "cache" / "models" / "tiny-random" / "config.json").is_file()
