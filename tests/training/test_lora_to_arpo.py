"""LoRA SFT → ARPO (issue 29): `arpo train model.name=<a LoRA sft run>` trains that adapter on without
repeating lora.enabled (it used to fail: "the model has no trainable parameters"), lora.enabled=false
merges it and trains all weights, and `arpo export` writes a plain HF directory with the adapter
merged that `arpo chat --model DIR` loads with the run's prompt template."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from arpo.cli import main
from arpo.config import load_config
from arpo.settings import SFTConfig, TrainConfig
from arpo.testing import save_tiny_model


@pytest.fixture(scope="module")
def lora_sft(tmp_path_factory):
    """A tiny model and a 2-step LoRA SFT run of it (r=4, so a remembered shape is not the default 16)."""
    from arpo.recipes import sft

    d = tmp_path_factory.mktemp("lora_sft")
    save_tiny_model(d / "model")
    (d / "sft.jsonl").write_text(json.dumps({"question": "1+1?", "response": "<answer> \\boxed{2} </answer>"}) + "\n")
    (d / "q.jsonl").write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i),
                                                   "task": "math"}) + "\n" for i in range(4)))
    cfg = load_config(SFTConfig, None, [f"model.name={d / 'model'}", f"data.path=[{d / 'sft.jsonl'}]",
                                            "prompts_per_step=1", "steps=2", "optim.lr=5e-2", "optim.warmup_steps=0",
                                            "lora.enabled=true", "lora.r=4", f"run.dir={d / 'sft'}",
                                            "run.tensorboard=false"])
    sft.run(cfg, quiet=True)
    return d


def _train(d, run, *extra):
    from arpo.recipes import train

    ov = [f"model.name={d / 'sft'}", f"data.path={d / 'q.jsonl'}", "tools.enabled=[]", "agent.max_response_tokens=8",
          "rollout.group_size=2", "rollout.initial_rollouts=2", "reward.fn=arpo.testing:half_uniform_reward",
          "steps=1", "prompts_per_step=2", "optim.lr=1e-7", f"run.dir={run}", "run.tensorboard=false", *extra]
    return Path(train.run(load_config(TrainConfig, None, ov), quiet=True)["checkpoint"]) / "model"


def _adapter(model_dir):
    return load_file(str(model_dir / "adapter_model.safetensors"))


def test_train_continues_the_sft_adapter_without_repeating_lora(lora_sft, tmp_path):
    sft_model = lora_sft / "sft" / "checkpoints" / "step_000002" / "model"
    ck = _train(lora_sft, tmp_path / "rl")
    assert (ck / "adapter_model.safetensors").is_file() and not (ck / "model.safetensors").exists()
    conf = json.loads((ck / "adapter_config.json").read_text())
    assert conf["r"] == 4 and Path(conf["base_model_name_or_path"]) == lora_sft / "model"
    import yaml

    saved = yaml.safe_load((tmp_path / "rl" / "config.yaml").read_text())["lora"]  # the LoRA in effect
    assert saved["enabled"] is True and saved["r"] == 4
    before, after = _adapter(sft_model), _adapter(ck)
    assert before.keys() == after.keys()
    bs = [k for k in before if "lora_B" in k]
    assert bs and all(before[k].abs().max() > 1e-3 for k in bs)  # SFT moved B away from its zero init
    # the RL run started from the SFT adapter (lr 1e-7: it barely moved), not from a fresh one (B = 0)
    assert all(torch.allclose(before[k], after[k], atol=1e-4) for k in bs)


def test_lora_false_merges_the_adapter_and_trains_all_weights(lora_sft, tmp_path):
    ck = _train(lora_sft, tmp_path / "full", "lora.enabled=false")
    assert (ck / "model.safetensors").is_file() and not (ck / "adapter_config.json").exists()


def test_a_plain_run_records_lora_false_and_resumes(lora_sft, tmp_path):
    """lora.enabled's default is null (resolved against model.name); config.yaml keeps the resolved
    false that runs always recorded, so a run started before resumes (a null was a 'changed key')."""
    import yaml

    from arpo.recipes import train

    ov = [f"model.name={lora_sft / 'model'}", f"data.path={lora_sft / 'q.jsonl'}", "tools.enabled=[]",
          "agent.max_response_tokens=8", "rollout.group_size=2", "rollout.initial_rollouts=2",
          "reward.fn=arpo.testing:half_uniform_reward", "prompts_per_step=2", f"run.dir={tmp_path / 'r'}",
          "run.tensorboard=false"]
    train.run(load_config(TrainConfig, None, [*ov, "steps=1"]), quiet=True)
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["lora"]["enabled"] is False
    out = train.run(load_config(TrainConfig, None, [*ov, "steps=2"]), resume=True, quiet=True)
    assert out["checkpoint"].endswith("step_000002")


def test_print_config_shows_the_lora_in_effect(lora_sft, capsys):
    assert main(["train", "--print-config", f"model.name={lora_sft / 'sft'}"]) == 0
    lora = capsys.readouterr().out.split("\nlora:")[1].split("\nrun:")[0]
    assert "enabled: true" in lora and "r: 4 " in lora
    assert main(["train", "--print-config", f"model.name={lora_sft / 'model'}"]) == 0
    lora = capsys.readouterr().out.split("\nlora:")[1].split("\nrun:")[0]
    assert "enabled: false" in lora and "r: 16 " in lora


def test_export_merges_the_adapter_into_a_plain_model_dir(lora_sft, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from arpo.models import load_model

    out = tmp_path / "merged"
    assert main(["export", str(lora_sft / "sft"), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["merged_adapter"] and summary["dtype"] == "float32"
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not (out / "adapter_config.json").exists()
    plain = AutoModelForCausalLM.from_pretrained(out).eval()  # no peft involved
    merged, _ = load_model(str(lora_sft / "sft"))
    base, _ = load_model(str(lora_sft / "model"))
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    with torch.no_grad():
        got, want, orig = (m(ids).logits for m in (plain, merged, base))
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, orig, atol=1e-3)
    # the run's prompt template goes with the model
    assert main(["chat", "--model", str(out), "--max-response-tokens", "2", "--temperature", "0", "hi"]) == 0
    assert "prompt template math (the run's)" in capsys.readouterr().err
    # an output that exists and is not empty is refused in one line
    assert main(["export", str(lora_sft / "sft"), "--out", str(out)]) == 2
    assert "not an empty directory" in capsys.readouterr().err
