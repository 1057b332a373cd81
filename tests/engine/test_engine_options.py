"""`engine_options` is a typed section (settings/engine.py EngineOptions; it was a free dict, issue 64 item
3): its defaults are the engines' own, each key is read by the engines READ_BY names, a key the chosen
engine does not read or a value of the wrong type is an error naming the key at load time, and vLLM's
other keywords pass through `extra`."""

import dataclasses
import inspect

import pytest

from arpo.config import from_dict, load_config
from arpo.engine.hf import HFEngine
from arpo.engine.names import ENGINES
from arpo.engine.vllm import VLLMEngine
from arpo.engine.vllm_server import VLLMServerEngine
from arpo.errors import ArpoError
from arpo.settings import EngineOptions, TrainConfig
from arpo.settings.engine import READ_BY

CLASSES = {"hf": HFEngine, "vllm": VLLMEngine, "vllm_server": VLLMServerEngine}
LLM_KWARGS = {"gpu_memory_utilization"}  # typed here, vllm.LLM's own keyword (VLLMEngine's **llm_kwargs)


def _params(engine: str) -> dict:
    return {k: p.default for k, p in inspect.signature(CLASSES[engine].__init__).parameters.items()}


@pytest.mark.parametrize("engine", ENGINES)
def test_each_key_an_engine_reads_is_its_keyword_with_its_default(engine):
    params, default = _params(engine), EngineOptions()
    for name, readers in READ_BY.items():
        if engine not in readers or name in LLM_KWARGS:
            continue
        assert name in params, f"engine_options.{name}: {engine} takes no such keyword"
        want = params[name]
        got = getattr(default, name)
        if (engine, name) == ("vllm", "dtype"):
            assert (want, got) == ("auto", None)  # None: the policy's dtype (VLLMEngine.from_model reads it)
        else:
            assert got == want, f"engine_options.{name}: default {got!r}, {engine}'s {want!r}"


def test_every_key_says_which_engines_read_it():
    names = {f.name for f in dataclasses.fields(EngineOptions)} - {"extra"}
    assert set(READ_BY) == names
    keywords = {k for e in ENGINES for k in _params(e)} | LLM_KWARGS
    assert names <= keywords


def test_a_key_the_engine_does_not_read_is_an_error_naming_it():
    """An hf run given max_model_len failed only when the engine was built, after the model had loaded."""
    with pytest.raises(ArpoError, match=r"engine_options.max_model_len: engine hf does not read it \(read by: vllm\)"):
        load_config(TrainConfig, None, ["engine_options.max_model_len=512"])
    with pytest.raises(ArpoError, match=r"engine_options.extra.swap_space: engine hf does not read it"):
        load_config(TrainConfig, None, ["engine_options.extra={swap_space: 4}"])
    cfg = load_config(TrainConfig, None, ["engine=vllm", "rollout.entropy_estimator=topk",
                                          "engine_options={max_model_len: 512, extra: {swap_space: 4}}"])
    assert cfg.engine_options.max_model_len == 512
    assert cfg.engine_options.kwargs("vllm") == {"max_model_len": 512, "swap_space": 4}


def test_wrong_types_and_unknown_keys_name_the_key():
    with pytest.raises(ArpoError, match=r"engine_options.gpu_memory_utilization: expected a number, got 'high'"):
        load_config(TrainConfig, None, ["engine=vllm", "rollout.entropy_estimator=topk",
                                        "engine_options.gpu_memory_utilization=high"])
    with pytest.raises(ArpoError, match=r"unknown config key 'engine_options.max_model_lenght'"):
        load_config(TrainConfig, None, ["engine_options.max_model_lenght=5"])
    with pytest.raises(ArpoError, match=r"engine_options.transfer: 'smoke'; choose one of disk, nccl, ipc"):
        from_dict(EngineOptions, {"transfer": "smoke"}, prefix="engine_options.")
    with pytest.raises(ArpoError, match=r"engine_options.extra: max_model_len: set engine_options.<name>"):
        from_dict(EngineOptions, {"extra": {"max_model_len": 5}}, prefix="engine_options.")
    with pytest.raises(ArpoError, match=r"engine_options.extra: servers: set"):
        from_dict(EngineOptions, {"extra": {"servers": ["http://h:1"]}}, prefix="engine_options.")


def test_only_the_keys_set_reach_the_engine():
    """The engine's own defaults apply to the rest (make_engine gets what a config says, as before)."""
    assert EngineOptions().kwargs("hf") == {}
    assert EngineOptions(topk_entropy=4, compile=True).kwargs("hf") == {"topk_entropy": 4, "compile": True}
    with pytest.raises(ArpoError, match=r"engine_options.topk_entropy: must be >= 1 for engine vllm_server"):
        EngineOptions(topk_entropy=0).kwargs("vllm_server")
