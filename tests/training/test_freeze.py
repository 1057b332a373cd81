"""model.train_layers: only the top decoder blocks (and the final norm) train."""

import pytest
import torch

from arpo.errors import ArpoError
from arpo.settings import TrainConfig
from arpo.training.optim import build_optimizer, freeze_lower_layers


def test_freeze_lower_layers_trains_only_the_top_blocks(tiny_tok):
    from arpo.testing import tiny_model

    m = tiny_model(tiny_tok, layers=3)
    freeze_lower_layers(m, 1)
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("model.layers.2.") or n.startswith("model.norm.") for n in trainable)
    assert "model.norm.weight" in trainable and not m.model.embed_tokens.weight.requires_grad
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = build_optimizer(m, type("O", (), {"lr": 1e-2, "weight_decay": 0.0, "betas": [0.9, 0.999]})())
    ids = torch.randint(0, len(tiny_tok), (2, 8))
    out = m(input_ids=ids, labels=ids)
    out.loss.backward()
    assert m.model.layers[0].self_attn.q_proj.weight.grad is None  # the backward stopped above layer 0
    opt.step()
    changed = {n for n, p in m.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable
    with pytest.raises(ArpoError, match="train_layers=4"):
        freeze_lower_layers(tiny_model(tiny_tok, layers=3), 4)


def test_train_layers_in_a_train_run(tmp_path):
    from safetensors.torch import load_file

    from arpo.config import load_config
    from arpo.models import load_model
    from arpo.recipes import train
    from arpo.training.checkpoint import latest_checkpoint

    cfg = load_config(TrainConfig, "configs/train_tiny.yaml",
                      [f"run.dir={tmp_path / 'r'}", "model.train_layers=1", "steps=1", "run.tensorboard=false"])
    train.run(cfg, quiet=True)
    start, _ = load_model("tiny-random")
    after = load_file(str(latest_checkpoint(tmp_path / "r") / "model" / "model.safetensors"))
    moved = {n for n, p in start.state_dict().items() if n in after and not torch.equal(p, after[n])}
    assert moved and all(n.startswith("model.layers.1.") or n.startswith("model.norm") for n in moved)
