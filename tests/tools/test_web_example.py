"""examples/deep_search: its configs load and validate (SFT data path, web tools on the local web),
its script is valid bash, and a bad tools.web key is refused naming the key."""

import subprocess
from pathlib import Path

import pytest

from arpo.config import load_config
from arpo.errors import ArpoError

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples" / "deep_search"


def test_example_configs_load_and_validate():
    from arpo.settings import SFTConfig, TrainConfig

    sft = load_config(SFTConfig, str(EX / "sft.yaml"))
    sft.validate()
    assert sft.data.path == ["runs/deep_search/sft.jsonl"] and sft.run.dir == "runs/deep_search/sft"
    train = load_config(TrainConfig, str(EX / "train.yaml"))
    train.validate()
    assert train.tools.enabled == ["web_search", "browse"] and train.model.name == "runs/deep_search/sft"
    assert train.tools.web.provider == "local" and train.tools.web.url == "http://127.0.0.1:8090"
    port = load_config(TrainConfig, str(EX / "train.yaml"), ["tools.web.url=http://127.0.0.1:9999"])
    assert port.tools.web.url == "http://127.0.0.1:9999"
    assert port.tools.web.top_k == train.tools.web.top_k == 2  # merged, not replaced


def test_bad_web_key_is_refused_with_its_name():
    from arpo.settings import TrainConfig

    with pytest.raises(ArpoError, match=r"unknown config key 'tools.web.windowchars' \(did you mean tools.web.wind"):
        load_config(TrainConfig, str(EX / "train.yaml"), ["tools.web.windowchars=3"])


def test_gpu_deep_search_configs_are_the_papers_recipe():
    from arpo.settings import TrainConfig

    for size in ("8b", "14b"):
        cfg = load_config(TrainConfig, str(ROOT / "configs" / "gpu" / f"deep_search_qwen3_{size}.yaml"))
        cfg.validate()
        assert (cfg.rollout.group_size, cfg.rollout.initial_rollouts) == (16, 8)
        assert cfg.agent.max_response_tokens == 10000 and cfg.tools.enabled == ["web_search", "browse"]
        assert cfg.tools.web.summarizer_model == f"Qwen3-{size[:-1]}B"


def test_run_sh_is_valid_bash():
    r = subprocess.run(["bash", "-n", str(EX / "run.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
